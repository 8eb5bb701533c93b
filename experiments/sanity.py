"""The report's sanity-check comparison: does the criterion, or only its layer densities, set the
cost of sparsity? (Frankle et al. 2021; Su et al. 2020.)

A study with ``[pruning] sanity = [...]`` stores one run per series (``experiments.series``). For
every sanity series and sparsity level this module sets its measured curve beside its criterion's
(same method, same optimizer, no sanity check): the steps ratio at every batch size where both
reached the goal (median, min, max), both fitted B_crit with their intervals, and each series'
steps over the dense network's. Shuffled, matched-random and reinitialized masks keep the
criterion's layer densities (:data:`DENSITY_PRESERVING`); inverted scores do not.

The verdict, one sentence per (criterion, sparsity): the layer densities alone set the cost when
every density-preserving series needs within a factor :data:`SAME_COST_FACTOR` of the criterion's
steps (median over batch sizes); otherwise the criterion's choice of weights matters too. The
factor is a tolerance for run-to-run noise of steps-to-result, not a statistical test: the
table's min / max and B_crit intervals show how firm a verdict is.

It also reads each run's ``masks.json`` (written by the runner) for the per-layer density figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .findings import Fits, Run, fmt_interval, fmt_num, fmt_pct, series_label
from .series import load_masks

DENSITY_PRESERVING = ("shuffle", "matched_random", "reinit")
SAME_COST_FACTOR = 1.25
WORDS = {"shuffle": "shuffled", "matched_random": "matched-random", "reinit": "reinitialized",
         "invert": "inverted"}
COLUMNS = ["series", "criterion", "check", "sparsity", "points", "ratio", "ratio_min", "ratio_max",
           "ratio_to_dense", "criterion_ratio_to_dense", "b_crit", "b_crit_lo", "b_crit_hi",
           "criterion_b_crit", "criterion_b_crit_lo", "criterion_b_crit_hi"]


@dataclass(frozen=True)
class SanityPart:
    """``table``: one row per (sanity series, sparsity) (:data:`COLUMNS`); ``sentences``: the
    verdicts; ``densities``: per-layer density of every series' mask (first seed) for the figure."""

    table: pd.DataFrame
    sentences: list[str]
    densities: pd.DataFrame


def _criterion(run: Run, runs: tuple[Run, ...]) -> Run | None:
    pr = run.spec.get("pruning", {})
    if not pr.get("sanity"):
        return None
    return next((r for r in runs if r.optimizer == run.optimizer and not r.spec["pruning"].get("sanity")
                 and r.spec["pruning"]["method"] == pr["method"]), None)


def _median_ratio(ratios: pd.DataFrame, series: str) -> float:
    r = ratios.loc[ratios["series"] == series, "ratio"]
    return float(r.median()) if len(r) else float("nan")


def sanity_view(runs: tuple[Run, ...], points: pd.DataFrame, fits: Fits,
                ratios: pd.DataFrame) -> SanityPart:
    """The comparison table, the verdict sentences and the density frame (see the module doc)."""
    combined = len(runs) > 1
    ft = fits.table.set_index("series")
    reached = points[points["status"] == "reached"]
    rows = []
    for run in runs:
        ref = _criterion(run, runs)
        if ref is None:
            continue
        for sparsity in sorted(s for s in run.spec["sparsities"] if s > 0):
            mine, theirs = series_label(run, sparsity, combined), series_label(ref, sparsity, combined)
            a = reached[reached["series"] == mine].set_index("batch_size")["steps"]
            b = reached[reached["series"] == theirs].set_index("batch_size")["steps"]
            ratio = (a / b).dropna()
            row = {"series": mine, "criterion": theirs, "check": run.spec["pruning"]["sanity"],
                   "sparsity": sparsity, "points": len(ratio),
                   "ratio": float(ratio.median()) if len(ratio) else float("nan"),
                   "ratio_min": float(ratio.min()) if len(ratio) else float("nan"),
                   "ratio_max": float(ratio.max()) if len(ratio) else float("nan"),
                   "ratio_to_dense": _median_ratio(ratios, mine),
                   "criterion_ratio_to_dense": _median_ratio(ratios, theirs)}
            for prefix, name in (("", mine), ("criterion_", theirs)):
                for k in ("b_crit", "b_crit_lo", "b_crit_hi"):
                    row[prefix + k] = float(ft.loc[name, k]) if name in ft.index else float("nan")
            rows.append(row)
    table = pd.DataFrame(rows, columns=COLUMNS)
    return SanityPart(table, verdicts(table), density_frame(runs))


def verdicts(table: pd.DataFrame) -> list[str]:
    """One sentence per (criterion, sparsity): its sanity series' step ratios and B_crit, and
    whether its layer densities alone set the cost of sparsity."""
    out = []
    for (criterion, sparsity), g in table.groupby(["criterion", "sparsity"], sort=False):
        parts = [f"{WORDS[r.check]} masks need {fmt_num(r.ratio, 3)}× its steps (B_crit "
                 f"{fmt_num(r.b_crit, 3)})" if r.points else f"{WORDS[r.check]} masks share no "
                 f"batch size where both reached the goal" for r in g.itertuples(index=False)]
        kept = g[g["check"].isin(DENSITY_PRESERVING) & (g["points"] > 0)]
        head = (f"Sanity checks at {fmt_pct(sparsity)} sparsity ({criterion}: B_crit "
                f"{fmt_num(g['criterion_b_crit'].iloc[0], 3)}; median over the batch sizes both "
                f"reached): " + ", ".join(parts))
        if not len(kept):
            out.append(head + "; without a density-preserving series that reached the goal, the "
                              "question stays open.")
            continue
        same = ((kept["ratio"] <= SAME_COST_FACTOR) & (kept["ratio"] >= 1 / SAME_COST_FACTOR)).all()
        verdict = ("only its layer densities, not its choice of weights, set the cost of sparsity"
                   if same else "its choice of weights, not only its layer densities, sets the "
                                "cost of sparsity")
        out.append(f"{head}: {verdict} (tolerance {SAME_COST_FACTOR:g}×).")
    return out


def density_frame(runs: tuple[Run, ...]) -> pd.DataFrame:
    """Per-layer density of every stored mask of the lowest seed: series, layer, density, and the
    layer-collapse counts of its diagnosis (dead units, kept weights on a path)."""
    combined = len(runs) > 1
    rows = []
    for run in runs:
        entries = load_masks(run.results.run_dir)
        if not entries:
            continue
        first = min(e["seed"] for e in entries)
        for e in (e for e in entries if e["seed"] == first):
            d = e["diagnosis"]
            rows += [{"series": series_label(run, e["sparsity"], combined), "layer": layer["name"],
                      "density": layer["density"], "kept": layer["kept"], "total": layer["total"],
                      "dead": layer["dead"], "on_path": layer["on_path"],
                      "connected": d["connected"]} for layer in d["layers"]]
    return pd.DataFrame(rows, columns=["series", "layer", "density", "kept", "total", "dead",
                                       "on_path", "connected"])


def density_figure_png(densities: pd.DataFrame) -> bytes:
    """Figure 7: ``pruning.density_figure`` of the densities, in the report's style."""
    from pruning import density_figure

    from .figures import png_bytes, style

    with style():
        return png_bytes(density_figure(densities, title="Per-layer density of the masks"))


def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """The comparison table as report strings."""
    return pd.DataFrame({
        "series": table["series"], "criterion": table["criterion"],
        "batch sizes compared": [str(v) for v in table["points"]],
        "steps / criterion (median [min, max])": [
            f"{fmt_num(m, 3)} {fmt_interval(lo, hi)}" if p else "–"
            for m, lo, hi, p in zip(table["ratio"], table["ratio_min"], table["ratio_max"],
                                    table["points"])],
        "steps / dense (median)": [fmt_num(v, 3) for v in table["ratio_to_dense"]],
        "criterion steps / dense": [fmt_num(v, 3) for v in table["criterion_ratio_to_dense"]],
        "B_crit [interval]": [f"{fmt_num(b, 4)} {fmt_interval(lo, hi)}" if b == b else "–"
                              for b, lo, hi in zip(table["b_crit"], table["b_crit_lo"],
                                                   table["b_crit_hi"])],
        "criterion B_crit [interval]": [
            f"{fmt_num(b, 4)} {fmt_interval(lo, hi)}" if b == b else "–"
            for b, lo, hi in zip(table["criterion_b_crit"], table["criterion_b_crit_lo"],
                                 table["criterion_b_crit_hi"])],
    })


def format_densities(densities: pd.DataFrame) -> pd.DataFrame:
    """The masks' per-layer table as report strings."""
    return pd.DataFrame({
        "series": densities["series"], "layer": densities["layer"],
        "kept / total": [f"{k} / {t}" for k, t in zip(densities["kept"], densities["total"])],
        "density": [fmt_num(v, 3) for v in densities["density"]],
        "dead units": [fmt_num(v) for v in densities["dead"]],
        "kept weights on an input-output path": [fmt_num(v) for v in densities["on_path"]],
        "every output reached": [fmt_num(v) if v is not None else "–"
                                 for v in densities["connected"]],
    })
