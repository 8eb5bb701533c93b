"""Learning-rate schedules, evaluation schedules and per-trial metaparameters.

One definition serves both trainers: the plain reference loop calls these with Python scalars, the
vectorized trainer with tensors (one entry per trial), so the arithmetic is the same.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any
from .errors import SparsescaleError

if TYPE_CHECKING:
    import torch

OPTIMIZERS = ("sgd", "momentum", "nesterov")


class ConfigError(SparsescaleError):
    """A trial, schedule or optimizer setting is invalid; names the key and what is allowed."""


@dataclass(frozen=True)
class Trial:
    """One metaparameter point.

    ``lr``: base learning rate; ``momentum``: mu (ignored by ``sgd``); ``decay_steps``: if given,
    the learning rate decays linearly from ``lr`` to ``lr * end_factor`` over that many steps and
    stays there (Shallue et al. 2019's linear decay); otherwise it is constant.
    """

    lr: float
    momentum: float = 0.0
    decay_steps: int | None = None
    end_factor: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"trial lr must be a positive finite number, got {self.lr!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"trial momentum must be in [0, 1), got {self.momentum!r}")
        if self.decay_steps is not None and int(self.decay_steps) < 1:
            raise ConfigError(f"trial decay_steps must be >= 1, got {self.decay_steps!r}")
        if not 0.0 <= self.end_factor <= 1.0:
            raise ConfigError(f"trial end_factor must be in [0, 1], got {self.end_factor!r}")

    @classmethod
    def from_dict(cls, d: "Trial | dict[str, Any]") -> "Trial":
        """A Trial from a dict of its fields; unknown keys or a missing ``lr`` raise ConfigError."""
        if isinstance(d, Trial):
            return d
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


def lr_factor(step: int, decay_steps: int | float | torch.Tensor | None,
              end_factor: float | torch.Tensor) -> float | torch.Tensor:
    """Multiplier of the base lr at ``step`` (0-based, the update about to be taken):
    1 - (1 - end_factor) * min(step, decay_steps) / decay_steps, or 1 for a constant schedule
    (``decay_steps`` None / inf). Works on floats and on tensors (one entry per trial)."""
    if decay_steps is None:
        return 1.0
    if isinstance(decay_steps, (int, float)):
        return 1.0 - (1.0 - end_factor) * min(step, decay_steps) / decay_steps
    # min(step, d) <= d, so the ratio is at most 1 without a further clamp
    return 1.0 - (1.0 - end_factor) * decay_steps.clamp(max=step).div(decay_steps)


def check_optimizer(name: str, momenta: Iterable[float] = ()) -> str:
    """Validate an optimizer name; Nesterov needs momentum > 0 (as ``torch.optim.SGD``)."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")
    if name == "nesterov" and any(m == 0 for m in momenta):
        raise ConfigError("optimizer 'nesterov' needs momentum > 0 in every trial; "
                          "use optimizer 'sgd' for momentum 0")
    return name


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
