"""Lee et al. (2021)'s tuning of a study (``[tuning]``, :mod:`experiments.spec.tables.tuning`):
the search, then the best point of every (sparsity, batch size).

- :func:`search_spec`: the search sub-study: ``points`` Sobol points of ``[search]`` per cell,
  the tuning's seed, no probes, no branching, no stopping rule; its store in
  ``RUN_DIR/search``.
- :func:`best_points`: from the search's stored trials, each cell's best point: the fewest
  steps to the goal among the trials that met it (ties: the lower trial index, the earlier
  Sobol point); where none met it, the lowest final metric (every goal here is "lower is
  better": an error or a loss); diverged trials never.
- :func:`tune`: run the search (a rerun skips what its store holds) and return the study with
  its cells' points (``Spec.tuned``), which :func:`experiments.spec.plan.tuned_points` repeats
  ``trials`` times.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from training.config import ADAM_KEYS
from training.errors import SparsescaleError

from experiments.spec.study import Spec
from experiments.spec.tables.probes import Probes
from experiments.store.database import open_store

SEARCH_DIR = "search"


class TuningError(SparsescaleError, ValueError):
    """A cell of a tuned study has no point to repeat: every trial of its search diverged."""


def search_spec(spec: Spec) -> Spec:
    """The search sub-study of the tuned study ``spec`` (module docstring)."""
    t = spec.tuning
    if t is None:
        raise TuningError(f"study {spec.name!r} has no [tuning] table: nothing to search")
    return replace(spec, name=f"{spec.name}-search", trials=t.points, seeds=(t.seed,),
                   tuning=None, tuned={}, stopping=None, probes=Probes(enabled=False),
                   branching=replace(spec.branching, enabled=False), subdir=SEARCH_DIR)


def point_of(row: pd.Series) -> dict[str, Any]:
    """The trial dict (``experiments.spec.search.sample``'s form) of a stored trial row."""
    decay = row.get("decay_steps")
    point: dict[str, Any] = {"lr": float(row.lr), "momentum": float(row.momentum),
                             "decay_steps": None if pd.isna(decay) else int(decay),
                             "end_factor": float(row.end_factor)}
    point.update({k: float(row[k]) for k in ADAM_KEYS if k in row and not pd.isna(row[k])})
    return point


def best_points(groups: pd.DataFrame, trials: pd.DataFrame
                ) -> dict[tuple[float, int], dict[str, Any]]:
    """Each (sparsity, batch size)'s best point over the stored ``trials`` of a search's
    finished ``groups`` (module docstring); raises :class:`TuningError` for a cell whose trials all
    diverged."""
    rows = trials[trials.group_key.isin(groups.key[groups.status == "done"])]
    out = {}
    for (s, b), cell in rows.groupby(["sparsity", "batch_size"]):
        reached = cell[cell.status == "reached"]
        if len(reached):
            best = reached.sort_values(["hit_step", "seed", "trial"], kind="stable").iloc[0]
        else:
            finite = cell[(cell.status == "not_reached")
                          & cell.final_metric.map(lambda v: v is not None and math.isfinite(v))]
            if not len(finite):
                raise TuningError(f"no point to repeat at sparsity {s:g}, batch size {int(b)}: "
                                  "every trial of the search diverged; allowed: a search space "
                                  "with smaller learning rates")
            best = finite.sort_values(["final_metric", "seed", "trial"], kind="stable").iloc[0]
        out[(float(s), int(b))] = point_of(best)
    return out


def tune(spec: Spec, out: Path, search: Callable[[Spec, Path], Path]) -> Spec:
    """``spec`` with its cells' tuned points: ``search(search_spec(spec), out / "search")``
    runs (or completes) the search sub-study and returns its run folder, whose store gives the
    points (:func:`best_points`)."""
    folder = search(search_spec(spec), Path(out) / SEARCH_DIR)
    with open_store(folder) as store:
        points = best_points(store.frame("groups"), store.frame("trials"))
    missing = [(s, b) for s in spec.sparsities for b in spec.batch_sizes
               if (float(s), int(b)) not in points]
    if missing:
        raise TuningError("the search stored no group at " + ", ".join(
            f"sparsity {s:g}, batch size {b}" for s, b in missing) + "; allowed: rerun the "
            "study (a rerun completes the search)")
    return replace(spec, tuned=points)

