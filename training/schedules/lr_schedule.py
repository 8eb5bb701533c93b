"""The learning-rate schedule: linear decay from the trial's lr to ``end_factor`` times it over
``decay_steps`` updates, then constant (the evaluation schedule is
:class:`training.config.EvalSchedule`, the batch-size schedule :mod:`training.schedules.batch_schedule`).

One definition serves every trainer: the plain reference loop calls :func:`lr_factor` with Python
scalars, the vectorized trainer with tensors (one entry per trial), so the arithmetic is the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

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
