"""The results store: one SQLite file per study (``RUN_DIR/results.sqlite``).

Stdlib ``sqlite3`` in WAL mode with explicit transactions. Only the driver process writes it: a
group's rows (its ``groups`` row, its ``trials`` and ``curves``) go in ONE transaction, so a study
killed at any moment leaves either the whole group or none of it, and a rerun simply redoes the
groups that are missing. The ``study`` table holds exactly one row; opening a folder whose store was
made from a different spec (a different ``spec_hash``) is refused, so studies never mix.

Readers use :func:`load_results`, which returns pandas DataFrames sorted by their natural keys (so
two stores with the same contents load identically, whatever order the groups finished in).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
from training.errors import SparsescaleError

DB_NAME = "results.sqlite"


class StoreError(SparsescaleError):
    """The store cannot be opened or written as asked (e.g. it holds a different study)."""


def lib_version() -> str:
    try:
        return metadata.version("sparsescale")
    except metadata.PackageNotFoundError:
        return "unknown"


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# Column order is the contract with the report (experiments/report.py); add, never rename.
COLUMNS: dict[str, tuple[str, ...]] = {
    "study": ("name", "spec_toml", "spec_hash", "spec_json", "created", "lib_version",
              "torch_version", "python_version"),
    "groups": ("key", "sparsity", "batch_size", "seed", "status", "steps_to_result", "best_trial",
               "max_steps", "n_trials", "n_reached", "n_diverged", "wall_time", "trial_steps",
               "error", "config_json", "lib_version", "torch_version", "finished"),
    "trials": ("group_key", "trial", "sparsity", "batch_size", "seed", "lr", "momentum",
               "decay_steps", "end_factor", "effective_lr", "status", "hit_step", "final_metric"),
    "curves": ("group_key", "trial", "step", "train_loss", "metric"),
    "probes": ("sparsity", "phase", "step", "batch_size", "quantity", "value", "lib_version",
               "torch_version"),
}

SORT_KEYS: dict[str, list[str]] = {
    "groups": ["sparsity", "batch_size", "seed", "key"],
    "trials": ["sparsity", "batch_size", "seed", "group_key", "trial"],
    "curves": ["group_key", "trial", "step"],
    "probes": ["sparsity", "phase", "step", "quantity"],
}

# Integer columns that may hold NULL: read as pandas' nullable Int64 (not float with NaN).
NULLABLE_INT = ("steps_to_result", "best_trial", "hit_step", "decay_steps")

# Columns that legitimately differ between two runs of the same spec.
VOLATILE = {"study": ("created",), "groups": ("wall_time", "finished")}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS study (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    name TEXT NOT NULL, spec_toml TEXT NOT NULL, spec_hash TEXT NOT NULL, spec_json TEXT NOT NULL,
    created TEXT NOT NULL, lib_version TEXT NOT NULL, torch_version TEXT NOT NULL,
    python_version TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS groups (
    key TEXT PRIMARY KEY, sparsity REAL NOT NULL, batch_size INTEGER NOT NULL,
    seed INTEGER NOT NULL, status TEXT NOT NULL CHECK (status IN ('done', 'failed')),
    steps_to_result INTEGER, best_trial INTEGER, max_steps INTEGER NOT NULL,
    n_trials INTEGER NOT NULL, n_reached INTEGER NOT NULL, n_diverged INTEGER NOT NULL,
    wall_time REAL NOT NULL, trial_steps INTEGER NOT NULL, error TEXT, config_json TEXT NOT NULL,
    lib_version TEXT NOT NULL, torch_version TEXT NOT NULL, finished TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    group_key TEXT NOT NULL REFERENCES groups(key), trial INTEGER NOT NULL,
    sparsity REAL NOT NULL, batch_size INTEGER NOT NULL, seed INTEGER NOT NULL,
    lr REAL NOT NULL, momentum REAL NOT NULL, decay_steps INTEGER, end_factor REAL NOT NULL,
    effective_lr REAL NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('reached', 'not_reached', 'diverged')),
    hit_step INTEGER, final_metric REAL, PRIMARY KEY (group_key, trial));
CREATE TABLE IF NOT EXISTS curves (
    group_key TEXT NOT NULL REFERENCES groups(key), trial INTEGER NOT NULL, step INTEGER NOT NULL,
    train_loss REAL, metric REAL, PRIMARY KEY (group_key, trial, step));
CREATE TABLE IF NOT EXISTS probes (
    sparsity REAL NOT NULL, phase TEXT NOT NULL CHECK (phase IN ('init', 'trajectory')),
    step INTEGER NOT NULL, batch_size INTEGER, quantity TEXT NOT NULL, value REAL,
    lib_version TEXT NOT NULL, torch_version TEXT NOT NULL,
    PRIMARY KEY (sparsity, phase, step, quantity));
"""

PROBE_QUANTITIES = ("g_sq", "trace_sigma", "b_simple", "b_noise", "hessian_top",
                    "local_lipschitz", "loss", "grad_norm_sq")


@dataclass(frozen=True)
class TrialRow:
    """One trial of a group, as stored (``status``: reached | not_reached | diverged)."""

    trial: int
    lr: float
    momentum: float
    decay_steps: int | None
    end_factor: float
    status: str
    hit_step: int | None
    final_metric: float | None
    curve: tuple[tuple[int, float, float], ...] = ()   # (step, train_loss, metric) rows


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

    @property
    def n_reached(self) -> int:
        return sum(t.status == "reached" for t in self.trials)

    @property
    def n_diverged(self) -> int:
        return sum(t.status == "diverged" for t in self.trials)


@dataclass(frozen=True)
class ProbeRow:
    sparsity: float
    phase: str
    step: int
    batch_size: int | None
    quantity: str
    value: float | None


@dataclass(frozen=True)
class StudyInfo:
    name: str
    spec_toml: str
    spec_hash: str
    spec_json: str


def _none_if_nan(x: float | None) -> float | None:
    # SQLite stores NaN as NULL anyway; be explicit so reads round-trip the same way
    return None if x is None or x != x else float(x)


def explain(path: Path, exc: BaseException) -> str:
    """One line saying why the store at ``path`` cannot be used, from an OSError or SQLite error."""
    msg = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        return (f"{path} is not a sparsescale results store ({msg}: corrupt, or another "
                f"program's file); move it away or choose another --out folder")
    if "full" in msg or getattr(exc, "errno", None) == errno.ENOSPC:   # SQLITE_FULL / ENOSPC
        return (f"cannot write the results store {path}: the disk is full ({msg}); free some "
                f"space or choose another --out folder")
    if "locked" in msg:
        return (f"{path} is locked by another process ({msg}); wait for it or choose another "
                f"--out folder")
    return (f"cannot write the results store {path}: {msg} (is the run folder read-only?); "
            f"choose a writable --out folder")


def check_is_store(conn: sqlite3.Connection, path: Path, empty_ok: bool = True) -> None:
    """Refuse a SQLite file made by another program. An empty file is a store not yet made (a
    first run killed at once): the writer makes it, a reader has nothing to read."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables and not empty_ok:
        raise StoreError(f"{path} holds no study yet: run a study into {path.parent} first")
    if tables and "study" not in tables:
        raise StoreError(f"{path} is not a sparsescale results store (it holds the tables "
                         f"{', '.join(sorted(tables))}); choose another --out folder")


def _flock_holder(path: Path) -> str:
    """" (pid N)" of the process holding a flock on ``path`` (Linux /proc/locks), else ""."""
    try:
        inode = str(path.stat().st_ino)
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if "FLOCK" in fields[1:2] and fields[5].rsplit(":", 1)[-1] == inode:
                return f" (pid {fields[4]})"
    except (OSError, IndexError):
        pass
    return ""


class Store:
    """An open results store. Use :func:`open_store` (creates or checks the study row).

    The writer holds an exclusive ``flock`` on the store file while it is open, so a second
    driver on the same run folder is refused at once; the kernel drops the lock when the
    process ends, however it ends. A store that is locked, corrupt, another program's, in a
    read-only folder or on a full disk raises :class:`StoreError` naming the reason.
    """

    def __init__(self, run_dir: str | Path, create: bool = True):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / DB_NAME
        if not create and not self.path.exists():
            raise StoreError(f"no results store at {self.path}: run a study into {self.run_dir} first")
        self._lock_fd: int | None = None
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            # autocommit mode: every write is wrapped in an explicit BEGIN IMMEDIATE ... COMMIT
            self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(explain(self.path, exc)) from None
        try:
            self._lock()
            check_is_store(self.conn, self.path)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            self._write(lambda c: [c.execute(stmt) for stmt in _split_sql(_SCHEMA)])
        except BaseException as exc:
            self.close()
            if isinstance(exc, (OSError, sqlite3.Error)):
                raise StoreError(explain(self.path, exc)) from None
            raise

    def _lock(self) -> None:
        import fcntl

        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"{self.path} is in use by another process{_flock_holder(self.path)}: "
                             f"a study is already running into {self.run_dir}; wait for it or "
                             f"choose another --out folder") from None
        self._lock_fd = fd

    def close(self) -> None:
        self.conn.close()
        # after the connection: closing another descriptor of the file would drop SQLite's own
        # POSIX locks while it still held them
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _write(self, fn) -> None:
        cur = self.conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                fn(cur)
            except BaseException:
                if self.conn.in_transaction:   # SQLite may have rolled back already (disk full)
                    cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")
        except sqlite3.OperationalError as exc:   # disk full, read-only, locked: say which
            raise StoreError(explain(self.path, exc)) from exc

    # -- study ---------------------------------------------------------------------------------

    def study(self) -> StudyInfo | None:
        row = self.conn.execute(
            "SELECT name, spec_toml, spec_hash, spec_json FROM study WHERE id = 1").fetchone()
        return StudyInfo(*row) if row else None

    def init_study(self, info: StudyInfo) -> None:
        """Record the study, or check that the store already holds this same study."""
        existing = self.study()
        if existing is not None:
            if existing.spec_hash != info.spec_hash:
                raise StoreError(
                    f"{self.path} holds a different study ({existing.name!r}, spec hash "
                    f"{existing.spec_hash[:12]}) than the one given ({info.name!r}, spec hash "
                    f"{info.spec_hash[:12]}); studies are never mixed: choose another --out folder")
            return
        self._write(lambda c: c.execute(
            "INSERT INTO study (id, name, spec_toml, spec_hash, spec_json, created, lib_version, "
            "torch_version, python_version) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)",
            (info.name, info.spec_toml, info.spec_hash, info.spec_json, now_iso(), lib_version(),
             torch_version(), sys.version.split()[0])))

    # -- groups --------------------------------------------------------------------------------

    def done_keys(self) -> set[str]:
        """Keys of groups finished successfully (failed groups are retried on a rerun)."""
        return {r[0] for r in self.conn.execute("SELECT key FROM groups WHERE status = 'done'")}

    def write_group(self, rec: GroupRecord) -> None:
        """Write one group (replacing an earlier failed attempt) in one transaction."""
        if rec.status not in ("done", "failed"):
            raise StoreError(f"group status {rec.status!r}; allowed: done, failed")
        lv, tv = lib_version(), torch_version()

        def tx(c: sqlite3.Cursor) -> None:
            for table in ("curves", "trials"):
                c.execute(f"DELETE FROM {table} WHERE group_key = ?", (rec.key,))
            c.execute("DELETE FROM groups WHERE key = ?", (rec.key,))
            c.execute(
                f"INSERT INTO groups ({', '.join(COLUMNS['groups'])}) VALUES "
                f"({', '.join('?' * len(COLUMNS['groups']))})",
                (rec.key, float(rec.sparsity), int(rec.batch_size), int(rec.seed), rec.status,
                 rec.steps_to_result, rec.best_trial, int(rec.max_steps), len(rec.trials),
                 rec.n_reached, rec.n_diverged, float(rec.wall_time), int(rec.trial_steps),
                 rec.error, rec.config_json, lv, tv, now_iso()))
            c.executemany(
                f"INSERT INTO trials ({', '.join(COLUMNS['trials'])}) VALUES "
                f"({', '.join('?' * len(COLUMNS['trials']))})",
                [(rec.key, t.trial, float(rec.sparsity), int(rec.batch_size), int(rec.seed),
                  float(t.lr), float(t.momentum), t.decay_steps, float(t.end_factor),
                  float(t.lr) / (1.0 - float(t.momentum)), t.status, t.hit_step,
                  _none_if_nan(t.final_metric)) for t in rec.trials])
            c.executemany(
                "INSERT INTO curves (group_key, trial, step, train_loss, metric) VALUES (?, ?, ?, ?, ?)",
                [(rec.key, t.trial, int(s), _none_if_nan(l), _none_if_nan(m))
                 for t in rec.trials for s, l, m in t.curve])

        self._write(tx)

    # -- probes --------------------------------------------------------------------------------

    def probed_sparsities(self) -> set[float]:
        return {float(r[0]) for r in self.conn.execute("SELECT DISTINCT sparsity FROM probes")}

    def write_probes(self, sparsity: float, rows: Sequence[ProbeRow]) -> None:
        """Write all probe rows of one sparsity level in one transaction (replacing old ones)."""
        bad = sorted({r.quantity for r in rows} - set(PROBE_QUANTITIES))
        if bad:
            raise StoreError(f"probe quantities {bad}; allowed: {', '.join(PROBE_QUANTITIES)}")
        lv, tv = lib_version(), torch_version()

        def tx(c: sqlite3.Cursor) -> None:
            c.execute("DELETE FROM probes WHERE sparsity = ?", (float(sparsity),))
            c.executemany(
                f"INSERT INTO probes ({', '.join(COLUMNS['probes'])}) VALUES "
                f"({', '.join('?' * len(COLUMNS['probes']))})",
                [(float(sparsity), r.phase, int(r.step), r.batch_size, r.quantity,
                  _none_if_nan(r.value), lv, tv) for r in rows])

        self._write(tx)

    # -- reading -------------------------------------------------------------------------------

    def frame(self, table: str) -> pd.DataFrame:
        return _read_frame(self.conn, table)


def _split_sql(script: str) -> Iterable[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _read_frame(conn: sqlite3.Connection, table: str) -> pd.DataFrame:
    df = pd.read_sql_query(f"SELECT {', '.join(COLUMNS[table])} FROM {table}", conn)
    for col in NULLABLE_INT:
        if col in df.columns:
            df[col] = df[col].astype("Int64")
    if table in SORT_KEYS and len(df):
        df = df.sort_values(SORT_KEYS[table], kind="stable").reset_index(drop=True)
    return df


def open_store(run_dir: str | Path, study: StudyInfo | None = None) -> Store:
    """Open (creating if needed) the store in ``run_dir``; with ``study``, record it or refuse a
    store that holds a different study (:class:`StoreError`)."""
    store = Store(run_dir)
    if study is not None:
        try:
            store.init_study(study)
        except BaseException:
            store.close()
            raise
    return store


@dataclass(frozen=True)
class Results:
    """A study's stored results as pandas DataFrames (see ``COLUMNS`` for the columns).

    ``study`` has one row; ``groups`` one per (sparsity, batch size, seed); ``trials`` one per
    trial; ``curves`` one per (trial, evaluation step); ``probes`` one per measured quantity;
    ``predictions`` is empty unless something stored predictions.
    """

    run_dir: Path
    study: pd.DataFrame
    groups: pd.DataFrame
    trials: pd.DataFrame
    curves: pd.DataFrame
    probes: pd.DataFrame
    predictions: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def spec(self) -> dict[str, Any]:
        """The validated spec as a dict (``study.spec_json`` decoded)."""
        import json

        return json.loads(self.study["spec_json"].iloc[0]) if len(self.study) else {}


def load_results(run_dir: str | Path) -> Results:
    """Read the store in ``run_dir`` into a :class:`Results` (frames sorted by natural keys).

    Raises :class:`StoreError` if ``run_dir`` holds no store.
    """
    path = Path(run_dir) / DB_NAME
    if not path.exists():
        raise StoreError(f"no results store at {path}: run a study into {run_dir} first")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(explain(path, exc)) from None
    try:
        check_is_store(conn, path, empty_ok=False)
        frames = {table: _read_frame(conn, table) for table in COLUMNS}
        has_pred = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='predictions'").fetchone()
        frames["predictions"] = (pd.read_sql_query("SELECT * FROM predictions", conn)
                                 if has_pred else pd.DataFrame())
    except sqlite3.DatabaseError as exc:
        raise StoreError(explain(path, exc)) from None
    except pd.errors.DatabaseError as exc:   # pandas wraps errors of its queries
        raise StoreError(f"{path}: cannot read the results ({str(exc).splitlines()[0]}); was it "
                         f"written by another sparsescale version?") from None
    finally:
        conn.close()
    return Results(run_dir=Path(run_dir), **frames)
