"""The report's tables formatted for display: every cell a string, fixed formatting.

Each function takes an analysis frame (:mod:`experiments.report.analysis`, :mod:`experiments.
theory_view`, :mod:`experiments.report.hardware`) and returns the frame the report shows, with its
column headings; the numbers themselves are computed there, not here.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from experiments.report.analysis import Fits
from experiments.report.formatting import (
    budget_text, fmt_interval, fmt_num, goal_text, grid_interval, sparsity_label,
)
from experiments.report.hardware import HardwarePart
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


def _with_interval(value: float, lo: float, hi: float, digits: int = 4) -> str:
    return "–" if pd.isna(value) else f"{fmt_num(value, digits)} {fmt_interval(lo, hi)}"


def sanity_table(table: pd.DataFrame) -> pd.DataFrame:
    """Each sanity series beside its criterion (:func:`experiments.report.sanity_view.sanity_view`): steps
    ratios to the criterion and to dense, and both fitted B_crit."""
    return pd.DataFrame({
        "series": table["series"], "criterion": table["criterion"],
        "batch sizes compared": [str(v) for v in table["points"]],
        "steps / criterion (median [min, max])": [
            f"{fmt_num(m, 3)} {fmt_interval(lo, hi)}" if p else "–"
            for m, lo, hi, p in zip(table["ratio"], table["ratio_min"], table["ratio_max"],
                                    table["points"])],
        "steps / dense (median)": [fmt_num(v, 3) for v in table["ratio_to_dense"]],
        "criterion steps / dense": [fmt_num(v, 3) for v in table["criterion_ratio_to_dense"]],
        "B_crit [interval]": [_with_interval(*v) for v in zip(
            table["b_crit"], table["b_crit_lo"], table["b_crit_hi"])],
        "criterion B_crit [interval]": [_with_interval(*v) for v in zip(
            table["criterion_b_crit"], table["criterion_b_crit_lo"], table["criterion_b_crit_hi"])],
    })


def densities_table(densities: pd.DataFrame) -> pd.DataFrame:
    """The masks' per-layer density and layer-collapse counts
    (:func:`experiments.report.sanity_view.density_frame`)."""
    return pd.DataFrame({
        "series": densities["series"], "layer": densities["layer"],
        "kept / total": [f"{k} / {t}" for k, t in zip(densities["kept"], densities["total"])],
        "density": [fmt_num(v, 3) for v in densities["density"]],
        "dead units": [fmt_num(v) for v in densities["dead"]],
        "kept weights on an input-output path": [fmt_num(v) for v in densities["on_path"]],
        "every output reached": [fmt_num(v) for v in densities["connected"]],
    })


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


def hardware_tables(part: HardwarePart) -> list[tuple[str, pd.DataFrame, str]]:
    """(title, table, note) of the time to result (worker-seconds) per series and B on each k,
    then of the fastest B per k; none without a cost model."""
    p = part.points
    if not len(p):
        return []
    ks = sorted(set(p["workers"]))
    extrapolated = set(p.loc[p["extrapolated"], "workers"])
    heads = {k: f"k = {k}" + (" (extrapolated)" if k in extrapolated else "") for k in ks}
    rows = []
    for (series, b), g in p.groupby(["series", "batch_size"], sort=False):
        cell = {int(r.workers): f"{fmt_num(r.time, 4)} ({fmt_num(r.worker_seconds, 4)})"
                for r in g.itertuples(index=False)}
        rows.append({"series": series, "B": str(b), "steps": str(int(g["steps"].iloc[0])),
                     **{heads[k]: cell.get(k, "–") for k in ks}})
    grid = pd.DataFrame(rows, columns=["series", "B", "steps", *heads.values()])
    rank = {s: i for i, s in enumerate(dict.fromkeys(p["series"]))}
    best = (p[p["fastest"]].assign(_rank=p["series"].map(rank))
            .sort_values(["_rank", "workers"], kind="stable"))
    fastest = pd.DataFrame({
        "series": best["series"], "k": best["workers"].astype(str),
        "fastest B": best["batch_size"].astype(str), "B/k": best["per_worker_batch"].astype(str),
        "steps": best["steps"].astype(str),
        "step (ms)": [fmt_num(v * 1e3, 4) for v in best["step_time"]],
        "time to result (s)": [fmt_num(v, 4) for v in best["time"]],
        "worker-seconds": [fmt_num(v, 4) for v in best["worker_seconds"]],
        "extrapolated": ["yes" if v else "no" for v in best["extrapolated"]]})
    gaps = (grid[list(heads.values())] == "–").any(axis=None)
    return [("Predicted time to result on k workers: seconds (worker-seconds)", grid,
             "–: B is not divisible by k." if gaps else ""),
            ("Fastest batch size per number of workers k", fastest.reset_index(drop=True), "")]


def critical_table(critical: pd.DataFrame) -> pd.DataFrame:
    """CBS at the goal, B_simple at the goal and the fitted B_crit with intervals, and the cost."""
    return pd.DataFrame({
        "series": critical["series"], "seed": critical["seed"],
        "base B, H": [f"{b}, {h}" for b, h in zip(critical["base_batch"], critical["goal_step"])],
        "CBS at the goal": [grid_interval(v, lo, hi, open_above=bool(u)) for v, lo, hi, u in
                            zip(critical["cbs"], critical["cbs_low"], critical["cbs_high"],
                                critical["upper_end"])],
        "B_simple at the goal": [_with_interval(v, lo, hi, 3) for v, lo, hi in
                                 zip(critical["b_simple"], critical["b_simple_low"], critical["b_simple_high"])],
        "fitted B_crit": [_with_interval(v, lo, hi, 3) for v, lo, hi in
                          zip(critical["b_crit"], critical["b_crit_low"], critical["b_crit_high"])],
        "cost (trial-steps)": critical["trial_steps"],
        "% of the sweep": [fmt_num(100 * c / s, 3) for c, s in zip(critical["trial_steps"],
                                                                   critical["sweep_trial_steps"])]})


def warmup_table(warm: pd.DataFrame) -> pd.DataFrame:
    """The warmup and the best fixed B: steps median [min, max] and median examples."""
    def steps(m, lo, hi):
        return f"{fmt_num(m)} [{fmt_num(lo)}, {fmt_num(hi)}]"

    return pd.DataFrame({
        "series": warm["series"], "seed": warm["seed"], "warmup B(t)": warm["schedule"],
        "budget (examples)": warm["examples_budget"],
        "warmup steps": [steps(*v) for v in zip(warm["warmup_steps"], warm["warmup_steps_min"],
                                                warm["warmup_steps_max"])],
        "warmup examples": [fmt_num(v) for v in warm["warmup_examples"]],
        "best fixed B": [fmt_num(v) for v in warm["best_fixed"]],
        "fixed steps": [steps(*v) for v in zip(warm["fixed_steps"], warm["fixed_steps_min"],
                                               warm["fixed_steps_max"])],
        "fixed examples": [fmt_num(v) for v in warm["fixed_examples"]],
        "base B: steps": [f"{b}: {fmt_num(v)}" for b, v in zip(warm["base_batch"], warm["base_steps"])]})
