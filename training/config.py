"""One run-configuration shape for every trainer: a :class:`Trial` (metaparameters) and a
:class:`RunConfig` (everything else about the run).

The idea is OpenLTH's hyperparameter dataclasses (Frankle et al., the ``open_lth`` code of
Frankle & Carbin 2019), without their global registry: plain frozen values, validated when they
are made, passed explicitly::

    trial = training.Trial(lr=0.1, momentum=0.9)
    run = training.RunConfig(batch_size=64, max_steps=2000, goal=0.3)
    training.train_reference(net, ds, trial, run)
    training.train_trials(net, ds, [trial, training.Trial(lr=0.3, momentum=0.9)], run)
    training.train_distributed(net, ds, trial, run, world_size=2)

Every bad value raises :class:`training.ConfigError` naming the field, what was found and what
is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch

from training.delay import check_delay
from training.device import PRECISIONS, resolve_device
from training.errors import ConfigError
from training.goal import Goal

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")
# torch.optim.Adam / AdamW: the keys beta1, beta2, eps and weight_decay apply to these only
ADAM_OPTIMIZERS = ("adam", "adamw")
# the Trial fields of those optimizers (stored per trial, searched by studies)
ADAM_KEYS = ("beta1", "beta2", "eps", "weight_decay")
# What a run does once the goal is met (RunConfig.stop).
STOPS = ("first", "all", "never")


def is_int(value: Any) -> bool:
    """True for Python and numpy integers, not for bools."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Trial:
    """One metaparameter point.

    ``lr``: base learning rate; ``momentum``: mu (ignored by ``sgd``); ``decay_steps``: if given,
    the learning rate decays linearly from ``lr`` to ``lr * end_factor`` over that many steps and
    stays there (Shallue et al. 2019's linear decay); otherwise it is constant.
    ``beta1``, ``beta2``, ``eps``, ``weight_decay``: those of ``torch.optim.Adam`` / ``AdamW``
    (optimizers ``adam`` / ``adamw`` only; weight decay defaults to 0 for both, where torch's
    AdamW defaults to 0.01).
    ``delay``, ``delay_kind``, ``workers``: delayed gradients, the model of an asynchronous
    worker (:mod:`training.delay`): the update at step t applies the gradient computed at the
    weights of step t - delay; ``delay_kind`` ``"fixed"`` (that delay at every step),
    ``"uniform"`` (a delay drawn from {0, ..., delay} at every step, from the trial's seed) or
    ``"round_robin"`` (``workers`` W of equal speed: delay W - 1, set from ``workers``).
    Delay 0 (the default) is synchronous SGD; only ``training.train_trials`` trains a delay.
    """

    lr: float
    momentum: float = 0.0
    decay_steps: int | None = None
    end_factor: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    delay: int = 0
    delay_kind: str = "fixed"
    workers: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"trial lr must be a positive finite number, got {self.lr!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"trial momentum must be in [0, 1), got {self.momentum!r}")
        if self.decay_steps is not None and int(self.decay_steps) < 1:
            raise ConfigError(f"trial decay_steps must be >= 1, got {self.decay_steps!r}")
        if not 0.0 <= self.end_factor <= 1.0:
            raise ConfigError(f"trial end_factor must be in [0, 1], got {self.end_factor!r}")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"trial {key} must be in [0, 1), got {getattr(self, key)!r}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ConfigError(f"trial eps must be a positive finite number, got {self.eps!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"trial weight_decay must be a finite number >= 0, "
                              f"got {self.weight_decay!r}")
        # round_robin's delay follows from its workers: one value, however it was given
        object.__setattr__(self, "delay", check_delay(self.delay, self.delay_kind, self.workers))

    @classmethod
    def from_dict(cls, d: "Trial | Mapping[str, Any]") -> "Trial":
        """A Trial from a mapping of its fields; unknown keys or a missing ``lr`` raise
        ConfigError."""
        if isinstance(d, Trial):
            return d
        if not isinstance(d, Mapping):
            raise ConfigError(f"a trial must be a training.Trial or a mapping of its fields, "
                              f"got {type(d).__name__}")
        allowed = {f.name for f in fields(cls)}
        unknown = set(d) - allowed
        if unknown:
            raise ConfigError(f"unknown trial keys {sorted(unknown)}; allowed: {sorted(allowed)}")
        if "lr" not in d:
            raise ConfigError("trial needs 'lr'")
        return cls(**d)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def effective_lr(self) -> float:
        """lr / (1 - momentum), the effective learning rate of Shallue et al."""
        return self.lr / (1.0 - self.momentum)


def check_run(run: Any, trainer: str) -> RunConfig:
    """``run`` if it is a :class:`RunConfig`; else a ConfigError naming ``trainer``."""
    if not isinstance(run, RunConfig):
        raise ConfigError(f"{trainer}: run must be a training.RunConfig, got {type(run).__name__}")
    return run


def check_trials(trials: Sequence[Trial | Mapping[str, Any]]) -> list[Trial]:
    """``trials`` as a non-empty list of :class:`Trial` (mappings go through
    ``Trial.from_dict``)."""
    if isinstance(trials, (Mapping, Trial, str)) or not len(trials):
        raise ConfigError("trials must be a non-empty list of Trial or dicts "
                          "(keys: lr, momentum, decay_steps, end_factor, beta1, beta2, eps, "
                          "weight_decay, delay, delay_kind, workers)")
    return [Trial.from_dict(t) for t in trials]


def check_optimizer(name: str, momenta: Iterable[float] = (),
                    weight_decays: Iterable[float] = ()) -> str:
    """Validate an optimizer name; Nesterov needs momentum > 0 (as ``torch.optim.SGD``), and
    weight decay is only implemented for ``adam`` / ``adamw``."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")
    if name == "nesterov" and any(m == 0 for m in momenta):
        raise ConfigError("optimizer 'nesterov' needs momentum > 0 in every trial; "
                          "use optimizer 'sgd' for momentum 0")
    if name not in ADAM_OPTIMIZERS and any(w != 0 for w in weight_decays):
        raise ConfigError(f"trial weight_decay is used by optimizers {', '.join(ADAM_OPTIMIZERS)} "
                          f"only; found weight_decay > 0 with optimizer {name!r}")
    return name


def check_batch_size(batch_size: Any, n_train: int) -> int:
    """``batch_size`` as an int in [1, n_train] (a batch never repeats an example)."""
    if not is_int(batch_size) or not 1 <= batch_size <= n_train:
        raise ConfigError(f"batch_size must be an integer in [1, {n_train}] (training set size), "
                          f"got {batch_size!r}")
    return int(batch_size)


def check_index(value: Any, name: str) -> int:
    """A trial index (``trial_index``, ``first_index``) as an int >= 0."""
    if not is_int(value) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class EvalSchedule:
    """When the goal metric is evaluated (always at step 0 and at the last step).

    ``kind="interval"``: every ``every`` steps. ``kind="geometric"``: steps ``first * ratio**k``
    rounded up and distinct, never more than ``max_gap`` apart (when given).
    """

    kind: str = "interval"
    every: int = 100
    first: int = 1
    ratio: float = 1.25
    max_gap: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("interval", "geometric"):
            raise ConfigError(f"eval schedule kind {self.kind!r}; allowed: interval, geometric")
        if self.kind == "interval" and int(self.every) < 1:
            raise ConfigError(f"eval schedule every must be >= 1, got {self.every}")
        if self.kind == "geometric" and (self.ratio <= 1.0 or self.first < 1):
            raise ConfigError("geometric eval schedule needs first >= 1 and ratio > 1")

    def steps(self, max_steps: int) -> list[int]:
        """Sorted evaluation steps in [0, max_steps], including both ends."""
        if self.kind == "interval":
            out = list(range(0, max_steps + 1, int(self.every)))
        else:
            out, s = [0], float(self.first)
            while True:
                step = max(math.ceil(s), out[-1] + 1)
                if self.max_gap is not None:
                    step = min(step, out[-1] + int(self.max_gap))
                if step >= max_steps:
                    break
                out.append(step)
                s *= self.ratio
        if out[-1] != max_steps:
            out.append(max_steps)
        return out


@dataclass(frozen=True)
class RunConfig:
    """How a run trains, for every trainer (``train_reference``, ``train_trials``,
    ``train_distributed``); the metaparameters are the :class:`Trial`'s.

    - ``batch_size``: examples per update (at most the training set size, checked by the
      trainer against its data set);
    - ``optimizer``: ``sgd``, ``momentum`` (heavy ball) or ``nesterov``, as ``torch.optim.SGD``,
      or ``adam`` / ``adamw``, as ``torch.optim.Adam`` / ``AdamW`` (the Trial's beta1, beta2,
      eps and weight_decay);
    - ``max_steps``: the update budget;
    - ``goal``: a :class:`training.Goal`, a bare target (error for classification, loss for
      regression), or None (train the budget, evaluate the default metric);
    - ``eval_schedule``: when the goal metric is evaluated on the validation split;
    - ``stop``: what happens once the goal is met. ``"first"``: the run ends at the first
      evaluation where any trial meets it (a group of trials stops together; steps-to-result,
      Shallue et al. 2019). ``"all"``: each trial stops at its own first hit, the others go on
      (one trial: as ``"first"``). ``"never"``: every trial trains the whole budget and its first
      hit is recorded;
    - ``seed``: the data order (trial i of a group reads ``trial_seed(seed, i)``'s batches);
    - ``dtype``, ``device``: where and in which floating-point type the run computes
      (``"cpu"``, ``"cuda"``, ``"cuda:N"``; a CUDA device this machine lacks is a
      :class:`training.device.DeviceError`);
    - ``precision``: the arithmetic of forward passes and losses, ``"fp32"`` (default),
      ``"tf32"`` (CUDA matmuls and convolutions in TF32; the same as fp32 on the CPU) or
      ``"bf16"`` (bfloat16 autocast, float32 weights, gradients and optimizer state); see
      :mod:`training.device`. Other than fp32 it needs ``dtype`` float32.
    """

    batch_size: int
    optimizer: str = "momentum"
    max_steps: int = 1000
    goal: Goal | float | None = None
    eval_schedule: EvalSchedule = EvalSchedule()
    stop: str = "first"
    seed: int = 0
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if not is_int(self.batch_size) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        check_optimizer(self.optimizer)
        if not is_int(self.max_steps) or self.max_steps < 0:
            raise ConfigError(f"max_steps must be an integer >= 0, got {self.max_steps!r}")
        if self.goal is not None and not isinstance(self.goal, Goal) and not (
                isinstance(self.goal, (int, float, np.floating)) and not isinstance(self.goal, bool)
                and math.isfinite(self.goal)):
            raise ConfigError(f"goal must be a training.Goal, a finite target or None, "
                              f"got {self.goal!r}")
        if not isinstance(self.eval_schedule, EvalSchedule):
            raise ConfigError(f"eval_schedule must be a training.EvalSchedule, "
                              f"got {type(self.eval_schedule).__name__}")
        if self.stop not in STOPS:
            raise ConfigError(f"stop {self.stop!r}; allowed: {', '.join(STOPS)}")
        if not is_int(self.seed) or self.seed < 0:
            raise ConfigError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not (isinstance(self.dtype, torch.dtype) and self.dtype.is_floating_point):
            raise ConfigError(f"dtype must be a floating-point torch dtype, got {self.dtype!r}")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ConfigError(f"device {self.device!r} is not a torch device; allowed: cpu, "
                              f"cuda, cuda:N, ...") from None
        if torch.device(self.device).type == "cuda":
            resolve_device(self.device)   # one line when this machine has no such GPU
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r}; allowed: {', '.join(PRECISIONS)}")
        if self.precision != "fp32" and self.dtype != torch.float32:
            raise ConfigError(f"precision {self.precision!r} needs dtype torch.float32 (float32 "
                              f"master weights), got {self.dtype}; use precision 'fp32' with "
                              f"{self.dtype}")
        # numpy integers (from a plan or a data frame) become ints: one value, one type
        for name in ("batch_size", "max_steps", "seed"):
            object.__setattr__(self, name, int(getattr(self, name)))
