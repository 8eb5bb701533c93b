"""The report's prose: sentences generated from the analysis tables and the theory view.

Every sentence states numbers the tables hold (fixed formatting, :mod:`experiments.report.formatting`),
so the same store always gives the same words: where perfect scaling ends per series (the regimes
of Shallue et al. 2019, the fit of McCandlish et al. 2018), how many more steps sparsity costs
(Lee et al. 2021), which optimizer extends perfect scaling further when several are compared,
what is missing, and per run what was fitted and what was predicted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from theory.models.scaling import MAXIMAL_SLOPE

from experiments.report.analysis import FIT_LEVEL, perfect_scaling_until
from experiments.report.formatting import (
    fmt_interval, fmt_num, series_label, sparsity_label,
)
from experiments.report.theory_view import RunPrediction

def scaling_sentence(name: str, f: pd.Series, reached: pd.Series) -> str:
    """Where perfect scaling ends for one fitted series (or that the measured range does not show
    it, when the fit puts B_crit at the edge of what the batch sizes resolve)."""
    if f["note"] and f["b_crit"] > reached.max():
        return (f"{name}: perfect scaling did not end within the measured batch sizes (up to "
                f"B = {int(reached.max())}); B_crit is only bounded below.")
    if f["note"] and f["b_crit"] < reached.min():
        return (f"{name}: no perfect scaling at the measured batch sizes (from B = {int(reached.min())}): "
                f"steps barely fall with B (S_min = {fmt_num(f['s_min'], 3)} steps).")
    perfect = reached[reached <= f["perfect_until"]]
    last = (f"the largest measured batch size in that regime is B = {int(perfect.max())}" if len(perfect)
            else "no measured batch size lies in that regime")
    return (f"{name}: perfect scaling ends near B ≈ {fmt_num(f['perfect_until'], 3)} "
            f"(B_crit / {perfect_scaling_until(1.0) ** -1:g} with fitted B_crit = {fmt_num(f['b_crit'], 3)}, "
            f"{int(FIT_LEVEL * 100)} % interval {fmt_interval(f['b_crit_lo'], f['b_crit_hi'])}; "
            f"{last}); beyond B ≈ {fmt_num(f['largest_useful_batch'], 3)} doubling the batch "
            f"saves under {100 * (1 - 2 ** MAXIMAL_SLOPE):.0f} % of the steps "
            f"(S_min = {fmt_num(f['s_min'], 3)} steps).")


def findings_text(points: pd.DataFrame, fits: pd.DataFrame, ratios: pd.DataFrame,
                  missing: pd.DataFrame, order: Sequence[str], runs: Sequence[str]) -> list[str]:
    """Sentences stating, from the numbers: where perfect scaling ends per series (``order``),
    how many more steps sparsity costs, how the runs' dense critical batches compare, and what is
    missing. ``fits`` is the fits table (:func:`experiments.report.analysis.fit_series`); the claims'
    verdicts get their sentences from :mod:`experiments.report.verdicts`."""
    out = []
    combined = len(runs) > 1
    ft = fits.set_index("series")
    for name in order:
        p = points[(points["series"] == name) & (points["status"] == "reached")]
        if name not in ft.index or pd.isna(ft.loc[name, "b_crit"]):
            reason = ft.loc[name, "note"] if name in ft.index else "no groups stored"
            out.append(f"{name}: {len(p)} batch size(s) reached the goal; no scaling fit ({reason}).")
            continue
        out.append(scaling_sentence(name, ft.loc[name], p["batch_size"]))
    for (run, series), r in ratios.groupby(["run", "series"], sort=False):
        dense = r["dense_series"].iloc[0]
        lo, hi = r.loc[r["ratio"].idxmin()], r.loc[r["ratio"].idxmax()]
        more = r["ratio"].median()
        out.append(f"{series} needs {fmt_num(more, 3)}× the steps of {dense} (median over "
                   f"{len(r)} batch sizes where both reached the goal; from {fmt_num(lo['ratio'], 3)}× "
                   f"at B = {int(lo['batch_size'])} to {fmt_num(hi['ratio'], 3)}× "
                   f"at B = {int(hi['batch_size'])}).")
    if combined:
        dense = [(r, ft.loc[series_label(r, 0.0, True), "b_crit"]) for r in runs
                 if series_label(r, 0.0, True) in ft.index]
        dense = [(label, b) for label, b in dense if not pd.isna(b)]
        if len(dense) > 1:
            base_label, base = dense[0]
            out += [f"Dense B_crit of {label} is {fmt_num(b / base, 3)}× that of {base_label}."
                    for label, b in dense[1:]]
    counts = missing["state"].value_counts()
    if len(missing):
        words = {"missing": "groups missing", "failed": "failed", "no probes": "sparsity levels without probes"}
        parts = [f"{int(counts[s])} {w}" for s, w in words.items() if s in counts]
        out.append("Incomplete: " + ", ".join(parts) + " (listed under Missing and failed); "
                   "the numbers above use only what the store holds.")
    return out


def optimizer_sentences(fits: pd.DataFrame, optimizers: Mapping[str, str],
                        sparsities: Sequence[float]) -> list[str]:
    """Which optimizer extends perfect scaling further: one sentence per sparsity level that runs
    with two or more optimizers fitted. ``fits``: the fits table
    (:func:`experiments.report.analysis.fit_series`); ``optimizers``: run label -> optimizer (a combined
    report: series labelled "run, level"); ``sparsities``: the levels planned.

    Perfect scaling lasts up to about B_crit / 4 on the fitted curve S(B) = S_min (1 + B_crit / B)
    (McCandlish et al. 2018), so at one level the optimizer with the larger fitted B_crit extends
    it further (Shallue et al. 2019 found momentum extends it beyond plain SGD; Zhang et al.
    2019's noisy quadratic model predicts that Adam-like preconditioning extends it beyond
    momentum). The verdict is only as firm as the fits: the leader's bootstrap interval must lie
    above every other's, and a B_crit the measured batch sizes only bound (the fit's note) decides
    nothing."""
    if len(set(optimizers.values())) < 2:
        return []
    ft = fits.set_index("series")
    out = []
    for sparsity in sorted(set(sparsities)):
        rows = [(run, ft.loc[series_label(run, sparsity, True)]) for run in optimizers
                if series_label(run, sparsity, True) in ft.index
                and not pd.isna(ft.loc[series_label(run, sparsity, True), "b_crit"])]
        if len(rows) < 2:
            continue
        rows.sort(key=lambda item: -item[1]["b_crit"])
        values = "; ".join(
            f"{run} {fmt_num(f['b_crit'], 3)} {fmt_interval(f['b_crit_lo'], f['b_crit_hi'])}"
            + (" (a bound: at the edge of the measured batch sizes)" if f["note"] else "")
            for run, f in rows)
        (lead, best), others = rows[0], rows[1:]
        if any(f["note"] for _, f in rows):
            verdict = ("not resolved: a critical batch at the edge of the measured batch sizes is "
                       "only a bound")
        elif all(best["b_crit_lo"] > f["b_crit_hi"] for _, f in others):
            verdict = f"{lead} extends perfect scaling further (the intervals do not overlap)"
        else:
            verdict = (f"not resolved: {lead} has the largest B_crit but the intervals overlap, "
                       "so these measurements do not separate the optimizers")
        out.append(f"Which optimizer extends perfect scaling further, {sparsity_label(sparsity)}: "
                   f"{verdict}. Fitted B_crit ({int(FIT_LEVEL * 100)} % intervals): {values}.")
    return out


def prediction_statement(p: RunPrediction) -> str:
    """One run in words: what was fitted on the measured curves, what was set from the dense
    probes and what was predicted with nothing further fitted (or why nothing could be)."""
    skip_text = (f" Left out: {', '.join(f'{sparsity_label(s)} ({why})' for s, why in p.left_out)}."
                 if p.left_out else "")
    if p.prediction is None:
        return f"{p.run}: no theory prediction: {p.reason}.{skip_text}"
    pred = p.prediction
    return (
        f"{p.run}: fitted on measured curves: S_min and B_crit of every curve (fit_scaling) and "
        f"the bound's one scale constant c = {fmt_num(pred.scale, 3)} on the dense curve. Set from the "
        f"dense probes, not from any curve: the goal on the gradient norm ε = 4σ²/B_simple = "
        f"{fmt_num(pred.eps, 3)}. Predicted with nothing further fitted: every sparse level's steps "
        f"(c·{pred.form} bound with its own L = {p.l_source.replace('_', ' ')}, σ² = tr Σ and Δ = initial "
        f"loss), its critical batch and its step ratio to dense; and every level's critical batch "
        f"from its noise scale B_simple.{skip_text}")
