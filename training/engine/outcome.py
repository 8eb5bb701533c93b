"""What the step loop (:mod:`training.engine.loop`) leaves of one call of
:func:`training.train_trials`: every trial's curve, hit, divergence and final weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training.engine.strategy import Strategy
from training.state import TrainState

Tensor = torch.Tensor
# Curve rows of one trial: (step, mean training loss since the last evaluation, goal metric).
Rows = list[tuple[int, float, float]]


@dataclass(frozen=True)
class Outcome:
    """What the loop leaves of one call, per trial i: its curve ``rows[i]``, the exact step it
    first met the goal ``hit[i]`` (or None), the update it diverged at ``diverged[i]`` (or None),
    the updates it took ``taken[i]``, and its final parameters ``names``, then module buffers
    ``buffer_names`` (where the program kept them), ``final[i]``; ``steps_run``, the steps the
    group ran; the cell's ``strategy``; with ``return_state``, the state after ``steps_run``
    updates of the trials ``end_trials``."""

    names: list[str]
    buffer_names: list[str]
    rows: list[Rows]
    hit: list[int | None]
    diverged: list[int | None]
    taken: list[int]
    final: dict[int, list[Tensor]]
    steps_run: int
    strategy: Strategy
    end_state: TrainState | None = None
    end_trials: tuple[int, ...] = ()
