"""What the Lightning and the Hugging Face callbacks share (:mod:`theory.callbacks.lightning`,
:mod:`theory.callbacks.huggingface`): :class:`Run`, the monitor of one training run, the metrics
its readings log as, the examples the run has trained on and the policy it drives.

The frameworks differ only in where they call it: :meth:`Run.start` when training starts (the
model, its optimizer), :meth:`Run.read` after a step's last backward pass and before the
gradients are clipped or the optimizer steps, :meth:`Run.decide` after the optimizer's step (the
policy's setting is the next step's), :meth:`Run.close` when training ends.

**The policy** (``policy=``): an object with ``decide(signal, current) -> Setting``, a function
of the same two arguments (:mod:`theory.policies.interface`), or a name that
:func:`theory.policies.builtin.make_policy` knows (``"noise_ramp"``, ``"goodput"``, ...,
``"package.module:Name"``; built with ``policy_options``), asked every ``decide_every``
measured steps (not while the lr is 0, at a warmup's first step or a decay's end: there is
no lr to scale). The signal holds the reading's smoothed B_simple, |G|^2, tr(Sigma) and parts, the
optimizer steps and the examples trained on so far (counted by a forward pre-hook on the model:
the first tensor argument's first dimension, in forwards with gradients enabled). Its setting is
applied as follows:

- **learning rate**: every parameter group's lr and, where a scheduler is given, its
  ``base_lrs`` are multiplied by new lr / current lr (the current one being the first group's),
  so the groups keep their ratios and a schedule that recomputes the lr from ``base_lrs``
  (``LambdaLR``, the Hugging Face Trainer's default linear decay) keeps the change: the
  schedule's shape goes on, scaled;
- **batch size** (examples per optimizer step): the training ``DataLoader``'s batch sampler
  (``torch.utils.data.BatchSampler``, which a ``DataLoader`` built with ``batch_size=`` has) gets
  batch size / accumulated micro-batches, which must divide; its ``batch_size`` is read at every
  batch, so the change holds from the next batch drawn: the next step's under Lightning (a
  loader with a length; num_workers=0), the step after under the Hugging Face Trainer
  (accelerate's loader draws one batch ahead); each worker process of a ``num_workers > 0``
  loader draws ``prefetch_factor`` batches ahead more. A loader without such a sampler is
  refused by name when a policy changes the batch size.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader

from theory.errors import TheoryError, check_int
from theory.monitor.log import columns, scalars
from theory.monitor.monitor import NoiseReading, NoiseScaleMonitor
from training.registry import did_you_mean

# what the callbacks pass on to NoiseScaleMonitor (the model and the optimizer are theirs)
MONITOR_OPTIONS = tuple(name for name in inspect.signature(NoiseScaleMonitor).parameters
                        if name not in ("model", "optimizer"))


def require(modules: tuple[str, ...], extra: str, what: str) -> Any:
    """The first of ``modules`` that imports, or a :class:`TheoryError` naming the extra that
    installs it."""
    for module in modules:
        try:
            return importlib.import_module(module)
        except ImportError:
            continue
    raise TheoryError(f"{what} needs the {modules[0].split('.')[0]} package: "
                      f"pip install 'sparsescale[{extra}]'")


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The monitor's keyword arguments, an unknown one refused by name."""
    for name in options:
        if name not in MONITOR_OPTIONS:
            raise TheoryError(f"unknown monitor option {name!r}{did_you_mean(name, MONITOR_OPTIONS)}"
                              f"; allowed: {', '.join(MONITOR_OPTIONS)}")
    return dict(options)


def metrics(reading: NoiseReading, prefix: str) -> dict[str, float]:
    """The reading's numbers as metrics: ``<prefix><field>`` for the whole model,
    ``<prefix><field>[<part>]`` for its parts (the names of the monitor's TensorBoard tags with
    ``prefix="noise/"``, :mod:`theory.monitor.log`). A value that is not defined at this step
    (a per-step B_simple whose |G|^2 estimate is not positive, the preconditioned part before
    the optimizer's first step) is logged as it is, nan or inf, so that every step's metrics
    are that step's (a framework shows a metric not logged at a step with its last value)."""
    return {prefix + name: value for name, value in scalars(columns(reading)).items()}


class Examples:
    """The examples the model's forwards see with gradients enabled (a forward pre-hook)."""

    def __init__(self, model: nn.Module) -> None:
        self.count = 0
        self.handle = model.register_forward_pre_hook(self._see, with_kwargs=True)

    def _see(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if torch.is_grad_enabled():
            first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)
                          and a.dim() > 0), None)
            self.count += 0 if first is None else int(first.shape[0])

    def close(self) -> None:
        self.handle.remove()


def batch_sampler(loader: Any) -> BatchSampler | None:
    """The ``BatchSampler`` whose ``batch_size`` sets ``loader``'s batches, through wrappers that
    hold it as their own ``batch_sampler`` (accelerate's), or None."""
    found = loader.batch_sampler if isinstance(loader, DataLoader) else None
    while found is not None and hasattr(found, "batch_sampler"):
        found = found.batch_sampler
    return found if type(found) is BatchSampler else None


def scale_lr(optimizer: torch.optim.Optimizer, schedulers: list[Any], factor: float) -> None:
    """Every group's lr, and the schedulers' ``base_lrs``, times ``factor`` (module docstring)."""
    for group in optimizer.param_groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
    for scheduler in schedulers:
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]


class Run:
    """One training run's monitor and policy (module docstring). ``preconditioned``: also read
    the noise scale of the gradient preconditioned by the optimizer (an Adam or AdamW);
    ``prefix``: the metrics' names start with it; ``options``: :class:`theory.NoiseScaleMonitor`'s
    keyword arguments (``window``, ``ema``, ``every``, ``per_layer``, ``norm_layers``, ...)."""

    def __init__(self, *, preconditioned: bool, policy: Any, policy_options: Mapping[str, Any]
                 | None, decide_every: int, prefix: str, options: Mapping[str, Any]) -> None:
        self.options = check_options(options)
        self.preconditioned, self.prefix = bool(preconditioned), str(prefix)
        self.decide_every = check_int(decide_every, "decide_every")
        self.policy = None
        if policy is not None:
            from theory.policies.builtin import make_policy

            self.policy = make_policy(policy, policy_options)
        self.monitor: NoiseScaleMonitor | None = None
        self.examples: Examples | None = None
        self.reading: NoiseReading | None = None      # a fresh reading not yet decided on
        self.measured = self.counted = 0
        self.hint = ""        # what the framework's error adds where the model ran no forward

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.close()
        optimizer = getattr(optimizer, "optimizer", optimizer)   # accelerate's wrapper
        self.monitor = NoiseScaleMonitor(model, optimizer=optimizer if self.preconditioned
                                         else None, **self.options)
        self.examples = Examples(model)
        self.reading, self.measured, self.counted = None, 0, 0

    def read(self, loss_scale: float) -> dict[str, float]:
        """The step's metrics (empty between measured steps, ``every`` > 1)."""
        if self.monitor is None:
            raise TheoryError("the noise-scale callback read a step before training started")
        if self.examples.count == self.counted:
            raise TheoryError(f"the monitored model ({type(self.monitor.module).__name__}) ran no "
                              f"forward with gradients in this step{self.hint}")
        self.counted = self.examples.count
        before = self.monitor.calls
        reading = self.monitor.step(loss_scale)
        if reading is None or reading.step != before + 1:
            return {}
        self.measured += 1
        if self.policy is not None and self.measured % self.decide_every == 0:
            self.reading = reading
        return metrics(reading, self.prefix)

    def decide(self, step: int, optimizer: torch.optim.Optimizer, schedulers: list[Any],
               loader: Any, micro_batches: int) -> dict[str, float]:
        """Ask the policy about the last fresh reading, if one waits, and apply its setting
        (module docstring); the setting as metrics ``policy/batch_size`` and ``policy/lr``."""
        if self.reading is None:
            return {}
        from theory.policies.interface import Setting, Signal

        optimizer = getattr(optimizer, "optimizer", optimizer)
        reading, self.reading = self.reading, None
        lr = float(optimizer.param_groups[0]["lr"])
        if not lr > 0:        # a warmup's first step or a decay's end: no lr to scale
            return {}
        sampler = batch_sampler(loader)
        size = reading.batch_size if sampler is None else sampler.batch_size * micro_batches
        current = Setting(size, lr)
        new = self.policy.decide(Signal.of(reading, int(step), self.examples.count), current)
        if not isinstance(new, Setting):
            raise TheoryError(f"the policy returned {type(new).__name__}; it must return a Setting")
        if new.batch_size != current.batch_size:
            if sampler is None:
                raise TheoryError(f"the policy changed the batch size ({current.batch_size} -> "
                                  f"{new.batch_size}), which needs a training DataLoader built "
                                  f"with batch_size= (a torch.utils.data.BatchSampler); got "
                                  f"{type(loader).__name__}")
            per_pass, rest = divmod(new.batch_size, micro_batches)
            if rest:
                raise TheoryError(f"the policy's batch size {new.batch_size} is not a multiple of "
                                  f"the {micro_batches} accumulated micro-batches of a step")
            sampler.batch_size = per_pass
        if new.lr != current.lr:
            scale_lr(optimizer, schedulers, new.lr / current.lr)
        return {"policy/batch_size": float(new.batch_size), "policy/lr": new.lr}

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        if self.examples is not None:
            self.examples.close()
        self.monitor = self.examples = None
