"""The built-in batch-size policies, their registry, and a user's own policy by import path.

Each policy is a frozen dataclass with ``decide(signal, current) -> Setting``
(:mod:`theory.policies.interface`). Two kinds:

- **noise-driven** (``reads_noise = True``): :class:`Goodput` and :class:`NoiseRamp` read the
  monitor's B_simple and move only when the predicted gain exceeds ``min_gain`` (the
  minimum-gain rule, :func:`theory.policies.interface.hold_unless_gain`);
- **schedule-driven** (``reads_noise = False``): :class:`Fixed`, :class:`CBSWarmup` and
  :class:`Seesaw` follow a rule fixed before the run (no reading, no gain to predict).

Batch sizes are powers of two within [min_batch, max_batch] (the grid a sweep measures).

Names: :data:`POLICIES` (``fixed``, ``goodput``, ``noise_ramp``, ``cbs_warmup``, ``seesaw``), or
``"package.module:Name"`` for a class (built with the options given), a function of
(signal, current) or an object with ``decide`` (:func:`make_policy`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from training.registry import Registry, import_path

from theory.errors import TheoryError, check_int
from theory.estimators.branching import warmup_batch
from theory.policies.interface import (
    Policy, Setting, Signal, StepTime, as_policy, check_fraction, check_rule, hold_unless_gain,
    powers_of_two, rate, scale_lr,
)

POLICIES: Registry[type] = Registry("policy", TheoryError, sort=True,
                                    hint="an import path 'package.module:Name'")


@POLICIES.register("fixed")
@dataclass(frozen=True)
class Fixed:
    """One batch size and learning rate throughout: the setting the run starts with."""

    reads_noise: ClassVar[bool] = False

    def decide(self, signal: Signal, current: Setting) -> Setting:
        return current


@dataclass(frozen=True)
class _Bounded:
    """Shared fields and checks of the noise-driven policies: the batch-size grid, the lr rule,
    the minimum gain, which part's noise scale is read (None: the whole model's), and the time
    model t(B) (None: steps)."""

    min_batch: int = 1
    max_batch: int = 4096
    lr_rule: str = "adascale"
    min_gain: float = 0.05
    part: str | None = None
    step_time: StepTime | None = None

    reads_noise: ClassVar[bool] = True

    def __post_init__(self) -> None:
        powers_of_two(self.min_batch, self.max_batch)
        check_rule(self.lr_rule)
        check_fraction(self.min_gain, "min_gain")

    @property
    def grid(self) -> tuple[int, ...]:
        return powers_of_two(self.min_batch, self.max_batch)

    def _move(self, target: int, signal: Signal, current: Setting, noise: float) -> Setting:
        return hold_unless_gain(target, current, signal, rule=self.lr_rule,
                                min_gain=self.min_gain, step_time=self.step_time, noise=noise)


@POLICIES.register("goodput")
@dataclass(frozen=True)
class Goodput(_Bounded):
    """Pollux (Qiao et al. 2021, "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized
    Deep Learning", OSDI): B* = argmax over the grid of

        goodput(B) = throughput(B) x E(B) = B / t(B) x (B_simple + B0) / (B_simple + B),

    with t(B) the library's measured time model (``step_time``, e.g.
    :class:`theory.policies.interface.LinearTime` from a fitted cost model; without one every
    step costs the same and goodput rises with B up to ``max_batch``). For t = t0 + t1 B the
    continuous optimum is B* = sqrt(B_simple t0 / t1). lr rule: ``adascale`` (Pollux's);
    ``part="<preconditioned>"`` reads Adam's preconditioned noise scale, as AdaptDL does."""

    def best(self, b_simple: float) -> int:
        """The grid's argmax of goodput (the smallest B on ties); goodput is proportional to
        :func:`theory.policies.interface.rate` (B_simple + B0 is a constant factor)."""
        return max(self.grid, key=lambda b: (rate(b_simple, b, self.step_time), -b))

    def decide(self, signal: Signal, current: Setting) -> Setting:
        noise = signal.noise(self.part)
        if not math.isfinite(noise):
            return current
        return self._move(self.best(noise), signal, current, noise)


@POLICIES.register("noise_ramp")
@dataclass(frozen=True)
class NoiseRamp(_Bounded):
    """A batch-size ramp that follows the measured noise scale (Gray et al. 2024, "Normalization
    Layer Per-Example Gradients are Sufficient to Predict Gradient Noise Scale in
    Transformers"): B = the grid's power of two nearest (in log) to ``factor`` x B_simple,
    never below the current B (a ramp only grows). ``part="<norm layers>"`` reads the
    normalization layers' estimate, as the paper does. lr rule: ``sqrt`` by default (Adam-type
    training, as theirs; ``linear`` for SGD)."""

    factor: float = 1.0
    lr_rule: str = "sqrt"

    def __post_init__(self) -> None:
        super().__post_init__()
        if check_fraction(self.factor, "factor") == 0:
            raise TheoryError("factor must be > 0")

    def target(self, b_simple: float) -> int:
        want = math.log2(max(self.factor * b_simple, self.min_batch))
        return min(self.grid, key=lambda b: (abs(math.log2(b) - want), b))

    def decide(self, signal: Signal, current: Setting) -> Setting:
        noise = signal.noise(self.part)
        if not math.isfinite(noise) or noise <= 0:
            return current
        target = self.target(noise)
        if target <= current.batch_size:
            return current
        return self._move(target, signal, current, noise)


@POLICIES.register("cbs_warmup")
@dataclass(frozen=True)
class CBSWarmup:
    """Batch-size warmup from the critical batch measured by branching along training (Merrill
    et al. 2025, "Critical Batch Size Revisited"): once the run has seen ``examples[j]``
    examples, B = the largest power of two <= max(CBS_j, ``min_batch``), at most ``max_batch``
    (:func:`theory.estimators.branching.warmup_batch`, the rule of
    :func:`theory.estimators.branching.warmup_schedule`). lr rule: ``linear`` for SGD-type,
    ``sqrt`` for Adam-type optimizers (the branching's :func:`theory.estimators.branching.lr_scale`).
    Build it from a measurement with :meth:`of`."""

    examples: tuple[int, ...]
    critical_batch: tuple[float, ...]
    min_batch: int = 1
    max_batch: int | None = None
    lr_rule: str = "linear"

    reads_noise: ClassVar[bool] = False

    def __post_init__(self) -> None:
        e, c = tuple(int(x) for x in self.examples), tuple(float(x) for x in self.critical_batch)
        if not e or len(e) != len(c) or any(b <= a for a, b in zip(e, e[1:])) or e[0] < 0:
            raise TheoryError(f"examples must be increasing counts >= 0, one per critical batch; "
                              f"got {len(e)} examples for {len(c)} critical batches")
        if not all(math.isfinite(x) and x >= 0 for x in c):
            raise TheoryError(f"critical_batch must be finite numbers >= 0, got {c}")
        object.__setattr__(self, "examples", e)
        object.__setattr__(self, "critical_batch", c)
        check_int(self.min_batch, "min_batch")
        if self.max_batch is not None:
            check_int(self.max_batch, "max_batch")
        check_rule(self.lr_rule)

    @classmethod
    def of(cls, critical: Any, optimizer: str, **options: Any) -> "CBSWarmup":
        """From a :class:`theory.estimators.branching.CriticalBatch`, the lr rule by ``optimizer``."""
        rule = "sqrt" if optimizer in ("adam", "adamw") else "linear"
        return cls(tuple(int(x) for x in critical.examples),
                   tuple(float(x) for x in critical.critical_batch),
                   **{"min_batch": int(critical.base_batch), "lr_rule": rule, **options})

    def batch_at(self, examples: int) -> int:
        j = max(0, sum(1 for e in self.examples if e <= examples) - 1)
        return warmup_batch(self.critical_batch[j], self.min_batch, self.max_batch)

    def decide(self, signal: Signal, current: Setting) -> Setting:
        b = self.batch_at(signal.examples)
        if b == current.batch_size:
            return current
        return Setting(b, scale_lr(current.lr, current.batch_size, b, self.lr_rule))


@POLICIES.register("seesaw")
@dataclass(frozen=True)
class Seesaw:
    """Seesaw (Meterez et al. 2025, "Seesaw: Accelerating Training by Balancing Learning Rate
    and Batch Size Scheduling"): at each of the ``milestones`` (training examples) where a step
    decay would divide the lr by ``decay`` (2), multiply the lr by 1 / sqrt(decay) and the
    batch size by ``decay`` instead; once B x decay would pass ``max_batch``, the plain cut
    (lr / decay) is made. The lr rule is the method itself; train with a constant lr schedule
    otherwise (Seesaw replaces the decay). Reads ``signal.previous_examples`` to count the
    milestones passed since the last decision."""

    milestones: tuple[int, ...]
    decay: float = 2.0
    max_batch: int = 4096

    reads_noise: ClassVar[bool] = False

    def __post_init__(self) -> None:
        m = tuple(int(x) for x in self.milestones)
        if not m or any(b <= a for a, b in zip(m, m[1:])) or m[0] <= 0:
            raise TheoryError(f"milestones must be increasing example counts > 0, got {self.milestones!r}")
        object.__setattr__(self, "milestones", m)
        if check_fraction(self.decay, "decay") <= 1:
            raise TheoryError(f"decay must be > 1, got {self.decay!r}")
        check_int(self.max_batch, "max_batch")

    def decide(self, signal: Signal, current: Setting) -> Setting:
        cuts = sum(1 for m in self.milestones if signal.previous_examples < m <= signal.examples)
        b, lr = current.batch_size, current.lr
        for _ in range(cuts):
            if b * self.decay <= self.max_batch and float(b * self.decay).is_integer():
                b, lr = int(b * self.decay), lr / math.sqrt(self.decay)
            else:
                lr = lr / self.decay
        return current if cuts == 0 else Setting(b, lr)


def make_policy(name: str | Policy | Any, options: Mapping[str, Any] | None = None) -> Policy:
    """The policy ``name`` stands for: a registered name (:data:`POLICIES`) or an import path
    ``"package.module:Name"`` of a class (built with ``options``), a function of
    (signal, current) or an object with ``decide``; a policy class built with ``options``; a
    policy object or function as it is."""
    options = dict(options or {})
    if isinstance(name, type):   # a policy class: built with the options
        return as_policy(_build(name, name.__qualname__, options))
    if not isinstance(name, str):
        if options:
            raise TheoryError("options are given with a policy object: build it with them")
        return as_policy(name)
    obj = _imported(name) if ":" in name else POLICIES.get(name)
    if isinstance(obj, type):
        return as_policy(_build(obj, name, options))
    if options:
        raise TheoryError(f"policy {name!r} is not a class; it takes no options, got {sorted(options)}")
    return as_policy(obj)


def _build(cls: type, name: str, options: dict[str, Any]) -> Any:
    """``cls(**options)``, an unknown option named with the ones allowed."""
    if dataclasses.is_dataclass(cls):
        allowed = [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise TheoryError(f"policy {name!r}: unknown option(s) {unknown}; allowed: "
                              f"{', '.join(allowed) or 'none'}")
    try:
        return cls(**options)
    except TypeError as exc:
        raise TheoryError(f"policy {name!r}: {exc}") from None


def _imported(path: str) -> Any:
    """The object at ``path`` (``module:attribute``, the attribute may be dotted)."""
    return import_path(path, "policy", TheoryError)
