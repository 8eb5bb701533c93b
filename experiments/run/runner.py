"""Run a study: spec -> plan of groups -> executor -> store -> measurements -> report.

The plan (:mod:`experiments.spec.plan`) lists the groups; each (sparsity, seed) mask is computed
once, on the driver, from the same initialization the workers build
(:class:`experiments.run.workload.Workload`). Workers train one group each as one vectorized
``training.train_trials`` call and return plain picklable data
(:class:`experiments.store.schema.GroupRecord`); only the driver writes the store, one transaction per
group, so Ctrl-C or SIGKILL at any moment leaves a consistent store that a rerun completes.
A measurement that takes something inside a group's runs ships its plan with the group
(:meth:`experiments.measurement.Measurement.watch`) and its rows come back with the record.
Then every registered measurement the spec asks for (:mod:`experiments.measurement`: the probes,
branching, the policies' shoot-out, a user's own) measures what the store lacks
(:func:`measure_runs`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import (
    FIRST_COMPLETED, BrokenExecutor, Executor, Future, ThreadPoolExecutor, wait,
)
from dataclasses import dataclass, replace
from pathlib import Path

import torch

import training
from training.config import ADAM_KEYS

from experiments import measurement
from training.extensions import disabled as without_compiled_kernel, kernels_ready

from experiments.run import timing
from experiments.run.complete import train_group
from experiments.run.executors import (
    LocalPool, dask_executor, default_workers, local_pool, torch_threads,
)
from experiments.spec import factories
from experiments.spec.plan import GroupPlan, plan, run_order
from experiments.run.rounds import train_rounds
from experiments.run.tuning import tune
from experiments.store.schema import GroupRecord, StudyInfo, TrialRow
from experiments.spec.factories import Factory
from experiments.spec.errors import SpecError
from experiments.spec.study import Spec, with_workload
from experiments.spec.tables.executor import PROGRAM_CHOICES
from experiments.spec.study import load as load_spec
from experiments.store.database import Store, open_store
from experiments.run.workload import Mask, Workload


@dataclass(frozen=True)
class GroupTask:
    """What is shipped to a worker: the plan, the workload, the (sparsity, seed) mask (with
    ``[pruning] mask_per_trial``, one per trial, ``[N, *shape]``),
    whether the compiled kernel is usable (the driver built it or found it missing, once), the
    device to train on (``"cuda"``: the worker's own GPU, :func:`executors.local_pool`), the
    program the store recorded for the group's cell (None: :func:`choose_group_program` has not
    decided it yet), the program choice that decides it (``"measure"`` or ``"rules"``) and what
    the measurements take inside its runs (``watches``: their plans,
    :meth:`experiments.measurement.Measurement.watch`)."""

    plan: GroupPlan
    workload: Workload
    mask: Mask | None
    kernels: bool = True
    device: str = "cpu"
    program: str | None = None
    program_choice: str | None = None
    watches: tuple = ()


# ---------------------------------------------------------------------------------------------
# worker side


def failed_record(p: GroupPlan, error: str, wall_time: float) -> GroupRecord:
    """The record of a group that raised: stored as 'failed' (no trials), retried by a rerun."""
    return GroupRecord(key=p.key, sparsity=p.sparsity, batch_size=p.batch_size, seed=p.seed,
                       status="failed", steps_to_result=None, best_trial=None,
                       max_steps=p.max_steps, wall_time=wall_time, trial_steps=0,
                       config_json=p.config_json, error=error, delay=p.delay)


def run_group(task: GroupTask) -> GroupRecord:
    """Train one group (worker side) and return its record; an exception becomes a 'failed'
    record (retried on the next run), never a lost group."""
    p = task.plan
    start = time.perf_counter()
    try:
        with _group_process(task) as (model, ds, run):
            cfg = json.loads(p.config_json)
            # mask_per_trial: every trial from its own initialization (its mask is its row)
            inits = task.workload.init_params(task.workload.load_dataset(), p.seed,
                                              len(p.trials))
            watchers = [w.watcher(model, ds,
                                  lambda trial: task.workload.trial_mask(task.mask, trial))
                        for w in task.watches]
            res = train_group(model, ds, list(p.trials), run, masks=task.mask,
                              complete=cfg.get("complete_trials", False), reserve=p.reserve,
                              init_params=inits, program=task.program,
                              train=functools.partial(_watched, watchers=watchers)
                              if watchers else training.train_trials)
            where = training.device.device_info(task.device)
            precision = run.precision
    except Exception as exc:  # noqa: BLE001 - any failure is recorded with its traceback
        return failed_record(p, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}",
                             time.perf_counter() - start)
    rows = []
    for i, t in enumerate(res.points):
        curve = res.curves[i]
        hit = res.hit_step[i]
        rows.append(TrialRow(
            trial=i, lr=t["lr"], momentum=t["momentum"], decay_steps=t["decay_steps"],
            end_factor=t["end_factor"], status=res.status[i],
            hit_step=None if hit is None else int(hit),
            final_metric=float(curve.metric[-1]) if len(curve) else None,
            curve=tuple(curve.rows()), **{k: t[k] for k in ADAM_KEYS if k in t}))
    return GroupRecord(
        key=p.key, sparsity=p.sparsity, batch_size=p.batch_size, seed=p.seed, status="done",
        steps_to_result=None if res.steps_to_result is None else int(res.steps_to_result),
        best_trial=None if res.best is None else int(res.best),
        max_steps=p.max_steps, wall_time=time.perf_counter() - start,
        trial_steps=int(sum(res.steps_taken)), config_json=p.config_json, trials=tuple(rows),
        program=res.program, device=where.device, device_name=where.name,
        cuda_version=where.cuda_version, driver_version=where.driver_version,
        precision=precision, delay=p.delay,
        measured=tuple((table, tuple(rows)) for w in watchers
                       for table, rows in w.taken(p, res).items()))


def _watched(*args, watchers: list, first_index: int = 0, **kwargs) -> training.TrialsResult:
    """``training.train_trials`` with the watchers' watches joined (trial k of the call is
    trial ``first_index + k`` of the group)."""
    watches = [w.watch(first_index) for w in watchers]
    joined = watches[0] if len(watches) == 1 else training.Watch(
        sorted({t for w in watches for t in w.steps}),
        lambda t, *weights: [w.callback(t, *weights) for w in watches if t in w.steps])
    return training.train_trials(*args, first_index=first_index, watch=joined, **kwargs)


@contextlib.contextmanager
def _group_process(task: GroupTask) -> Iterator[tuple[torch.nn.Module, training.Dataset,
                                                       training.RunConfig]]:
    """A group's model, data set and run configuration, within one torch thread and (where the
    driver found it missing) without the compiled kernel."""
    p = task.plan
    cfg = json.loads(p.config_json)
    with torch_threads(1), contextlib.nullcontext() if task.kernels else without_compiled_kernel():
        model = task.workload.build_model(task.workload.load_dataset(), p.seed)
        ds = task.workload.load_dataset(task.device)   # on a GPU: copied once per worker
        run = training.RunConfig(
            p.batch_size, cfg["optimizer"], max_steps=p.max_steps,
            goal=training.Goal(**cfg["goal"]), eval_schedule=training.EvalSchedule(**cfg["eval"]),
            seed=p.seed, device=task.device, precision=cfg["workload"].get("precision", "fp32"),
            stop=cfg.get("stop", "first"))
        yield model, ds, run


def choose_group_program(task: GroupTask) -> tuple[int, str, str]:
    """(batch size, program, how it was chosen) of the cell of ``task``'s group (worker side):
    what ``train_trials`` would run there under ``task.program_choice``
    (:func:`training.choose_program`: the rules, or the candidates timed in this worker)."""
    p = task.plan
    with _group_process(task) as (model, ds, run):
        name, how = training.choose_program(model, ds, list(p.trials), run, masks=task.mask,
                                            program_choice=task.program_choice)
    return p.batch_size, name, how


def cell_programs(tasks: list[GroupTask], executor: Executor, store: Store) -> list[GroupTask]:
    """``tasks`` with the program of their cell (batch size): the one the store recorded (or,
    in a store written before the programs table, the one its groups of the cell ran), else
    the one a worker chooses now (one :func:`choose_group_program` per new cell, all before any
    group trains, so that every group of a cell, in this run and in any rerun, runs the same
    program), recorded in the store first. A cell whose choice failed is left to its groups
    (which will most likely fail the same way, and be retried)."""
    recorded = store.programs()
    first = {}
    for t in tasks:
        first.setdefault(t.plan.batch_size, t)
    # a store written before the programs table: a cell whose stored groups ran one program
    # keeps it (recorded as taken from the groups), so its remaining groups run it too
    done = store.frame("groups")
    done = done[(done.status == "done") & done.program.notna()]
    chosen = {int(b): (str(g.program.iloc[0]), "groups") for b, g in done.groupby("batch_size")
              if b not in recorded and g.program.nunique() == 1}
    new = [t for b, t in sorted(first.items()) if b not in recorded and b not in chosen]
    for fut in [executor.submit(choose_group_program, t) for t in new]:
        with contextlib.suppress(Exception):
            b, name, how = fut.result()
            chosen[b] = (name, how)
    if chosen:
        recorded = store.record_programs(chosen)
    return [replace(t, program=recorded.get(t.plan.batch_size)) for t in tasks]


# ---------------------------------------------------------------------------------------------
# driver side


def _progress(total: int, quiet: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=quiet, desc=desc, unit="group", dynamic_ncols=True)


# Attempts of a group whose worker process died (killed, out of memory) before it is stored as
# failed: the pool breaks for every group in flight, so innocent groups need a second chance.
ATTEMPTS = 2


def execute(tasks: list[GroupTask], executor: Executor, store: Store, quiet: bool = False,
            respawn: Callable[[], Executor] | None = None) -> list[GroupRecord]:
    """Submit ``tasks`` to ``executor``, write each record as it lands (driver only).

    A worker process that dies breaks a process pool for every group in flight
    (``BrokenExecutor``): with ``respawn`` (a factory of fresh executors) those groups are
    resubmitted to a new pool, up to ``ATTEMPTS`` attempts each; then, or without ``respawn``,
    they are stored as failed with the reason (a rerun retries them). On Ctrl-C (or any error)
    the futures not yet started are cancelled, the respawned pools are ended and the exception
    propagates; records already written are whole groups, so the store stays consistent.
    """
    records = []
    attempts = {t.plan.key: 1 for t in tasks}
    spawned: list[Executor] = []
    futures: dict[Future, GroupTask] = {}
    bar = _progress(len(tasks), quiet, "groups")
    try:
        todo = list(tasks)
        while todo:
            futures = {executor.submit(run_group, t): t for t in todo}
            todo = []
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: futures[f].plan.key):
                    task = futures[fut]
                    lost = isinstance(fut.exception(), BrokenExecutor)
                    if lost and respawn is not None and attempts[task.plan.key] < ATTEMPTS:
                        attempts[task.plan.key] += 1
                        todo.append(task)
                        continue
                    rec = _result(fut, task.plan, attempts[task.plan.key])
                    store.write_group(rec)
                    records.append(rec)
                    bar.update(1)
                    bar.set_postfix_str(f"s={rec.sparsity:g} B={rec.batch_size} {rec.status}")
            if todo:
                executor.shutdown(wait=False, cancel_futures=True)
                executor = respawn()
                spawned.append(executor)
    except BaseException:
        for fut in futures:
            fut.cancel()
        for ex in spawned:
            if isinstance(ex, LocalPool):
                ex.terminate()
        raise
    finally:
        bar.close()
        for ex in spawned:
            ex.shutdown(wait=False, cancel_futures=True)
    return records


def _result(fut: Future, p: GroupPlan, attempts: int = 1) -> GroupRecord:
    try:
        return fut.result()
    except BrokenExecutor as exc:
        return failed_record(p, f"worker process died while running this group (killed, or out "
                                f"of memory; {attempts} attempt(s)): {type(exc).__name__}: {exc}",
                             0.0)
    except Exception as exc:  # noqa: BLE001 - a lost worker is a failed group, retried later
        return failed_record(p, f"{type(exc).__name__}: {exc}", 0.0)


def study_info(spec: Spec, dataset: training.Dataset | None = None) -> StudyInfo:
    """The store's study row for ``spec`` (its hash keeps other studies out of the folder) and
    ``dataset``'s provenance (its content digest keeps results on other data out)."""
    return StudyInfo(name=spec.name, spec_toml=spec.toml, spec_hash=spec.hash,
                     spec_json=spec.to_json(),
                     dataset_json=None if dataset is None else json.dumps(
                         dataset.provenance, sort_keys=True, default=str))


def run_study(config: str | Path | Spec, out: str | Path | None = None,
              workers: int | None = None, executor: Executor | None = None,
              quiet: bool = False, dask: str | None = None, probes: bool = True,
              report: bool = True, cost_model: bool = False, model: Factory | None = None,
              dataset: Factory | None = None, program_choice: str | None = None) -> Path:
    """Run (or complete) the study ``config`` into ``out`` and return the run folder.

    ``config``: a TOML path, a bundled config name (``"quickstart"``) or a :class:`Spec`.
    ``model`` / ``dataset``: replace the spec's ``[workload] model`` / ``dataset`` with a
    registered name, an import path ``"module:factory"`` or the factory itself, a callable that
    worker processes import by its ``module:qualname`` (:mod:`experiments.spec.factories`; one
    defined in ``__main__`` or inside a function needs an in-process ``executor``, a
    ``ThreadPoolExecutor``). A bad factory (it cannot be imported, raises, returns the wrong
    type) raises :class:`experiments.spec.factories.FactoryError` or :class:`SpecError` before
    anything is written.
    ``out``: default ``runs/<name>``. ``executor``: any ``concurrent.futures.Executor`` (not shut
    down here); otherwise ``dask`` (an address or ``"local"``) or a local process pool of
    ``workers`` (default: ``[executor] workers`` of the spec, else the CPU count). Groups already
    in the store are skipped; then every measurement the spec asks for measures what the
    store lacks (:func:`measure_runs`: the probes, branching, the policies' shoot-out, ...;
    ``probes=False`` skips them all), and the report is written.
    A spec listing several optimizers or pruning series (criteria, sanity checks) runs one
    sub-study per optimizer and series in ``out/<optimizer>/<series>`` (``Spec.variants``) and
    writes one report comparing them into ``out``. ``cost_model``: put this machine's DDP cost
    model into ``out`` for the report's time-to-result section (:mod:`experiments.run.costcache`:
    measured once per machine and workload, then cached; ``sparsescale study`` does this unless
    given ``--no-cost-model`` or ``--no-report``). The wall time of each phase and the training
    time per batch size and the summed seconds of the training's and each measurement's tasks go
    to ``timing.json`` (:mod:`experiments.run.timing`), printed unless ``quiet``.
    A group-sequential ``[stopping]`` rule trains the groups round by round and stops at the
    first look that stops (:mod:`experiments.run.rounds`).
    ``[tuning]``: the search first, into ``out/search`` (:mod:`experiments.run.tuning`).
    ``program_choice``: how the program of a cell no rule covers is chosen, ``"measure"`` or
    ``"rules"`` (default: the spec's ``[executor] program_choice``, else the workers'
    ``SPARSESCALE_PROGRAM_CHOICE``, else measure; :mod:`training.engine.choice`). Each cell's
    program is chosen once, before its first group trains, and recorded in the store
    (:func:`cell_programs`); every group of the cell, in this run or a rerun, on any worker,
    runs it.
    """
    if program_choice not in (None, *PROGRAM_CHOICES):
        raise SpecError([f"program_choice: found {program_choice!r}; allowed: "
                         f"{', '.join(PROGRAM_CHOICES)}"])
    spec = (with_workload(config, model, dataset) if isinstance(config, Spec)
            else load_spec(config, model, dataset))
    if program_choice is not None:
        spec = replace(spec, program_choice=program_choice)
    check_in_process(spec, executor)
    out = run_folder(spec, out)
    variants = spec.variants()
    clock = timing.PhaseClock()
    if len(variants) > 1:
        with clock.phase("variants"):
            dirs = [run_study(v, out / v.subdir, workers, executor, quiet, dask, probes,
                              report=False, cost_model=cost_model) for v in variants]
        if report:
            with clock.phase("report"):
                _write_report(dirs, out, quiet)
        timing.record(out, clock, quiet)
        return out

    if dask is None:   # a Dask cluster's workers may have GPUs its driver lacks
        training.device.resolve_device(spec.device, "workload.device")
    if spec.tuning is not None and not spec.tuned:   # Lee's protocol: search, then repeat
        with clock.phase("tuning"):
            spec = tune(spec, out, lambda s, d: run_study(s, d, workers, executor, quiet, dask,
                                                          probes=False, report=False))
    workload, dataset, model = load_workload(spec)
    groups = plan(spec)
    with open_store(out, study_info(spec, dataset)) as store:
        done = store.done_keys()
        todo = run_order([g for g in groups if g.key not in done])
        # a measurement's check of the store may read it whole: once, before any pool starts
        measures = [m for m in measurement.wanted(spec) if probes
                    and m.pending(measurement.RunContext(spec, dataset, store))]
        if todo or measures:
            # build the compiled kernel here, once, before the workers start (or warn once
            # that it is missing, and tell them not to try)
            # (a CUDA study never runs it: the kernel is CPU code)
            on_cpu = spec.device == "cpu"
            use_kernels = on_cpu and kernels_ready(model, dataset.input_shape)
            own = executor is None
            n_workers = workers or spec.workers or default_workers(spec.device)
            # a pool no larger than the work: one group or measured run per worker
            pool_size = n_workers if measures else min(n_workers, len(todo))
            ex = executor or (dask_executor(dask, n_workers) if dask
                              else local_pool(pool_size, spec.device))
            # only a pool made here can be replaced (Dask reschedules lost work by itself)
            respawn = (functools.partial(local_pool, pool_size, spec.device)
                       if own and not dask else None)
            try:
                if todo:
                    with clock.phase("masks"):
                        masks = workload.masks(dataset, ((g.sparsity, g.seed) for g in todo),
                                               record=out, executor=ex)
                    tasks = [GroupTask(g, workload, masks[(g.sparsity, g.seed)], use_kernels,
                                       spec.device, program_choice=spec.program_choice,
                                       watches=tuple(w for m in measurement.wanted(spec) if
                                                     (w := m.watch(spec, g)) is not None))
                             for g in todo]
                    with clock.phase("programs"):
                        tasks = cell_programs(tasks, ex, store)
                    with clock.phase("training"):
                        # round by round under a group-sequential rule (experiments.run.rounds)
                        stopped = train_rounds(spec, store, tasks, lambda t: t.plan.seed,
                                               lambda part: execute(part, ex, store, quiet,
                                                                    respawn))
                    if stopped is not None and not quiet:
                        print(f"stopping rule: stopped at look {stopped} of "
                              f"{spec.stopping.rounds}")
                if measures:
                    with clock.phase("measurements"):
                        ctx = measurement.RunContext(spec, dataset, store, ex)
                        try:
                            measure_runs(ctx, measures, quiet)
                        except BrokenExecutor:
                            if respawn is None:
                                raise
                            # a worker died: what is not yet written is measured once more in a
                            # fresh pool (each skips what the store holds)
                            ex.shutdown(wait=False, cancel_futures=True)
                            ex = respawn()
                            measure_runs(replace(ctx, executor=ex), measures, quiet)
            except BaseException:
                if own and isinstance(ex, LocalPool):
                    ex.terminate()
                raise
            finally:
                if own:
                    ex.shutdown(wait=False, cancel_futures=True)
        trained = timing.training_by_batch_size(store.frame("groups"))
        tasks = timing.task_seconds(store.frame)
    if cost_model:
        from experiments.run.costcache import ensure_cost_model

        with clock.phase("cost model"):
            ensure_cost_model(out, workload, quiet)
    if report:
        with clock.phase("report"):
            _write_report([out], out, quiet)
    timing.record(out, clock, quiet, trained, tasks)
    return out


def run_folder(spec: Spec, out: str | Path | None = None) -> Path:
    """The run folder of ``spec``: ``out``, by default ``runs/<name>``."""
    return Path(out) if out is not None else Path("runs") / spec.name


def load_workload(spec: Spec) -> tuple[Workload, training.Dataset, torch.nn.Module]:
    """``spec``'s workload, its data set and the model of its first seed, built in this
    process before anything is written or any worker starts, so that what fails on the
    workload fails here, in one line: a batch size larger than the training set, a bad option,
    a factory that cannot be imported, raises or returns the wrong type, or whose source is no
    longer the one the spec was made from."""
    workload = Workload.of(spec)
    dataset = workload.load_dataset()
    check_against_dataset(spec, dataset.n_train)
    model = workload.build_model(dataset, spec.seeds[0])
    training.models.check_runnable(model)   # before the output check's forward pass
    training.models.check_output(model, dataset, "study")
    return workload, dataset, model


def check_against_dataset(spec: Spec, n_train: int) -> None:
    """Checks that need the loaded data set: every batch size fits in the training set, and
    each measurement's own (:meth:`experiments.measurement.Measurement.check`)."""
    problems = [f"batch_sizes: found {b} > {n_train} (the training set size); allowed: "
                f"1..{n_train}" for b in spec.batch_sizes if b > n_train]
    problems += [p for m in measurement.wanted(spec) for p in m.check(spec, n_train)]
    if problems:
        raise SpecError(problems)


def check_in_process(spec: Spec, executor: Executor | None) -> None:
    """Refuse a factory that worker processes cannot import (defined in ``__main__`` or inside
    a function) unless ``executor`` runs groups in this process (a ``ThreadPoolExecutor``)."""
    if isinstance(executor, ThreadPoolExecutor):
        return
    for kind in ("dataset", "model"):
        path = getattr(spec, kind)
        if factories.in_process_only(path):
            raise factories.FactoryError(
                kind, f"{path} is defined in __main__ or inside a function, and worker processes "
                      f"import a factory by its path: move it into a module (e.g. mymodels.py "
                      f"beside the notebook or spec), or train in this process with "
                      f"executor=concurrent.futures.ThreadPoolExecutor(n)")


def measure_runs(ctx: measurement.RunContext, measures: list[measurement.Measurement],
                 quiet: bool) -> None:
    """Start every measurement of ``measures`` (in ``ctx.executor``'s workers, in the registry's
    order: branching before the probes, a level's branching being longer than a probed run),
    then wait for each and write it, in the same order (one that reads another's rows, the
    policies' shoot-out, is registered after it), so the pool idles neither between them nor
    while the driver writes results. Each skips what the store already holds."""
    pending = [m.start(ctx) for m in measures]
    for finish in pending:
        if finish is not None:
            finish(quiet)


def _write_report(run_dirs: list[Path], out: Path, quiet: bool) -> Path:
    from experiments.report.write import write_report  # late: matplotlib / seaborn are not needed to train

    path = write_report(run_dirs, out)
    if not quiet:
        print(f"report: {path}")
    return path
