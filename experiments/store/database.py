"""The results store: one SQLite file per study (``RUN_DIR/results.sqlite``).

Stdlib ``sqlite3`` in WAL mode with explicit transactions. Only the driver process writes it: a
group's rows (its ``groups`` row, its ``trials`` and ``curves``) go in ONE transaction, so a study
killed at any moment leaves either the whole group or none of it, and a rerun simply redoes the
groups that are missing; the rows a measurement took inside the group's runs go in the same
transaction. Likewise each unit of work of a measurement (:meth:`Store.replace_rows`: a
sparsity level's probe rows, a (sparsity, seed)'s CBS(t) rows with its warmup comparison) is
one transaction. A store written before a table existed gains it when opened for writing and
reads as an empty table with the table's columns when only read. The ``study`` table holds exactly one row; opening a folder whose store was
made from a different spec (a different ``spec_hash``) is refused, so studies never mix.

Every refusal is a :class:`StoreError`, of one of two kinds: :class:`StoreContentError` (a
``ValueError``: the folder holds another study, another program's file, a corrupt store or no
store) or :class:`StoreIOError` (an ``OSError``: the store is locked or in use by another
process, the run folder is read-only, the disk is full). Each names the store's path.

Readers use :func:`experiments.store.results.load_results`, which returns pandas DataFrames
sorted by their natural keys (so two stores with the same contents load identically, whatever
order the groups finished in).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from training.config import ADAM_KEYS
from training.errors import SparsescaleError, SparsescaleIOError

from experiments.store.schema import COLUMNS, GroupRecord, StudyInfo, schema
from experiments.store.upgrade import add_columns, read_frame, rename_tables
from experiments.store.refusals import other_data, other_study

DB_NAME = "results.sqlite"


class StoreError(SparsescaleError):
    """The store cannot be opened, read or written as asked: a :class:`StoreContentError` or a
    :class:`StoreIOError` (catch this class for both; it is never raised itself)."""


class StoreContentError(StoreError, ValueError):
    """What the run folder holds cannot be used: a different study, another program's file, a
    corrupt store, no store (or no study) yet, rows of another version; or a bad row to write."""


class StoreIOError(StoreError, SparsescaleIOError):
    """The store file cannot be opened, locked or written: in use or locked by another process,
    a read-only run folder, a full disk, a run folder that cannot be made. Names the path."""


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


def _none_if_nan(x: float | None) -> float | None:
    # SQLite stores NaN as NULL anyway; be explicit so reads round-trip the same way
    return None if x is None or x != x else float(x)


def _cell(x: Any) -> Any:
    """A value as SQLite binds it: a NumPy scalar as its Python value, NaN as NULL."""
    x = x.item() if hasattr(x, "item") else x
    return _none_if_nan(x) if isinstance(x, float) else x


def failure(path: Path, exc: BaseException, action: str = "write") -> StoreError:
    """The error saying in one line why the store at ``path`` cannot be used, from an OSError or
    SQLite error: a :class:`StoreContentError` for a file that is no store of ours (corrupt, or
    another program's), else a :class:`StoreIOError` (full disk, locked, read-only or otherwise
    unusable). ``action``: what was tried, "write" or "read"."""
    msg = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        return StoreContentError(f"{path} is not a sparsescale results store ({msg}: corrupt, or "
                                 f"another program's file); move it away or choose another "
                                 f"--out folder")
    if "full" in msg or getattr(exc, "errno", None) == errno.ENOSPC:   # SQLITE_FULL / ENOSPC
        return StoreIOError(f"cannot write the results store {path}: the disk is full ({msg}); "
                            f"free some space or choose another --out folder")
    if "locked" in msg:
        return StoreIOError(f"{path} is locked by another process ({msg}); wait for it or "
                            f"choose another --out folder")
    if action == "read":
        return StoreIOError(f"cannot read the results store {path}: {msg}")
    return StoreIOError(f"cannot write the results store {path}: {msg} (is the run folder "
                        f"read-only?); choose a writable --out folder")


def check_is_store(conn: sqlite3.Connection, path: Path, empty_ok: bool = True) -> None:
    """Refuse a SQLite file made by another program. An empty file is a store not yet made (a
    first run killed at once): the writer makes it, a reader has nothing to read."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables and not empty_ok:
        raise StoreContentError(f"{path} holds no study yet: run a study into {path.parent} "
                                f"first")
    if tables and "study" not in tables:
        raise StoreContentError(f"{path} is not a sparsescale results store (it holds the "
                                f"tables {', '.join(sorted(tables))}); choose another --out "
                                f"folder")


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
    read-only folder or on a full disk raises :class:`StoreError` naming the reason
    (:class:`StoreIOError` for locked, in use, read-only and full; :class:`StoreContentError` for
    corrupt, another program's or another study's).
    """

    def __init__(self, run_dir: str | Path, create: bool = True):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / DB_NAME
        if not create and not self.path.exists():
            raise StoreContentError(f"no results store at {self.path}: run a study into "
                                    f"{self.run_dir} first")
        self._lock_fd: int | None = None
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            # autocommit mode: every write is wrapped in an explicit BEGIN IMMEDIATE ... COMMIT
            self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        except (OSError, sqlite3.Error) as exc:
            raise failure(self.path, exc) from None
        try:
            self._lock()
            check_is_store(self.conn, self.path)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            # an older store upgraded: its renamed tables first, or the schema would make
            # them empty beside the old ones (experiments.store.upgrade)
            self._write(rename_tables)
            self._write(lambda c: [c.execute(stmt) for stmt in _split_sql(schema())])
            self._write(add_columns)
        except BaseException as exc:
            self.close()
            if isinstance(exc, (OSError, sqlite3.Error)) and not isinstance(exc, StoreError):
                raise failure(self.path, exc) from None
            raise

    def _lock(self) -> None:
        import fcntl

        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreIOError(f"{self.path} is in use by another process"
                               f"{_flock_holder(self.path)}: a study is already running into "
                               f"{self.run_dir}; wait for it or choose another --out "
                               f"folder") from None
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
            raise failure(self.path, exc) from exc

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
                raise StoreContentError(other_study(self.path, existing, info))
            stored = self.conn.execute("SELECT dataset_json FROM study WHERE id = 1").fetchone()[0]
            if (why := other_data(self.path, stored, info.dataset_json)) is not None:
                raise StoreContentError(why)
            return
        self._write(lambda c: c.execute(
            "INSERT INTO study (id, name, spec_toml, spec_hash, spec_json, created, lib_version, "
            "torch_version, python_version, dataset_json) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (info.name, info.spec_toml, info.spec_hash, info.spec_json, now_iso(), lib_version(),
             torch_version(), sys.version.split()[0], info.dataset_json)))

    # -- groups --------------------------------------------------------------------------------

    def done_keys(self) -> set[str]:
        """Keys of groups finished successfully (failed groups are retried on a rerun)."""
        return {r[0] for r in self.conn.execute("SELECT key FROM groups WHERE status = 'done'")}

    def write_group(self, rec: GroupRecord) -> None:
        """Write one group (replacing an earlier failed attempt) in one transaction."""
        if rec.status not in ("done", "failed"):
            raise StoreContentError(f"group status {rec.status!r}; allowed: done, failed")
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
                 rec.error, rec.config_json, lv, tv, now_iso(), rec.program, rec.device,
                 rec.device_name, rec.cuda_version, rec.driver_version, rec.precision,
                 int(rec.delay)))
            c.executemany(
                f"INSERT INTO trials ({', '.join(COLUMNS['trials'])}) VALUES "
                f"({', '.join('?' * len(COLUMNS['trials']))})",
                [(rec.key, t.trial, float(rec.sparsity), int(rec.batch_size), int(rec.seed),
                  float(t.lr), float(t.momentum), t.decay_steps, float(t.end_factor),
                  float(t.lr) / (1.0 - float(t.momentum)), t.status, t.hit_step,
                  _none_if_nan(t.final_metric), *(_none_if_nan(getattr(t, k)) for k in ADAM_KEYS),
                  int(rec.delay))
                 for t in rec.trials])
            c.executemany(
                "INSERT INTO curves (group_key, trial, step, train_loss, metric) VALUES (?, ?, ?, ?, ?)",
                [(rec.key, t.trial, int(s), _none_if_nan(l), _none_if_nan(m))
                 for t in rec.trials for s, l, m in t.curve])
            # what a measurement took inside the group's runs (Measurement.watch)
            where = {"sparsity": float(rec.sparsity), "seed": int(rec.seed),
                     "batch_size": int(rec.batch_size)}
            for table, rows in rec.measured:
                if rows:
                    _replace(c, table, rows, where, {"lib_version": lv, "torch_version": tv})

        self._write(tx)

    # -- programs ------------------------------------------------------------------------------

    def programs(self) -> dict[int, str]:
        """The program recorded for each cell (batch size) of the study."""
        return {int(b): str(p) for b, p in
                self.conn.execute("SELECT batch_size, program FROM programs")}

    def record_programs(self, chosen: Mapping[int, tuple[str, str]]) -> dict[int, str]:
        """Record ``chosen`` (batch size -> (program, how it was chosen)) for the cells not yet
        recorded, in one transaction; a recorded cell keeps its program. Returns every cell's
        recorded program."""
        now = now_iso()

        def tx(c: sqlite3.Cursor) -> None:
            c.executemany(
                f"INSERT OR IGNORE INTO programs ({', '.join(COLUMNS['programs'])}) VALUES "
                "(?, ?, ?, ?)",
                [(int(b), str(p), str(how), now) for b, (p, how) in sorted(chosen.items())])

        self._write(tx)
        return self.programs()

    # -- looks -------------------------------------------------------------------------------

    def write_looks(self, taken: Sequence[Any]) -> None:
        """Replace the stored looks of a group-sequential rule with ``taken``
        (:class:`theory.verdicts.sequential.Look` s, in order), in one transaction."""
        now = now_iso()

        def tx(c: sqlite3.Cursor) -> None:
            c.execute("DELETE FROM looks")
            c.executemany(
                f"INSERT INTO looks ({', '.join(COLUMNS['looks'])}) VALUES "
                f"({', '.join('?' * len(COLUMNS['looks']))})",
                [(int(x.look), int(x.looks), int(x.pairs), float(x.mean),
                  _none_if_nan(x.interval[0]), _none_if_nan(x.interval[1]),
                  _none_if_nan(x.statistic), float(x.boundary), float(x.nominal), int(x.stop),
                  x.why, now) for x in taken])

        self._write(tx)

    # -- a measurement's rows -----------------------------------------------------------------

    def replace_rows(self, rows: Mapping[str, Sequence[Sequence[Any]]],
                     where: Mapping[str, Any] | None = None) -> None:
        """Replace the rows of each table of ``rows`` matching ``where`` (column -> value;
        None: every row) in one transaction: a measurement's unit of work is written whole or
        not at all. A row is a tuple in the order of ``COLUMNS[table]`` without the
        ``lib_version`` and ``torch_version`` columns, which are filled in where the table has
        them."""
        versions = {"lib_version": lib_version(), "torch_version": torch_version()}

        def tx(c: sqlite3.Cursor) -> None:
            for table, table_rows in rows.items():
                _replace(c, table, table_rows, where or {}, versions)

        self._write(tx)

    # -- reading -------------------------------------------------------------------------------

    def frame(self, table: str) -> pd.DataFrame:
        return read_frame(self.conn, table)


def stored_study(run_dir: str | Path) -> tuple[StudyInfo | None, set[str]]:
    """The study row and the keys of the finished groups of the store in ``run_dir``, read
    without writing anything; ``(None, set())`` where there is no store yet."""
    path = Path(run_dir) / DB_NAME
    if not path.exists():
        return None, set()
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise failure(path, exc, "read") from None
    try:
        check_is_store(conn, path)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "study" not in tables:
            return None, set()
        row = conn.execute(
            "SELECT name, spec_toml, spec_hash, spec_json FROM study WHERE id = 1").fetchone()
        keys = {r[0] for r in conn.execute("SELECT key FROM groups WHERE status = 'done'")}
    except sqlite3.DatabaseError as exc:
        raise failure(path, exc, "read") from None
    finally:
        conn.close()
    return (StudyInfo(*row) if row else None), keys


def _replace(c: sqlite3.Cursor, table: str, rows: Sequence[Sequence[Any]],
             where: Mapping[str, Any], versions: Mapping[str, str]) -> None:
    """Replace the rows of ``table`` matching ``where`` (column -> value; empty: every row) with
    ``rows``, tuples in the order of ``COLUMNS[table]`` without the ``versions`` columns, which
    are filled in where the table has them (:meth:`Store.replace_rows`)."""
    condition = " AND ".join(f"{k} = ?" for k in where) or "1"
    filled = [k for k in versions if k in COLUMNS[table]]
    names = [k for k in COLUMNS[table] if k not in versions] + filled
    c.execute(f"DELETE FROM {table} WHERE {condition}", tuple(where.values()))
    c.executemany(f"INSERT INTO {table} ({', '.join(names)}) VALUES "
                  f"({', '.join('?' * len(names))})",
                  [(*map(_cell, row), *(versions[k] for k in filled)) for row in rows])


def _split_sql(script: str) -> Iterable[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def open_store(run_dir: str | Path, study: StudyInfo | None = None) -> Store:
    """Open (creating if needed) the store in ``run_dir``; with ``study``, record it or refuse a
    store that holds a different study (:class:`StoreContentError`)."""
    store = Store(run_dir)
    if study is not None:
        try:
            store.init_study(study)
        except BaseException:
            store.close()
            raise
    return store
