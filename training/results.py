"""Result types shared by the trainers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from training.state import TrainState


@dataclass(frozen=True)
class Curve:
    """Training curve at evaluation steps: ``train_loss`` is the mean mini-batch loss of the
    updates since the previous evaluation (at step 0: the first mini-batch's loss at the initial
    weights); ``metric`` is the goal metric on the validation split after ``step`` updates."""

    step: np.ndarray
    train_loss: np.ndarray
    metric: np.ndarray

    def __len__(self) -> int:
        return len(self.step)

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[int, float, float]]) -> "Curve":
        """The curve of ``(step, train_loss, metric)`` rows (empty arrays for no rows)."""
        return cls(np.array([r[0] for r in rows], dtype=int), np.array([r[1] for r in rows]),
                   np.array([r[2] for r in rows]))

    def rows(self) -> list[tuple[int, float, float]]:
        """The curve as ``(step, train_loss, metric)`` rows (inverse of :meth:`from_rows`)."""
        return [(int(s), float(l), float(m)) for s, l, m in zip(self.step, self.train_loss, self.metric)]


@dataclass(frozen=True)
class ReferenceResult:
    """Outcome of :func:`training.train_reference`.

    ``steps_to_result``: first evaluation step at which the goal was met (None if never);
    ``diverged`` / ``diverged_step``: the run ended on a non-finite or exploding loss;
    ``steps_run``: updates taken; ``state``: final parameters by name; ``buffers``: the module's
    final buffers by name (BatchNorm's running statistics; empty for a module without).
    """

    steps_to_result: int | None
    diverged: bool
    diverged_step: int | None
    steps_run: int
    curve: Curve
    state: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class ScheduleResult:
    """Outcome of :func:`training.reference.train_schedule_reference`.

    ``result``: as :func:`training.train_reference`'s (steps count from the run's beginning, not
    from the start state); ``state``: where the run stopped, to resume or branch from;
    ``examples``: training examples consumed by this call; ``snapshots``: the parameters and
    module buffers (by name) after each update count the call's ``snapshots`` asked for.
    """

    result: ReferenceResult
    state: TrainState
    examples: int
    snapshots: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
