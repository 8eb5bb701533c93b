"""Learning-rate schedules.

One definition serves every trainer: the plain reference loop calls :func:`lr_factor` with Python
scalars, the vectorized trainer with tensors (one entry per trial), so the arithmetic is the same.
The run configuration (trials, evaluation schedules, optimizers) lives in :mod:`training.config`;
its names stay importable from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import ADAM_OPTIMIZERS, OPTIMIZERS, EvalSchedule, Trial, check_optimizer
from .errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["lr_factor", "ADAM_OPTIMIZERS", "OPTIMIZERS", "ConfigError", "EvalSchedule", "Trial",
           "check_optimizer"]


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
