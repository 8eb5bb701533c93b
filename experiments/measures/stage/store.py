"""Lee et al. (2021)'s stage in the results store: the ``stage_probes`` table, one row per
quantity at each step k N of each probed trial (:class:`StageRow`), written with the probes'
level by the replay path (:func:`experiments.measures.probes.store.write_probes`) or with the
group when L is taken inside the run (:class:`experiments.measures.stage.inside.InsideL`). A
store written before 2026-12 holds it as ``schedule_probes`` (the table's ``former`` name,
:data:`experiments.store.schema.RENAMED_TABLES`)."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.measurement import Table

STAGE_PROBES = Table(
    "stage_probes",
    ("sparsity", "seed", "batch_size", "trial", "step", "horizon", "quantity", "value",
     "examples", "seconds", "lib_version", "torch_version"),
    # the SQL as stores have held it since the table was made, comments included
    """   -- L at Lee et al.'s stage: every N steps to the goal
    sparsity REAL NOT NULL, seed INTEGER NOT NULL, batch_size INTEGER NOT NULL,
    trial INTEGER NOT NULL, step INTEGER NOT NULL,
    horizon INTEGER NOT NULL,   -- the trial's own steps-to-result: the run ends there
    quantity TEXT NOT NULL, value REAL,
    examples INTEGER,           -- the sample L's gradients used (NULL: the whole training split)
    seconds REAL, lib_version TEXT NOT NULL, torch_version TEXT NOT NULL,
    PRIMARY KEY (sparsity, seed, batch_size, trial, step, quantity)""",
    sort=("sparsity", "seed", "batch_size", "trial", "step", "quantity"),
    volatile=("seconds",),
    former=("schedule_probes",))   # until 2026-12: "schedule" named Lee et al.'s stage

# at Lee et al.'s stage: L (on lipschitz_examples, or the split), the noise and the loss at the
# same points, and L on the whole split where lipschitz_check asks for it
STAGE_QUANTITIES = ("local_lipschitz", "local_lipschitz_full", "g_sq", "trace_sigma",
                    "b_simple", "loss")


@dataclass(frozen=True)
class StageRow:
    """One measurement at Lee et al.'s stage: trial ``trial`` of the group (sparsity, seed,
    batch_size), at step ``step`` = k N of its run, which reached the goal at ``horizon``;
    ``examples``: the sample L's gradients used (None: the whole training split; rows of
    ``local_lipschitz_full`` always None); ``seconds``: that run's replay and measurements."""

    sparsity: float
    seed: int
    batch_size: int
    trial: int
    step: int
    horizon: int
    quantity: str
    value: float | None
    examples: int | None = None
    seconds: float | None = None
