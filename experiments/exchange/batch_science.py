"""Shallue et al. (2019)'s published measurements (the ``batch_science`` archive) as results stores.

The archive holds one folder per workload (data set, model, optimizer) and below it one study per
batch size, each with its trials' metadata and evaluations (layout and reading:
:mod:`experiments.exchange.batch_science_tree`).

One workload becomes one run folder (a results store, :mod:`experiments.store.database`): one group per
batch size (sparsity 0, seed 0), one trial row per trial with its metaparameters and status, and
its evaluations as curves (``metric`` = the chosen column, ``train_loss`` = ``train/cross_entropy_error`` when
present). Every trial's full metadata and the study.json are kept in the group's ``config_json``.

Steps-to-result follows the archive's own rule (``measurement_utils.compute_steps_to_result``
after ``apply_step_budget``): among the trials counted, the first evaluation whose metric is
strictly below the target, at a step no larger than the step budget; ties go to the lowest
trial id. As the archive's loader does by default, only COMPLETE trials count: INFEASIBLE trials
(training diverged) are stored as ``diverged``, INCOMPLETE ones are left out (``incomplete=True``
counts them like COMPLETE ones). Shallue et al. (2019) take "the first 100 complete trials" at
each batch size: the counted trials by ascending trial id, up to the ``first``-th (default
:data:`FIRST_COMPLETE` = 100; ``first=None`` keeps every trial), with the INFEASIBLE trials drawn
before it; a batch size with fewer counted trials keeps them all.

A synthesized spec (``study.spec_json``, an :class:`experiments.spec.external.ExternalSpec` naming its
``source``) describes the workload to the report: goal, batch sizes, the search space (when every
batch size searched the same one) and the step budget.

Malformed or partial trees raise :class:`ArchiveError` (a file that cannot be read:
:class:`~experiments.exchange.batch_science_tree.ArchiveIOError`), one line naming the file. The
store is written into a temporary folder beside ``out`` and moved into place only when every
workload has been read, so a failed import leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.spec.external import ExternalSpec, external_spec
from experiments.store.schema import GroupRecord, StudyInfo, TrialRow
from experiments.spec.study import SpecError, canonical_json
from experiments.store.database import open_store
from experiments.exchange.batch_science_tree import (
    OPTIMIZERS, ArchiveError, ArchiveIOError, ArchiveStudy, ArchiveTrial, find_workloads,
    read_workload,
)

__all__ = ["FIRST_COMPLETE", "ArchiveError", "ArchiveIOError", "Imported", "first_hit",
           "first_trials", "group_record", "import_batch_science"]

SCALES = {"LOG_SCALE": "log", "REVERSE_LOG_SCALE": "reverse-log", "LINEAR_SCALE": "linear",
          "": "linear"}
# archive parameter name -> this library's search dimension
SEARCHED = {"learning_rate": "lr", "momentum": "momentum"}
# Shallue et al. (2019): steps-to-result over the first 100 complete trials of each batch size
FIRST_COMPLETE = 100


@dataclass(frozen=True)
class Imported:
    """One imported workload: its run folder, report name and how many batch sizes reached."""

    run_dir: Path
    name: str
    batch_sizes: int
    reached: int


# ---------------------------------------------------------------------------------------------
# the archive's steps-to-result rule and the store's rows


def first_hit(curve: tuple[tuple[int, float, float], ...], target: float,
              max_steps: int | None = None) -> int | None:
    """The first evaluation step whose metric is strictly below ``target`` (and at most
    ``max_steps``), as ``compute_steps_to_result`` with ``apply_step_budget``; None if none."""
    for step, _, metric in curve:
        if max_steps is not None and step > max_steps:
            return None
        if metric < target:
            return step
    return None


def _trial_row(t: ArchiveTrial, target: float, max_steps: int | None) -> TrialRow:
    hit = None if t.status == "INFEASIBLE" else first_hit(t.curve, target, max_steps)
    status = "diverged" if t.status == "INFEASIBLE" else ("reached" if hit is not None else "not_reached")
    final = t.curve[-1][2] if t.curve else None
    return TrialRow(trial=t.trial_id, lr=t.lr, momentum=t.momentum, decay_steps=t.decay_steps,
                    end_factor=t.end_factor, status=status, hit_step=hit, final_metric=final,
                    curve=t.curve)


def first_trials(trials: tuple[ArchiveTrial, ...], first: int | None = FIRST_COMPLETE,
                 incomplete: bool = False) -> list[ArchiveTrial]:
    """The trials a batch size keeps, by ascending id: the counted ones (COMPLETE, and INCOMPLETE
    with ``incomplete``) up to the ``first``-th, and the INFEASIBLE ones drawn before it; every
    counted and INFEASIBLE trial when ``first`` is None or more than the counted ones."""
    kept = sorted((t for t in trials if incomplete or t.status != "INCOMPLETE"),
                  key=lambda t: t.trial_id)
    counted = [t.trial_id for t in kept if t.status != "INFEASIBLE"]
    if first is None or len(counted) <= first:
        return kept
    return [t for t in kept if t.trial_id <= counted[first - 1]]


def group_record(study: ArchiveStudy, name: str, metric: str, target: float,
                 max_steps: int | None = None, incomplete: bool = False,
                 first: int | None = FIRST_COMPLETE) -> GroupRecord:
    """One batch size as a stored group (sparsity 0, seed 0); steps-to-result by the archive's
    rule over the counted trials of :func:`first_trials`, the best trial the earliest to hit
    (ties: lowest id)."""
    kept = first_trials(study.trials, first, incomplete)
    rows = tuple(_trial_row(t, target, max_steps) for t in kept)
    hits = [(r.hit_step, r.trial) for r in rows if r.hit_step is not None]
    steps, best = min(hits) if hits else (None, None)
    config = {"source": "batch_science", "workload": name, "study": study.doc,
              "goal": {"metric": metric, "target": target, "max_steps": max_steps},
              "incomplete_counted": incomplete, "first_complete": first,
              "trials": {str(t.trial_id): {"status": t.status, "steps": t.steps,
                                           "parameters": t.parameters} for t in study.trials}}
    text = canonical_json(config)
    budget = max_steps or study.train_steps or max((t.steps for t in kept), default=0)
    return GroupRecord(key=hashlib.sha256(text.encode()).hexdigest()[:20], sparsity=0.0,
                       batch_size=study.batch_size, seed=0, status="done", steps_to_result=steps,
                       best_trial=best, max_steps=budget, wall_time=0.0,
                       trial_steps=sum(t.steps for t in kept), config_json=text, trials=rows)


def _search(studies: list[ArchiveStudy]) -> dict[str, Any]:
    """The searched lr / momentum ranges, when every batch size searched the same ones."""
    configs = [s.doc.get("parameter_configs", {}) for s in studies]
    out = {}
    for name, dim in SEARCHED.items():
        cfg = configs[0].get(name)
        if (isinstance(cfg, dict) and all(c.get(name) == cfg for c in configs)
                and {"min_value", "max_value"} <= cfg.keys()):
            out[dim] = {"scale": SCALES.get(cfg.get("scale", ""), "linear"),
                        "min": cfg["min_value"], "max": cfg["max_value"], "relative": False}
    return out


def _span(values: list[int]) -> int | str:
    lo, hi = min(values), max(values)
    return lo if lo == hi else f"{lo}–{hi}"


def synthesized_spec(studies: list[ArchiveStudy], trial_counts: list[int], name: str,
                     metric: str, target: float, max_steps: int | None,
                     incomplete: bool, first: int | None = FIRST_COMPLETE) -> dict[str, Any]:
    """The spec the report reads for an imported workload (``study.spec_json``);
    ``trial_counts``: the trials stored per batch size."""
    top = studies[0]
    train = [s.train_steps for s in studies]
    budget = max_steps or (_span(train) if len(set(train)) == 1 and train[0] > 0 else
                           f"train_steps of each study.json ({_span(train)}; 0 = a time budget)")
    return {"name": name,
            "source": {"format": "batch_science", "workload": name, "incomplete_counted": incomplete,
                       "first_complete": "every trial" if first is None else first},
            "workload": {"dataset": top.dataset, "dataset_options": {}, "model": top.model,
                         "model_options": {}},
            "optimizer": OPTIMIZERS[top.optimizer],
            "goal": {"metric": metric, "target": target, "strict": True},
            "batch_sizes": [s.batch_size for s in studies], "sparsities": [0.0], "seeds": [0],
            "trials": _span(trial_counts), "search": _search(studies),
            "budget": {"max_steps": budget}, "probes": {"enabled": False}}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml_value, v)) + "]"
    return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"


def spec_toml(spec: dict[str, Any]) -> str:
    """The synthesized spec as TOML text (shown under Study specs in the report)."""
    lines = [f"# Imported from Shallue et al. (2019)'s batch_science archive: {spec['name']}",
             "# steps-to-result: the first evaluation with the goal metric below the target"]
    tables = []
    for key, value in spec.items():
        if isinstance(value, dict):
            tables += ["", f"[{key}]"] + [f"{k} = {_toml_value(v)}" for k, v in value.items()
                                          if v is not None]
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines + tables) + "\n"


def _write_workload(folder: Path, run_dir: Path, name: str, metric: str, target: float,
                    max_steps: int | None, incomplete: bool, first: int | None) -> Imported:
    """Write one workload's store: each group as soon as its study is read (a workload's curves
    never sit in memory whole), then the study row, whose spec needs every batch size."""
    studies, counts, reached = [], [], 0
    with open_store(run_dir) as store:
        for study in read_workload(folder, metric):
            rec = group_record(study, name, metric, target, max_steps, incomplete, first)
            store.write_group(rec)
            studies.append(replace(study, trials=()))
            counts.append(len(rec.trials))
            reached += rec.steps_to_result is not None
        spec = checked_spec(folder, synthesized_spec(studies, counts, name, metric, target,
                                                     max_steps, incomplete, first))
        store.init_study(StudyInfo(name=name, spec_toml=spec.toml, spec_json=spec.to_json(),
                                   spec_hash=spec.hash))
    return Imported(run_dir, name, len(studies), reached)


def checked_spec(folder: Path, spec: dict[str, Any]) -> ExternalSpec:
    """The synthesized spec as the store will read it back (:mod:`experiments.spec.external`)."""
    try:
        return external_spec(spec, toml_text=spec_toml(spec))
    except SpecError as exc:
        raise ArchiveError(f"{folder}: its study.json files give no valid spec "
                           f"({'; '.join(exc.problems)})") from None


# ---------------------------------------------------------------------------------------------
# the public function


def import_batch_science(path: str | os.PathLike, out: str | os.PathLike, metric: str,
                         target: float, *, all: bool = False, max_steps: int | None = None,
                         incomplete: bool = False,
                         first: int | None = FIRST_COMPLETE) -> list[Imported]:
    """Import the workload folder ``path`` (dataset/model/optimizer), or with ``all=True`` every
    workload below the archive root ``path``, into the run folder ``out`` (with ``all``: one run
    folder per workload at its relative path below ``out``).

    ``metric``: a measurements.csv column (e.g. ``val/classification_error``); ``target``: the
    goal, met by the first evaluation with ``metric < target``; ``max_steps``: the step budget
    (evaluations after it do not count); ``incomplete``: count INCOMPLETE trials too; ``first``:
    the counted trials per batch size, the first by trial id (Shallue et al.'s 100; None: every
    trial). ``out``
    must not exist yet (or be empty): an import never mixes with other results. Example::

        import_batch_science("batch_science/mnist/simple_cnn_base/nesterov_momentum",
                             "runs/mnist-cnn", "val/classification_error", 0.01)
    """
    root, out = Path(path), Path(out)
    if not isinstance(metric, str) or not metric:
        raise ArchiveError(f"metric must be a measurements.csv column name, got {metric!r}")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
        raise ArchiveError(f"target must be a finite number, got {target!r}")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                  or max_steps < 1):
        raise ArchiveError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 1):
        raise ArchiveError(f"first must be an integer >= 1 (the first complete trials counted "
                           f"per batch size) or None (every trial), got {first!r}")
    if not root.is_dir():
        raise ArchiveError(f"{root}: not a folder; expected a workload folder "
                           f"dataset/model/optimizer" + (" or the archive root" if all else ""))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ArchiveError(f"out folder {out}: already exists and is not empty; an import never "
                           f"mixes with other results: choose a new folder")
    workloads = ([(w, w.relative_to(root)) for w in find_workloads(root)] if all
                 else [(root, Path("."))])
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.importing-", dir=out.parent))
    try:
        done = []
        for folder, rel in workloads:
            parts = folder.resolve().parts[-3:-1] if rel == Path(".") else rel.parts[:-1]
            name = "/".join(parts) or folder.resolve().name
            done.append(_write_workload(folder, staging / rel, name, metric, float(target),
                                        max_steps, incomplete, first))
        if out.exists():
            out.rmdir()
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [Imported(out / r.run_dir.relative_to(staging), r.name, r.batch_sizes, r.reached)
            for r in done]
