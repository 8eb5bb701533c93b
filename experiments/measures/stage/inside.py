"""Lee et al. (2021)'s L at their stage taken inside the run, from the trainer's own weights.

With ``[probes] lipschitz_in_run = true`` (:mod:`experiments.spec.tables.probes`) a group at a
probed batch size (:func:`inside_batch_sizes`) trains with a :class:`training.Watch` at Lee's
steps t = k N >= ``lipschitz_start`` (:func:`theory.stage_steps` up to the budget): at each,
for every trial still training, the local Lipschitz constant of the update into t,

    L_t = max_gamma |grad f(w_{t-1} + gamma d) - grad f(w_{t-1})| / |gamma d|,  d = w_t - w_{t-1},

gamma in 0.1 .. 0.9, gradients over kept weights on the fixed sample of ``lipschitz_examples``
training examples (seed :data:`LIPSCHITZ_SAMPLE_SEED`, the same sample
for every run, level and point), in float32: the same call of :func:`theory.local_lipschitz`
as the replay path (``theory.probe_trajectory(lipschitz_update="into")``), on the same weights,
so the same numbers without a second pass of training (their equality in float64 is tested).
Lee et al.'s ``edps/train.py`` logs L the same way, inside each run.

Every trial that did not diverge is measured (the trainer does not know which will reach the
goal first), up to its run's end (:func:`run_end`): its goal step, else its last evaluation (the
budget under ``stop = "all"``). The points a trial trained past its goal (up to the evaluation
that saw it) are dropped. ``lipschitz_check`` (with a sample: every level) adds L on the whole
split at the first point of trial 0 of each level's first group (first seed, smallest probed
batch size). The rows go to ``stage_probes`` with the group (the stage measurement's
:meth:`~experiments.measurement.Measurement.watch`: :class:`InsidePlan` made on the driver,
:class:`InsideL` in the worker, its rows in ``GroupRecord.measured``), their ``seconds`` the
measuring time of that trial; the noise at Lee's stage is not measured here (it is the replay
path's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import astuple, dataclass, field
from typing import Any

import torch

import theory
import training

from experiments.measures.stage.store import STAGE_PROBES, StageRow
from experiments.spec.study import Spec

# L's measurement precision: the replay path's (theory.probe_trajectory's default dtype)
LIPSCHITZ_DTYPE = torch.float32
# L's fixed sample at Lee's stage: the same examples for every run, level and point, inside the
# run or by replay (experiments.measures.probes.tasks)
LIPSCHITZ_SAMPLE_SEED = 0
FULL = "local_lipschitz_full"


def inside_batch_sizes(spec: Spec) -> tuple[int, ...]:
    """The batch sizes whose groups measure L in the run: ``[probes] batch_sizes``' explicit
    sizes, ``"smallest"`` and ``"largest"`` of the study's (the spec refuses ``"b_crit"``, known
    only from the trained sweep)."""
    p = spec.probes
    if not (p.enabled and p.lipschitz_every and p.lipschitz_in_run):
        return ()
    rule = {"smallest": min(spec.batch_sizes), "largest": max(spec.batch_sizes)}
    return tuple(sorted({rule.get(b, b) for b in p.batch_sizes if b in rule or
                         isinstance(b, int)}))


@dataclass(frozen=True)
class InsidePlan:
    """What one group measures inside its run (picklable, made on the driver): Lee's
    ``steps`` up to the group's budget, L's sample size ``examples`` (None: the split), and
    ``check``: L on the whole split too at the first step, for trial 0."""

    steps: tuple[int, ...]
    examples: int | None
    check: bool
    seed: int = 0
    dtype: torch.dtype = LIPSCHITZ_DTYPE

    def watcher(self, model: torch.nn.Module, dataset: training.Dataset,
                mask_of: Callable[[int], Mapping[str, torch.Tensor] | None]) -> "InsideL":
        """The worker's watcher of the group (:meth:`experiments.measurement.Measurement.watch`)."""
        return InsideL(self, model, dataset, mask_of)


def inside_plan(spec: Spec, sparsity: float, batch_size: int, seed: int, max_steps: int,
                delay: int = 0) -> InsidePlan | None:
    """The :class:`InsidePlan` of a group, None where it measures nothing in its run."""
    sizes = inside_batch_sizes(spec)
    if delay or batch_size not in sizes:
        return None
    p = spec.probes
    steps = theory.stage_steps(max_steps, p.lipschitz_every, p.lipschitz_start)
    if not steps:
        return None
    check = (sparsity in p.lipschitz_check and seed == spec.seeds[0]
             and batch_size == sizes[0])
    return InsidePlan(steps, p.lipschitz_examples, check, LIPSCHITZ_SAMPLE_SEED)


@dataclass
class InsideL:
    """The watch's callback for one group: L of every trial at each planned step, kept by
    (trial, step); ``model`` the network (its buffers where the weights carry none),
    ``mask_of(trial)`` that trial's mask."""

    plan: InsidePlan
    model: torch.nn.Module
    dataset: training.Dataset
    mask_of: Callable[[int], Mapping[str, torch.Tensor] | None]
    values: dict[tuple[int, int, str], float] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)

    def watch(self, first_index: int = 0) -> training.Watch:
        """The watch of one ``train_trials`` call whose trial k is trial ``first_index + k``."""
        return training.Watch(self.plan.steps,
                              lambda t, ids, before, after: self(t, [first_index + i for i in ids],
                                                                 before, after))

    def __call__(self, t: int, ids: list[int], before: Mapping[str, torch.Tensor],
                 after: Mapping[str, torch.Tensor]) -> None:
        for r, trial in enumerate(ids):
            start = time.perf_counter()
            w_prev = {k: v[r] for k, v in before.items()}
            w_next = {k: v[r] for k, v in after.items()}
            sizes = [("local_lipschitz", self.plan.examples)]
            if self.plan.check and trial == 0 and t == self.plan.steps[0]:
                sizes.append((FULL, None))
            for quantity, examples in sizes:
                self.values[(trial, t, quantity)] = theory.local_lipschitz(
                    self.model, self.dataset, w_prev, w_next, mask=self.mask_of(trial),
                    examples=examples, seed=self.plan.seed, dtype=self.plan.dtype).value
            self.seconds[trial] = self.seconds.get(trial, 0.0) + time.perf_counter() - start

    def rows(self, sparsity: float, seed: int, batch_size: int, ends: Mapping[int, int]
             ) -> tuple[StageRow, ...]:
        """The rows of the trials ``ends`` (trial -> its run's end, :func:`run_end`), the points
        at or before each end."""
        return tuple(
            StageRow(float(sparsity), int(seed), int(batch_size), trial, t, ends[trial],
                        quantity, value, self.plan.examples if quantity != FULL else None,
                        self.seconds.get(trial))
            for (trial, t, quantity), value in sorted(self.values.items())
            if trial in ends and t <= ends[trial])

    def taken(self, group: Any, outcome: Any) -> dict[str, list[tuple]]:
        """The ``stage_probes`` rows of ``group`` (its plan: sparsity, seed, batch size) once
        trained (``outcome``: each trial's status, goal step and curve): :meth:`rows` of the
        trials that did not diverge, up to their runs' ends (:func:`run_end`)."""
        ends = {i: e for i, status in enumerate(outcome.status)
                if (e := run_end(status, outcome.hit_step[i], outcome.curves[i])) is not None}
        return {STAGE_PROBES.name: [astuple(r) for r in self.rows(
            group.sparsity, group.seed, group.batch_size, ends)]}


def run_end(status: str, hit_step: int | None, curve: training.Curve) -> int | None:
    """Where a trained trial's run ended, as the replay path reads it from the store
    (:func:`experiments.measures.probes.tasks.run_end`): its goal step when it reached the goal, else its
    last evaluation; None for a diverged trial (not measured)."""
    if status == "diverged":
        return None
    if status == "reached":
        return int(hit_step)
    return int(curve.step[-1]) if len(curve) else None
