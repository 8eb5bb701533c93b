"""The critical batch by branching in the report: the section with the critical batch three ways
(CBS at the goal, B_simple at the goal, the fitted B_crit), Figure 9 (CBS(t) along the run) and
the batch-size warmup against the best fixed batch size
(:mod:`experiments.measures.branching.view` computes them)."""

from __future__ import annotations

import pandas as pd

from experiments.report.analysis import Fits
from experiments.report.figures.measurement import colors, empty_panel, log2_axis, png_bytes, style
from experiments.report.figures.theory import along_the_run, b_crit_band, series_panels
from experiments.report.formatting import fmt_num, grid_interval, with_interval
from experiments.report.runs import RunSet
from experiments.report.sections import Figure, Paragraphs, Section, table_section


def branching_section(runs: RunSet, fits: Fits, critical: pd.DataFrame, warm: pd.DataFrame) -> Section:
    """Critical batch by branching: CBS at the goal beside B_simple and the fitted B_crit, its
    cost, CBS(t) along the run (Figure 9) and the warmup against the best fixed B."""
    order = list(runs.order)
    return Section(BRANCHING_HEADING, 2, (
        Paragraphs((BRANCHING_TEXT,)),
        table_section("The critical batch three ways", critical_shown(critical),
               "CBS: at the checkpoint at H, the base run's steps-to-result, with its bootstrap interval "
               "over branch seeds (≥: the largest branch passed, a lower bound). B_simple: at the goal "
               "(last 20 % of the probed runs), hierarchical bootstrap. B_crit: the sweep's fit, "
               "bootstrap. Cost: the base run and every branch, in trial-steps, as a share of the "
               "sweep's."),
        Figure("fig9_branching", "Figure 9. CBS(t) by branching beside B_simple(t) and the fitted B_crit",
               "Merrill et al. (2025)'s critical batch at K checkpoints of the best run at a small "
               "batch size (x: step / H), band: its bootstrap interval over branch seeds; dashed: "
               "McCandlish et al. (2018)'s B_simple probed along the run of the same batch size (or "
               "of every probed batch size when that one was not probed; median over seeds); "
               "black line and grey band: the series' fitted B_crit and its interval; dotted: the "
               "largest branch.", png_bytes(branching_figure(
                   runs.branching, runs.probes, fits.table, order, colors(order)))),
        table_section("Batch-size warmup from CBS(t) against the best fixed batch size", warmup_shown(warm),
               "Both under the same examples budget, lr scaled by the optimizer's rule (× k SGD-type, "
               "× √k Adam-type); steps: median [min, max] over replicate data orders; examples: "
               "median. Best fixed B: fewest median steps among the fixed B that reached the goal "
               "in every replicate." if len(warm) else "No warmup was measured."),
    ))


BRANCHING_HEADING = "Critical batch by branching"
BRANCHING_TEXT = (
    "From K checkpoints of the best run at a small batch size B, short runs branch at k B "
    "(k = 1, 2, 4, ...) with the learning rate scaled by the optimizer's rule times multipliers "
    "0.5, 1, 2, for the same number of examples W. CBS(t) is the largest k B whose best "
    "multiplier's held-out loss, averaged over branch seeds, stays within (1 + ε) of the base "
    "run's (Merrill et al. 2025). It is set beside the noise scale B_simple measured along the "
    "run (McCandlish et al. 2018) and the critical batch B_crit fitted to the sweep: three "
    "estimates of one quantity, dense beside sparse.")


def critical_shown(critical: pd.DataFrame) -> pd.DataFrame:
    """CBS at the goal, B_simple at the goal and the fitted B_crit with intervals, and the cost."""
    return pd.DataFrame({
        "series": critical["series"], "seed": critical["seed"],
        "base B, H": [f"{b}, {h}" for b, h in zip(critical["base_batch"], critical["goal_step"])],
        "CBS at the goal": [grid_interval(v, lo, hi, open_above=bool(u)) for v, lo, hi, u in
                            zip(critical["cbs"], critical["cbs_low"], critical["cbs_high"],
                                critical["upper_end"])],
        "B_simple at the goal": [with_interval(v, lo, hi, 3) for v, lo, hi in
                                 zip(critical["b_simple"], critical["b_simple_low"], critical["b_simple_high"])],
        "fitted B_crit": [with_interval(v, lo, hi, 3) for v, lo, hi in
                          zip(critical["b_crit"], critical["b_crit_low"], critical["b_crit_high"])],
        "cost (trial-steps)": critical["trial_steps"],
        "% of the sweep": [fmt_num(100 * c / s, 3) for c, s in zip(critical["trial_steps"],
                                                                   critical["sweep_trial_steps"])]})




def warmup_shown(warm: pd.DataFrame) -> pd.DataFrame:
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


def branching_figure(branching: pd.DataFrame, probes: pd.DataFrame, fits: pd.DataFrame, series: list[str],
                     cmap: dict[str, tuple]):
    """CBS(t) measured by branching (Merrill et al. 2025) along the base run with its bootstrap
    interval (band), one line per seed, beside B_simple(t) probed on the run of the same batch
    size (dashed, median over seeds; every probed batch size when that one was not probed) and the series' fitted B_crit with its interval (grey band),
    one panel per series; dotted: the largest branch k_max B (CBS there is a lower bound)."""
    with style():
        fig, panels = series_panels(set(branching["series"]), series)
        for ax, name in panels:
            d = branching[branching["series"] == name]
            if not len(d):
                empty_panel(ax, f"{name}:\nnot branched")
                continue
            b_crit_band(ax, fits, name)
            for k, (seed, g) in enumerate(d.groupby("seed")):
                g = g.sort_values("step")
                x = g["step"] / g["goal_step"]
                # CBS = 0 (below the smallest branch) is drawn at half the base batch on the log axis
                floor = g["batch_size"] / 2
                ax.fill_between(x, g["low"].clip(lower=floor), g["high"].clip(lower=floor), color=cmap[name],
                                alpha=0.2, lw=0)
                ax.plot(x, g["critical_batch"].clip(lower=floor), "o-", ms=3, lw=1.3, color=cmap[name],
                        label="CBS(t), branching" if k == 0 else None)
            top = d["k_max"] * d["batch_size"]
            ax.axhline(top.max(), color=cmap[name], ls=":", lw=0.9, label=f"largest branch {int(top.max())}")
            p = probes[(probes["series"] == name) & (probes["quantity"] == "b_simple") & probes["value"].notna()]
            same = p[p["batch_size"].isin(set(d["batch_size"]))]
            for k, (b, g) in enumerate((same if len(same) else p).groupby("batch_size")):
                m = g.groupby("fraction")["value"].median()
                ax.plot(m.index, m.to_numpy(), ["--", ":", "-."][k % 3], color="0.35", lw=1.0,
                        label=f"B_simple(t), probed at B = {int(b)}")
            log2_axis(ax.yaxis)
            along_the_run(ax, "batch size", name)
        return fig
