"""Reading a study's store: :func:`load_results` gives its tables as pandas DataFrames sorted by
their natural keys (two stores with the same contents load identically, whatever order the groups
finished in) and its validated spec. It opens the store read-only: a table or column added since
the store was written reads empty (NULL), a renamed one under its new name, and nothing is
migrated (:mod:`experiments.store.upgrade`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from experiments.spec.errors import SpecError
from experiments.spec.external import StudySpec, external_spec, is_external
from experiments.spec.study import from_canonical
from experiments.store.database import DB_NAME, StoreContentError, check_is_store, failure
from experiments.store.schema import COLUMNS
from experiments.store.upgrade import read_frame

# the tables a Results holds as fields; every other one (``looks``, each measurement's) is in
# Results.tables
FIELDS = ("study", "groups", "trials", "curves", "programs")


@dataclass(frozen=True)
class Results:
    """A study's stored results as pandas DataFrames (see ``COLUMNS`` for the columns) and its
    validated :class:`~experiments.spec.study.Spec` (an :class:`~experiments.spec.external.ExternalSpec`
    for an imported workload; None while the store has no study row).

    ``study`` has one row; ``groups`` one per (sparsity, batch size, seed); ``trials`` one per
    trial; ``curves`` one per (trial, evaluation step); ``programs`` one per cell (batch size):
    the program every group of it ran (``groups.program``, each group's); ``predictions`` is
    empty unless something stored predictions. ``tables``: every other table, by name (each
    registered measurement's, :mod:`experiments.measurement`: ``probes``, one row per measured
    quantity; ``stage_probes``, one per quantity at each step k N of each probed trial at Lee
    et al.'s stage; ``branching``, ``warmup``, ``policy_runs``, a user's own; and ``looks``,
    one per look a group-sequential rule took while the study trained,
    :mod:`experiments.run.rounds`), also read as attributes (``results.branching``).
    """

    run_dir: Path
    study: pd.DataFrame
    groups: pd.DataFrame
    trials: pd.DataFrame
    curves: pd.DataFrame
    programs: pd.DataFrame = field(default_factory=pd.DataFrame)
    predictions: pd.DataFrame = field(default_factory=pd.DataFrame)
    spec: StudySpec | None = None
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)

    def __getattr__(self, name: str) -> pd.DataFrame:
        return table_attribute(self, name)


def table_attribute(obj: object, name: str) -> pd.DataFrame:
    """``obj.tables[name]`` for an attribute ``obj`` lacks (its ``tables`` may be unset while
    it is unpickled: then, and for an unknown table, AttributeError)."""
    tables = obj.__dict__.get("tables") if not name.startswith("__") else None
    if tables is None or name not in tables:
        raise AttributeError(f"{type(obj).__name__} has no attribute or table {name!r}; tables: "
                             f"{', '.join(tables or ())}")
    return tables[name]


def stored_spec(study: pd.DataFrame, path: Path) -> StudySpec | None:
    """The spec of a store's study row, validated again and checked against its stored hash: a
    :class:`Spec`, or for an imported workload (its spec names a ``source``) an
    :class:`~experiments.spec.external.ExternalSpec`."""
    if not len(study):
        return None
    row = study.iloc[0]
    try:
        canonical = json.loads(row["spec_json"])
        parse = external_spec if is_external(canonical) else from_canonical
        spec = parse(canonical, toml_text=str(row["spec_toml"]))
    except (SpecError, KeyError, TypeError, json.JSONDecodeError) as exc:
        reason = "; ".join(exc.problems) if isinstance(exc, SpecError) else repr(exc)
        raise StoreContentError(f"{path}: the stored spec is not a valid study spec ({reason}); "
                                f"was it written by another sparsescale version?") from None
    if spec.hash != row["spec_hash"]:
        raise StoreContentError(f"{path}: the stored spec does not give its stored hash "
                                f"({row['spec_hash'][:12]}); was it written by another "
                                f"sparsescale version?")
    return spec


def load_results(run_dir: str | Path) -> Results:
    """Read the store in ``run_dir`` into a :class:`Results` (frames sorted by natural keys).

    Raises :class:`StoreContentError` if ``run_dir`` holds no store (or no study, or not ours),
    :class:`StoreIOError` if the store cannot be read.
    """
    path = Path(run_dir) / DB_NAME
    if not path.exists():
        raise StoreContentError(f"no results store at {path}: run a study into {run_dir} first")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise failure(path, exc, "read") from None
    try:
        check_is_store(conn, path, empty_ok=False)
        frames = {table: read_frame(conn, table) for table in COLUMNS}
        has_pred = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='predictions'").fetchone()
        frames["predictions"] = (pd.read_sql_query("SELECT * FROM predictions", conn)
                                 if has_pred else pd.DataFrame())
    except sqlite3.DatabaseError as exc:
        raise failure(path, exc, "read") from None
    except pd.errors.DatabaseError as exc:   # pandas wraps errors of its queries
        raise StoreContentError(f"{path}: cannot read the results "
                                f"({str(exc).splitlines()[0]}); was it written by another "
                                f"sparsescale version?") from None
    finally:
        conn.close()
    return Results(run_dir=Path(run_dir), spec=stored_spec(frames["study"], path),
                   predictions=frames.pop("predictions"),
                   tables={t: frames.pop(t) for t in list(frames) if t not in FIELDS},
                   **frames)
