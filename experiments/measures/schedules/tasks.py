"""The ``schedules`` shoot-out of a study: every policy of ``[schedules]`` against the best fixed
batch size of the same study's sweep, over ``replicates`` data orders.

For each (sparsity, seed) with a stored sweep:

1. **The time model.** t(B) = t_fixed + t_example B fitted (:func:`training.distributed.costmodel.fit`,
   one worker) to the sweep's own seconds per trial-step (each done group's wall time over its
   trial-steps): the modelled wall time of a run is the sum over its segments of steps x t(B).
2. **The best fixed B**: the sweep's batch size with the least modelled time to the goal,
   S(B) t(B) (S(B): the group's steps-to-result); its best trial is run again over the
   replicates' data orders, so that it has an interval as the policies do.
3. **The policies** start from the best trial at ``[schedules] batch_size`` (its metaparameters,
   its initialization and mask, its budget) and run under
   :func:`theory.policies.train_under_policy`, deciding every ``every`` updates, each replicate
   a data order of its own (:func:`experiments.run.branching.branch_data_seeds`; replicate 0 is
   the stored run's). The best fixed B uses the same data seeds.

Rows go to the store's ``policy_runs`` table (:mod:`experiments.measures.schedules.store`); a
rerun skips what is stored. Runs in the driver process, with the probes' torch threads, after
the other measurements (:class:`experiments.measures.schedules.Schedules`: last in the
registry, so the branching rows it reads are written).
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

import numpy as np
import pandas as pd

import training
from theory.errors import TheoryError
from theory.policies import LinearTime, PolicyTrial, make_policy, train_under_policy
from training.distributed.costmodel import CostModelError, Measurements, StepTime, fit
from training.schedules.order import trial_seed

from experiments.measures.probes.tasks import PROBE_THREADS
from experiments.measures.schedules import store as R
from experiments.run.branching import branch_data_seeds
from experiments.run.executors import torch_threads
from experiments.run.workload import Workload, base_group, best_trial, on_device, stored_trial
from experiments.spec.tables.schedules import Schedules
from experiments.spec.study import Spec
from experiments.store.database import Store

BEST_FIXED = "best fixed"
ADAM_TYPE = ("adam", "adamw")


def time_model(groups: pd.DataFrame) -> LinearTime | None:
    """t(B) fitted to the done groups' seconds per trial-step (module docstring); None when the
    store holds no timed group."""
    g = groups[(groups.status == "done") & (groups.trial_steps > 0) & groups.wall_time.notna()]
    if g.empty:
        return None
    per = (g.wall_time / g.trial_steps).groupby(g.batch_size).median()
    try:
        cost = fit(Measurements(tuple(StepTime(1, int(b), float(s)) for b, s in per.items()), (), 1))
    except CostModelError:
        return None
    return LinearTime.of(cost) if cost.t_fixed or cost.t_example else None


def best_fixed(groups: pd.DataFrame, sparsity: float, seed: int, step_time: LinearTime | None
               ) -> pd.Series | None:
    """The synchronous done group of (sparsity, seed) with the least modelled time to the goal."""
    g = groups[(groups.sparsity == sparsity) & (groups.seed == seed) & (groups.status == "done")
               & groups.steps_to_result.notna() & (groups.delay == 0)]
    if g.empty:
        return None
    t = [int(s) * (1.0 if step_time is None else step_time(int(b)))
         for s, b in zip(g.steps_to_result, g.batch_size)]
    return g.iloc[int(np.argmin(t))]


def policy_defaults(name: str, optimizer: str, start: int, top: int, horizon_examples: int,
                    step_time: LinearTime | None, critical: pd.DataFrame) -> dict[str, Any] | None:
    """The options a built-in policy gets from the sweep (the table's docstring); None when it
    cannot run here (CBS warmup without branching rows)."""
    rule = "sqrt" if optimizer in ADAM_TYPE else "linear"
    if name == "goodput":
        return {"min_batch": start, "max_batch": top, "step_time": step_time}
    if name == "noise_ramp":
        return {"min_batch": start, "max_batch": top, "step_time": step_time, "lr_rule": rule}
    if name == "seesaw":
        return {"milestones": (horizon_examples // 4, horizon_examples // 2), "max_batch": top}
    if name == "cbs_warmup":
        if critical.empty:
            return None
        c = critical.sort_values("examples")
        return {"examples": tuple(int(e) for e in c.examples),
                "critical_batch": tuple(float(v) for v in c.critical_batch),
                "min_batch": start, "max_batch": top, "lr_rule": rule}
    return {}


def _rows(sparsity: float, seed: int, name: str, trials: list[PolicyTrial], start: int,
          max_steps: int, step_time: LinearTime | None, seconds: float) -> list[R.PolicyRunRow]:
    t0, t1 = (step_time.t_fixed, step_time.t_example) if step_time else (math.nan, math.nan)
    return [R.PolicyRunRow(
        float(sparsity), int(seed), name, r, int(start), pt.hit_step, pt.examples_to_result,
        None if pt.hit_step is None else pt.seconds(step_time), int(max_steps),
        json.dumps([[s.start_step, s.batch_size, s.lr_scale] for s in pt.schedule.segments]),
        json.dumps([[d.step, d.examples, None if math.isnan(d.b_simple) else d.b_simple,
                     d.batch_size, d.lr_scale] for d in pt.decisions]),
        int(pt.measured_examples), t0, t1, seconds / len(trials)) for r, pt in enumerate(trials)]


def shootout(spec: Spec, settings: Schedules, store: Store, dataset: training.Dataset,
             sparsity: float, seed: int, mask: Any) -> list[R.PolicyRunRow]:
    """The rows of one (sparsity, seed) (module docstring); empty, with a note on stderr, when
    the sweep has no base run there."""
    groups = store.frame("groups")
    base = base_group(groups, sparsity, seed, settings.batch_size)
    step_time = time_model(groups)
    fixed = best_fixed(groups, sparsity, seed, step_time)
    if base is None or fixed is None:
        print(f"schedules: sparsity {sparsity:g}, seed {seed} left out: no batch size of the "
              f"sweep reached the goal", file=sys.stderr)
        return []
    workload = Workload.of(spec)
    branching = store.frame("branching")
    critical = branching[(branching.sparsity == sparsity) & (branching.seed == seed)]
    out: list[R.PolicyRunRow] = []
    runs = [(BEST_FIXED, fixed, "fixed", {})] + [
        (name, base, name, settings.options.get(name, {})) for name in settings.policies]
    for label, group, name, options in runs:
        row = best_trial(store, group.key)
        index, b = int(row.trial), int(group.batch_size)
        dataset_d, model = on_device(workload, spec.device, dataset, workload.init_seed(seed, index))
        top = min(settings.max_batch or max(spec.batch_sizes), dataset_d.n_train)
        defaults = (policy_defaults(name, spec.optimizer, b, top, int(group.steps_to_result) * b,
                                    step_time, critical) if ":" not in name else {})
        if defaults is None:
            print(f"schedules: {name} left out at sparsity {sparsity:g}, seed {seed}: it needs the "
                  f"study's [branching] rows", file=sys.stderr)
            continue
        policy = make_policy(name, {**defaults, **options})
        run = training.RunConfig(b, spec.optimizer, max_steps=int(group.max_steps), seed=seed,
                                 goal=training.Goal(spec.metric, spec.target, spec.strict),
                                 eval_schedule=spec.eval, stop="all", device=spec.device,
                                 precision=spec.precision)
        seeds = branch_data_seeds(trial_seed(seed, index), settings.replicates)
        every = settings.every or (spec.eval.every if spec.eval.kind == "interval" else
                                   max(1, int(base.steps_to_result) // 10))
        start = time.perf_counter()
        trials = train_under_policy(model, dataset_d, [stored_trial(row)] * settings.replicates,
                                    run, policy, every=every, data_seeds=seeds, first_index=index,
                                    masks=workload.trial_mask(mask, index),
                                    measure_steps=settings.measure_steps)
        out += _rows(sparsity, seed, label, trials, b, run.max_steps, step_time,
                     time.perf_counter() - start)
    return out


def run_schedules(spec: Spec, dataset: training.Dataset, store: Store, quiet: bool = False,
                  settings: Schedules | None = None, redo: bool = False) -> None:
    """The shoot-out of every (sparsity, seed) not yet stored (all with ``redo``), in this
    process; each (sparsity, seed)'s rows in one transaction."""
    settings = settings or spec.schedules
    done = set() if redo else R.done(store)
    todo = [(float(s), int(seed)) for s in spec.sparsities for seed in spec.seeds
            if (float(s), int(seed)) not in done]
    if not todo:
        return
    masks = Workload.of(spec).masks(dataset, todo)
    with torch_threads(PROBE_THREADS):
        for s, seed in todo:
            try:
                rows = shootout(spec, settings, store, dataset, s, seed, masks[(s, seed)])
            except TheoryError as exc:
                raise TheoryError(f"[schedules] at sparsity {s:g}, seed {seed}: {exc}") from None
            if rows:
                R.write(store, s, seed, rows)
            if not quiet:
                print(f"schedules: sparsity {s:g}, seed {seed}: {len(rows)} runs", file=sys.stderr)
