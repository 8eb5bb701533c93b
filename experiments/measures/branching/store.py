"""The branching measurement's store tables and rows: ``branching``, CBS(t) at each checkpoint of
a (sparsity, seed)'s base run (:class:`BranchRow`), and ``warmup``, each replicate of the
batch-size warmup and of the fixed batch sizes it is compared with (:class:`WarmupRow`). A
(sparsity, seed)'s rows of both are written in one transaction (:func:`write_branching`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass

from experiments.measurement import Table

BRANCHING = Table(
    "branching",
    ("sparsity", "seed", "step", "critical_batch", "low", "high", "examples", "batch_size",
     "goal_step", "window", "k_max", "n_seeds", "eps", "trial_steps", "lib_version",
     "torch_version", "seconds"),
    """sparsity REAL NOT NULL, seed INTEGER NOT NULL, step INTEGER NOT NULL,
    critical_batch REAL NOT NULL, low REAL NOT NULL, high REAL NOT NULL,
    examples INTEGER NOT NULL, batch_size INTEGER NOT NULL, goal_step INTEGER NOT NULL,
    window INTEGER NOT NULL, k_max INTEGER NOT NULL, n_seeds INTEGER NOT NULL, eps REAL NOT NULL,
    trial_steps INTEGER NOT NULL, lib_version TEXT NOT NULL, torch_version TEXT NOT NULL,
    seconds REAL,   -- wall time of the whole (sparsity, seed) measurement, warmup included
    PRIMARY KEY (sparsity, seed, step)""",
    sort=("sparsity", "seed", "step"), volatile=("seconds",), added=(("seconds", "REAL"),))

WARMUP = Table(
    "warmup",
    ("sparsity", "seed", "kind", "batch_size", "replicate", "steps_to_result",
     "examples_to_result", "max_steps", "examples_budget", "schedule", "trial_steps"),
    """sparsity REAL NOT NULL, seed INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('warmup', 'fixed')), batch_size INTEGER NOT NULL,
    replicate INTEGER NOT NULL, steps_to_result INTEGER, examples_to_result INTEGER,
    max_steps INTEGER NOT NULL, examples_budget INTEGER NOT NULL, schedule TEXT NOT NULL,
    trial_steps INTEGER NOT NULL, PRIMARY KEY (sparsity, seed, kind, batch_size, replicate)""",
    sort=("sparsity", "seed", "kind", "batch_size", "replicate"),
    nullable_int=("steps_to_result", "examples_to_result"))


@dataclass(frozen=True)
class BranchRow:
    """CBS(t) at one checkpoint of one (sparsity, seed)'s base run (batch ``batch_size``, goal
    step ``goal_step``, ``examples`` = step x batch_size), with its interval; ``trial_steps``:
    the whole measurement's cost and ``seconds`` its wall time, warmup included (the same on
    each of its rows; None: not known)."""

    sparsity: float
    seed: int
    step: int
    critical_batch: float
    low: float
    high: float
    examples: int
    batch_size: int
    goal_step: int
    window: int
    k_max: int
    n_seeds: int
    eps: float
    trial_steps: int
    seconds: float | None = None


@dataclass(frozen=True)
class WarmupRow:
    """One replicate of the CBS(t) warmup (``kind="warmup"``, ``batch_size`` its largest) or of a
    fixed batch size (``kind="fixed"``) under ``examples_budget`` examples; ``schedule``: the
    warmup's segments as JSON [[start_step, batch_size, lr_scale], ...]; ``trial_steps``: the
    whole comparison's cost (the same on each of its rows)."""

    sparsity: float
    seed: int
    kind: str
    batch_size: int
    replicate: int
    steps_to_result: int | None
    examples_to_result: int | None
    max_steps: int
    examples_budget: int
    schedule: str
    trial_steps: int


def branched(store) -> set[tuple[float, int]]:
    """(sparsity, seed) pairs whose branching measurement is stored."""
    frame = store.frame("branching")
    return {(float(s), int(seed)) for s, seed in zip(frame.sparsity, frame.seed)}


def write_branching(store, sparsity: float, seed: int, rows: Sequence[BranchRow],
                    warmup: Sequence[WarmupRow] = ()) -> None:
    """Write one (sparsity, seed)'s CBS(t) rows and warmup rows in one transaction (replacing
    old ones)."""
    key = (float(sparsity), int(seed))
    store.replace_rows({"branching": [(*key, *astuple(r)[2:]) for r in rows],
                        "warmup": [(*key, *astuple(w)[2:]) for w in warmup]},
                       {"sparsity": key[0], "seed": key[1]})
