"""Branching in a study: CBS(t) and the warmup for every sparsity level and seed of a stored sweep.

For each (sparsity, seed), the base run is the best trial of the group at the ``[branching]
batch_size`` (``"smallest"``: the smallest batch size whose group reached the goal), replayed
from its own initialization, mask, metaparameters and data order (trial index and group seed)
up to the group's steps-to-result H; :func:`experiments.branching.branch_critical_batch`
measures CBS(t) at the table's checkpoints, and :func:`experiments.branching.warmup_comparison`
the warmup against fixed batch sizes. ``k_max`` is lowered to the largest power of two whose
k_max B fits in the training set when a larger base batch needs it (the stored rows record the
k_max used). Rows go to the store's ``branching`` and ``warmup`` tables, one transaction per
(sparsity, seed); a rerun skips what is stored.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace

import pandas as pd
from tqdm.auto import tqdm

import training
from theory.branching import branch_factors, critical_batch

from .branching import branch_critical_batch, warmup_comparison
from .executors import torch_threads
from .probes import PROBE_THREADS, best_trial, stored_trial
from .schema import BranchRow, WarmupRow
from .spec import Spec
from .spec_branching import Branching
from .store import Store
from .workload import Mask, Workload


def base_group(groups: pd.DataFrame, sparsity: float, seed: int, batch_size: str | int) -> pd.Series | None:
    """The group the base run comes from: at ``batch_size`` (or the smallest that reached the
    goal, ``"smallest"``), among the done groups of (sparsity, seed) that reached it; None if
    there is none."""
    g = groups[(groups.sparsity == sparsity) & (groups.seed == seed) & (groups.status == "done")
               & groups.steps_to_result.notna()]
    g = g if batch_size == "smallest" else g[g.batch_size == batch_size]
    return None if g.empty else g.sort_values("batch_size").iloc[0]


def branch_level(spec: Spec, dataset: training.Dataset, store: Store, sparsity: float, seed: int,
                 mask: Mask | None, settings: Branching) -> tuple[list[BranchRow], list[WarmupRow]]:
    """The branching and warmup rows of one (sparsity, seed); none when no base run exists."""
    group = base_group(store.frame("groups"), sparsity, seed, settings.batch_size)
    if group is None:
        return [], []
    if group.steps_to_result < settings.checkpoints - 1:
        print(f"branching: sparsity {sparsity:g}, seed {seed} left out: its base run reaches the goal in "
              f"{group.steps_to_result} steps, too few for {settings.checkpoints} distinct checkpoints",
              file=sys.stderr)
        return [], []
    row = best_trial(store, group.key)
    trial, index, b = stored_trial(row), int(row.trial), int(group.batch_size)
    model = Workload.of(spec).build_model(dataset, seed)
    run = training.RunConfig(b, spec.optimizer, max_steps=int(group.max_steps), seed=seed,
                             goal=training.Goal(spec.metric, spec.target, spec.strict),
                             eval_schedule=spec.eval)
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


def run_branching(spec: Spec, dataset: training.Dataset, store: Store, settings: Branching | None = None,
                  quiet: bool = False, redo: bool = False) -> None:
    """Measure every (sparsity, seed) not yet in the store (all with ``redo``) with ``settings``
    (default the spec's ``[branching]`` table), with ``PROBE_THREADS`` torch threads. A level
    whose base run is too short for the checkpoints is reported on stderr and left out; bad
    settings raise ``theory.BranchingError`` before anything runs."""
    settings = settings or spec.branching
    branch_factors(settings.k_max)
    critical_batch([0], [1.0], [[[[1.0] * settings.seeds]]], base_batch=1, ks=[1], eps=settings.eps,
                   level=settings.level)   # seeds, eps and level as the measurement takes them
    done = set() if redo else store.branched()
    todo = [(s, seed) for s in spec.sparsities for seed in spec.seeds if (float(s), int(seed)) not in done]
    if not todo:
        return
    # outside the thread change: the same masks, bit for bit, as the runner gave the groups
    masks = Workload.of(spec).masks(dataset, todo)
    with torch_threads(PROBE_THREADS):
        for sparsity, seed in tqdm(todo, disable=quiet, desc="branching", unit="run"):
            rows, warm = branch_level(spec, dataset, store, sparsity, seed, masks[(sparsity, seed)], settings)
            if rows:
                store.write_branching(sparsity, seed, rows, warm)


def with_overrides(settings: Branching, **values) -> Branching:
    """``settings`` with the given (not None) values, enabled."""
    return replace(settings, enabled=True, **{k: v for k, v in values.items() if v is not None})
