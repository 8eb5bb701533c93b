"""The shoot-out's rows in the results store: one table, ``policy_runs``, one row per (sparsity,
seed, policy, replicate), defined and written here (a store written before it reads it empty).

Columns: ``policy`` (its name in the spec; ``best fixed`` for the sweep's best fixed batch
size), ``replicate`` (data order), ``batch_size`` (the starting B; for the best fixed B, that
B), ``steps_to_result`` / ``examples_to_result`` (NULL: not reached in the budget),
``seconds_to_result`` (modelled: sum over segments of steps x t(B), the sweep's time model),
``max_steps``, ``schedule`` (JSON [[start_step, batch_size, lr_scale], ...]), ``decisions``
(JSON [[step, examples, b_simple, batch_size, lr_scale], ...]), ``measured_examples`` (the
noise readings' cost), ``t_fixed`` / ``t_example`` (the time model), ``seconds`` (the task's
own wall time).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path

import pandas as pd

from experiments.store.database import DB_NAME, Store, failure

TABLE = "policy_runs"


@dataclass(frozen=True)
class PolicyRunRow:
    """One row of ``policy_runs`` (module docstring)."""

    sparsity: float
    seed: int
    policy: str
    replicate: int
    batch_size: int
    steps_to_result: int | None
    examples_to_result: int | None
    seconds_to_result: float | None
    max_steps: int
    schedule: str
    decisions: str
    measured_examples: int
    t_fixed: float
    t_example: float
    seconds: float


COLUMNS = tuple(f.name for f in fields(PolicyRunRow))
_TYPES = {"sparsity": "REAL", "seed": "INTEGER", "policy": "TEXT", "replicate": "INTEGER",
          "batch_size": "INTEGER", "steps_to_result": "INTEGER", "examples_to_result": "INTEGER",
          "seconds_to_result": "REAL", "max_steps": "INTEGER", "schedule": "TEXT",
          "decisions": "TEXT", "measured_examples": "INTEGER", "t_fixed": "REAL",
          "t_example": "REAL", "seconds": "REAL"}
CREATE = (f"CREATE TABLE IF NOT EXISTS {TABLE} ("
          + ", ".join(f"{c} {_TYPES[c]}" for c in COLUMNS)
          + ", PRIMARY KEY (sparsity, seed, policy, replicate))")


def done(store: Store) -> set[tuple[float, int]]:
    """(sparsity, seed) pairs whose shoot-out is stored."""
    store.conn.execute(CREATE)
    return {(float(a), int(b)) for a, b in
            store.conn.execute(f"SELECT DISTINCT sparsity, seed FROM {TABLE}")}


def write(store: Store, sparsity: float, seed: int, rows: Sequence[PolicyRunRow]) -> None:
    """One (sparsity, seed)'s rows in one transaction, replacing the old ones."""
    cur = store.conn.cursor()
    try:
        cur.execute("BEGIN IMMEDIATE")
        cur.execute(CREATE)
        cur.execute(f"DELETE FROM {TABLE} WHERE sparsity = ? AND seed = ?", (float(sparsity), int(seed)))
        cur.executemany(f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(COLUMNS))})",
                        [tuple(None if isinstance(v, float) and math.isnan(v) else v
                               for v in astuple(r)) for r in rows])
        cur.execute("COMMIT")
    except sqlite3.Error as exc:
        if store.conn.in_transaction:
            cur.execute("ROLLBACK")
        raise failure(store.path, exc) from exc


def read(run_dir: str | Path) -> pd.DataFrame:
    """The stored rows of ``run_dir`` (read-only; empty when none were written)."""
    path = Path(run_dir) / DB_NAME
    if not path.exists():
        return pd.DataFrame(columns=list(COLUMNS))
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if not conn.execute("SELECT name FROM sqlite_master WHERE name = ?", (TABLE,)).fetchone():
            return pd.DataFrame(columns=list(COLUMNS))
        df = pd.read_sql_query(f"SELECT {', '.join(COLUMNS)} FROM {TABLE}", conn)
    except sqlite3.Error as exc:
        raise failure(path, exc, "read") from None
    finally:
        conn.close()
    for col in ("steps_to_result", "examples_to_result"):
        df[col] = df[col].astype("Int64")
    return df.sort_values(["sparsity", "seed", "policy", "replicate"], kind="stable").reset_index(drop=True)
