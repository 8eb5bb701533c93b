"""What a batch-size policy reads and returns, the learning-rate rules, the predicted gain and
the minimum-gain rule.

A **policy** is any object with ``decide(signal, current) -> Setting`` (or a plain function of
the same two arguments): it reads a :class:`Signal` (the noise monitor's reading where the run
is now, and how far the run has come) and the current :class:`Setting` (batch size B and
learning rate), and returns the next one. The built-ins are frozen dataclasses
(:mod:`theory.policies.builtin`); a trainer calls ``decide`` between segments of a run
(:func:`theory.policies.train.train_under_policy`) or a callback calls it every few steps.

The model behind the gains (McCandlish et al. 2018, eq. 2.7 and appendix D): with B_simple the
noise scale, a step at batch B makes 1 / (1 + B_simple / B) of the progress of a step with the
full-batch gradient, so the progress per second at B is

    rate(B) = 1 / ((1 + B_simple / B) t(B)),

t(B) the seconds per step (:class:`LinearTime`; without a time model t = 1: steps). Pollux's
goodput (Qiao et al. 2021) is the same quantity up to constants: throughput B / t(B) times
statistical efficiency E(B) = (B_simple + B0) / (B_simple + B).

The **minimum-gain rule** (:func:`hold_unless_gain`): a proposed change of B is taken only when
its predicted gain rate(B_new) / rate(B_old) - 1 exceeds ``min_gain`` (e.g. 0.05: 5 %);
otherwise the setting is kept. It keeps a policy from chasing the noise of the estimate.

The **learning-rate rules** (:func:`scale_lr`), from B_old to B_new:

- ``linear``: lr x B_new / B_old (Goyal et al. 2017; SGD with momentum);
- ``sqrt``: lr x sqrt(B_new / B_old) (Krizhevsky 2014; Malladi et al. 2022 for Adam);
- ``adascale``: lr x r(B_new) / r(B_old), the gain ratio r(B) = (1 + B_simple / B0) /
  (1 + B_simple / B) of AdaScale (Johnson et al. 2020), as Pollux uses it (B0 cancels): x
  B_new / B_old where the noise dominates (B_simple >> B), x 1 where there is none;
- ``none``: lr unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from theory.errors import TheoryError, check_int

LR_RULES = ("linear", "sqrt", "adascale", "none")


@dataclass(frozen=True)
class Signal:
    """What a policy reads at a decision: ``step`` updates and ``examples`` training examples
    done; ``b_simple`` (and ``g_sq``, ``trace_sigma``) the monitor's smoothed whole-model noise
    scale (nan: not measured, e.g. a policy that needs none); ``parts`` the parts' B_simple by
    name (``"<norm layers>"``, ``"<preconditioned>"``, a layer's name:
    :mod:`theory.monitor.parts`); ``previous_examples`` the examples done at the previous
    decision (0 at the first), for policies that act on what happened since."""

    step: int
    examples: int
    b_simple: float = math.nan
    g_sq: float = math.nan
    trace_sigma: float = math.nan
    parts: Mapping[str, float] = field(default_factory=dict)
    previous_examples: int = 0

    @classmethod
    def of(cls, reading: Any, step: int, examples: int, previous_examples: int = 0) -> "Signal":
        """The signal of a :class:`theory.NoiseReading` (its smoothed values and parts)."""
        return cls(step, examples, float(reading.b_simple), float(reading.g_sq),
                   float(reading.trace_sigma),
                   {p.name: float(p.b_simple) for p in getattr(reading, "parts", ())},
                   previous_examples)

    def noise(self, part: str | None = None) -> float:
        """B_simple of the whole model (``part`` None) or of one part; a part the reading does
        not hold is refused by name."""
        if part is None:
            return self.b_simple
        if part not in self.parts:
            raise TheoryError(f"the reading holds no part {part!r}; it holds: "
                              f"{', '.join(self.parts) or 'none (monitor without parts)'}")
        return self.parts[part]


@dataclass(frozen=True)
class Setting:
    """A run's batch size and learning rate from this decision on."""

    batch_size: int
    lr: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", check_int(self.batch_size, "batch_size"))
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise TheoryError(f"lr must be a positive finite number, got {self.lr!r}")
        object.__setattr__(self, "lr", float(self.lr))


@runtime_checkable
class Policy(Protocol):
    """A batch-size policy (module docstring)."""

    def decide(self, signal: Signal, current: Setting) -> Setting: ...


@dataclass(frozen=True)
class LinearTime:
    """Seconds per step t(B) = t_fixed + t_example B (one worker;
    :class:`training.distributed.costmodel.CostModel` with k = 1)."""

    t_fixed: float
    t_example: float

    def __post_init__(self) -> None:
        for name in ("t_fixed", "t_example"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise TheoryError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.t_fixed == self.t_example == 0:
            raise TheoryError("t_fixed and t_example are both 0: a step must take time")

    @classmethod
    def of(cls, cost: Any) -> "LinearTime":
        """From a fitted :class:`training.distributed.costmodel.CostModel` (its k = 1 terms)."""
        return cls(float(cost.t_fixed), float(cost.t_example))

    def __call__(self, batch_size: int) -> float:
        return self.t_fixed + self.t_example * batch_size


StepTime = Callable[[int], float]


def step_seconds(step_time: StepTime | None, batch_size: int) -> float:
    """t(B) of ``step_time``, 1 (a step) without one."""
    return 1.0 if step_time is None else float(step_time(batch_size))


def efficiency(b_simple: float, batch_size: int, base_batch: int = 1) -> float:
    """Pollux's statistical efficiency (B_simple + B0) / (B_simple + B): the progress per
    example at B relative to B0 (Qiao et al. 2021, eq. 4)."""
    b = max(b_simple, 0.0)
    return (b + base_batch) / (b + batch_size)


def rate(b_simple: float, batch_size: int, step_time: StepTime | None = None) -> float:
    """Progress per second (per step without a time model), 1 / ((1 + B_simple / B) t(B))
    (module docstring); B_simple nan or <= 0 counts as 0 (no noise: every B progresses alike)."""
    b = b_simple if b_simple > 0 else 0.0
    return 1.0 / ((1.0 + b / batch_size) * step_seconds(step_time, batch_size))


def predicted_gain(b_simple: float, old: int, new: int, step_time: StepTime | None = None) -> float:
    """rate(new) / rate(old) - 1: the predicted speed-up of moving from B = ``old`` to ``new``."""
    return rate(b_simple, new, step_time) / rate(b_simple, old, step_time) - 1.0


def scale_lr(lr: float, old: int, new: int, rule: str, b_simple: float = math.nan) -> float:
    """The learning rate at B = ``new`` from ``lr`` at ``old`` by ``rule`` (module docstring)."""
    if rule not in LR_RULES:
        raise TheoryError(f"lr rule {rule!r}; allowed: {', '.join(LR_RULES)}")
    ratio = new / old
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    if rule == "adascale":
        if not math.isfinite(b_simple):
            raise TheoryError("the adascale lr rule needs the measured noise scale; got "
                              f"B_simple = {b_simple!r}")
        b = max(b_simple, 0.0)   # a negative estimate: no measurable noise, r = 1
        return lr * (1.0 + b / old) / (1.0 + b / new)
    return lr


def hold_unless_gain(proposal: int, current: Setting, signal: Signal, *, rule: str,
                     min_gain: float, step_time: StepTime | None = None,
                     noise: float | None = None) -> Setting:
    """The minimum-gain rule (module docstring): move to B = ``proposal`` with the lr scaled by
    ``rule`` when the predicted gain exceeds ``min_gain``, else keep ``current``. ``noise``: the
    B_simple the gain and AdaScale use (default the signal's whole-model one)."""
    b = signal.b_simple if noise is None else noise
    if proposal == current.batch_size or predicted_gain(b, current.batch_size, proposal,
                                                        step_time) <= min_gain:
        return current
    return Setting(proposal, scale_lr(current.lr, current.batch_size, proposal, rule, b))


def check_rule(rule: str) -> str:
    if rule not in LR_RULES:
        raise TheoryError(f"lr_rule {rule!r}; allowed: {', '.join(LR_RULES)}")
    return rule


def check_fraction(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise TheoryError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """The powers of two in [low, high] (``low`` rounded up)."""
    check_int(low, "min_batch")
    check_int(high, "max_batch")
    if high < low:
        raise TheoryError(f"max_batch ({high}) must be >= min_batch ({low})")
    out, b = [], 1 << max(0, math.ceil(math.log2(low)))
    while b <= high:
        out.append(b)
        b *= 2
    if not out:
        raise TheoryError(f"no power of two in [{low}, {high}]")
    return tuple(out)


def as_policy(obj: Any) -> Policy:
    """``obj`` if it has ``decide``, a function of (signal, current) wrapped, else refused."""
    if isinstance(obj, Policy):
        return obj
    if callable(obj):
        return FunctionPolicy(obj)
    raise TheoryError(f"a policy needs a decide(signal, current) method or is a function of "
                      f"(signal, current); got {type(obj).__name__}")


@dataclass(frozen=True)
class FunctionPolicy:
    """A plain function ``fn(signal, current) -> Setting`` as a policy."""

    fn: Callable[[Signal, Setting], Setting]

    def decide(self, signal: Signal, current: Setting) -> Setting:
        out = self.fn(signal, current)
        if not isinstance(out, Setting):
            raise TheoryError(f"policy function {getattr(self.fn, '__qualname__', self.fn)!r} "
                              f"returned {type(out).__name__}; it must return a Setting")
        return out
