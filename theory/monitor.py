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
   those, no parameter is shared between modules, no batch normalization mixes the examples, and
   each forward's inputs have the batch as their first dimension.
2. ``micro_batch``: under gradient accumulation (several backward passes before ``step()``), the
   gradients of the k micro-batches (u_small = mean_j |g_j|^2, c = mean_j 1/b_j) against their
   accumulated sum in ``.grad`` (u_big, c = sum_j 1/(k^2 b_j)): any layers. ``.grad`` must be
   zero before the step's first backward (checked on the first step) and is read at ``step()``,
   so call it before clipping or rescaling gradients.
3. ``ddp``: under ``DistributedDataParallel``, a communication hook reads each rank's local
   gradient before the all-reduce (u_small = mean over ranks, c = 1/b_local) and the averaged
   one after it (u_big, c = 1/(W b_local)): any layers, and one extra all-reduce of a 2-element
   tensor per step.

The loop's loss must be the *mean* over the batch's examples (``reduction="mean"``) times a
constant ``loss_scale`` passed to ``step()``: 1 for a plain mean, 1/k for a loss divided over k
accumulated micro-batches, the batch size for ``reduction="sum"``, the gradient scaler's scale
under mixed precision. The scale cannot be read from gradients; B_simple does not depend on it,
|G|^2 and tr(Sigma) scale with its square. What is measured is the loss the loop differentiates,
in the mode the model is in (dropout included).

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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from theory.errors import TheoryError, check_int
from theory.layer_norms import layer_sq_norms, unsupported
from theory.monitor_log import ReadingLog
from theory.noise import ratio_se, weighted_mean_cov
from theory.sampling import noise_scale

METHODS = ("auto", "per_example", "micro_batch", "ddp")
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
    """Per-step (|G|^2, tr Sigma) estimates averaged over a window or by a bias-corrected EMA."""

    def __init__(self, window: int | None, ema: float | None) -> None:
        self.window, self.ema = window, ema
        self.recent: deque[tuple[float, float]] = deque(maxlen=window)
        self.sums = np.zeros(7)   # weight, weight^2, g, t, gg, tt, gt
        self.count = 0

    @property
    def label(self) -> str:
        return f"window {self.window}" if self.window else f"ema {self.ema:g}"

    def add(self, g: float, t: float) -> tuple[float, float, float, float, float, float]:
        """Add one step; the smoothed (g, t, b_simple) and their standard errors."""
        self.count += 1
        term = np.array([1.0, 1.0, g, t, g * g, t * t, g * t])
        if self.window:
            self.recent.append((g, t))
            x = np.array(self.recent)
            gs, ts = x[:, 0], x[:, 1]
            n = float(len(x))
            sums = (n, n, gs.sum(), ts.sum(), gs @ gs, ts @ ts, gs @ ts)
        else:
            decay = np.array([self.ema, self.ema ** 2, *[self.ema] * 5])
            self.sums = self.sums * decay + term
            sums = tuple(self.sums)
        (g_mean, t_mean), cov = weighted_mean_cov(*sums)
        return (float(g_mean), float(t_mean), float(noise_scale(t_mean, g_mean)),
                float(math.sqrt(cov[0, 0])), float(math.sqrt(cov[1, 1])),
                ratio_se(g_mean, t_mean, cov))

    @property
    def steps(self) -> int:
        return len(self.recent) if self.window else self.count


@dataclass
class _Pass:
    """What one grad-enabled forward of the model captured for its backward."""

    batch: int | None
    inputs: dict[str, list[torch.Tensor]]
    grads: dict[str, list[torch.Tensor | None]]
    sq: torch.Tensor | None = None
    problem: str | None = None


@dataclass(frozen=True)
class _Backward:
    """One backward pass: its examples, this pass's squared gradient norm and the sum of the
    squared norms of its examples' gradients (None when they were not available, ``problem``
    says why)."""

    batch: int | None
    grad_sq: torch.Tensor
    example_sq: torch.Tensor | None
    problem: str | None


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _total_sq(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum |g|^2 over tensors (sparse ones by their coalesced values), in float64 on their
    device, without a host synchronization."""
    dense = [g.coalesce().values() if g.is_sparse else g for g in grads]
    return torch.stack([g.detach().double().square().sum() for g in dense]).sum() if dense \
        else torch.zeros((), dtype=torch.float64)


class NoiseScaleMonitor:
    """Gradient noise scale of the loop's own batches (module docstring).

    ``model``: the ``nn.Module`` the loop trains, or its ``DistributedDataParallel`` wrapper
    (then ``method="ddp"``; build the monitor before the first backward). ``window`` steps or an
    ``ema`` decay (default ``ema=0.99``; not both); ``population``: the size of the split the
    batches are drawn from without replacement (finite-population correction), or None for
    i.i.d. examples. ``csv`` / ``log_dir``: append each reading to a CSV file / a TensorBoard
    run (under DDP only rank 0 writes). ``comm_hook`` / ``comm_state``: a DDP communication hook
    of yours that the monitor's wraps (default: DDP's own all-reduce mean).

    Use: ``loss.backward()`` (one or more times), then ``reading = monitor.step()``, then the
    optimizer step. ``close()`` (or ``with``) removes the hooks and closes the logs.
    """

    def __init__(self, model: nn.Module, *, window: int | None = None, ema: float | None = None,
                 population: int | None = None, method: str = "auto",
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
        self.count = 0
        self.rank = 0
        self._hooks: list[Any] = []
        self._pass: _Pass | None = None
        self._backwards: list[_Backward] = []
        self._forwards: list[int] = []
        self._stale_grad = False
        self._fresh_checks: list[Any] = []
        self.layers, self.blockers = self._layers()
        if self.ddp:
            self._attach_ddp(model, comm_hook, comm_state)
        else:
            self._attach()
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
        if not self.blockers and self.method in ("auto", "per_example"):
            for name, module in self.layers.items():
                self._hooks.append(module.register_forward_hook(partial(self._on_layer, name)))
        self._hooks.append(torch.autograd.graph.register_multi_grad_hook(
            self.params, self._on_backward, mode="all"))
        # the micro-batch estimator reads the accumulated .grad, which must start at zero: checked
        # on the first backward, just before each parameter's gradient is accumulated
        self._fresh_checks = [p.register_hook(partial(self._check_fresh, p)) for p in self.params]

    def _check_fresh(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        if param.grad is not None and bool(param.grad.ne(0).any()):
            self._stale_grad = True

    def _attach_ddp(self, ddp: DistributedDataParallel, hook: Callable | None, state: Any) -> None:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.method = "ddp"
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._inner = (hook, state) if hook is not None else (default_hooks.allreduce_hook, None)
        self._local: list[torch.Tensor] = []
        self._reduced: list[torch.Tensor] = []
        self._hooks.append(self.module.register_forward_pre_hook(self._on_forward,
                                                                  with_kwargs=True))
        ddp.register_comm_hook(None, self._comm_hook)

    # -- hooks -------------------------------------------------------------------------------

    def _on_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        # evaluations without gradients and torch.func calls (vmap, grad: not the loop's
        # backward) are not the loop's batches
        if not torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
            self._pass = None
            return
        x = _first_tensor(args, kwargs)
        batch = int(x.shape[0]) if x is not None and x.dim() > 0 else None
        self._forwards.append(batch)
        # a forward whose graph gets no backward (e.g. a validation loss with gradients on) is
        # dropped when the next forward starts
        self._pass = _Pass(batch, {n: [] for n in self.layers}, {n: [] for n in self.layers})
        if batch is None:
            self._pass.problem = ("the model's forward got no tensor argument with a batch "
                                  "dimension")

    def _on_layer(self, name: str, module: nn.Module, args: tuple, out: Any) -> None:
        run = self._pass
        if run is None or not isinstance(out, torch.Tensor) or not out.requires_grad:
            return
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != run.batch:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            run.problem = (f"layer {name} ({type(module).__name__}) got an input of shape {shape}"
                           f" whose first dimension is not the batch ({run.batch}); per-example "
                           f"norms need batch-first inputs (e.g. batch_first=True)")
            return
        k = len(run.inputs[name])
        run.inputs[name].append(x.detach())
        run.grads[name].append(None)
        out.register_hook(partial(self._on_output_grad, run, name, k))

    def _on_output_grad(self, run: _Pass, name: str, k: int, grad: torch.Tensor) -> None:
        if run is not self._pass:
            run.problem = "a backward pass reached a forward pass after a newer one started"
            return
        run.grads[name][k] = grad.detach()
        if all(g is not None for g in run.grads[name]):
            self._layer_done(run, name)

    def _layer_done(self, run: _Pass, name: str) -> None:
        sq = layer_sq_norms(self.layers[name], run.inputs[name], run.grads[name])
        run.inputs[name], run.grads[name] = [], []
        if sq is not None:
            total = sq.double().sum()
            run.sq = total if run.sq is None else run.sq + total

    def _on_backward(self, grads: Sequence[torch.Tensor | None]) -> None:
        present = [g for g in grads if g is not None]
        for handle in self._fresh_checks:
            handle.remove()
        self._fresh_checks = []
        run, self._pass = self._pass, None
        if run is None:
            self._backwards.append(_Backward(None, _total_sq(present), None,
                                             "a backward pass without a forward pass"))
            return
        for name, calls in run.grads.items():
            if calls:                      # calls whose outputs got no gradient
                self._layer_done(run, name)
        problem = run.problem or ("per-example norms are off" if self.blockers or
                                  self.method == "micro_batch" else None)
        if problem is None and run.sq is None:
            problem = "no supported layer got a gradient"
        self._backwards.append(_Backward(run.batch, _total_sq(present),
                                         None if problem else run.sq, problem))

    def _comm_hook(self, state, bucket):   # DDP checks the annotations: none given
        # the local gradient, before the inner hook averages the buffer in place
        self._local.append(bucket.buffer().detach().double().square().sum())
        hook, inner_state = self._inner
        fut = hook(inner_state, bucket)

        def reduced(f: torch.futures.Future) -> torch.Tensor:
            value = f.value()
            tensor = value[0] if isinstance(value, (list, tuple)) else value
            self._reduced.append(tensor.detach().double().square().sum())
            return tensor

        return fut.then(reduced)

    # -- estimates -----------------------------------------------------------------------------

    def _coef(self, x: float) -> float:
        """c from x = sum_j w_j^2 / b_j (module docstring)."""
        if self.population is None:
            return x
        n = self.population
        return n / (n - 1) * (x - 1.0 / n)

    def _check_population(self, batch: int) -> None:
        if self.population is not None and batch > self.population:
            raise TheoryError(f"a step saw {batch} examples, more than population="
                              f"{self.population} (examples drawn without replacement)")

    def _per_example(self, passes: list[_Backward], scale: float) -> tuple[float, float, int]:
        values = torch.stack([torch.stack([b.grad_sq, b.example_sq]) for b in passes]).tolist()
        g_total = t_total = 0.0
        examples = 0
        for b, (grad_sq, example_sq) in zip(passes, values):
            n = b.batch
            if n < 2:
                raise TheoryError("per-example estimates need at least 2 examples per batch, "
                                  f"got {n}")
            self._check_population(n)
            # the hooks saw (scale / n) g_i: undo the mean and the loss scale
            u_small = example_sq * n / scale ** 2
            g, t = solve_two_sizes(u_small, self._coef(1.0), grad_sq / scale ** 2,
                                   self._coef(1.0 / n))
            g_total, t_total, examples = g_total + n * g, t_total + n * t, examples + n
        return g_total / examples, t_total / examples, examples

    def _micro_batch(self, passes: list[_Backward], scale: float) -> tuple[float, float, int]:
        if self._stale_grad:
            raise TheoryError("the parameters' .grad held a gradient before the first backward: "
                              "zero the gradients before each step's first micro-batch (the "
                              "micro-batch estimator reads the accumulated .grad)")
        sizes = [b.batch for b in passes]
        if any(b is None for b in sizes):
            raise TheoryError("a micro-batch's size is unknown: the model's forward got no "
                              "tensor argument with a batch dimension")
        k = len(passes)
        grads = [p.grad for p in self.params if p.grad is not None]
        values = torch.stack([*(b.grad_sq for b in passes), _total_sq(grads)]).tolist()
        self._check_population(sum(sizes))
        u_small = float(np.mean(values[:k])) / scale ** 2
        c_small = float(np.mean([self._coef(1.0 / b) for b in sizes]))
        u_big = values[k] / (scale * k) ** 2
        c_big = self._coef(sum(1.0 / (k * k * b) for b in sizes))
        g, t = solve_two_sizes(u_small, c_small, u_big, c_big)
        return g, t, sum(sizes)

    def _ddp(self, scale: float) -> tuple[float, float, int]:
        import torch.distributed as dist

        if not self._local or len(self._reduced) != len(self._local):
            raise TheoryError("NoiseScaleMonitor.step() found no synchronized backward pass since "
                              "the last step: call it after the step's last loss.backward() "
                              "(outside no_sync)")
        sizes = self._forwards
        if not sizes or any(b is None for b in sizes):
            raise TheoryError("the batch size is unknown: the model's forward got no tensor "
                              "argument with a batch dimension")
        k = len(sizes)
        x_local = sum(1.0 / (k * k * b) for b in sizes)
        local = torch.stack(self._local).sum() / (scale * k) ** 2
        shared = torch.stack([local, local.new_tensor(x_local)])
        dist.all_reduce(shared)
        u_small, x_mean = (shared / self.world).tolist()
        # c is affine in x: the mean of the ranks' c is c of their mean x; the averaged gradient
        # weighs each rank 1/W, so its x is the ranks' sum over W^2
        u_big = float(torch.stack(self._reduced).sum()) / (scale * k) ** 2
        g, t = solve_two_sizes(u_small, self._coef(x_mean), u_big, self._coef(x_mean / self.world))
        batch = sum(sizes) * self.world
        self._check_population(batch)
        return g, t, batch

    def step(self, loss_scale: float = 1.0) -> NoiseReading:
        """Read this step's batch: call after the step's last ``loss.backward()`` (and before
        the optimizer clears the gradients). ``loss_scale``: the constant the backward's loss
        carries beyond the batch mean (module docstring). Returns the :class:`NoiseReading`."""
        if not (isinstance(loss_scale, (int, float)) and math.isfinite(loss_scale)
                and loss_scale > 0):
            raise TheoryError(f"loss_scale must be a positive number, got {loss_scale!r}")
        try:
            if self.ddp:
                method = "ddp"
                g, t, batch = self._ddp(float(loss_scale))
            else:
                method, (g, t, batch) = self._estimate(float(loss_scale))
        finally:
            self._backwards, self._forwards, self._pass = [], [], None
            if self.ddp:
                self._local, self._reduced = [], []
        self.count += 1
        g_s, t_s, b_s, g_se, t_se, b_se = self.smoother.add(g, t)
        reading = NoiseReading(step=self.count, method=method, batch_size=batch, b_simple=b_s,
                               g_sq=g_s, trace_sigma=t_s, b_simple_se=b_se, g_sq_se=g_se,
                               trace_sigma_se=t_se, step_b_simple=float(noise_scale(t, g)),
                               step_g_sq=g, step_trace_sigma=t, smoothing=self.smoother.label,
                               steps=self.smoother.steps)
        self.log.write(reading)
        return reading

    def _estimate(self, scale: float) -> tuple[str, tuple[float, float, int]]:
        passes = self._backwards
        if not passes:
            raise TheoryError("NoiseScaleMonitor.step() called before any backward pass since "
                              "the last step: call it after loss.backward()")
        problems = [b.problem for b in passes if b.problem]
        if self.method in ("auto", "per_example") and not problems:
            return "per_example", self._per_example(passes, scale)
        if self.method == "per_example" or (len(passes) < 2 and self.method == "auto"):
            why = ("; ".join(self.blockers) if self.blockers else problems[0])
            raise TheoryError(
                f"NoiseScaleMonitor: no per-example gradient norms here: {why}; accumulate at "
                f"least 2 micro-batches per step (several backward passes before step()), or "
                f"train under DistributedDataParallel")
        if len(passes) < 2:
            raise TheoryError("method='micro_batch' needs at least 2 backward passes (micro-"
                              "batches) before step()")
        return "micro_batch", self._micro_batch(passes, scale)

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the hooks (a DDP communication hook stays: DDP cannot unregister it) and close
        the logs."""
        for h in self._hooks + self._fresh_checks:
            h.remove()
        self._hooks, self._fresh_checks = [], []
        self.log.close()

    def __enter__(self) -> "NoiseScaleMonitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
