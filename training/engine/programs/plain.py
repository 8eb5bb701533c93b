"""The ``plain`` program: the plain loop's way of computing a step, as a candidate of the measured
choice (:mod:`training.engine.choice`).

One trial after another on all of torch's threads, inputs as given (NCHW), the whole mini-batch
at once: what ``training.train_reference`` does for its one model. It is always a candidate for
a cell no rule covers, so the measured choice is never slower than the plain loop's own way
(with the update in one pass of the compiled kernel, or torch's, as the ``per_trial`` program's).
"""

from __future__ import annotations

import torch
from torch import nn

from training.engine.programs.base import Cell
from training.engine.programs.per_trial import PerTrialProgram


class PlainProgram(PerTrialProgram):
    """:class:`~training.engine.programs.per_trial.PerTrialProgram` run as the plain loop runs
    its model: no channels-last layout, no trials spread over threads."""

    def __init__(self, model: nn.Module, task: str, examples_per_chunk: int,
                 eval_chunk: int | None = None, loss=None, random: bool | None = None,
                 precision: str = "fp32", device: str | torch.device = "cpu"):
        super().__init__(model, task, examples_per_chunk, eval_chunk, loss, random, precision,
                         layout="nchw", spread=False, device=device)


def build(cell: Cell, examples_per_chunk: int, eval_chunk: int) -> PlainProgram:
    """The registry's builder (:mod:`training.engine.programs.registry`): the whole mini-batch in
    one piece, whatever ``examples_per_chunk`` says."""
    return PlainProgram(cell.model, cell.task, cell.batch_size, eval_chunk, cell.loss,
                        cell.random, cell.precision, cell.device)
