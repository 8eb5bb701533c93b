"""The stored runs a measurement of the user's own most often follows: the best trial of every
group that reached the goal, replayed from its own initialization, mask, metaparameters and data
order (``theory.replay_states``: bit for bit the states of the loop that trained it).

Usage, in a :meth:`experiments.measurement.Measurement.start`::

    for run in best_runs(ctx):
        for step, state in run.states([0, run.horizon]).items():
            ...   # state: parameter and buffer name -> tensor after ``step`` updates
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

import theory
import training

from experiments.measurement import RunContext
from experiments.run.workload import Mask, Workload, best_trial, on_device, stored_trial


@dataclass(frozen=True)
class BestRun:
    """The best trial ``trial`` of the group (``sparsity``, ``seed``, ``batch_size``), which
    reached the goal at step ``horizon``; :meth:`states` replays it."""

    sparsity: float
    seed: int
    batch_size: int
    trial: int
    horizon: int
    row: pd.Series
    mask: Mask | None
    ctx: RunContext

    def states(self, steps: Sequence[int]) -> dict[int, Mapping[str, torch.Tensor]]:
        """The network's parameters and buffers after each of ``steps`` updates (one replay)."""
        spec = self.ctx.spec
        workload = Workload.of(spec)
        dataset, model = on_device(workload, spec.device, self.ctx.dataset,
                                   workload.init_seed(self.seed, self.trial))
        run = training.RunConfig(self.batch_size, spec.optimizer, seed=self.seed,
                                 device=spec.device, precision=spec.precision)
        return theory.replay_states(model, dataset, stored_trial(self.row), run,
                                    sorted(set(steps)), self.mask, self.trial)


def best_runs(ctx: RunContext) -> list[BestRun]:
    """The best run of every synchronous group of the store that reached the goal, by
    (sparsity, seed, batch size)."""
    groups = ctx.store.frame("groups")
    done = groups[(groups.status == "done") & groups.steps_to_result.notna()
                  & (groups.delay == 0)]
    workload = Workload.of(ctx.spec)
    masks: dict[Any, Mask | None] = workload.masks(
        ctx.dataset, sorted({(float(s), int(seed)) for s, seed in zip(done.sparsity, done.seed)}))
    out = []
    for g in done.itertuples():
        row = best_trial(ctx.store, g.key)
        trial = int(row.trial)
        out.append(BestRun(float(g.sparsity), int(g.seed), int(g.batch_size), trial,
                           int(g.steps_to_result), row,
                           workload.trial_mask(masks[(float(g.sparsity), int(g.seed))], trial),
                           ctx))
    return out
