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

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")
# torch.optim.Adam / AdamW: the keys beta1, beta2, eps and weight_decay apply to these only
ADAM_OPTIMIZERS = ("adam", "adamw")


class ConfigError(SparsescaleError):
    """A trial, schedule or optimizer setting is invalid; names the key and what is allowed."""


@dataclass(frozen=True)
class Trial:
    """One metaparameter point.

    ``lr``: base learning rate; ``momentum``: mu (ignored by ``sgd``); ``decay_steps``: if given,
    the learning rate decays linearly from ``lr`` to ``lr * end_factor`` over that many steps and
    stays there (Shallue et al. 2019's linear decay); otherwise it is constant.
    ``beta1``, ``beta2``, ``eps``, ``weight_decay``: those of ``torch.optim.Adam`` / ``AdamW``
    (optimizers ``adam`` / ``adamw`` only; weight decay defaults to 0 for both, where torch's
    AdamW defaults to 0.01).
    """

    lr: float
    momentum: float = 0.0
    decay_steps: int | None = None
    end_factor: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

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
