"""The shoot-out's rows in the results store: one table, ``policy_runs``, one row per (sparsity,
seed, policy, replicate) (:class:`PolicyRunRow`; a store written before it reads it empty),
read as every table is (``load_results(run_dir).policy_runs``).

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

from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields

from experiments.measurement import Table
from experiments.store.database import Store


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


_TYPES = {"sparsity": "REAL", "seed": "INTEGER", "policy": "TEXT", "replicate": "INTEGER",
          "batch_size": "INTEGER", "steps_to_result": "INTEGER", "examples_to_result": "INTEGER",
          "seconds_to_result": "REAL", "max_steps": "INTEGER", "schedule": "TEXT",
          "decisions": "TEXT", "measured_examples": "INTEGER", "t_fixed": "REAL",
          "t_example": "REAL", "seconds": "REAL"}
_COLUMNS = tuple(f.name for f in fields(PolicyRunRow))
POLICY_RUNS = Table(
    "policy_runs", _COLUMNS,
    ", ".join(f"{c} {_TYPES[c]}" for c in _COLUMNS)
    + ", PRIMARY KEY (sparsity, seed, policy, replicate)",
    sort=("sparsity", "seed", "policy", "replicate"), volatile=("seconds",),
    nullable_int=("steps_to_result", "examples_to_result"))


def done(store: Store) -> set[tuple[float, int]]:
    """(sparsity, seed) pairs whose shoot-out is stored."""
    frame = store.frame(POLICY_RUNS.name)
    return {(float(a), int(b)) for a, b in zip(frame.sparsity, frame.seed)}


def write(store: Store, sparsity: float, seed: int, rows: Sequence[PolicyRunRow]) -> None:
    """One (sparsity, seed)'s rows in one transaction, replacing the old ones."""
    store.replace_rows({POLICY_RUNS.name: [astuple(r) for r in rows]},
                       where={"sparsity": float(sparsity), "seed": int(seed)})
