"""Theory probes of a study: noise and smoothness along the run, per level, seed and batch size.

For every sparsity level and seed, at the batch sizes ``[probes] batch_sizes`` picks from those
that reached the goal (``theory.probe_batch_sizes``; default the smallest, the one nearest the
level's fitted B_crit, the largest), the group's best trial is replayed once to its
steps-to-result H (``theory.probe_trajectory``: same metaparameters, Adam's included, data order,
schedule and mask) and
measured at ``points`` evenly spaced steps of [0, H] (``theory.probe_steps``): |G|^2, tr(Sigma)
and B_simple averaged over ``average`` consecutive steps, B_noise and G^T H G, lambda_max, Lee
et al. (2021)'s local Lipschitz constant of the run's own update, and the training loss.

Rows go to the store's ``probes`` table (:mod:`experiments.measures.probes.store`: columns
``sparsity, seed, batch_size, step, fraction, quantity, value`` and ``seconds``, the wall time
of that run's replay and measurements), one transaction per sparsity level; a rerun skips levels already probed. The runs are independent
tasks: a study probes them in its worker pool, one run per task.

At Lee et al.'s stage (``[probes] lipschitz_every = N``, :mod:`experiments.spec.tables.probes`) the
same replay also measures, at steps N, 2N, ... up to the run's own goal step
(``theory.stage_steps``), L of the update into that step as Lee's ``edps/train.py`` logs it
(on ``lipschitz_examples`` fixed examples, or the split: the same sample for L along [0, H]),
and the noise and loss at the same weights; and it does so for ``lipschitz_trials`` runs of
each probed group: the reached trials with the fewest steps, then, unless the study stops a
group at its first hit, the runs that ended without meeting the goal, up to the step they ended
at (the budget), as Lee's code logs L in every run (:func:`probe_tasks`). Each is its own
replay and task; the first one is the run the points along [0, H] are measured on.
``lipschitz_check`` adds L on the whole split at the first point of each listed level's first
probed run (lowest seed, smallest probed batch size, best trial).
These rows go to the ``stage_probes`` table (:mod:`experiments.measures.stage.store`) in the
level's transaction.
With ``lipschitz_in_run`` none of this replays: L at Lee's stage (and its check) came with
the groups (:mod:`experiments.measures.stage.inside`), and only the best trial of each probed
group is replayed, for the points along [0, H].
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

import theory
import training
from theory.errors import TheoryError
from theory.estimators.functional import changed_by_eval_mode, probe_definition
from theory.verdicts.trajectory import needed_steps

from experiments.measures.probes.store import (
    ProbeRow, probed_runs, probed_sparsities, write_probes,
)
from experiments.measures.stage.inside import LIPSCHITZ_SAMPLE_SEED
from experiments.measures.stage.store import StageRow
from experiments.report.theory_view import PROBE_DEFINITION_FILE
from experiments.run.executors import torch_threads
from experiments.spec.study import Spec
from experiments.store.database import Store
from experiments.run.workload import Workload, best_trials, on_device, stored_trial

# Torch threads while probing: on the loaded 2-core machine a second intra-op thread multiplied
# the probes' CPU time (spinning workers), and the operations are small.
PROBE_THREADS = 1
# what is measured at each point of Lee et al.'s stage (no Hessian: their schedule never had one)
STAGE_MEASURED = ("g_sq", "trace_sigma", "b_simple", "local_lipschitz", "loss")


def probe_network(model: torch.nn.Module, dataset: training.Dataset,
                  mask: Mapping[str, torch.Tensor] | None = None, examples: int | None = None,
                  seed: int = 0, lanczos: int = 40) -> dict[str, float]:
    """Noise and smoothness of ``model`` at its current weights (``sparsescale probe``):
    ``g_sq``, ``trace_sigma``, ``b_simple``, ``b_noise`` (unbiased for the training split,
    ``theory.gradient_noise`` on ``examples`` examples, None: all), ``hessian_top`` (``lanczos``
    Lanczos steps) and ``loss``, all of the network in eval mode
    (``theory.estimators.functional.probe_definition``)."""
    examples = None if examples is None else min(int(examples), dataset.n_train)
    noise = theory.gradient_noise(model, dataset, mask=mask, examples=examples, seed=seed,
                                  hessian_examples=16)
    fl = theory.estimators.functional.flat_loss(model, dataset, mask=mask, examples=examples, seed=seed)
    return {"g_sq": noise.g_sq, "trace_sigma": noise.trace_sigma, "b_simple": noise.b_simple,
            "b_noise": noise.b_noise, "hessian_top": theory.lanczos_top(fl, lanczos, seed),
            "loss": noise.loss}


def level_b_crit(groups: pd.DataFrame, sparsity: float) -> float | None:
    """The level's fitted B_crit (McCandlish et al. 2018's S(B) fit over every seed's reached
    groups), None when it cannot be fitted."""
    g = groups[(groups.sparsity == sparsity) & (groups.status == "done")
               & groups.steps_to_result.notna()]
    try:
        fit = theory.fit_scaling(g.batch_size.to_numpy(float), g.steps_to_result.to_numpy(float),
                                 seeds=g.seed.to_numpy() if g.seed.nunique() > 1 else None,
                                 n_boot=50, seed=0)
    except TheoryError:
        return None
    return fit.b_crit


def run_end(trial: pd.Series, curves: Callable[[], pd.DataFrame]) -> int:
    """The step a stored trial's run ended at: its goal step when it reached the goal, else its
    last evaluated step in the store's ``curves()`` (the budget under ``stop = "all"`` or
    ``"never"``, the group's end under ``"first"`` or a completed-trial count)."""
    if trial.status == "reached":
        return int(trial.hit_step)
    frame = curves()
    steps = frame[(frame.group_key == trial.group_key) & (frame.trial == trial.trial)].step
    if steps.empty:
        raise TheoryError(f"trial {int(trial.trial)} of group {trial.group_key} has no "
                          "evaluated step to probe up to")
    return int(steps.max())


def probe_run(spec: Spec, dataset: training.Dataset, model: torch.nn.Module, group: pd.Series,
              trial: pd.Series, mask: Mapping[str, torch.Tensor] | None, horizon: int,
              early: bool = True, check: bool = False
              ) -> tuple[list[ProbeRow], list[StageRow]]:
    """Replay one trial of a group to ``horizon`` H (its goal step, or where a run that never
    met the goal ended: :func:`run_end`) once and probe it: along [0, H] when ``early`` (the
    group's first probed trial), and at Lee et al.'s stage when the spec asks for it, with L on
    the whole split at its first point when ``check`` (module docstring)."""
    start = time.perf_counter()
    p = spec.probes
    run = training.RunConfig(int(group.batch_size), spec.optimizer, seed=int(group.seed),
                             device=spec.device, precision=spec.precision)
    along = (theory.probe_steps(horizon, p.points) if horizon > 0 else (0,)) if early else ()
    # Lee's stage ends where the run did, or at lipschitz_until in every run (a fixed window);
    # inside the run, L at Lee's stage came with the group (experiments.measures.stage.inside)
    end = p.lipschitz_until or horizon
    lee = (theory.stage_steps(end, p.lipschitz_every, p.lipschitz_start)
           if p.lipschitz_every and not p.lipschitz_in_run else ())
    needed = set(needed_steps(along, max(horizon, 1), p.average) if along else ())
    needed |= set(needed_steps(lee, end, p.average, "into") if lee else ())
    if not needed:
        return [], []
    states = theory.replay_states(model, dataset, stored_trial(trial), run, sorted(needed), mask,
                                  int(trial.trial))
    common = dict(mask=mask, sparsity=float(group.sparsity), trial_index=int(trial.trial),
                  average=p.average, examples=p.examples, sample_seed=int(group.seed),
                  states=states, lipschitz_seed=LIPSCHITZ_SAMPLE_SEED)
    # L on lipschitz_examples (when set) along [0, H] too: one sample for every L of the study
    rows = theory.probe_trajectory(
        model, dataset, stored_trial(trial), run, along, max(horizon, 1),
        curvature_examples=p.curvature_examples, hessian_examples=p.hessian_examples,
        lanczos=p.lanczos, lipschitz_examples=p.lipschitz_examples, **common) if along else None
    stage = [theory.probe_trajectory(
        model, dataset, stored_trial(trial), run, lee, end, quantities=STAGE_MEASURED,
        lipschitz_update="into", lipschitz_examples=p.lipschitz_examples, **common)] if lee else []
    if lee and check:
        full = theory.probe_trajectory(
            model, dataset, stored_trial(trial), run, lee[:1], end,
            quantities=("local_lipschitz",), lipschitz_update="into", **common)
        stage.append(full.assign(quantity="local_lipschitz_full"))
    seconds = time.perf_counter() - start
    early_rows = [] if rows is None else [
        ProbeRow(float(r.sparsity), int(r.seed), int(r.batch_size), int(r.step),
                 float(r.fraction), r.quantity, float(r.value), seconds)
        for r in rows.itertuples(index=False)]
    sizes = {"local_lipschitz": p.lipschitz_examples, "local_lipschitz_full": None}
    stage_rows = [StageRow(float(r.sparsity), int(r.seed), int(r.batch_size),
                              int(trial.trial), int(r.step), end, r.quantity, float(r.value),
                              sizes.get(r.quantity, p.examples), seconds)
                  for frame in stage for r in frame.itertuples(index=False)]
    return early_rows, stage_rows


@dataclass(frozen=True)
class ProbeTask:
    """One probed run, everything a worker process needs: the spec, its workload, the group's
    and the trial's stored rows, the level's mask for that seed and the step H the run ended
    at (:func:`run_end`); ``early``: also along [0, H] (the group's first probed trial);
    ``check``: L on the whole split at its first point of Lee's stage."""

    spec: Spec
    workload: Workload
    group: pd.Series
    trial: pd.Series
    mask: Mapping[str, torch.Tensor] | None
    horizon: int
    early: bool = True
    check: bool = False


def run_probe_task(task: ProbeTask, dataset: training.Dataset | None = None
                   ) -> tuple[list[ProbeRow], list[StageRow]]:
    """Probe one run (worker side, or in the driver with its ``dataset``), with
    ``PROBE_THREADS`` torch threads."""
    with torch_threads(PROBE_THREADS):
        # the trial's own initialization with [pruning] mask_per_trial, else the seed's
        seed = task.workload.init_seed(int(task.group.seed), int(task.trial.trial))
        dataset, model = on_device(task.workload, task.spec.device, dataset, seed)
        return probe_run(task.spec, dataset, model, task.group, task.trial, task.mask,
                         task.horizon, task.early, task.check)


def probe_tasks(spec: Spec, store: Store, sparsity: float,
                masks: Mapping[int, Mapping[str, torch.Tensor] | None]) -> list[ProbeTask]:
    """The probed runs of one sparsity level: every seed, at the chosen batch sizes.

    Without Lee et al.'s stage, the best trial of each chosen group that reached the goal.
    With it (``[probes] lipschitz_every``), the ``lipschitz_trials`` reached trials with the
    fewest steps and, where fewer reached and the runs were not stopped at the group's first
    hit, the runs that ended without meeting the goal, each up to its end: Lee's
    ``edps/train.py`` logs L in every run until the goal or the step budget ends it, so a level
    whose runs never meet the goal is still measured (batch sizes are then chosen among every
    completed group)."""
    groups = store.frame("groups")
    # the noise and smoothness of synchronous SGD: a delay axis's delayed groups are not probed
    groups = groups[groups.delay == 0]
    b_crit = level_b_crit(groups, sparsity)
    workload = Workload.of(spec)
    p = spec.probes
    # L inside the run: only the first chosen trial's probes along [0, H] are replayed
    k = p.lipschitz_trials if p.lipschitz_every and not p.lipschitz_in_run else 1
    unreached = bool(p.lipschitz_every) and spec.stop != "first"
    curves = functools.cache(lambda: store.frame("curves"))   # read once, only if needed
    tasks: list[ProbeTask] = []
    for seed in spec.seeds:
        mine = groups[(groups.sparsity == sparsity) & (groups.seed == seed)
                      & (groups.status == "done")
                      & (groups.steps_to_result.notna() | unreached)]
        choices = {int(g.batch_size): best_trials(store, g.key, k, unreached)
                   for g in mine.itertuples()}
        choices = {b: trials for b, trials in choices.items() if trials}
        if not choices:
            continue
        for b in theory.probe_batch_sizes(sorted(choices), b_crit, p.batch_sizes):
            group = mine[mine.batch_size == b].iloc[0]
            for i, trial in enumerate(choices[b]):
                # the level's first run checks L's sample against the whole split
                check = not tasks and i == 0 and sparsity in p.lipschitz_check
                tasks.append(ProbeTask(spec, workload, group, trial,
                                       workload.trial_mask(masks[seed], int(trial.trial)),
                                       run_end(trial, curves), early=i == 0, check=check))
    return tasks


def longest_first(tasks: list[ProbeTask]) -> list[ProbeTask]:
    """``tasks`` in the order a pool should start them: the whole-split checks of L (about ten
    gradient passes over the training split each), then the longest replays, so that no long
    run starts last while the other workers idle (ties keep their order)."""
    return sorted(tasks, key=lambda t: (not t.check, -t.horizon))


def start_probes(spec: Spec, dataset: training.Dataset, store: Store,
                 executor: Executor | None = None) -> Callable[[bool], None]:
    """Submit the probes of every sparsity level not yet in the store to ``executor`` (one run
    per task) and return the function that waits for them and writes them (its argument:
    ``quiet``); without an executor that function probes in this process. Submitting first lets
    a caller put other work (the branching measurement) into the same pool before waiting."""
    todo = [s for s in spec.sparsities if s not in probed_sparsities(store)]
    if not todo:
        return lambda quiet: None
    record_definition(Workload.of(spec).build_model(dataset, spec.seeds[0]), store.path.parent)
    # the same masks, bit for bit, as the runner gave the groups
    masks = Workload.of(spec).masks(dataset, ((s, seed) for s in todo for seed in spec.seeds))
    levels = {s: probe_tasks(spec, store, s, {seed: masks[(s, seed)] for seed in spec.seeds})
              for s in todo}
    # submitted all at once, so the pool never idles between levels
    futures = {} if executor is None else {
        id(t): executor.submit(run_probe_task, t)
        for t in longest_first([t for tasks in levels.values() for t in tasks])}

    def finish(quiet: bool) -> None:
        def write(sparsity: float, results) -> None:
            rows: list[ProbeRow] = []
            stage: list[StageRow] = []
            for run_rows, stage_rows in results:
                rows += run_rows
                stage += stage_rows
            write_probes(store, sparsity, rows, stage)

        with tqdm(total=sum(map(len, levels.values())), disable=quiet, desc="probes",
                  unit="run") as bar:
            if not futures:
                for sparsity, tasks in levels.items():
                    results = []
                    for t in tasks:
                        results.append(run_probe_task(t, dataset))
                        bar.update()
                    write(sparsity, results)
                return
            # the bar counts runs as they end (longest first is not the levels' order); each
            # level is written, in the levels' order, once all its runs have ended
            waiting = list(levels)
            for _ in as_completed(futures.values()):
                bar.update()
                while waiting and all(futures[id(t)].done() for t in levels[waiting[0]]):
                    sparsity = waiting.pop(0)
                    write(sparsity, [futures[id(t)].result() for t in levels[sparsity]])

    return finish


def record_definition(model: torch.nn.Module, run_dir: Path) -> None:
    """Write what the probes of ``model`` measure (``theory.estimators.functional.probe_definition``) to
    ``run_dir/PROBE_DEFINITION_FILE`` when eval mode changes the model (batch normalization,
    dropout), for the report to state beside the probe values; otherwise write nothing."""
    if changed_by_eval_mode(model):
        (run_dir / PROBE_DEFINITION_FILE).write_text(probe_definition(model) + "\n")


def run_probes(spec: Spec, dataset: training.Dataset, store: Store, quiet: bool = False,
               executor: Executor | None = None) -> None:
    """Probe every sparsity level not yet in the store (one transaction per level, rows in the
    same order whatever ran them). With ``executor`` the runs are probed in its workers, one
    run per task; each run's values do not depend on where it ran (one torch thread, the
    driver's masks)."""
    start_probes(spec, dataset, store, executor)(quiet)


def probe_cost(groups: pd.DataFrame, probes: pd.DataFrame,
               stage: pd.DataFrame | None = None) -> tuple[float, float]:
    """(probe seconds, training seconds) of a stored study: the sum over probed runs of their
    replay and measurement time (:func:`~experiments.measures.probes.store.probed_runs`: with
    ``stage``, the runs probed only at Lee's stage too), and the sum of the groups' wall
    times."""
    return (float(np.nansum(probed_runs(probes, stage).seconds)),
            float(groups.wall_time.sum()))
