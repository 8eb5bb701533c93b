"""The vectorized trainer under a batch-size schedule: N trials follow one piecewise-constant
:class:`training.schedules.batch_schedule.BatchSchedule` B(t) together (e.g. Merrill et al. 2025's
batch-size warmup, :func:`theory.estimators.branching.warmup_schedule`).

Segment j of the schedule (updates ``start_step`` to the next segment's) is one
:func:`training.train_trials` call at its batch size, from the state the previous segment ended in
(``start=``, ``return_state=True``), with every trial's lr multiplied by the segment's
``lr_scale`` (the trial's own schedule on top: update t uses lr * lr_factor(t) * lr_scale, as
:func:`training.reference.train_schedule_reference`). Trials keep their data seeds across
segments, and a state carries the data position, so trial i reads exactly the batches of
``train_schedule_reference(..., trial_index=first_index + i)``. Trials that diverge, or stop at
their hit under ``run.stop == "all"``, leave the later segments; ``run.stop == "first"`` ends the
run at the first evaluation where any trial meets the goal.

Evaluations: the run's schedule (``run.eval_schedule.steps(run.max_steps)``), as the reference
loop. A segment also evaluates at its own end (``train_trials`` always does); that row is dropped
from the curve and its train-loss window merged into the next row, unless the run ended there.
Steps-to-result are exact to the step (``train_trials``' replay within each segment).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from training.schedules.batch_schedule import BatchSchedule
from training.config import RunConfig, Trial, check_batch_size, check_index, check_trials
from training.data import Dataset
from training.delay import refuse
from training.models import check_output
from training.errors import ConfigError
from training.masks import check_mask
from training.schedules.order import trial_seed
from training.engine.loop import Outcome
from training.engine.resume import check_data_seeds
from training.state import TrainState
from training.trials import TrialsResult, _result, train_trials

Tensor = torch.Tensor


def train_schedule_trials(model: nn.Module, dataset: Dataset,
                          trials: Sequence[Trial | Mapping[str, Any]], run: RunConfig, *,
                          schedule: BatchSchedule | None = None,
                          masks: Mapping[str, Tensor] | None = None,
                          start: TrainState | None = None, first_index: int = 0,
                          data_seeds: Sequence[int] | None = None,
                          trials_per_stack: int | None = None) -> TrialsResult:
    """Train N trials together following ``schedule`` (None: ``run.batch_size`` throughout);
    see the module docstring. Arguments as :func:`training.train_trials`; the result's
    ``end_state`` holds the trials ``end_trials`` that ran to ``steps_run``.
    """
    check_output(model, dataset, "train_schedule_trials")
    trial_list = check_trials(trials)
    refuse(trial_list, "train_schedule_trials",
           "its segments hand a TrainState on, which holds no queue of past weights")
    n = len(trial_list)
    if schedule is None:
        schedule = BatchSchedule.constant(check_batch_size(run.batch_size, dataset.n_train))
    elif not isinstance(schedule, BatchSchedule):
        raise ConfigError(f"schedule must be a training.schedules.batch_schedule.BatchSchedule or None, "
                          f"got {type(schedule).__name__}")
    for segment in schedule.segments:
        check_batch_size(segment.batch_size, dataset.n_train)
    first = check_index(first_index, "first_index")
    seeds = check_data_seeds(data_seeds, n) or [trial_seed(run.seed, first + i) for i in range(n)]
    mask_map = check_mask(masks, model, trials=n)
    dims = {name: p.dim() for name, p in model.named_parameters()}
    evals = set(run.eval_schedule.steps(run.max_steps))

    rows: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
    windows: list[list[int]] = [[] for _ in range(n)]   # updates each raw row's train loss covers
    hit: list[int | None] = [None] * n
    diverged: list[int | None] = [None] * n
    taken = [0 if start is None else start.step] * n
    final: dict[int, list[Tensor]] = {}
    at_goal: set[int] = set()   # trials whose run ended at an evaluation meeting the goal
    state, active = start, list(range(n))
    step = 0 if start is None else start.step
    programs: list[str] = []   # the programs of the segments (by batch size, training.engine.strategy)
    for seg, end in _spans(schedule, step, run.max_steps):
        sub = [m if m.dim() == dims[k] else m[active] for k, m in mask_map.items()]
        result = train_trials(
            model, dataset, [replace(trial_list[i], lr=trial_list[i].lr * seg.lr_scale) for i in active],
            replace(run, batch_size=seg.batch_size, max_steps=end),
            masks=dict(zip(mask_map, sub)) or None, start=state,
            data_seeds=[seeds[i] for i in active], trials_per_stack=trials_per_stack,
            first_index=first, return_state=True)
        for j, i in enumerate(active):
            last = step
            for row in result.curves[j].rows():
                rows[i].append(row)
                windows[i].append(row[0] - last)
                last = row[0]
            hit[i] = result.hit_step[j] if hit[i] is None else hit[i]
            diverged[i], taken[i] = result.diverged_step[j], result.steps_taken[j]
            final[i] = [t[j].clone() for t in (*result.params.values(),
                                               *result.buffers.values())]
            if run.stop == "all" and result.hit_step[j] is not None:
                at_goal.add(i)
        programs.append(result.program)
        stopped = run.stop == "first" and result.steps_to_result is not None
        if stopped:
            at_goal.update(active[j] for j in result.end_trials)
        state, active = result.end_state, [active[j] for j in result.end_trials]
        step = result.steps_run
        if not active or stopped:
            break
    curves = [_merge(r, w, evals, i in at_goal) for i, (r, w) in enumerate(zip(rows, windows))]
    return _result(trial_list, Outcome(
        [name for name, _ in model.named_parameters()],
        [name for name, _ in model.named_buffers()], curves, hit, diverged, taken, final, step,
        ",".join(dict.fromkeys(programs)), end_state=state, end_trials=tuple(active)))


def _spans(schedule: BatchSchedule, step: int, max_steps: int) -> list[tuple[Any, int]]:
    """(segment, end step) of the segments left to run from ``step`` to ``max_steps``; a run with
    nothing left runs its current segment for no update (one evaluation, its state back)."""
    spans = []
    for seg, nxt in zip(schedule.segments, schedule.segments[1:] + (None,)):
        end = max_steps if nxt is None else min(nxt.start_step, max_steps)
        if end > max(seg.start_step, step):
            spans.append((seg, end))
    return spans or [(schedule.at(step), step)]


def _merge(rows: list[tuple[int, float, float]], windows: list[int], evals: set[int],
           at_goal: bool) -> list[tuple[int, float, float]]:
    """The rows at the run's evaluation steps: a segment-end row elsewhere is dropped and its
    train loss merged into the next row, weighted by the updates each covers (the last row is
    kept when the trial's run ended there at the goal)."""
    out: list[tuple[int, float, float]] = []
    carry_loss = carry_n = 0.0
    for k, (row, n) in enumerate(zip(rows, windows)):
        step, loss, metric = row
        if step not in evals and not (at_goal and k == len(rows) - 1):
            carry_loss, carry_n = carry_loss + loss * n, carry_n + n
            continue
        if carry_n:
            loss = (carry_loss + loss * n) / (carry_n + n)
            carry_loss = carry_n = 0.0
        out.append((step, loss, metric))
    return out
