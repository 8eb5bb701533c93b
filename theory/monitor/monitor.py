"""The gradient noise scale inside any PyTorch training loop.

``NoiseScaleMonitor(model)`` attaches hooks to an ``nn.Module``; after the loop's own backward
pass(es) of a step, ``monitor.step()`` returns a :class:`NoiseReading`: unbiased estimates of
|G|^2 and tr(Sigma) from this step's batch, their smoothed values, B_simple = tr(Sigma) / |G|^2
(McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training") and
standard errors; it can log them to CSV and TensorBoard. Nothing is recomputed: every estimator
reads quantities the loop's backward already produced.

The estimators all rest on one identity (McCandlish et al. 2018, appendix A): for v, a weighted
mean of the mean gradients of disjoint micro-batches j of b_j examples (weights w_j, sum 1),

    E |v|^2 = |G|^2 + c tr(Sigma),    c = sum_j w_j^2 / b_j                    (examples i.i.d.)
                                      c = N/(N-1) (sum_j w_j^2 / b_j - 1/N)    (distinct examples
                                                                                of a split of N)

(the second with ``population=N``: a batch drawn without replacement, Cochran 1977, thm. 2.2, as
:mod:`theory.sampling`). Two such averages u_small (coefficient c_small) and u_big (c_big) with
c_small > c_big give the unbiased pair

    tr(Sigma) ~ (u_small - u_big) / (c_small - c_big),    |G|^2 ~ u_big - c_big tr(Sigma),

which is McCandlish et al.'s two-batch estimator (their appendix A.1, :func:`theory.noise.
two_batch_estimates` for b_small, b_big) and, with single examples as the small batches, the
sample-covariance estimator (:func:`theory.sampling.to_split`). The three ways to get them, in
order of preference (``method="auto"`` picks the first that applies):

1. ``per_example``: squared norms of every example's gradient from the backward pass the loop
   already does (:mod:`theory.layer_norms`: Linear on any number of leading dimensions, Conv1d,
   Conv2d, Embedding, LayerNorm, RMSNorm). u_small = mean_i |g_i|^2 (c = 1), u_big = |mean
   gradient|^2 (c = 1/B). It applies when every module that owns trainable parameters is one of
   those, no parameter is shared between modules, no batch normalization mixes the examples,
   each forward's inputs have the batch as their first dimension, and each such layer's
   parameters are used only inside its own calls (a table read as ``layer.weight[:t]`` or tied
   to an output head would be left out of the terms: the first measured step checks the autograd
   graph, :func:`used_outside`, and refuses it by name).
2. ``micro_batch``: under gradient accumulation (several backward passes before ``step()``), the
   gradients of the k micro-batches (u_small = mean_j |g_j|^2, c = mean_j 1/b_j) against their
   accumulated sum in ``.grad`` (u_big, c = sum_j 1/(k^2 b_j)): any layers. ``.grad`` must be
   zero before the step's first backward (checked on the first step) and is read at ``step()``,
   so call it before clipping or rescaling gradients.
3. ``ddp``: under ``DistributedDataParallel``, a communication hook reads each rank's local
   gradient before the all-reduce (u_small = mean over ranks, c = 1/b_local) and the averaged
   one after it (u_big, c = 1/(W b_local)): any layers, at least 2 processes. The two per-rank
   scalars ride in the last bucket's all-reduce under DDP's own averaging, or take one extra
   all-reduce of a 2-element tensor per step (:mod:`theory.monitor_ddp`).

The loop's loss must be the *mean* over the batch's examples (``reduction="mean"``) times a
constant ``loss_scale`` passed to ``step()``: 1 for a plain mean, 1/k for a loss divided over k
accumulated micro-batches, the batch size for ``reduction="sum"``, the gradient scaler's scale
under mixed precision. The scale cannot be read from gradients; B_simple does not depend on it,
|G|^2 and tr(Sigma) scale with its square. What is measured is the loss the loop differentiates,
in the mode the model is in (dropout included).

Cost (per-example estimator): during the forward, one hook per supported layer keeps its input
and registers a hook on its output whose callable is a dict's own ``__setitem__`` (installed as
``register_hook`` installs it, without its removable handle), so the backward stores each output
gradient without running a Python frame; nothing else happens until ``step()``. There, on the
CPU, one call of a compiled routine (:mod:`theory.norms_kernel`) takes every layer's sum over
the batch of per-example squared norms and the squared norm of the parameters' ``.grad``, in
double precision: plain loops for Linear layers on one position, Embedding and the norm layers,
register-blocked or batched products for layers over positions, no operator call from Python.
Where that routine cannot be built, and for tensors on other devices, the same sums come from a
few torch kernels per layer (:class:`theory.layer_norms.Terms`) and one
``torch._foreach_norm`` over all of them and ``.grad`` (one fused kernel on a GPU), read to the
host in one transfer. What remains per measured step on small, dispatch-bound steps is the
hooks and ``step()``'s Python; on a layer over P positions the per-example terms take about
the multiplications of the layer's own forward product (P K O per example for K inputs and O
outputs, or P^2 (K + O) in the Gram form), so on sequence models they stay a sizeable fraction
of the step however large it is. ``every=N`` measures one step in N and removes all hooks in
between (docs/guide/noise-monitor.md has the measured overhead).

Smoothing: |G|^2 and tr(Sigma) are averaged *separately* over the last ``window`` steps or with an
exponential moving average of decay ``ema`` (bias-corrected), and B_simple is the ratio of the
averages, never an average of ratios (McCandlish et al. 2018, appendix A.1). Standard errors come
from the spread of the per-step estimates in the window (the weighted variance of the mean,
B_simple's by the delta method; :func:`theory.noise.weighted_mean_cov`): at fixed weights the
steps' batches are independent and they are honest; while training, the drift of the weights
across the window adds to them. ``NoiseReading.smoothing`` states the window.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from theory.errors import TheoryError, check_int
from theory import norms_kernel
from theory.layer_norms import Terms, job_function, terms_function, unsupported
from theory.monitor_ddp import LocalNormHook, batch_term
from theory.monitor_log import ReadingLog
from theory.noise import ratio_se, weighted_mean_cov
from theory.sampling import noise_scale

METHODS = ("auto", "per_example", "micro_batch", "ddp")
# Forwards without a backward (yet) whose layer inputs are held until step(): enough for
# micro-batches whose forwards all run before their backward passes, and a bound on the memory
# an evaluation with gradients enabled can pin between steps.
MAX_PENDING_FORWARDS = 8
DEFAULT_EMA = 0.99


@dataclass(frozen=True)
class NoiseReading:
    """One step's reading of :class:`NoiseScaleMonitor`.

    ``g_sq`` ~ |G|^2, ``trace_sigma`` ~ tr(Sigma) smoothed as ``smoothing`` says, ``b_simple``
    their ratio, ``*_se`` standard errors from the spread of the per-step estimates (nan until
    two steps); ``step_g_sq`` / ``step_trace_sigma`` / ``step_b_simple`` this step's own unbiased
    estimates; ``batch_size`` the examples this step saw (all micro-batches and ranks),
    ``method`` the estimator that ran, ``steps`` how many steps the smoothing holds.
    """

    step: int
    method: str
    batch_size: int
    b_simple: float
    g_sq: float
    trace_sigma: float
    b_simple_se: float
    g_sq_se: float
    trace_sigma_se: float
    step_b_simple: float
    step_g_sq: float
    step_trace_sigma: float
    smoothing: str
    steps: int


def solve_two_sizes(u_small: float, c_small: float, u_big: float, c_big: float
                    ) -> tuple[float, float]:
    """Unbiased (|G|^2, tr(Sigma)) from two averages with E u = |G|^2 + c tr(Sigma) (module
    docstring): tr = (u_small - u_big) / (c_small - c_big), |G|^2 = u_big - c_big tr."""
    trace = (u_small - u_big) / (c_small - c_big)
    return u_big - c_big * trace, trace


class _Smoother:
    """Per-step (|G|^2, tr Sigma) estimates averaged over a window or by a bias-corrected EMA
    (plain floats: it runs every step)."""

    def __init__(self, window: int | None, ema: float | None) -> None:
        self.window, self.ema = window, ema
        self.label = f"window {window}" if window else f"ema {ema:g}"
        self.recent: deque[tuple[float, float]] = deque(maxlen=window)
        self.sums = [0.0] * 7   # weight, weight^2, g, t, gg, tt, gt
        self.count = 0

    def add(self, g: float, t: float) -> tuple[float, float, float, float, float, float]:
        """Add one step; the smoothed (g, t, b_simple) and their standard errors."""
        self.count += 1
        w, w2, sg, st, sgg, stt, sgt = self.sums
        if self.window:
            if len(self.recent) == self.window:     # the oldest step leaves the window
                og, ot = self.recent[0]
                w, w2, sg, st = w - 1.0, w2 - 1.0, sg - og, st - ot
                sgg, stt, sgt = sgg - og * og, stt - ot * ot, sgt - og * ot
            self.recent.append((g, t))
            w, w2, sg, st = w + 1.0, w2 + 1.0, sg + g, st + t
            sgg, stt, sgt = sgg + g * g, stt + t * t, sgt + g * t
            if self.count % self.window == 0:       # bound the rounding of the running sums
                w = w2 = float(len(self.recent))
                sg, st, sgg, stt, sgt = map(math.fsum, zip(*((a, b, a * a, b * b, a * b)
                                                             for a, b in self.recent)))
        else:
            d = self.ema
            w, w2, sg, st = w * d + 1.0, w2 * (d * d) + 1.0, sg * d + g, st * d + t
            sgg, stt, sgt = sgg * d + g * g, stt * d + t * t, sgt * d + g * t
        self.sums = [w, w2, sg, st, sgg, stt, sgt]
        (g_mean, t_mean), cov = weighted_mean_cov(w, w2, sg, st, sgg, stt, sgt)
        return (g_mean, t_mean, noise_scale(t_mean, g_mean), math.sqrt(max(cov[0], 0.0)),
                math.sqrt(max(cov[1], 0.0)), ratio_se(g_mean, t_mean, cov))

    @property
    def steps(self) -> int:
        return len(self.recent) if self.window else self.count


class _Pass:
    """One grad-enabled forward of the model: its batch size, the supported layers' calls
    (layer index, input), and the gradients of those calls' outputs by call number, filled in by
    its backward pass without any Python frame (each output's hook is the dict's own
    ``__setitem__``); the per-example norms are computed from them at ``step()``."""

    __slots__ = ("batch", "calls", "grads", "problem", "outputs", "roots")

    def __init__(self, batch: int | None, checking: bool = False) -> None:
        self.batch = batch
        self.calls: list[tuple[int, Any]] = []
        self.grads: dict[int, torch.Tensor] = {}
        self.problem: str | None = None
        # until the graph check has passed: each call's output node and the model's outputs'
        self.outputs: list[Any] | None = [] if checking else None
        self.roots: list[Any] = []


def _edges_into_parameters(starts: Sequence[Any], stops: set[Any], seen: set[Any],
                           counts: dict[int, int]) -> None:
    """Walk the autograd graph from the nodes ``starts`` (not expanding ``stops`` nor any node in
    ``seen``, which the walk extends) and add, for each parameter's gradient-accumulation node,
    the number of edges into it from the nodes walked (keyed by the parameter's id)."""
    todo = [n for n in starts if n is not None and n not in seen]
    seen.update(todo)
    while todo:
        node = todo.pop()
        if node in stops:
            continue
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            variable = getattr(nxt, "variable", None)
            if variable is not None:     # an AccumulateGrad node: a leaf's gradient
                counts[id(variable)] = counts.get(id(variable), 0) + 1
            elif nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)


def used_outside(run: _Pass, layers: Sequence[tuple[str, nn.Module]]) -> list[str]:
    """The supported layers' parameters that the pass's graph uses outside those layers' own
    calls (e.g. a position table read as ``self.pos.weight[:t]``), as "layer.parameter" names.
    The per-example terms see a layer's parameters only through its calls' inputs and output
    gradients, so such a use would be left out of them: counted here as the edges into each
    parameter's gradient-accumulation node from the whole graph of the model's outputs against
    those from inside the layers' calls (from a call's output node down to its input's)."""
    inside: dict[int, int] = {}
    seen: set[Any] = set()
    for (index, x), node in zip(run.calls, run.outputs or ()):
        stops = {x.grad_fn} if isinstance(x, torch.Tensor) and x.grad_fn is not None else set()
        _edges_into_parameters([node], stops, seen, inside)
    total: dict[int, int] = {}
    _edges_into_parameters(run.roots, set(), set(), total)
    return [f"{name}.{pname}" if name else pname
            for name, module in layers for pname, p in module.named_parameters(recurse=False)
            if total.get(id(p), 0) > inside.get(id(p), 0)]


@dataclass(frozen=True)
class _Backward:
    """One backward pass of the micro-batch estimator: its examples and its own squared gradient
    norm (``problem`` says why it cannot be used)."""

    batch: int | None
    grad_sq: torch.Tensor
    problem: str | None


def _no_backward() -> TheoryError:
    return TheoryError("NoiseScaleMonitor.step() called before any backward pass since the last "
                       "step: call it after loss.backward()")


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _grad_hook(out: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> None:
    """``out.register_hook(hook)`` without its removable handle, which costs about 10 us of
    Python per call (a third of a small layer's forward): a fresh output's hooks as the ordered
    dict that ``register_hook`` itself installs, the same hook on the same node (so an in-place
    change of ``out`` after the layer still gives the gradient of the layer's output). Its key,
    -1, is none that a later ``register_hook`` of the model's own (handles count from 0) can
    take."""
    if type(out) is torch.Tensor and out._backward_hooks is None and out.grad_fn is not None:
        out._backward_hooks = OrderedDict(((-1, hook),))
        out.grad_fn._register_hook_dict(out)
    else:
        out.register_hook(hook)


def _dense(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sparse gradients (``Embedding(sparse=True)``) by their coalesced values, with the same
    norm."""
    if any(g.is_sparse for g in grads):
        return [g.coalesce().values() if g.is_sparse else g for g in grads]
    return grads


def _norms(grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """|g| of each tensor (sparse ones by their coalesced values), on their device and without a
    host synchronization: one fused kernel per dtype and device."""
    return list(torch._foreach_norm(_dense(list(grads)))) if grads else []


def _total_sq(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum |g|^2 over tensors, float64, without a host synchronization."""
    norms = _norms(grads)
    if not norms:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack([n.double() for n in norms]).square().sum()


def _host_vector(scalars: torch.Tensor, norms: Sequence[torch.Tensor]
                 ) -> tuple[list[float], float]:
    """:func:`_host` for scalars already in one 1-d tensor (cat promotes to the wider dtype)."""
    values = torch.cat((scalars, torch.stack(list(norms)))).tolist() if norms else \
        scalars.tolist()
    return values[:scalars.numel()], math.fsum(v * v for v in values[scalars.numel():])


def _host(scalars: Sequence[torch.Tensor], norms: Sequence[torch.Tensor]
          ) -> tuple[list[float], float]:
    """Scalars and the sum of the squares of norms as floats, in one transfer (stack promotes
    to the widest dtype; the squares are summed in double precision)."""
    values = torch.stack([*scalars, *norms]).tolist()
    return values[:len(scalars)], math.fsum(v * v for v in values[len(scalars):])


class NoiseScaleMonitor:
    """Gradient noise scale of the loop's own batches (module docstring).

    ``model``: the ``nn.Module`` the loop trains, or its ``DistributedDataParallel`` wrapper
    (then ``method="ddp"``; build the monitor before the first backward). ``window`` steps or an
    ``ema`` decay (default ``ema=0.99``; not both); ``population``: the size of the split the
    batches are drawn from without replacement (finite-population correction), or None for
    i.i.d. examples. ``every``: measure one step in ``every`` (1, the default: every step),
    with no hooks attached in between; the window then counts measured steps. ``csv`` /
    ``log_dir``: append each reading to a CSV file / a TensorBoard run (under DDP only rank 0
    writes). ``comm_hook`` / ``comm_state``: a DDP communication hook of yours that the
    monitor's wraps and calls on every bucket (default: DDP's own all-reduce mean over DDP's
    process group, into whose last bucket the monitor folds its two per-rank scalars).

    Use: ``loss.backward()`` (one or more times), then ``reading = monitor.step()``, then the
    optimizer step. ``close()`` (or ``with``) removes the hooks and closes the logs.
    """

    def __init__(self, model: nn.Module, *, window: int | None = None, ema: float | None = None,
                 population: int | None = None, method: str = "auto", every: int = 1,
                 csv: str | os.PathLike | None = None, log_dir: str | os.PathLike | None = None,
                 comm_hook: Callable | None = None, comm_state: Any = None) -> None:
        if not isinstance(model, nn.Module):
            raise TheoryError(f"NoiseScaleMonitor needs an nn.Module, got {type(model).__name__}")
        if method not in METHODS:
            raise TheoryError(f"method {method!r}; allowed: {', '.join(METHODS)}")
        if window is not None and ema is not None:
            raise TheoryError("give window or ema, not both")
        if window is not None:
            check_int(window, "window")
        elif ema is None:
            ema = DEFAULT_EMA
        if ema is not None and not (isinstance(ema, (int, float)) and 0.0 < ema < 1.0):
            raise TheoryError(f"ema must be a decay in (0, 1), got {ema!r}")
        if population is not None:
            check_int(population, "population", minimum=2)
        self.every = check_int(every, "every")
        self.ddp = isinstance(model, DistributedDataParallel)
        if method == "ddp" and not self.ddp:
            raise TheoryError("method='ddp' needs a DistributedDataParallel model")
        if self.ddp and method in ("per_example", "micro_batch"):
            raise TheoryError(f"method={method!r} is not available under DistributedDataParallel:"
                              f" use method='ddp' (or 'auto')")
        self.module = model.module if self.ddp else model
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        if not self.params:
            raise TheoryError(f"NoiseScaleMonitor: the model ({type(self.module).__name__}) has no "
                              f"parameters that require gradients")
        self.method, self.population = method, population
        self.smoother = _Smoother(window, ema)
        self.calls = 0
        self.last: NoiseReading | None = None
        self.rank = 0
        self._active = True
        self._closed = False
        self._hooks: list[Any] = []
        self._fresh_checks: list[Any] = []
        self._stale_grad = False
        self._pass: _Pass | None = None
        self._passes: list[_Pass] = []          # the step's forwards, per-example estimator
        self._evicted: deque[_Pass] = deque(maxlen=64)   # released forwards without a backward
        self._backwards: list[_Backward] = []   # the step's backward passes, micro-batch one
        self._fresh_seen: set[int] = set()
        self._forwards: list[int | None] = []
        self.layers, self.blockers = self._layers()
        self._layer_list = list(self.layers.items())
        # each layer's terms function, looked up once: step() calls it directly
        self._terms_of = [terms_function(m) for m in self.layers.values()]
        self._jobs_of = [job_function(m) for m in self.layers.values()]
        # the compiled routine (theory.norms_kernel), loaded at the first per-example step;
        # False: not loaded yet
        self._kernel: Any = False
        self._layer_hooks = [partial(self._on_layer, i) for i in range(len(self._layer_list))]
        # the first measured step checks that no supported layer's parameter is used outside
        # the layer's own calls (used_outside); the forwards until then keep their graph's nodes
        self._graph_checked = False
        self._root_hook: Any = None
        # the micro-batch estimator reads each backward's gradient norm
        self.per_pass_norms = not self.ddp and (
            method == "micro_batch" or (method == "auto" and bool(self.blockers)))
        self.per_example_hooks = (not self.ddp and not self.blockers
                                  and method in ("auto", "per_example"))
        if self.ddp:
            self._attach_ddp(model, comm_hook, comm_state)
        else:
            self._attach()
        # the estimators read the accumulated .grad at step(), which must start at zero: checked
        # until the first step, just before each parameter's gradient is accumulated
        self._fresh_checks = [p.register_hook(partial(self._check_fresh, p)) for p in self.params]
        self.log = ReadingLog(csv, log_dir) if self.rank == 0 else ReadingLog(None, None)

    # -- attaching ---------------------------------------------------------------------------

    def _layers(self) -> tuple[dict[str, nn.Module], list[str]]:
        """The modules that own trainable parameters, by name, and why per-example norms do not
        apply (empty when they do)."""
        layers: dict[str, nn.Module] = {}
        blockers: list[str] = []
        owners: dict[int, str] = {}
        for name, module in self.module.named_modules():
            if isinstance(module, _BatchNorm):
                blockers.append(f"{name or 'model'} ({type(module).__name__}: normalizes over "
                                f"the batch)")
            own = [p for p in module._parameters.values() if p is not None and p.requires_grad]
            if not own:
                continue
            for p in own:
                if id(p) in owners:
                    blockers.append(f"{name} (shares a parameter with {owners[id(p)] or 'model'})")
                owners[id(p)] = name
            why = unsupported(module)
            if why is None:
                layers[name] = module
            elif not isinstance(module, _BatchNorm):
                blockers.append(f"{name or 'model'} ({why})")
        return layers, blockers

    def _attach(self) -> None:
        self._hooks.append(self.module.register_forward_pre_hook(self._on_forward,
                                                                  with_kwargs=True))
        if self.per_example_hooks:
            self._hooks += [module.register_forward_hook(hook) for (_, module), hook in
                            zip(self._layer_list, self._layer_hooks)]
            if not self._graph_checked and self._root_hook is None:
                self._root_hook = self.module.register_forward_hook(self._on_output)
        if self.per_pass_norms:
            self._hooks.append(torch.autograd.graph.register_multi_grad_hook(
                self.params, self._on_backward, mode="all"))

    def _detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks, self._pass = [], None
        self._stop_checking()

    def _stop_checking(self) -> None:
        if self._root_hook is not None:
            self._root_hook.remove()
            self._root_hook = None

    def _check_fresh(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        # at the first backward that reaches this parameter, before its gradient is added
        if id(param) in self._fresh_seen:
            return
        self._fresh_seen.add(id(param))
        if param.grad is not None and bool(param.grad.ne(0).any()):
            self._stale_grad = True

    def _attach_ddp(self, ddp: DistributedDataParallel, hook: Callable | None, state: Any) -> None:
        import torch.distributed as dist

        self.method = "ddp"
        self._ddp_hook = LocalNormHook(ddp, hook, state, self._batch_term)
        self.rank, self.world = dist.get_rank(), self._ddp_hook.world
        self._hooks.append(self.module.register_forward_pre_hook(self._on_ddp_forward,
                                                                  with_kwargs=True))
        ddp.register_comm_hook(None, self._ddp_hook.hook)

    # -- hooks -------------------------------------------------------------------------------

    def _on_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._pass = None
        # evaluations without gradients and torch.func calls (vmap, grad: not the loop's
        # backward) are not the loop's batches
        if not torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
            return
        x = _first_tensor(args, kwargs)
        batch = int(x.shape[0]) if x is not None and x.dim() > 0 else None
        self._forwards.append(batch)
        self._pass = run = _Pass(batch, not self._graph_checked)
        if self.per_example_hooks:
            pending = ([r for r in self._passes if not r.grads]
                       if len(self._passes) >= MAX_PENDING_FORWARDS else ())
            if len(pending) >= MAX_PENDING_FORWARDS:
                # release the oldest forward still without a backward; should its backward come
                # after all, step() refuses the step
                old = pending[0]
                self._passes.remove(old)
                old.calls = []
                self._evicted.append(old)
            self._passes.append(run)
        if batch is None:
            run.problem = "the model's forward got no tensor argument with a batch dimension"

    def _on_ddp_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        # under DDP only the micro-batches' sizes are needed (as _on_forward counts them)
        if torch.is_grad_enabled() and not torch._C._are_functorch_transforms_active():
            x = _first_tensor(args, kwargs)
            self._forwards.append(int(x.shape[0]) if x is not None and x.dim() > 0 else None)

    def _batch_term(self) -> float:
        return batch_term(self._forwards)

    def _on_layer(self, index: int, module: nn.Module, args: tuple, out: Any) -> None:
        # the forward's only work per layer: keep the input, and have the output's gradient
        # stored by a builtin (no Python frame runs during the backward)
        run = self._pass
        if run is None or not isinstance(out, torch.Tensor) or not out.requires_grad:
            return
        k = len(run.calls)
        run.calls.append((index, args[0] if args else None))
        _grad_hook(out, partial(run.grads.__setitem__, k))
        if run.outputs is not None:
            run.outputs.append(out.grad_fn)

    def _on_output(self, module: nn.Module, args: tuple, out: Any) -> None:
        run = self._pass
        if run is not None and run.outputs is not None:
            run.roots = [t.grad_fn for t in torch.utils._pytree.tree_leaves(out)
                         if isinstance(t, torch.Tensor) and t.grad_fn is not None]

    def _pass_calls(self, run: _Pass) -> list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]
                                             ] | None:
        """The pass's (layer index, its calls' (input, output gradient) pairs) for the layers
        whose outputs got a gradient; None, with ``run.problem`` saying why, where there are
        none."""
        batch, grads = run.batch, run.grads
        by_layer: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for k, (index, x) in enumerate(run.calls):
            if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != batch:
                name, module = self._layer_list[index]
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                run.problem = (f"layer {name} ({type(module).__name__}) got an input of shape "
                               f"{shape} whose first dimension is not the batch ({batch}); "
                               f"per-example norms need batch-first inputs (e.g. "
                               f"batch_first=True)")
                return None
            g = grads.get(k)
            if g is not None:       # (a call whose output got no gradient adds nothing)
                by_layer.setdefault(index, []).append((x, g))
        if not by_layer:
            run.problem = "no supported layer got a gradient"
            return None
        return list(by_layer.items())

    def _pass_terms(self, calls: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]]
                    ) -> Terms:
        """The pass's per-example squared norms over its layers (torch operators; call under
        ``no_grad``)."""
        terms, layers, terms_of = Terms(), self._layer_list, self._terms_of
        for index, pairs in calls:
            terms_of[index](terms, layers[index][1], pairs)
        return terms

    def _on_backward(self, grads: Sequence[torch.Tensor | None]) -> None:
        run, self._pass = self._pass, None
        batch = run.batch if run is not None else None
        self._backwards.append(_Backward(batch, _total_sq([g for g in grads if g is not None]),
                                         None if run else "a backward pass without a forward"))

    # -- estimates -----------------------------------------------------------------------------

    def _coef(self, x: float) -> float:
        """c from x = sum_j w_j^2 / b_j (module docstring)."""
        if self.population is None:
            return x
        n = self.population
        return n / (n - 1) * (x - 1.0 / n)

    def _sizes(self, sizes: Sequence[int | None]) -> int:
        """The step's examples; checks them against ``population``."""
        if any(b is None for b in sizes):
            raise TheoryError("the batch size is unknown: the model's forward got no tensor "
                              "argument with a batch dimension")
        batch = sum(sizes)
        if batch < 2:
            raise TheoryError(f"a step needs at least 2 examples to estimate the noise, got {batch}")
        if self.population is not None and batch > self.population:
            raise TheoryError(f"a step saw {batch} examples, more than population="
                              f"{self.population} (examples drawn without replacement)")
        return batch

    def _grads(self) -> list[torch.Tensor]:
        """The parameters' .grad: the step's accumulated gradient."""
        if self._stale_grad:
            raise TheoryError("the parameters' .grad held a gradient before the first backward: "
                              "zero the gradients before each step's first backward (the monitor "
                              "reads the accumulated .grad)")
        return [p.grad for p in self.params if p.grad is not None]

    def _grad_norms(self) -> list[torch.Tensor]:
        """|.grad| of each parameter."""
        return _norms(self._grads())

    def _example_sums(self, calls: list[list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]]]
                      ) -> tuple[list[float], float]:
        """Per pass, the sum over its examples of their squared gradient norms, and the squared
        norm of .grad: by the compiled routine in one call where it is available and the
        gradients are on the CPU (:mod:`theory.norms_kernel`), else by torch operators, all
        norms of the step in one ``_foreach_norm`` read in one transfer: [the passes' extras'
        sums..., the squares' norms..., the .grad norms...]."""
        grads = _dense(self._grads())
        on_cpu = all(g.is_cpu for g in grads)
        if on_cpu and self._kernel is False:       # (built or loaded once, only for the CPU)
            self._kernel = norms_kernel.kernel()
        if on_cpu and self._kernel is not None:
            layers, jobs_of = self._layer_list, self._jobs_of
            jobs = [(j, *jobs_of[index](layers[index][1], pairs))
                    for j, run in enumerate(calls) for index, pairs in run]
            values = norms_kernel.sums(self._kernel, len(calls), jobs, grads)
            return values[:-1], values[-1]
        with torch.no_grad():
            terms = [self._pass_terms(run) for run in calls]
        squares = [s for t in terms for s in t.squares]
        extras = [torch.cat(t.extras).sum() for t in terms if t.extras]
        tensors = squares + grads
        scalars = [*extras, *(torch._foreach_norm(tensors) if tensors else ())]
        values = torch.stack(scalars).tolist() if scalars else []
        extra, at, sums = 0, len(extras), []
        for t in terms:
            parts = [v * v for v in values[at:at + len(t.squares)]]
            at += len(t.squares)
            if t.extras:
                parts.append(values[extra])
                extra += 1
            sums.append(math.fsum(parts))
        return sums, math.fsum(v * v for v in values[at:])

    def _per_example(self, sizes: list[int | None],
                     calls: list[list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]]],
                     scale: float) -> tuple[float, float, int]:
        """Examples i of pass j (b_j of them, squared norms summed to S_j) were seen as
        (scale / b_j) g_i; the mean gradient v = .grad / (scale k) weighs the k passes' means
        1/k each."""
        batch, k = self._sizes(sizes), len(sizes)
        sums, grad_sq = self._example_sums(calls)
        u_small = sum(b * b * v for b, v in zip(sizes, sums)) / (scale * scale * batch)
        u_big = grad_sq / (scale * k) ** 2
        g, t = solve_two_sizes(u_small, self._coef(1.0), u_big,
                               self._coef(sum(1.0 / (k * k * b) for b in sizes)))
        return g, t, batch

    def _micro_batch(self, passes: list[_Backward], scale: float) -> tuple[float, float, int]:
        sizes = [b.batch for b in passes]
        batch, k = self._sizes(sizes), len(passes)
        values, grad_sq = _host([b.grad_sq for b in passes], self._grad_norms())
        u_small = sum(values) / (k * scale * scale)
        c_small = sum(self._coef(1.0 / b) for b in sizes) / k
        u_big = grad_sq / (scale * k) ** 2
        g, t = solve_two_sizes(u_small, c_small, u_big,
                               self._coef(sum(1.0 / (k * k * b) for b in sizes)))
        return g, t, batch

    def _ddp(self, scale: float) -> tuple[float, float, int]:
        """Rank r's local gradient (scale sum_j g_j over its k micro-batches) seen as
        v_r = local / (scale k), x_r = sum_j 1/(k^2 b_j); the averaged gradient in .grad is
        (scale k) times the mean of the v_r, with x = sum_r x_r / W^2."""
        sums, synced = self._ddp_hook.reduced()
        if sums is None:
            raise TheoryError("NoiseScaleMonitor.step() found no synchronized backward pass since "
                              "the last step: call it after the step's last loss.backward() "
                              "(outside no_sync)")
        if synced > 1:
            raise TheoryError(f"NoiseScaleMonitor: {synced} synchronized backward passes in one "
                              f"step (each all-reduces the accumulated .grad): accumulate "
                              f"micro-batches under ddp.no_sync() and call step() after the "
                              f"last backward")
        sizes = self._forwards
        self._sizes(sizes)
        k = len(sizes)
        (local_sq, x_sum), grad_sq = _host_vector(sums, self._grad_norms())
        u_small, x_mean = local_sq / self.world / (scale * k) ** 2, x_sum / self.world
        u_big = grad_sq / (scale * k) ** 2
        # c is affine in x: the mean of the ranks' c is c of their mean x
        g, t = solve_two_sizes(u_small, self._coef(x_mean), u_big, self._coef(x_mean / self.world))
        return g, t, self._sizes([sum(sizes) * self.world])

    def step(self, loss_scale: float = 1.0) -> NoiseReading | None:
        """Read this step's batch: call after the step's last ``loss.backward()`` (and before
        the optimizer clears the gradients). ``loss_scale``: the constant the backward's loss
        carries beyond the batch mean (module docstring). Returns the :class:`NoiseReading` of
        this step, or with ``every`` > 1 between measured steps the last one (its ``step`` says
        which)."""
        if self._closed:
            raise TheoryError("NoiseScaleMonitor.step() after close()")
        if not (isinstance(loss_scale, (int, float)) and math.isfinite(loss_scale)
                and loss_scale > 0):
            raise TheoryError(f"loss_scale must be a positive number, got {loss_scale!r}")
        if self._active:
            reading = self._measure(float(loss_scale))
        else:
            reading = self.last
            self._reset()
        self.calls += 1
        active = self.calls % self.every == 0
        if not self.ddp and active != self._active:
            # between measured steps the model runs without the monitor's hooks
            self._attach() if active else self._detach()
        self._active = active
        if self.ddp:
            self._ddp_hook.active = active
        return reading

    def _reset(self) -> None:
        """Forget the step's passes (the fresh-gradient check ends with the first step)."""
        self._backwards, self._forwards, self._passes, self._pass = [], [], [], None
        self._evicted.clear()
        if self.ddp:
            self._ddp_hook.reset()
        for handle in self._fresh_checks:
            handle.remove()
        self._fresh_checks, self._stale_grad = [], False
        self._fresh_seen.clear()

    def _measure(self, scale: float) -> NoiseReading:
        try:
            if self.ddp:
                method = "ddp"
                g, t, batch = self._ddp(scale)
            else:
                method, (g, t, batch) = self._estimate(scale)
        finally:
            self._reset()
        g_s, t_s, b_s, g_se, t_se, b_se = self.smoother.add(g, t)
        reading = NoiseReading(step=self.calls + 1, method=method, batch_size=batch,
                               b_simple=b_s, g_sq=g_s, trace_sigma=t_s, b_simple_se=b_se,
                               g_sq_se=g_se, trace_sigma_se=t_se, step_b_simple=noise_scale(t, g),
                               step_g_sq=g, step_trace_sigma=t, smoothing=self.smoother.label,
                               steps=self.smoother.steps)
        self.log.write(reading)
        self.last = reading
        return reading

    def _estimate(self, scale: float) -> tuple[str, tuple[float, float, int]]:
        if self.per_pass_norms:
            passes = self._backwards
            if not passes:
                raise _no_backward()
            if len(passes) < 2:
                why = "; ".join(self.blockers) or "method='micro_batch'"
                raise TheoryError(
                    f"NoiseScaleMonitor: no per-example gradient norms here: {why}; accumulate "
                    f"at least 2 micro-batches per step (several backward passes before step()),"
                    f" or train under DistributedDataParallel")
            return "micro_batch", self._micro_batch(passes, scale)
        # the forwards whose backward ran (one without a backward is dropped)
        runs = [run for run in self._passes if run.grads]
        if any(run.grads for run in self._evicted):
            raise TheoryError(f"NoiseScaleMonitor: a backward pass reached a forward that had been "
                              f"released after {MAX_PENDING_FORWARDS} newer forwards without a "
                              f"backward; run each micro-batch's backward within "
                              f"{MAX_PENDING_FORWARDS} forwards")
        if not runs:
            raise _no_backward()
        if not self._graph_checked:
            outside = sorted({name for run in runs if run.outputs is not None
                              for name in used_outside(run, self._layer_list)})
            if outside:
                raise TheoryError(
                    f"NoiseScaleMonitor: parameter(s) {', '.join(outside)} are used outside their "
                    f"layer's own call (e.g. a table read as layer.weight[:t]), which per-example "
                    f"norms cannot see; call the layer instead, or use method='micro_batch' with "
                    f"at least 2 micro-batches per step")
            self._graph_checked = True
            self._stop_checking()
        calls = [None if run.problem else self._pass_calls(run) for run in runs]
        problems = [run.problem for run in runs if run.problem]
        if problems:
            raise TheoryError(f"NoiseScaleMonitor: no per-example gradient norms: {problems[0]};"
                              f" or use method='micro_batch' with at least 2 micro-batches per "
                              f"step")
        return "per_example", self._per_example([run.batch for run in runs], calls, scale)

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the hooks (a DDP communication hook stays: DDP cannot unregister it) and close
        the logs."""
        self._detach()
        for h in self._fresh_checks:
            h.remove()
        self._fresh_checks, self._closed = [], True
        self.log.close()

    def __enter__(self) -> NoiseScaleMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
