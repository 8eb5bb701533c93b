"""The probes in the results store: the ``probes`` table, one row per quantity at each probed
step of each probed run (:class:`ProbeRow`), and the writer of a sparsity level's rows, its rows
at Lee et al.'s stage (``stage_probes``, :mod:`experiments.measures.stage.store`) with them, in
one transaction (:func:`write_probes`); the probed runs of a store, with their seconds
(:func:`probed_runs`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass

import pandas as pd

from experiments.measurement import Table
from experiments.store.database import Store, StoreContentError

PROBES = Table(
    "probes",
    ("sparsity", "seed", "batch_size", "step", "fraction", "quantity", "value", "seconds",
     "lib_version", "torch_version"),
    # the SQL as stores have held it since the table was made
    """
    sparsity REAL NOT NULL, seed INTEGER NOT NULL, batch_size INTEGER NOT NULL,
    step INTEGER NOT NULL, fraction REAL NOT NULL CHECK (fraction BETWEEN 0 AND 1),
    quantity TEXT NOT NULL, value REAL, seconds REAL,
    lib_version TEXT NOT NULL, torch_version TEXT NOT NULL,
    PRIMARY KEY (sparsity, seed, batch_size, step, quantity)""",
    sort=("sparsity", "seed", "batch_size", "step", "quantity"), volatile=("seconds",))

# theory.verdicts.trajectory.QUANTITIES, spelled out: the store's modules do not import torch
PROBE_QUANTITIES = ("g_sq", "trace_sigma", "b_simple", "b_noise", "g_h_g", "hessian_top",
                    "local_lipschitz", "loss")


@dataclass(frozen=True)
class ProbeRow:
    """One probe measurement along one run (``fraction`` = step / H); ``seconds``: wall time of
    that run's replay and measurements (the same on each of its rows)."""

    sparsity: float
    seed: int
    batch_size: int
    step: int
    fraction: float
    quantity: str
    value: float | None
    seconds: float | None = None


def probed_sparsities(store: Store) -> set[float]:
    """The sparsity levels whose probes are stored."""
    return {float(s) for s in store.frame(PROBES.name).sparsity.unique()}


def write_probes(store: Store, sparsity: float, rows: Sequence[ProbeRow],
                 stage: Sequence = ()) -> None:
    """Write all probe rows of one sparsity level, and its rows at Lee et al.'s stage
    (``stage``), in one transaction (replacing old ones; the level's stage rows only when
    ``stage`` holds some, :class:`~experiments.measures.stage.store.StageRow` s: L taken
    inside the runs came with the groups). A quantity not in :data:`PROBE_QUANTITIES`
    (``STAGE_QUANTITIES`` at the stage) is refused."""
    # late: importing the stage's package registers it, and it registers after the probes
    from experiments.measures.stage.store import STAGE_PROBES, STAGE_QUANTITIES

    for given, allowed in ((rows, PROBE_QUANTITIES), (stage, STAGE_QUANTITIES)):
        bad = sorted({r.quantity for r in given} - set(allowed))
        if bad:
            raise StoreContentError(f"probe quantities {bad}; allowed: {', '.join(allowed)}")
    level = float(sparsity)
    tables = {PROBES.name: [(level, *astuple(r)[1:]) for r in rows]}
    if stage:
        tables[STAGE_PROBES.name] = [astuple(r) for r in stage]
    store.replace_rows(tables, where={"sparsity": level})


def probed_runs(probes: pd.DataFrame, stage: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per probed run with its ``seconds``: the runs along [0, H] (one per (sparsity,
    seed, batch size)), and the runs probed only at Lee et al.'s stage (rows of ``stage``,
    the store's ``stage_probes``, whose seconds no run along [0, H] shares: the best trial's
    run is in both tables with the same seconds, and counts once)."""
    key = ["sparsity", "seed", "batch_size"]
    runs = probes.drop_duplicates(key)[key + ["seconds"]]
    if stage is None or not len(stage):
        return runs.reset_index(drop=True)
    staged = stage.drop_duplicates(key + ["trial"])[key + ["seconds"]]
    both = staged.merge(runs.drop_duplicates(), how="left", indicator=True)
    own = staged[both["_merge"].to_numpy() == "left_only"]
    return pd.concat([runs, own], ignore_index=True)
