"""Branching in a study: CBS(t) and the warmup for every sparsity level and seed of a stored sweep.

For each (sparsity, seed), the base run is the best trial of the group at the ``[branching]
batch_size`` (``"smallest"``: the smallest batch size whose group reached the goal), replayed
from its own initialization, mask, metaparameters and data order (trial index and group seed)
up to the group's steps-to-result H; :func:`experiments.run.branching.branch_critical_batch`
measures CBS(t) at the table's checkpoints, and :func:`experiments.run.branching.warmup_comparison`
the warmup against fixed batch sizes. ``k_max`` is lowered to the largest power of two whose
k_max B fits in the training set when a larger base batch needs it (the stored rows record the
k_max used). Rows go to the store's ``branching`` and ``warmup`` tables, one transaction per
(sparsity, seed); a rerun skips what is stored.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace

import pandas as pd
import torch
from tqdm.auto import tqdm

import training
from theory.estimators.branching import branch_factors, critical_batch

from experiments.measures.branching.store import BranchRow, WarmupRow, branched, write_branching
from experiments.run.branching import branch_critical_batch, warmup_comparison
from experiments.run.executors import torch_threads
from experiments.measures.probes.tasks import PROBE_THREADS
from experiments.spec.study import Spec
from experiments.spec.tables.branching import Branching
from experiments.store.database import Store
from experiments.run.workload import (
    Mask, Workload, base_group, best_trial, on_device, stored_trial,
)


@dataclass(frozen=True)
class BranchTask:
    """One level's branching measurement, everything a worker process needs: the spec, its
    workload, the (sparsity, seed), the level's mask, the settings, the base group's and its
    best trial's stored rows, and the programs the store recorded per batch size (the base run
    trains as its group did; any other batch size takes the rules' program:
    :func:`training.trials.given_programs`)."""

    spec: Spec
    workload: Workload
    sparsity: float
    seed: int
    mask: Mask | None
    settings: Branching
    group: pd.Series
    trial: pd.Series
    programs: Mapping[int, str] = field(default_factory=dict)


def branch_task(spec: Spec, store: Store, sparsity: float, seed: int, mask: Mask | None,
                settings: Branching) -> BranchTask | None:
    """The task of one (sparsity, seed); None (and why, on stderr) when it has no base run."""
    group = base_group(store.frame("groups"), sparsity, seed, settings.batch_size)
    if group is None:
        return None
    if group.steps_to_result < settings.checkpoints - 1:
        print(f"branching: sparsity {sparsity:g}, seed {seed} left out: its base run reaches the goal in "
              f"{group.steps_to_result} steps, too few for {settings.checkpoints} distinct checkpoints",
              file=sys.stderr)
        return None
    trial = best_trial(store, group.key)
    workload = Workload.of(spec)
    return BranchTask(spec, workload, sparsity, seed, workload.trial_mask(mask, int(trial.trial)),
                      settings, group, trial, store.programs())


def run_branch_task(task: BranchTask, dataset: training.Dataset | None = None
                    ) -> tuple[list[BranchRow], list[WarmupRow]]:
    """The branching and warmup rows of one (sparsity, seed) (worker side, or in the driver with
    its ``dataset``), with ``PROBE_THREADS`` torch threads; each branching row carries the
    measurement's wall time (``seconds``, as the probes' rows do: the study's timing sums it)."""
    with torch_threads(PROBE_THREADS), training.trials.given_programs(task.programs):
        # the trial's own initialization with [pruning] mask_per_trial, else the seed's
        seed = task.workload.init_seed(task.seed, int(task.trial.trial))
        dataset, model = on_device(task.workload, task.spec.device, dataset, seed)
        start = time.perf_counter()
        rows, warm = branch_level(task, dataset, model)
        seconds = time.perf_counter() - start
        return [replace(r, seconds=seconds) for r in rows], warm


def branch_level(task: BranchTask, dataset: training.Dataset, model: torch.nn.Module
                 ) -> tuple[list[BranchRow], list[WarmupRow]]:
    """The branching and warmup rows of one (sparsity, seed), of ``model`` (the seed's
    initialization) on ``dataset``, both on the study's device."""
    spec, settings, group, sparsity, seed = task.spec, task.settings, task.group, task.sparsity, task.seed
    trial, index, b = stored_trial(task.trial), int(task.trial.trial), int(group.batch_size)
    mask = task.mask
    run = training.RunConfig(b, spec.optimizer, max_steps=int(group.max_steps), seed=seed,
                             goal=training.Goal(spec.metric, spec.target, spec.strict),
                             eval_schedule=spec.eval, device=spec.device,
                             precision=spec.precision)
    k_max = min(settings.k_max, 1 << int(math.log2(dataset.n_train // b)))
    res = branch_critical_batch(
        model, dataset, trial, run, mask=mask, trial_index=index, goal_step=int(group.steps_to_result),
        checkpoints=settings.checkpoints, k_max=k_max, window=settings.window,
        window_fraction=settings.window_fraction, eps=settings.eps, seeds=settings.seeds,
        multipliers=settings.multipliers, level=settings.level)
    c = res.critical
    rows = [BranchRow(sparsity, seed, int(t), float(v), float(lo), float(hi), int(t) * b, b, res.goal_step,
                      res.window, k_max, c.n_seeds, c.eps, res.trial_steps)
            for t, v, lo, hi in zip(c.steps, c.critical_batch, c.low, c.high)]
    if not settings.warmup:
        return rows, []
    warm = warmup_comparison(model, dataset, trial, run, c, mask=mask, trial_index=index,
                             replicates=settings.warmup_replicates, examples=settings.warmup_examples)
    schedule = json.dumps([[s.start_step, s.batch_size, s.lr_scale] for s in warm.schedule.segments])
    return rows, [WarmupRow(sparsity, seed, r.kind, int(r.batch_size), int(r.replicate),
                            None if math.isnan(r.steps_to_result) else int(r.steps_to_result),
                            None if math.isnan(r.examples_to_result) else int(r.examples_to_result),
                            int(r.max_steps), warm.examples, schedule, warm.trial_steps)
                  for r in warm.runs.itertuples(index=False)]


def start_branching(spec: Spec, dataset: training.Dataset, store: Store, settings: Branching | None = None,
                    redo: bool = False, executor: Executor | None = None) -> Callable[[bool], None]:
    """Submit the measurement of every (sparsity, seed) not yet in the store (all with ``redo``)
    to ``executor`` (one level per task, the sparsest first: it takes the most steps) and return
    the function that waits for them and writes them (its argument: ``quiet``); without an
    executor that function measures in this process. Bad settings raise
    ``theory.BranchingError`` here, before anything runs."""
    settings = settings or spec.branching
    branch_factors(settings.k_max)
    critical_batch([0], [1.0], [[[[1.0] * settings.seeds]]], base_batch=1, ks=[1], eps=settings.eps,
                   level=settings.level)   # seeds, eps and level as the measurement takes them
    done = set() if redo else branched(store)
    todo = [(s, seed) for s in sorted(spec.sparsities, reverse=True) for seed in spec.seeds
            if (float(s), int(seed)) not in done]
    if not todo:
        return lambda quiet: None
    # the same masks, bit for bit, as the runner gave the groups
    masks = Workload.of(spec).masks(dataset, todo)
    tasks = [t for t in (branch_task(spec, store, s, seed, masks[(s, seed)], settings)
                         for s, seed in todo) if t is not None]
    submitted = [executor.submit(run_branch_task, t) for t in tasks] if executor is not None else []

    def finish(quiet: bool) -> None:
        results = ((f.result() for f in submitted) if executor is not None
                   else (run_branch_task(t, dataset) for t in tasks))
        for task, (rows, warm) in tqdm(zip(tasks, results), total=len(tasks), disable=quiet,
                                       desc="branching", unit="run"):
            if rows:
                write_branching(store, task.sparsity, task.seed, rows, warm)

    return finish


def run_branching(spec: Spec, dataset: training.Dataset, store: Store, settings: Branching | None = None,
                  quiet: bool = False, redo: bool = False, executor: Executor | None = None) -> None:
    """Measure every (sparsity, seed) not yet in the store (all with ``redo``) with ``settings``
    (default the spec's ``[branching]`` table), in ``executor``'s workers or in this process,
    with ``PROBE_THREADS`` torch threads; a level's rows do not depend on where it ran. A level
    whose base run is too short for the checkpoints is reported on stderr and left out; bad
    settings raise ``theory.BranchingError`` before anything runs."""
    start_branching(spec, dataset, store, settings, redo, executor)(quiet)


def with_overrides(settings: Branching, **values) -> Branching:
    """``settings`` with the given (not None) values, enabled."""
    return replace(settings, enabled=True, **{k: v for k, v in values.items() if v is not None})
