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
:mod:`theory.estimators.sampling`). Two such averages u_small (coefficient c_small) and u_big (c_big) with
c_small > c_big give the unbiased pair

    tr(Sigma) ~ (u_small - u_big) / (c_small - c_big),    |G|^2 ~ u_big - c_big tr(Sigma),

which is McCandlish et al.'s two-batch estimator (their appendix A.1, :func:`theory.estimators.noise.
two_batch_estimates` for b_small, b_big) and, with single examples as the small batches, the
sample-covariance estimator (:func:`theory.estimators.sampling.to_split`). The three ways to get them, in
order of preference (``method="auto"`` picks the first that applies):

1. ``per_example``: squared norms of every example's gradient from the backward pass the loop
   already does (:mod:`theory.monitor.layer_norms`: Linear on any number of leading dimensions, Conv1d,
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
   all-reduce of a 2-element tensor per step (:mod:`theory.monitor.ddp`).

The loop's loss must be the *mean* over the batch's examples (``reduction="mean"``) times a
constant ``loss_scale`` passed to ``step()``: 1 for a plain mean, 1/k for a loss divided over k
accumulated micro-batches, the batch size for ``reduction="sum"``, the gradient scaler's scale
under mixed precision. The scale cannot be read from gradients; B_simple does not depend on it,
|G|^2 and tr(Sigma) scale with its square. What is measured is the loss the loop differentiates,
in the mode the model is in (dropout included).

What the hooks capture, and what a measured step costs: :mod:`theory.monitor.capture`; the
readings and their smoothing: :mod:`theory.monitor.readings`; the noise scales per layer, of the
normalization layers and of Adam's preconditioned gradient (``per_layer``, ``norm_layers``,
``optimizer``): :mod:`theory.monitor.parts`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from theory.errors import TheoryError, check_int
from theory.monitor import kernel
from theory.monitor.capture import (
    Backward, Calls, Capture, dense, host, host_vector, norms,
)
from theory.monitor.ddp import LocalNormHook, batch_term
from theory.monitor.log import ReadingLog
from theory.monitor.parts import Parts
from theory.monitor.readings import NoiseReading, PartReading, Smoother, solve_two_sizes
from theory.estimators.sampling import noise_scale

METHODS = ("auto", "per_example", "micro_batch", "ddp")
DEFAULT_EMA = 0.99


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
    ``per_layer`` / ``norm_layers`` / ``optimizer`` (an ``Adam`` or ``AdamW``): also read the
    noise scale of each layer, of the normalization layers together, of the gradients
    preconditioned by the optimizer's second moment, into ``NoiseReading.parts``
    (:mod:`theory.monitor.parts`; not under DDP).

    Use: ``loss.backward()`` (one or more times), then ``reading = monitor.step()``, then the
    optimizer step. ``close()`` (or ``with``) removes the hooks and closes the logs.
    """

    def __init__(self, model: nn.Module, *, window: int | None = None, ema: float | None = None,
                 population: int | None = None, method: str = "auto", every: int = 1,
                 csv: str | os.PathLike | None = None, log_dir: str | os.PathLike | None = None,
                 comm_hook: Callable | None = None, comm_state: Any = None,
                 per_layer: bool = False, norm_layers: bool = False,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
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
        self.smoother = Smoother(window, ema)
        self.parts: Parts | None = None
        if per_layer or norm_layers or optimizer is not None:
            if self.ddp:
                raise TheoryError("per_layer, norm_layers and optimizer are not available under "
                                  "DistributedDataParallel")
            self.parts = Parts(self.module, self.params, per_layer, norm_layers, optimizer,
                               window, ema)
        self._part_readings: tuple[PartReading, ...] = ()
        self.calls = 0
        self.last: NoiseReading | None = None
        self.rank = 0
        self._active = True
        self._closed = False
        self.capture = Capture(self.module, self.params, method, self.ddp)
        if self.parts is not None and self.capture.per_pass_norms:
            # the parts read each micro-batch's gradients (before the hooks are attached)
            self.capture.part_hook = self.parts.on_backward
        self.layers, self.blockers = self.capture.layers, self.capture.blockers
        # the kernel (theory.monitor.kernel), loaded at the first per-example step;
        # False: not loaded yet
        self._kernel: Any = False
        if self.ddp:
            import torch.distributed as dist

            self.method = "ddp"
            self._ddp_hook = LocalNormHook(model, comm_hook, comm_state,
                                           lambda: batch_term(self.capture.forwards))
            self.rank, self.world = dist.get_rank(), self._ddp_hook.world
            self.capture.attach_ddp()
            model.register_comm_hook(None, self._ddp_hook.hook)
        else:
            self.capture.attach()
        # the estimators read the accumulated .grad at step(), which must start at zero: checked
        # until the first step, just before each parameter's gradient is accumulated
        self.capture.check_fresh_grads()
        self.log = ReadingLog(csv, log_dir) if self.rank == 0 else ReadingLog(None, None)

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

    def _example_sums(self, calls: list[Calls]) -> tuple[list[float], float]:
        """Per pass, the sum over its examples of their squared gradient norms, and the squared
        norm of .grad: by the kernel in one call where it is available and the gradients are
        on the CPU (:mod:`theory.monitor.kernel`), else by torch operators, all norms of the
        step in one ``_foreach_norm`` read in one transfer: [the passes' extras' sums..., the
        squares' norms..., the .grad norms...]."""
        grads = dense(self.capture.grads())
        on_cpu = all(g.is_cpu for g in grads)
        if on_cpu and self._kernel is False:       # (built or loaded once, only for the CPU)
            self._kernel = kernel.load()
        if on_cpu and self._kernel is not None:
            layers, jobs_of = self.capture.layer_list, self.capture.jobs_of
            jobs = [(j, *jobs_of[index](layers[index][1], pairs))
                    for j, run in enumerate(calls) for index, pairs in run]
            values = kernel.sums(self._kernel, len(calls), jobs, grads)
            return values[:-1], values[-1]
        with torch.no_grad():
            terms = [self.capture.pass_terms(run) for run in calls]
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

    def _per_example(self, sizes: list[int | None], calls: list[Calls], scale: float
                     ) -> tuple[float, float, int]:
        """Examples i of pass j (b_j of them, squared norms summed to S_j) were seen as
        (scale / b_j) g_i; the mean gradient v = .grad / (scale k) weighs the k passes' means
        1/k each."""
        batch, k = self._sizes(sizes), len(sizes)
        sums, grad_sq = self._example_sums(calls)
        u_small = sum(b * b * v for b, v in zip(sizes, sums)) / (scale * scale * batch)
        u_big = grad_sq / (scale * k) ** 2
        c_small, c_big = self._coef(1.0), self._coef(sum(1.0 / (k * k * b) for b in sizes))
        g, t = solve_two_sizes(u_small, c_small, u_big, c_big)
        if self.parts is not None:
            parts = self.parts
            examples, pre = parts.example_sums(self.capture, calls)
            small = [math.fsum(b * b * v[o] for b, v in zip(sizes, examples))
                     / (scale * scale * batch) for o in range(len(parts.owners))]
            pre_small = None if pre is None else \
                math.fsum(b * b * v for b, v in zip(sizes, pre)) / (scale * scale * batch)
            self._read_parts(small, c_small, c_big, scale, k, pre_small)
        return g, t, batch

    def _read_parts(self, small: list[float], c_small: float, c_big: float, scale: float,
                    k: int, pre_small: float | None = None) -> None:
        """The parts' readings from the owners' small averages: their big ones from ``.grad``;
        the preconditioned small average ``pre_small`` from the per-example terms, or from the
        micro-batches' backward passes where it is None (:mod:`theory.monitor.parts`)."""
        parts = self.parts
        big = [v / (scale * k) ** 2 for v in parts.owner_sums(parts.grad_squares())]
        pre = None
        if parts.passes and parts.scale() is not None:
            u_big = float(parts.grad_squares(scaled=True).sum()) / (scale * k) ** 2
            if pre_small is None:
                pre_small = math.fsum(float(b.parts[1].sum()) for b in self.capture.backwards
                                      ) / (k * scale * scale)
            pre = (pre_small, c_small, u_big, c_big)
        self._part_readings = parts.read(small, c_small, big, c_big, pre)

    def _micro_batch(self, passes: list[Backward], scale: float) -> tuple[float, float, int]:
        sizes = [b.batch for b in passes]
        batch, k = self._sizes(sizes), len(passes)
        values, grad_sq = host([b.grad_sq for b in passes], norms(self.capture.grads()))
        u_small = sum(values) / (k * scale * scale)
        c_small = sum(self._coef(1.0 / b) for b in sizes) / k
        u_big = grad_sq / (scale * k) ** 2
        c_big = self._coef(sum(1.0 / (k * k * b) for b in sizes))
        g, t = solve_two_sizes(u_small, c_small, u_big, c_big)
        if self.parts is not None:
            per_pass = [self.parts.owner_sums(b.parts[0]) for b in passes]
            small = [math.fsum(v[o] for v in per_pass) / (k * scale * scale)
                     for o in range(len(self.parts.owners))]
            self._read_parts(small, c_small, c_big, scale, k)
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
        sizes = self.capture.forwards
        self._sizes(sizes)
        k = len(sizes)
        (local_sq, x_sum), grad_sq = host_vector(sums, norms(self.capture.grads()))
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
            self.capture.attach() if active else self.capture.detach()
        self._active = active
        if self.ddp:
            self._ddp_hook.active = active
        return reading

    def _reset(self) -> None:
        """Forget the step's passes (the fresh-gradient check ends with the first step)."""
        self.capture.reset()
        if self.parts is not None:
            self.parts.reset()
        if self.ddp:
            self._ddp_hook.reset()

    def _measure(self, scale: float) -> NoiseReading:
        try:
            if self.ddp:
                method = "ddp"
                g, t, batch = self._ddp(scale)
            elif self.capture.per_pass_norms:
                method = "micro_batch"
                g, t, batch = self._micro_batch(self.capture.micro_batches(), scale)
            else:
                method = "per_example"
                g, t, batch = self._per_example(*self.capture.per_example_calls(), scale)
        finally:
            self._reset()
        g_s, t_s, b_s, g_se, t_se, b_se = self.smoother.add(g, t)
        reading = NoiseReading(step=self.calls + 1, method=method, batch_size=batch,
                               b_simple=b_s, g_sq=g_s, trace_sigma=t_s, b_simple_se=b_se,
                               g_sq_se=g_se, trace_sigma_se=t_se, step_b_simple=noise_scale(t, g),
                               step_g_sq=g, step_trace_sigma=t, smoothing=self.smoother.label,
                               steps=self.smoother.steps, parts=self._part_readings)
        self.log.write(reading)
        self.last = reading
        return reading

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the hooks (a DDP communication hook stays: DDP cannot unregister it) and close
        the logs."""
        self.capture.detach()
        self.capture.reset()
        self._closed = True
        self.log.close()

    def __enter__(self) -> NoiseScaleMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
