"""The results store's schema: its tables and columns, and the rows a study writes.

``COLUMNS`` is the contract between the writer (:mod:`experiments.store.database`), the readers
(:func:`experiments.store.results.load_results`) and the report: tables and columns are added;
the one column renamed (``groups.kernel``, now ``groups.program``) is in ``RENAMED_COLUMNS``, a
table renamed in ``RENAMED_TABLES`` (its :class:`~experiments.measurement.Table`'s ``former``
names), and a store holding an old name is read, and migrated when opened for writing, under
the new one (:mod:`experiments.store.upgrade`).
Workers return :class:`GroupRecord` (with its :class:`TrialRow` s, and the rows a measurement
took inside its runs) as plain picklable data; :class:`StudyInfo` is the study's one row.

The core tables (``CORE_*``, :data:`CORE_SCHEMA`) are the study's own; every registered
measurement (:mod:`experiments.measurement`) adds its tables, and ``COLUMNS``, ``SORT_KEYS``,
``ADDED_COLUMNS``, ``VOLATILE``, ``RENAMED_TABLES`` and :func:`schema` are the core ones
followed by theirs (:class:`WithMeasurements`): the schema names no kind of measurement. The
group-sequential rule's ``looks`` (:mod:`experiments.run.rounds`) is a core table: the stopping
rule is the study's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from experiments import measurement

# Column order is the contract with the report (experiments/report/write.py); add, and rename
# only through RENAMED_COLUMNS. The core tables; COLUMNS adds every registered measurement's.
CORE_COLUMNS: dict[str, tuple[str, ...]] = {
    "study": ("name", "spec_toml", "spec_hash", "spec_json", "created", "lib_version",
              "torch_version", "python_version", "dataset_json"),
    "groups": ("key", "sparsity", "batch_size", "seed", "status", "steps_to_result", "best_trial",
               "max_steps", "n_trials", "n_reached", "n_diverged", "wall_time", "trial_steps",
               "error", "config_json", "lib_version", "torch_version", "finished", "program",
               "device", "device_name", "cuda_version", "driver_version", "precision", "delay"),
    "trials": ("group_key", "trial", "sparsity", "batch_size", "seed", "lr", "momentum",
               "decay_steps", "end_factor", "effective_lr", "status", "hit_step", "final_metric",
               "beta1", "beta2", "eps", "weight_decay", "delay"),
    "curves": ("group_key", "trial", "step", "train_loss", "metric"),
    "programs": ("batch_size", "program", "choice", "recorded"),
    "looks": ("look", "looks", "pairs", "mean", "low", "high", "statistic", "boundary",
              "nominal", "stop", "why", "recorded"),
}

CORE_SORT_KEYS: dict[str, list[str]] = {
    "groups": ["sparsity", "batch_size", "delay", "seed", "key"],
    "trials": ["sparsity", "batch_size", "delay", "seed", "group_key", "trial"],
    "curves": ["group_key", "trial", "step"],
    "programs": ["batch_size"],
    "looks": ["look"],
}

# Integer columns that may hold NULL: read as pandas' nullable Int64 (not float with NaN).
# (A measurement's own: its Table's nullable_int.)
NULLABLE_INT = ("steps_to_result", "best_trial", "hit_step", "decay_steps", "examples")

# The gradient delay of a group's trials (training.delay): every group of a store written before
# the delay axis trained synchronously, so it reads 0.
DELAY_TYPE = "INTEGER NOT NULL DEFAULT 0"

# Columns added after their table was first written: (name, SQL type), nullable unless the type
# gives a DEFAULT. A store written before them gains them when opened for writing (its rows read
# NULL, or the default); a read-only reader of such a store reads the same.
CORE_ADDED_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "study": (("dataset_json", "TEXT"),),
    "groups": (("program", "TEXT"), ("device", "TEXT"), ("device_name", "TEXT"),
               ("cuda_version", "TEXT"), ("driver_version", "TEXT"), ("precision", "TEXT"),
               ("delay", DELAY_TYPE)),
    "trials": (("beta1", "REAL"), ("beta2", "REAL"), ("eps", "REAL"), ("weight_decay", "REAL"),
               ("delay", DELAY_TYPE)),
}

# Columns renamed after stores were written with the old name: table -> ((old, new), ...). A
# store holding the old name gets the new one when opened for writing (ALTER TABLE ... RENAME
# COLUMN); a read-only reader reads the old column under the new name.
RENAMED_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "groups": (("kernel", "program"),),   # until 2026-12: "kernel" named the program
}


# Columns that legitimately differ between two runs of the same spec.
CORE_VOLATILE = {"study": ("created",), "groups": ("wall_time", "finished"),
                 "programs": ("recorded",), "looks": ("recorded",)}

CORE_SCHEMA = """
CREATE TABLE IF NOT EXISTS study (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    name TEXT NOT NULL, spec_toml TEXT NOT NULL, spec_hash TEXT NOT NULL, spec_json TEXT NOT NULL,
    created TEXT NOT NULL, lib_version TEXT NOT NULL, torch_version TEXT NOT NULL,
    python_version TEXT NOT NULL,
    dataset_json TEXT);   -- the data set's provenance (e.g. python_source's Python version and corpus digest)
CREATE TABLE IF NOT EXISTS groups (
    key TEXT PRIMARY KEY, sparsity REAL NOT NULL, batch_size INTEGER NOT NULL,
    seed INTEGER NOT NULL, status TEXT NOT NULL CHECK (status IN ('done', 'failed')),
    steps_to_result INTEGER, best_trial INTEGER, max_steps INTEGER NOT NULL,
    n_trials INTEGER NOT NULL, n_reached INTEGER NOT NULL, n_diverged INTEGER NOT NULL,
    wall_time REAL NOT NULL, trial_steps INTEGER NOT NULL, error TEXT, config_json TEXT NOT NULL,
    lib_version TEXT NOT NULL, torch_version TEXT NOT NULL, finished TEXT NOT NULL,
    program TEXT,   -- the program that trained the group (training.engine.programs.PROGRAMS), "kernel" in stores before 2026-12
    device TEXT, device_name TEXT,          -- training.device.device_info of the worker's device
    cuda_version TEXT, driver_version TEXT, -- NULL on the CPU
    precision TEXT,                         -- training.device.PRECISIONS
    delay INTEGER NOT NULL DEFAULT 0);      -- the trials' gradient delay (training.delay)
CREATE TABLE IF NOT EXISTS trials (
    group_key TEXT NOT NULL REFERENCES groups(key), trial INTEGER NOT NULL,
    sparsity REAL NOT NULL, batch_size INTEGER NOT NULL, seed INTEGER NOT NULL,
    lr REAL NOT NULL, momentum REAL NOT NULL, decay_steps INTEGER, end_factor REAL NOT NULL,
    effective_lr REAL NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('reached', 'not_reached', 'diverged')),
    hit_step INTEGER, final_metric REAL,
    beta1 REAL, beta2 REAL, eps REAL, weight_decay REAL,   -- adam / adamw trials only
    delay INTEGER NOT NULL DEFAULT 0,                      -- its group's
    PRIMARY KEY (group_key, trial));
CREATE TABLE IF NOT EXISTS curves (
    group_key TEXT NOT NULL REFERENCES groups(key), trial INTEGER NOT NULL, step INTEGER NOT NULL,
    train_loss REAL, metric REAL, PRIMARY KEY (group_key, trial, step));
CREATE TABLE IF NOT EXISTS programs (
    batch_size INTEGER PRIMARY KEY,   -- the cell: a study's model, optimizer and precision are one
    program TEXT NOT NULL,            -- training.engine.programs.registry.PROGRAMS: every group of the cell runs it
    choice TEXT NOT NULL,             -- how it was chosen: ruled | measured | forced, or groups (those a store held before the table)
    recorded TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS looks (   -- a group-sequential rule's looks (experiments.run.rounds)
    look INTEGER PRIMARY KEY, looks INTEGER NOT NULL, pairs INTEGER NOT NULL,
    mean REAL NOT NULL, low REAL, high REAL,   -- paired mean log ratio, repeated interval
    statistic REAL, boundary REAL NOT NULL, nominal REAL NOT NULL,
    stop INTEGER NOT NULL,   -- 1: the study stopped at this look (no later round trained)
    why TEXT NOT NULL, recorded TEXT NOT NULL);
"""

@dataclass(frozen=True)
class TrialRow:
    """One trial of a group, as stored (``status``: reached | not_reached | diverged). The Adam
    keys are None for the SGD family, which does not use them."""

    trial: int
    lr: float
    momentum: float
    decay_steps: int | None
    end_factor: float
    status: str
    hit_step: int | None
    final_metric: float | None
    curve: tuple[tuple[int, float, float], ...] = ()   # (step, train_loss, metric) rows
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None


@dataclass(frozen=True)
class GroupRecord:
    """Everything one finished (or failed) group writes, as plain picklable data."""

    key: str
    sparsity: float
    batch_size: int
    seed: int
    status: str
    steps_to_result: int | None
    best_trial: int | None
    max_steps: int
    wall_time: float
    trial_steps: int
    config_json: str
    trials: tuple[TrialRow, ...] = ()
    error: str | None = None
    program: str | None = None   # training.TrialsResult.program (None: failed)
    # where and in which arithmetic it trained (training.device.DeviceInfo; None: not known)
    device: str | None = None
    device_name: str | None = None
    cuda_version: str | None = None
    driver_version: str | None = None
    precision: str | None = None
    delay: int = 0   # its trials' gradient delay (training.delay)
    # rows a measurement took inside its runs (experiments.measurement.Measurement.watch), by
    # table: each replaces that table's rows of the group's (sparsity, seed, batch_size)
    measured: tuple[tuple[str, tuple[tuple[Any, ...], ...]], ...] = ()

    @property
    def n_reached(self) -> int:
        return sum(t.status == "reached" for t in self.trials)

    @property
    def n_diverged(self) -> int:
        return sum(t.status == "diverged" for t in self.trials)


@dataclass(frozen=True)
class StudyInfo:
    """The study's row. ``dataset_json``: the data set's ``provenance`` as key-sorted JSON
    (how it was made: files, generator, sizes, and the digests that tell data sets apart, such
    as ``python_source``'s ``python_version`` and ``corpus_digest``), None when not known."""

    name: str
    spec_toml: str
    spec_hash: str
    spec_json: str
    dataset_json: str | None = field(default=None, compare=False)


class WithMeasurements(Mapping):
    """A core mapping and, after it, the entries ``entries`` gives for every registered
    measurement's table (:func:`experiments.measurement.tables`; falsy values left out): read
    at each use, so a measurement registered later (a user's, imported by its spec) is in the
    schema of every store opened after it."""

    def __init__(self, core: Mapping[str, Any],
                 entries: Callable[[measurement.Table], Iterable[tuple[str, Any]]]):
        self.core = core
        self.entries = entries

    def _all(self) -> dict[str, Any]:
        own = [kv for t in measurement.tables().values() for kv in self.entries(t)]
        return {**self.core, **{k: v for k, v in own if v}}

    def __getitem__(self, table: str) -> Any:
        return self._all()[table]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def per_table(field: Callable[[measurement.Table], Any]
              ) -> Callable[[measurement.Table], Iterable[tuple[str, Any]]]:
    """The entries of :class:`WithMeasurements` keyed by table name: ``field`` of each."""
    return lambda t: ((t.name, field(t)),)


COLUMNS = WithMeasurements(CORE_COLUMNS, per_table(lambda t: t.columns))
SORT_KEYS = WithMeasurements(CORE_SORT_KEYS, per_table(lambda t: list(t.sort)))
ADDED_COLUMNS = WithMeasurements(CORE_ADDED_COLUMNS, per_table(lambda t: t.added))
VOLATILE = WithMeasurements(CORE_VOLATILE, per_table(lambda t: t.volatile))
TABLE_NULLABLE_INT = WithMeasurements({}, per_table(lambda t: t.nullable_int))
# Tables renamed after stores were written with the old name: old -> new (each Table's
# ``former`` names). A store holding the old table gets the new name when opened for writing
# (ALTER TABLE ... RENAME TO); a read-only reader reads the old table under the new name.
RENAMED_TABLES = WithMeasurements({}, lambda t: ((old, t.name) for old in t.former))


def schema() -> str:
    """The SQL script that makes every table: the core ones, then each measurement's."""
    return CORE_SCHEMA + "".join(f"{t.create()};\n" for t in measurement.tables().values())
