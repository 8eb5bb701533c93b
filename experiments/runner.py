"""Run a study: spec -> plan of groups -> executor -> store -> probes -> report.

A *group* is one (sparsity, batch size, seed) cell: ``spec.trials`` metaparameter points (the same
Sobol points at every cell) trained as one vectorized ``training.train_trials`` call. Its key is
the hash of its canonical config, so a rerun skips every group the store already holds. Masks are
computed once per (sparsity, seed), on the driver, from the same initialization the workers build
(``training.models.build(..., seed=seed)``). Workers return plain picklable data
(:class:`experiments.store.GroupRecord`); only the driver writes the store, one transaction per
group, so Ctrl-C or SIGKILL at any moment leaves a consistent store that a rerun completes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Executor, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import training

from . import search
from .executors import LocalPool, dask_executor, default_workers, local_pool, torch_threads
from .spec import Spec, check_against_dataset, canonical_json
from .spec import load as load_spec
from .store import GroupRecord, Store, StudyInfo, TrialRow, open_store


@dataclass(frozen=True)
class GroupPlan:
    """One group to run: everything a worker needs except the mask (added on submission)."""

    key: str
    sparsity: float
    batch_size: int
    seed: int
    max_steps: int
    trials: tuple[dict[str, Any], ...]
    config_json: str

    @property
    def cost(self) -> int:
        """Upper bound on trial-steps (every trial runs the whole budget)."""
        return self.max_steps * len(self.trials)


@dataclass(frozen=True)
class GroupTask:
    """What is shipped to a worker: the plan, the workload and the (sparsity, seed) mask."""

    plan: GroupPlan
    workload: dict[str, Any]
    mask: dict[str, torch.Tensor] | None


def group_config(spec: Spec, sparsity: float, batch_size: int, seed: int, max_steps: int,
                 trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything that determines a group's results (its key is this dict's hash)."""
    c = spec.canonical()
    return {"workload": c["workload"], "optimizer": spec.optimizer, "goal": c["goal"],
            "pruning": c["pruning"] if sparsity > 0 else None, "sparsity": sparsity,
            "batch_size": batch_size, "seed": seed, "max_steps": max_steps, "eval": c["eval"],
            "trials": trials}


def plan(spec: Spec) -> list[GroupPlan]:
    """All groups of ``spec`` in a stable order (sparsity, batch size, seed)."""
    groups = []
    for sparsity in spec.sparsities:
        for b in spec.batch_sizes:
            max_steps = spec.budget.steps(b)
            trials = search.sample(spec.search, spec.trials, spec.search_seed, max_steps,
                                   momentum_used=spec.optimizer != "sgd")
            for seed in spec.seeds:
                cfg = group_config(spec, sparsity, b, seed, max_steps, trials)
                text = canonical_json(cfg)
                groups.append(GroupPlan(key=hashlib.sha256(text.encode()).hexdigest()[:20],
                                        sparsity=sparsity, batch_size=b, seed=seed,
                                        max_steps=max_steps, trials=tuple(trials),
                                        config_json=text))
    return groups


# ---------------------------------------------------------------------------------------------
# worker side


@functools.lru_cache(maxsize=4)
def _dataset_cached(workload_json: str) -> training.Dataset:
    w = json.loads(workload_json)
    return training.data.load(w["dataset"], **w["dataset_options"])


def load_dataset(workload: dict[str, Any]) -> training.Dataset:
    """The workload's data set (cached per process: every group of a study shares it)."""
    return _dataset_cached(canonical_json(workload))


def build_model(workload: dict[str, Any], dataset: training.Dataset, seed: int) -> torch.nn.Module:
    """The workload's model initialized with ``seed`` (workers, masks and probes all build it so)."""
    return training.models.build(workload["model"], dataset, seed=seed, **workload["model_options"])


def failed_record(p: GroupPlan, error: str, wall_time: float) -> GroupRecord:
    """The record of a group that raised: stored as 'failed' (no trials), retried by a rerun."""
    return GroupRecord(key=p.key, sparsity=p.sparsity, batch_size=p.batch_size, seed=p.seed,
                       status="failed", steps_to_result=None, best_trial=None,
                       max_steps=p.max_steps, wall_time=wall_time, trial_steps=0,
                       config_json=p.config_json, error=error)


def run_group(task: GroupTask) -> GroupRecord:
    """Train one group (worker side) and return its record; an exception becomes a 'failed'
    record (retried on the next run), never a lost group."""
    p = task.plan
    cfg = json.loads(p.config_json)
    start = time.perf_counter()
    try:
        with torch_threads(1):
            ds = load_dataset(task.workload)
            model = build_model(task.workload, ds, p.seed)
            goal = training.Goal(**cfg["goal"])
            res = training.train_trials(
                model, ds, batch_size=p.batch_size, trials=list(p.trials),
                optimizer=cfg["optimizer"], target=goal, max_steps=p.max_steps,
                masks=task.mask, seed=p.seed,
                eval_schedule=training.EvalSchedule(**cfg["eval"]))
    except Exception as exc:  # noqa: BLE001 - any failure is recorded with its traceback
        return failed_record(p, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}",
                             time.perf_counter() - start)
    rows = []
    for i, t in enumerate(p.trials):
        curve = res.curves[i]
        hit = res.hit_step[i]
        rows.append(TrialRow(
            trial=i, lr=t["lr"], momentum=t["momentum"], decay_steps=t["decay_steps"],
            end_factor=t["end_factor"], status=res.status[i],
            hit_step=None if hit is None else int(hit),
            final_metric=float(curve.metric[-1]) if len(curve) else None,
            curve=tuple(curve.rows())))
    return GroupRecord(
        key=p.key, sparsity=p.sparsity, batch_size=p.batch_size, seed=p.seed, status="done",
        steps_to_result=None if res.steps_to_result is None else int(res.steps_to_result),
        best_trial=None if res.best is None else int(res.best),
        max_steps=p.max_steps, wall_time=time.perf_counter() - start,
        trial_steps=int(sum(res.steps_taken)), config_json=p.config_json, trials=tuple(rows))


# ---------------------------------------------------------------------------------------------
# driver side


def compute_masks(spec: Spec, dataset: training.Dataset, keys: Iterable[tuple[float, int]]
                  ) -> dict[tuple[float, int], dict[str, torch.Tensor] | None]:
    """One mask per (sparsity, seed), from the initialization ``build_model(..., seed)``."""
    workload = spec.canonical()["workload"]
    out: dict[tuple[float, int], dict[str, torch.Tensor] | None] = {}
    for sparsity, seed in sorted(set(keys)):
        if sparsity == 0:
            out[(sparsity, seed)] = None
            continue
        import pruning

        model = build_model(workload, dataset, seed)
        mask = pruning.prune(model, spec.pruning_method, sparsity, data=dataset, seed=seed)
        out[(sparsity, seed)] = {k: v.detach().clone() for k, v in mask.items()}
    return out


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


def study_info(spec: Spec) -> StudyInfo:
    """The store's study row for ``spec`` (its hash keeps other studies out of the folder)."""
    return StudyInfo(name=spec.name, spec_toml=spec.toml, spec_hash=spec.hash,
                     spec_json=spec.to_json())


def run_study(config: str | Path | Spec, out: str | Path | None = None,
              workers: int | None = None, executor: Executor | None = None,
              quiet: bool = False, dask: str | None = None, probes: bool = True,
              report: bool = True, cost_model: bool = False) -> Path:
    """Run (or complete) the study ``config`` into ``out`` and return the run folder.

    ``config``: a TOML path, a bundled config name (``"quickstart"``) or a :class:`Spec`.
    ``out``: default ``runs/<name>``. ``executor``: any ``concurrent.futures.Executor`` (not shut
    down here); otherwise ``dask`` (an address or ``"local"``) or a local process pool of
    ``workers`` (default: ``[executor] workers`` of the spec, else the CPU count). Groups already
    in the store are skipped; then the probes run (unless disabled) and the report is written.
    A spec listing several optimizers runs one sub-study per optimizer in ``out/<optimizer>`` and
    writes one report comparing them into ``out``. ``cost_model``: put this machine's DDP cost
    model into ``out`` for the report's time-to-result section (:mod:`experiments.costcache`:
    measured once per machine and workload, then cached; ``sparsescale study`` does this unless
    given ``--no-cost-model`` or ``--no-report``).
    """
    spec = config if isinstance(config, Spec) else load_spec(config)
    out = Path(out) if out is not None else Path("runs") / spec.name
    variants = spec.variants()
    if len(variants) > 1:
        dirs = [run_study(v, out / v.optimizer, workers, executor, quiet, dask, probes,
                          report=False, cost_model=cost_model) for v in variants]
        if report:
            _write_report(dirs, out, quiet)
        return out

    workload = spec.canonical()["workload"]
    dataset = load_dataset(workload)
    check_against_dataset(spec, dataset.n_train)
    build_model(workload, dataset, spec.seeds[0])   # a bad model option fails here, not in workers
    groups = plan(spec)
    with open_store(out, study_info(spec)) as store:
        done = store.done_keys()
        # longest first (time per step grows with B), so the pool's last wave is short
        todo = sorted((g for g in groups if g.key not in done),
                      key=lambda g: -g.cost * (g.batch_size + 32))
        if todo:
            masks = compute_masks(spec, dataset, ((g.sparsity, g.seed) for g in todo))
            tasks = [GroupTask(g, workload, masks[(g.sparsity, g.seed)]) for g in todo]
            own = executor is None
            n_workers = workers or spec.workers
            pool_size = min(n_workers or default_workers(), len(tasks))
            ex = executor or (dask_executor(dask, n_workers) if dask else local_pool(pool_size))
            # only a pool made here can be replaced (Dask reschedules lost work by itself)
            respawn = functools.partial(local_pool, pool_size) if own and not dask else None
            try:
                execute(tasks, ex, store, quiet, respawn)
            except BaseException:
                if own and isinstance(ex, LocalPool):
                    ex.terminate()
                raise
            finally:
                if own:
                    ex.shutdown(wait=False, cancel_futures=True)
        if probes and spec.probes.enabled:
            from .probes import run_probes

            run_probes(spec, dataset, store, quiet=quiet)
    if cost_model:
        from .costcache import ensure_cost_model

        ensure_cost_model(out, workload, quiet)
    if report:
        _write_report([out], out, quiet)
    return out


def _write_report(run_dirs: list[Path], out: Path, quiet: bool) -> Path:
    from .report import write_report   # late: matplotlib / seaborn are not needed to train

    path = write_report(run_dirs, out)
    if not quiet:
        print(f"report: {path}")
    return path
