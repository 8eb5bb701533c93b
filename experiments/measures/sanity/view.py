"""The report's sanity-check comparison: does the criterion, or only its layer densities, set the
cost of sparsity? (Frankle et al. 2021; Su et al. 2020.)

A study with ``[pruning] sanity = [...]`` stores one run per series (``experiments.spec.series``). For
every sanity series and sparsity level this module sets its measured curve beside its criterion's
(same criterion, same optimizer, no sanity check): the steps ratio at every batch size where both
reached the goal (median, min, max), both fitted B_crit with their intervals, and each series'
steps over the dense network's. Shuffled, matched-random and reinitialized masks keep the
criterion's layer densities (:data:`DENSITY_PRESERVING`); inverted scores do not.

The verdict (:func:`same_cost`, worded by ``experiments.report.prose.sanity_sentences``), per
(criterion, sparsity): the layer densities alone set the cost when every density-preserving
series needs within a factor :data:`SAME_COST_FACTOR` of the criterion's steps (median over batch
sizes); otherwise the criterion's choice of weights matters too. The factor is a tolerance for
run-to-run noise of steps-to-result, not a statistical test: the table's min / max and B_crit
intervals show how firm a verdict is.

It also reads each run's ``masks.json`` (written by the runner) for the per-layer density figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from experiments.report.analysis import Fits
from experiments.report.formatting import series_label
from experiments.report.runs import Run, RunSet
from experiments.spec.series import load_masks

DENSITY_PRESERVING = ("shuffle", "matched_random", "reinit")
SAME_COST_FACTOR = 1.25
COLUMNS = ["series", "criterion", "check", "sparsity", "points", "ratio", "ratio_min", "ratio_max",
           "ratio_to_dense", "criterion_ratio_to_dense", "b_crit", "b_crit_lo", "b_crit_hi",
           "criterion_b_crit", "criterion_b_crit_lo", "criterion_b_crit_hi"]
DENSITY_COLUMNS = ["series", "layer", "density", "kept", "total", "dead", "on_path", "connected"]


@dataclass(frozen=True)
class SanityPart:
    """``table``: one row per (sanity series, sparsity) (:data:`COLUMNS`); ``densities``:
    per-layer density of every series' mask (lowest seed) for the figure (:data:`DENSITY_COLUMNS`)."""

    table: pd.DataFrame
    densities: pd.DataFrame


def same_cost(ratio: float) -> bool:
    """Whether a steps ratio to the criterion lies within a factor :data:`SAME_COST_FACTOR`."""
    return 1 / SAME_COST_FACTOR <= ratio <= SAME_COST_FACTOR


def _criterion(run: Run, runs: RunSet) -> Run | None:
    """The run of ``run``'s criterion (same criterion and optimizer, no sanity check), if ``run``
    is a sanity series and its criterion is among the runs."""
    if not run.spec.pruning_sanity:
        return None
    return next((r for r in runs.runs if r.optimizer == run.optimizer
                 and not r.spec.pruning_sanity and r.spec.pruning_criterion == run.spec.pruning_criterion),
                None)


def _median_ratio(ratios: pd.DataFrame, series: str) -> float:
    r = ratios.loc[ratios["series"] == series, "ratio"]
    return float(r.median()) if len(r) else math.nan


def sanity_view(runs: RunSet, points: pd.DataFrame, fits: Fits, ratios: pd.DataFrame) -> SanityPart:
    """The comparison table and the density frame (see the module doc)."""
    ft = fits.table.set_index("series")
    reached = points[points["status"] == "reached"]
    rows = []
    for run in runs.runs:
        ref = _criterion(run, runs)
        if ref is None:
            continue
        for sparsity in sorted(s for s in run.spec.sparsities if s > 0):
            mine = series_label(run.label, sparsity, runs.combined)
            theirs = series_label(ref.label, sparsity, runs.combined)
            a = reached[reached["series"] == mine].set_index("batch_size")["steps"]
            b = reached[reached["series"] == theirs].set_index("batch_size")["steps"]
            ratio = (a / b).dropna()
            row = {"series": mine, "criterion": theirs, "check": run.spec.pruning_sanity,
                   "sparsity": sparsity, "points": len(ratio),
                   "ratio": float(ratio.median()) if len(ratio) else math.nan,
                   "ratio_min": float(ratio.min()) if len(ratio) else math.nan,
                   "ratio_max": float(ratio.max()) if len(ratio) else math.nan,
                   "ratio_to_dense": _median_ratio(ratios, mine),
                   "criterion_ratio_to_dense": _median_ratio(ratios, theirs)}
            for prefix, name in (("", mine), ("criterion_", theirs)):
                for k in ("b_crit", "b_crit_lo", "b_crit_hi"):
                    row[prefix + k] = float(ft.loc[name, k]) if name in ft.index else math.nan
            rows.append(row)
    return SanityPart(pd.DataFrame(rows, columns=COLUMNS), density_frame(runs))


def density_frame(runs: RunSet) -> pd.DataFrame:
    """Per-layer density of every stored mask of the lowest seed: series, layer, density, and the
    layer-collapse counts of its diagnosis (dead units, kept weights on a path)."""
    rows = []
    for run in runs.runs:
        entries = load_masks(run.results.run_dir)
        if not entries:
            continue
        first = min(e["seed"] for e in entries)
        for e in (e for e in entries if e["seed"] == first):
            d = e["diagnosis"]
            rows += [{"series": series_label(run.label, e["sparsity"], runs.combined),
                      "layer": layer["name"], "density": layer["density"], "kept": layer["kept"],
                      "total": layer["total"], "dead": layer["dead"], "on_path": layer["on_path"],
                      "connected": d["connected"]} for layer in d["layers"]]
    return pd.DataFrame(rows, columns=DENSITY_COLUMNS)
