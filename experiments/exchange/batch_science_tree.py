"""Reading Shallue et al. (2019)'s ``batch_science`` archive tree, with one-line errors.

The layout (google-research/google-research, ``batch_science/README.md`` and ``data_loader.py``)::

    dataset/model/optimizer/batch_size/study.json               batch_size, dataset, model,
                                                                optimizer, train_steps,
                                                                parameter_configs
    dataset/model/optimizer/batch_size/trial_id/metadata.json   parameters, status, steps
    dataset/model/optimizer/batch_size/trial_id/measurements.csv
                                                                step, then {train,val,test}/...

Folders below a workload are named by integers (batch sizes, then trial ids); evaluations are
unevenly spaced, and the metric columns differ by model. Anything else raises
:class:`ArchiveError` (a ``ValueError``), one line naming the file, what was found and what is
expected; a file that cannot be read raises :class:`ArchiveIOError` (an ``OSError``) naming it.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.errors import SparsescaleError, SparsescaleIOError

OPTIMIZERS = {"sgd": "sgd", "momentum": "momentum", "nesterov_momentum": "nesterov"}
STATUSES = ("COMPLETE", "INCOMPLETE", "INFEASIBLE")
TRAIN_LOSS = "train/cross_entropy_error"


class ArchiveError(SparsescaleError, ValueError):
    """A batch_science tree cannot be imported: names the file and what was wrong."""


class ArchiveIOError(SparsescaleIOError):
    """A file of a batch_science tree cannot be read (permissions, an IO error): names it."""


@dataclass(frozen=True)
class ArchiveTrial:
    """One trial: its metaparameters (archive names in ``parameters``) and its evaluations
    ``curve`` = ((step, train loss, metric), ...) in ascending step order (NaN: not measured)."""

    trial_id: int
    status: str
    parameters: dict[str, Any]
    steps: int
    lr: float
    momentum: float
    decay_steps: int | None
    end_factor: float
    curve: tuple[tuple[int, float, float], ...]


@dataclass(frozen=True)
class ArchiveStudy:
    """One batch size of a workload: study.json (``doc``) and its trials by ascending id."""

    path: Path
    batch_size: int
    dataset: str
    model: str
    optimizer: str
    train_steps: int
    doc: dict[str, Any]
    trials: tuple[ArchiveTrial, ...]


# ---------------------------------------------------------------------------------------------
# reading the tree


def _json(path: Path, needed_by: str) -> dict[str, Any]:
    if not path.is_file():
        raise ArchiveError(f"{path}: missing ({needed_by})")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArchiveIOError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArchiveError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ArchiveError(f"{path}: expected a JSON object, found {type(doc).__name__}")
    return doc


def _field(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path,
           default: Any = ...) -> Any:
    if key not in doc:
        if default is not ...:
            return default
        raise ArchiveError(f"{path}: key {key!r} missing")
    value = doc[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not ok:
        raise ArchiveError(f"{path}: {key!r} is {value!r}; expected {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "an object"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _numbered(folder: Path, what: str) -> list[tuple[int, Path]]:
    """Sub-folders of ``folder`` by number: every one must be named by an integer ``what``."""
    out = []
    for entry in sorted(folder.iterdir()):
        if not entry.is_dir():
            continue
        if not (entry.name.isascii() and entry.name.isdigit()):
            raise ArchiveError(f"{entry}: folder name {entry.name!r} is not an integer {what}; "
                               f"the archive names {what} folders by number")
        out.append((int(entry.name), entry))
    if not out:
        raise ArchiveError(f"{folder}: no {what} folders")
    return sorted(out)


def _number(text: str, path: Path, line: int, column: str) -> float:
    try:
        return float(text) if text.strip() else math.nan
    except ValueError:
        raise ArchiveError(f"{path}: line {line}: {column} is {text!r}; expected a number") from None


def read_measurements(path: Path, metric: str) -> tuple[tuple[int, float, float], ...]:
    """(step, train loss, metric) rows of one measurements.csv, ascending in step."""
    if not path.is_file():
        raise ArchiveError(f"{path}: missing (every trial folder holds measurements.csv)")
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise ArchiveIOError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ArchiveError(f"{path}: not a readable CSV file ({exc})") from None
    header = rows[0] if rows else []
    for column in ("step", metric):
        if column not in header:
            raise ArchiveError(f"{path}: no column {column!r}; columns: {', '.join(header) or 'none'}")
    i_step, i_metric = header.index("step"), header.index(metric)
    i_loss = header.index(TRAIN_LOSS) if TRAIN_LOSS in header else None
    curve: dict[int, tuple[int, float, float]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise ArchiveError(f"{path}: line {line} has {len(row)} fields; the header has {len(header)}")
        step = _number(row[i_step], path, line, "step")
        if not (step >= 0 and float(step).is_integer()):
            raise ArchiveError(f"{path}: line {line}: step is {row[i_step]!r}; expected an integer >= 0")
        if int(step) in curve:
            raise ArchiveError(f"{path}: line {line}: step {int(step)} appears twice")
        loss = _number(row[i_loss], path, line, TRAIN_LOSS) if i_loss is not None else math.nan
        curve[int(step)] = (int(step), loss, _number(row[i_metric], path, line, metric))
    return tuple(curve[s] for s in sorted(curve))


def read_trial(folder: Path, trial_id: int, metric: str, momentum_used: bool) -> ArchiveTrial:
    """One trial folder: metadata.json and measurements.csv."""
    path = folder / "metadata.json"
    doc = _json(path, "every trial folder holds metadata.json")
    if _field(doc, "trial_id", int, path, trial_id) != trial_id:
        raise ArchiveError(f"{path}: trial_id is {doc['trial_id']!r} but the folder is {folder.name}")
    status = _field(doc, "status", str, path)
    if status not in STATUSES:
        raise ArchiveError(f"{path}: status is {status!r}; allowed: {', '.join(STATUSES)}")
    params = _field(doc, "parameters", dict, path)
    lr = _field(params, "learning_rate", (int, float), path)
    momentum = _field(params, "momentum", (int, float), path) if momentum_used else 0.0
    if not 0.0 <= momentum < 1.0:
        raise ArchiveError(f"{path}: momentum is {momentum!r}; expected a number in [0, 1)")
    decay = _field(params, "learning_rate_decay_steps", int, path, None)
    end_factor = _field(params, "end_learning_rate_factor", (int, float), path, 1.0)
    curve = read_measurements(folder / "measurements.csv", metric)
    steps = _field(doc, "steps", int, path, curve[-1][0] if curve else 0)
    return ArchiveTrial(trial_id, status, params, steps, float(lr), float(momentum), decay,
                        float(end_factor), curve)


def read_study(folder: Path, batch_size: int, metric: str) -> ArchiveStudy:
    """One batch-size folder: study.json and every trial below it."""
    path = folder / "study.json"
    doc = _json(path, "every batch-size folder holds study.json")
    if _field(doc, "batch_size", int, path) != batch_size:
        raise ArchiveError(f"{path}: batch_size is {doc['batch_size']!r} but the folder is {folder.name}")
    optimizer = _field(doc, "optimizer", str, path)
    if optimizer not in OPTIMIZERS:
        raise ArchiveError(f"{path}: optimizer {optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")
    train_steps = _field(doc, "train_steps", int, path)
    _field(doc, "parameter_configs", dict, path, {})
    trials = tuple(read_trial(d, i, metric, optimizer != "sgd") for i, d in _numbered(folder, "trial id"))
    return ArchiveStudy(folder, batch_size, _field(doc, "dataset", str, path),
                        _field(doc, "model", str, path), optimizer, train_steps, doc, trials)


def read_workload(folder: Path, metric: str) -> Iterator[ArchiveStudy]:
    """The studies of one workload folder by ascending batch size (read one at a time, so an
    archive-sized workload never sits in memory whole)."""
    if (folder / "study.json").exists():
        raise ArchiveError(f"{folder}: is one study (one batch size); pass its parent, the "
                           f"workload folder dataset/model/optimizer")
    first = None
    for b, d in _numbered(folder, "batch size"):
        study = read_study(d, b, metric)
        first = first or study
        for key in ("dataset", "model", "optimizer"):
            if getattr(study, key) != getattr(first, key):
                raise ArchiveError(f"{d / 'study.json'}: {key} is {getattr(study, key)!r} but "
                                   f"{first.path / 'study.json'} says {getattr(first, key)!r}; "
                                   f"one workload folder holds one {key}")
        yield study


def find_workloads(root: Path) -> list[Path]:
    """Every workload folder below ``root``: the parents of folders holding study.json."""
    found = sorted({p.parent.parent for p in root.rglob("study.json")})
    if not found:
        raise ArchiveError(f"{root}: no study.json below it; expected "
                           f"dataset/model/optimizer/batch_size/study.json")
    return found
