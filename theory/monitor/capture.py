"""What :class:`theory.NoiseScaleMonitor`'s hooks capture of a step: its forwards, their layer
inputs and output gradients, and its backward passes (:class:`Capture`).

Cost (per-example estimator): during the forward, one hook per supported layer keeps its input
and registers a hook on its output whose callable is a dict's own ``__setitem__`` (installed as
``register_hook`` installs it, without its removable handle), so the backward stores each output
gradient without running a Python frame; nothing else happens until ``step()``. There, on the
CPU, one call of the monitor's kernel (:mod:`theory.monitor.kernel`, compiled C++) takes every
layer's sum over the batch of per-example squared norms and the squared norm of the parameters'
``.grad``, in double precision: plain loops for Linear layers on one position, Embedding and the
norm layers, register-blocked or batched products for layers over positions, no operator call
from Python. Where that kernel cannot be built, and for tensors on other devices, the same sums
come from a few torch kernels per layer (:class:`theory.monitor.layer_norms.Terms`) and one
``torch._foreach_norm`` over all of them and ``.grad`` (one fused kernel on a GPU), read to the
host in one transfer. What remains per measured step on small, dispatch-bound steps is the
hooks and ``step()``'s Python; on a layer over P positions the per-example terms take about
the multiplications of the layer's own forward product (P K O per example for K inputs and O
outputs, or P^2 (K + O) in the Gram form), so on sequence models they stay a sizeable fraction
of the step however large it is. ``every=N`` measures one step in N and removes all hooks in
between (docs/guide/noise-monitor.md has the measured overhead).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from theory.errors import TheoryError
from theory.monitor.layer_norms import Terms, job_function, terms_function, unsupported

# Forwards without a backward (yet) whose layer inputs are held until step(): enough for
# micro-batches whose forwards all run before their backward passes, and a bound on the memory
# an evaluation with gradients enabled can pin between steps.
MAX_PENDING_FORWARDS = 8
# (layer index, its calls' (input, output gradient) pairs) of one pass
Calls = list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]]


class Pass:
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


def used_outside(run: Pass, layers: Sequence[tuple[str, nn.Module]]) -> list[str]:
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
class Backward:
    """One backward pass of the micro-batch estimator: its examples and its own squared gradient
    norm (``problem`` says why it cannot be used)."""

    batch: int | None
    grad_sq: torch.Tensor
    problem: str | None
    parts: Any = None       # what the parts' hook read of it (theory.monitor.parts)


def no_backward() -> TheoryError:
    return TheoryError("NoiseScaleMonitor.step() called before any backward pass since the last "
                       "step: call it after loss.backward()")


def first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def grad_hook(out: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> None:
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


def dense(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sparse gradients (``Embedding(sparse=True)``) by their coalesced values, with the same
    norm."""
    if any(g.is_sparse for g in grads):
        return [g.coalesce().values() if g.is_sparse else g for g in grads]
    return grads


def norms(grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """|g| of each tensor (sparse ones by their coalesced values), on their device and without a
    host synchronization: one fused kernel per dtype and device."""
    return list(torch._foreach_norm(dense(list(grads)))) if grads else []


def total_sq(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum |g|^2 over tensors, float64, without a host synchronization."""
    found = norms(grads)
    if not found:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack([n.double() for n in found]).square().sum()


def host_vector(scalars: torch.Tensor, norms: Sequence[torch.Tensor]
                 ) -> tuple[list[float], float]:
    """:func:`host` for scalars already in one 1-d tensor (cat promotes to the wider dtype)."""
    values = torch.cat((scalars, torch.stack(list(norms)))).tolist() if norms else \
        scalars.tolist()
    return values[:scalars.numel()], math.fsum(v * v for v in values[scalars.numel():])


def host(scalars: Sequence[torch.Tensor], norms: Sequence[torch.Tensor]
          ) -> tuple[list[float], float]:
    """Scalars and the sum of the squares of norms as floats, in one transfer (stack promotes
    to the widest dtype; the squares are summed in double precision)."""
    values = torch.stack([*scalars, *norms]).tolist()
    return values[:len(scalars)], math.fsum(v * v for v in values[len(scalars):])


class Capture:
    """The monitor's hooks on ``module`` (the model, or a DDP wrapper's inner module) and what
    they record of the current step: the modules owning trainable parameters (``layers``) and
    why per-example norms do not apply (``blockers``), the step's forwards (``passes``, with
    their layers' inputs and output gradients, for the per-example estimator), its backward
    passes (``backwards``, for the micro-batch estimator) and every grad-enabled forward's batch
    size (``forwards``). ``per_example_hooks`` / ``per_pass_norms``: which of the two the hooks
    feed (none under DDP, whose hook is the monitor's own)."""

    def __init__(self, module: nn.Module, params: list[nn.Parameter], method: str, ddp: bool
                 ) -> None:
        self.module, self.params = module, params
        self.layers, self.blockers = trained_layers(module)
        self.layer_list = list(self.layers.items())
        # each layer's terms function, looked up once: step() calls it directly
        self.terms_of = [terms_function(m) for m in self.layers.values()]
        self.jobs_of = [job_function(m) for m in self.layers.values()]
        self._layer_hooks = [partial(self._on_layer, i) for i in range(len(self.layer_list))]
        # the micro-batch estimator reads each backward's gradient norm
        self.per_pass_norms = not ddp and (
            method == "micro_batch" or (method == "auto" and bool(self.blockers)))
        self.per_example_hooks = not ddp and not self.blockers and method in ("auto",
                                                                              "per_example")
        # what each backward pass's gradients give the parts (theory.monitor.parts), or None
        self.part_hook: Callable[[Sequence[torch.Tensor | None]], Any] | None = None
        # the first measured step checks that no supported layer's parameter is used outside
        # the layer's own calls (used_outside); the forwards until then keep their graph's nodes
        self.graph_checked = False
        self._root_hook: Any = None
        self._hooks: list[Any] = []
        self._fresh_checks: list[Any] = []
        self._fresh_seen: set[int] = set()
        self.stale_grad = False
        self.pass_: Pass | None = None
        self.passes: list[Pass] = []          # the step's forwards, per-example estimator
        self.evicted: deque[Pass] = deque(maxlen=64)   # released forwards without a backward
        self.backwards: list[Backward] = []   # the step's backward passes, micro-batch one
        self.forwards: list[int | None] = []

    # -- attaching ---------------------------------------------------------------------------

    def attach(self) -> None:
        self._hooks.append(self.module.register_forward_pre_hook(self._on_forward,
                                                                  with_kwargs=True))
        if self.per_example_hooks:
            self._hooks += [module.register_forward_hook(hook) for (_, module), hook in
                            zip(self.layer_list, self._layer_hooks)]
            if not self.graph_checked and self._root_hook is None:
                self._root_hook = self.module.register_forward_hook(self._on_output)
        if self.per_pass_norms or self.part_hook is not None:
            self._hooks.append(torch.autograd.graph.register_multi_grad_hook(
                self.params, self._on_backward, mode="all"))

    def attach_ddp(self) -> None:
        """Under DDP only the micro-batches' sizes are captured (the monitor's communication
        hook reads the gradients)."""
        self._hooks.append(self.module.register_forward_pre_hook(self._on_ddp_forward,
                                                                  with_kwargs=True))

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks, self.pass_ = [], None
        self.stop_checking()

    def stop_checking(self) -> None:
        if self._root_hook is not None:
            self._root_hook.remove()
            self._root_hook = None

    def check_fresh_grads(self) -> None:
        """Until the next :meth:`reset`, note a parameter whose ``.grad`` is not zero when its
        first backward reaches it: the estimators read the accumulated ``.grad`` at ``step()``,
        which must start at zero."""
        self._fresh_checks = [p.register_hook(partial(self._check_fresh, p)) for p in self.params]

    def _check_fresh(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        # at the first backward that reaches this parameter, before its gradient is added
        if id(param) in self._fresh_seen:
            return
        self._fresh_seen.add(id(param))
        if param.grad is not None and bool(param.grad.ne(0).any()):
            self.stale_grad = True

    def reset(self) -> None:
        """Forget the step's passes (the fresh-gradient check ends with the first step)."""
        self.backwards, self.forwards, self.passes, self.pass_ = [], [], [], None
        self.evicted.clear()
        for handle in self._fresh_checks:
            handle.remove()
        self._fresh_checks, self.stale_grad = [], False
        self._fresh_seen.clear()

    # -- hooks -------------------------------------------------------------------------------

    def _on_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.pass_ = None
        # evaluations without gradients and torch.func calls (vmap, grad: not the loop's
        # backward) are not the loop's batches
        if not torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
            return
        x = first_tensor(args, kwargs)
        batch = int(x.shape[0]) if x is not None and x.dim() > 0 else None
        self.forwards.append(batch)
        self.pass_ = run = Pass(batch, not self.graph_checked)
        if self.per_example_hooks:
            pending = ([r for r in self.passes if not r.grads]
                       if len(self.passes) >= MAX_PENDING_FORWARDS else ())
            if len(pending) >= MAX_PENDING_FORWARDS:
                # release the oldest forward still without a backward; should its backward come
                # after all, step() refuses the step
                old = pending[0]
                self.passes.remove(old)
                old.calls = []
                self.evicted.append(old)
            self.passes.append(run)
        if batch is None:
            run.problem = "the model's forward got no tensor argument with a batch dimension"

    def _on_ddp_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        # under DDP only the micro-batches' sizes are needed (as _on_forward counts them)
        if torch.is_grad_enabled() and not torch._C._are_functorch_transforms_active():
            x = first_tensor(args, kwargs)
            self.forwards.append(int(x.shape[0]) if x is not None and x.dim() > 0 else None)

    def _on_layer(self, index: int, module: nn.Module, args: tuple, out: Any) -> None:
        # the forward's only work per layer: keep the input, and have the output's gradient
        # stored by a builtin (no Python frame runs during the backward)
        run = self.pass_
        if run is None or not isinstance(out, torch.Tensor) or not out.requires_grad:
            return
        k = len(run.calls)
        run.calls.append((index, args[0] if args else None))
        grad_hook(out, partial(run.grads.__setitem__, k))
        if run.outputs is not None:
            run.outputs.append(out.grad_fn)

    def _on_output(self, module: nn.Module, args: tuple, out: Any) -> None:
        run = self.pass_
        if run is not None and run.outputs is not None:
            run.roots = [t.grad_fn for t in torch.utils._pytree.tree_leaves(out)
                         if isinstance(t, torch.Tensor) and t.grad_fn is not None]

    def _on_backward(self, grads: Sequence[torch.Tensor | None]) -> None:
        run, self.pass_ = self.pass_, None
        batch = run.batch if run is not None else None
        present = [g for g in grads if g is not None]
        self.backwards.append(Backward(
            batch, total_sq(present) if self.per_pass_norms else torch.zeros(()),
            None if run else "a backward pass without a forward",
            None if self.part_hook is None else self.part_hook(grads)))

    # -- what a step read --------------------------------------------------------------------

    def grads(self) -> list[torch.Tensor]:
        """The parameters' .grad: the step's accumulated gradient."""
        if self.stale_grad:
            raise TheoryError("the parameters' .grad held a gradient before the first backward: "
                              "zero the gradients before each step's first backward (the monitor "
                              "reads the accumulated .grad)")
        return [p.grad for p in self.params if p.grad is not None]

    def micro_batches(self) -> list[Backward]:
        """The step's backward passes, for the micro-batch estimator (at least 2)."""
        passes = self.backwards
        if not passes:
            raise no_backward()
        if len(passes) < 2:
            why = "; ".join(self.blockers) or "method='micro_batch'"
            raise TheoryError(
                f"NoiseScaleMonitor: no per-example gradient norms here: {why}; accumulate "
                f"at least 2 micro-batches per step (several backward passes before step()),"
                f" or train under DistributedDataParallel")
        return passes

    def per_example_calls(self) -> tuple[list[int | None], list[Calls]]:
        """The batch sizes and layer calls of the step's forwards whose backward ran (one
        without a backward is dropped), for the per-example estimator; refused with the reason
        where their per-example norms cannot be taken."""
        runs = [run for run in self.passes if run.grads]
        if any(run.grads for run in self.evicted):
            raise TheoryError(f"NoiseScaleMonitor: a backward pass reached a forward that had been "
                              f"released after {MAX_PENDING_FORWARDS} newer forwards without a "
                              f"backward; run each micro-batch's backward within "
                              f"{MAX_PENDING_FORWARDS} forwards")
        if not runs:
            raise no_backward()
        if not self.graph_checked:
            outside = sorted({name for run in runs if run.outputs is not None
                              for name in used_outside(run, self.layer_list)})
            if outside:
                raise TheoryError(
                    f"NoiseScaleMonitor: parameter(s) {', '.join(outside)} are used outside their "
                    f"layer's own call (e.g. a table read as layer.weight[:t]), which per-example "
                    f"norms cannot see; call the layer instead, or use method='micro_batch' with "
                    f"at least 2 micro-batches per step")
            self.graph_checked = True
            self.stop_checking()
        calls = [None if run.problem else self._pass_calls(run) for run in runs]
        problems = [run.problem for run in runs if run.problem]
        if problems:
            raise TheoryError(f"NoiseScaleMonitor: no per-example gradient norms: {problems[0]};"
                              f" or use method='micro_batch' with at least 2 micro-batches per "
                              f"step")
        return [run.batch for run in runs], calls

    def _pass_calls(self, run: Pass) -> Calls | None:
        """The pass's (layer index, its calls' (input, output gradient) pairs) for the layers
        whose outputs got a gradient; None, with ``run.problem`` saying why, where there are
        none."""
        batch, grads = run.batch, run.grads
        by_layer: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for k, (index, x) in enumerate(run.calls):
            if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != batch:
                name, module = self.layer_list[index]
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

    def pass_terms(self, calls: Calls) -> Terms:
        """The pass's per-example squared norms over its layers (torch operators; call under
        ``no_grad``)."""
        terms, layers, terms_of = Terms(), self.layer_list, self.terms_of
        for index, pairs in calls:
            terms_of[index](terms, layers[index][1], pairs)
        return terms


def trained_layers(model: nn.Module) -> tuple[dict[str, nn.Module], list[str]]:
    """The modules of ``model`` that own trainable parameters, by name, and why per-example
    norms do not apply (empty when they do)."""
    layers: dict[str, nn.Module] = {}
    blockers: list[str] = []
    owners: dict[int, str] = {}
    for name, module in model.named_modules():
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
