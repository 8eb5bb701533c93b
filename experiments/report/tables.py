"""The report's tables formatted for display: every cell a string, fixed formatting.

Each function takes an analysis frame (:mod:`experiments.report.analysis`, :mod:`experiments.
theory_view`, :mod:`experiments.measures`) and returns the frame the report shows, with its
column headings; the numbers themselves are computed there, not here.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from experiments.report.analysis import Fits
from experiments.report.formatting import (
    budget_text, fmt_interval, fmt_num, goal_text, sparsity_label,
)
from experiments.report.runs import Run


def fmt_frame(df: pd.DataFrame, columns: dict[str, str], digits: int = 4) -> pd.DataFrame:
    """Select ``columns`` (source -> heading) and format every cell with :func:`fmt_num`."""
    out = pd.DataFrame({head: [v if isinstance(v, str) else fmt_num(v, digits) for v in df[src]]
                        for src, head in columns.items()}, columns=list(columns.values()))
    return out


def overview_table(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per run: its workload, optimizer, goal, batch sizes, sparsity levels, pruning
    criterion, trials per group, seeds and step budget."""
    rows = []
    for r in runs:
        s = r.spec
        bs = s.batch_sizes
        rows.append({
            "study": r.label,
            "workload": f"{s.dataset} / {s.model}",
            "optimizer": s.optimizer,
            "goal": goal_text(s),
            "batch sizes": f"{bs[0]} … {bs[-1]} ({len(bs)})" if len(bs) > 3 else ", ".join(map(str, bs)),
            "sparsities": ", ".join(sparsity_label(x) for x in s.sparsities),
            "pruning": s.pruning_criterion + (f" / {s.pruning_sanity}" if s.pruning_sanity else ""),
            "trials per group": str(s.trials),
            "seeds": ", ".join(map(str, s.seeds)),
            "step budget": budget_text(s.budget),
        })
    return pd.DataFrame(rows)


def steps_table(points: pd.DataFrame, edges: pd.DataFrame) -> pd.DataFrame:
    """Steps to result per series and B with the best metaparameters (`` *``: at the edge of
    the searched range) and how many trials and seeds reached the goal."""
    d = points.join(edges)
    df = fmt_frame(d, {"series": "series", "batch_size": "B", "status": "status", "steps": "steps",
                        "lr": "lr", "momentum": "momentum", "effective_lr": "effective lr",
                        "n_reached": "trials reached", "n_diverged": "diverged", "n_trials": "trials"})
    df["lr"] = [v + (" *" if e else "") for v, e in zip(df["lr"], d["lr_at_edge"])]
    df["momentum"] = [v + (" *" if e else "") for v, e in zip(df["momentum"], d["momentum_at_edge"])]
    df["seeds reached"] = [f"{a}/{b}" for a, b in zip(d["seeds_reached"], d["seeds"])]
    return df


def fits_table(fits: Fits) -> pd.DataFrame:
    """S_min and B_crit per series with their intervals and the regime boundaries."""
    t = fits.table
    return pd.DataFrame({
        "series": t["series"],
        "points": [fmt_num(v) for v in t["points"]],
        "S_min": [fmt_num(v, 4) for v in t["s_min"]],
        "S_min interval": [fmt_interval(a, b) if not pd.isna(a) else "–"
                           for a, b in zip(t["s_min_lo"], t["s_min_hi"])],
        "B_crit": [fmt_num(v, 4) for v in t["b_crit"]],
        "B_crit interval": [fmt_interval(a, b) if not pd.isna(a) else "–"
                            for a, b in zip(t["b_crit_lo"], t["b_crit_hi"])],
        "perfect scaling up to B": [fmt_num(v, 3) for v in t["perfect_until"]],
        "maximal data parallelism from B": [fmt_num(v, 3) for v in t["largest_useful_batch"]],
        "residual sd (log)": [fmt_num(v, 2) for v in t["residual_sd"]],
        "note": t["note"].fillna(""),
    })


def predictions_table(table: pd.DataFrame) -> pd.DataFrame:
    """The bound's values beside the measurement, with their ratio: the structure of the bound,
    not scored (the papers' claims are scored in the verdict table)."""
    df = fmt_frame(table, {"series": "series", "quantity": "quantity", "predicted": "bound",
                            "measured": "measured"})
    df["bound / measured"] = [fmt_num(1.0 + e, 3) if not pd.isna(e) else "–"
                              for e in table["relative_error"]]
    return df


def probe_inputs_table(inputs: pd.DataFrame) -> pd.DataFrame:
    """The probe values the theory used per series."""
    return fmt_frame(inputs, {"series": "series", "L": "L", "L_source": "L from", "sigma2": "σ² = tr Σ",
                               "delta": "Δ", "b_simple": "B_simple", "b_noise": "B_noise"}, digits=3)


def ratios_table(ratios: pd.DataFrame) -> pd.DataFrame:
    """Sparse / dense step ratios: one row per sparse series, one column per batch size."""
    if not len(ratios):
        return pd.DataFrame({"series": []})
    wide = ratios.pivot_table(index="series", columns="batch_size", values="ratio", sort=False)
    wide = wide.reindex([s for s in dict.fromkeys(ratios["series"])])
    df = pd.DataFrame({"series": wide.index})
    for b in sorted(wide.columns):
        df[f"B = {int(b)}"] = [fmt_num(v, 3) for v in wide[b]]
    return df


def missing_table(missing: pd.DataFrame) -> pd.DataFrame:
    """Missing and failed groups and levels without probes."""
    df = missing.copy()
    df["sparsity"] = [sparsity_label(s) for s in df["sparsity"]]
    return fmt_frame(df, {"run": "study", "sparsity": "sparsity", "batch_size": "B", "seed": "seed",
                           "state": "state", "detail": "detail"})


def cost_table(cost: pd.DataFrame) -> pd.DataFrame:
    """Per run: groups, trials, trial-steps, wall time, versions, device and precision."""
    df = fmt_frame(cost, {"run": "study", "planned": "groups planned", "done": "done", "failed": "failed",
                           "missing": "missing", "trials": "trials", "trial_steps": "trial-steps",
                           "wall_time_s": "wall time (s, summed over groups)", "created": "created",
                           "sparsescale": "sparsescale", "torch": "torch", "python": "python",
                           "device": "device", "precision": "precision"})
    df["trial-steps"] = [f"{int(v):,}" for v in cost["trial_steps"]]
    df["wall time (s, summed over groups)"] = [f"{v:.1f}" for v in cost["wall_time_s"]]
    return df
