"""The report of ``sparsescale advise``: the recommended batch size, what it rests on, and its cost.

Plain inputs (the report package does not import the runner): the headline lines, and four
frames as :class:`experiments.run.advise.Advice` holds them (``noise``: B_simple along the base
run with standard errors; ``critical``: CBS(t) with intervals; ``predicted``: steps and time to
the goal per batch size; ``cost``: one row per part). :func:`advice_document` builds one
:class:`experiments.report.sections.Document` with one figure, rendered to Markdown and HTML by
the study report's templates (:func:`experiments.report.write.write_document`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.report.figures import measurement as F
from experiments.report.formatting import fmt_interval, fmt_num, grid_interval
from experiments.report.sections import Document, Figure, Paragraphs, Section, Table

FIGURE_NAME = "advice"


def advice_figure(noise: pd.DataFrame, critical: pd.DataFrame, predicted: pd.DataFrame,
                  base_batch: int, goal_step: int, recommended: float, interval: tuple[float, float]):
    """Two panels: (a) B_simple (+- 2 standard errors) and CBS(t) (with its interval) along the
    base run; (b) predicted steps to the goal against batch size, with the measured base run and
    the recommendation's interval."""
    with F.style():
        fig, (a, b) = F.plt.subplots(1, 2, figsize=(9.0, 3.4), constrained_layout=True)
        pal = F.colors(["b_simple", "cbs", "fit"])
        se = 2 * noise.b_simple_se.to_numpy(float)
        a.errorbar(noise.fraction, noise.b_simple, yerr=se, marker="o", ms=4, capsize=3,
                   color=pal["b_simple"], label="B_simple (± 2 SE)")
        lo, hi = critical.low.to_numpy(float), critical.high.to_numpy(float)
        cbs = critical.critical_batch.to_numpy(float)
        a.errorbar(critical.fraction, cbs, yerr=[cbs - lo, hi - cbs], marker="s", ms=4, capsize=3,
                   color=pal["cbs"], linestyle="--", label="CBS(t) by branching (interval)")
        a.axhline(base_batch, color="0.5", linewidth=0.8, linestyle=":", label=f"base batch {base_batch}")
        a.set_yscale("log", base=2)
        F.log2_axis(a.yaxis)
        a.set_xlabel("fraction of the base run's steps to the goal")
        a.set_ylabel("batch size")
        a.set_title("(a) noise scale and critical batch along the run")
        a.legend(loc="best")
        bs = predicted.batch_size.to_numpy(float)
        b.fill_between(bs, predicted.steps_low, predicted.steps_high, color=pal["fit"], alpha=0.25,
                       label="from the recommendation's interval")
        b.plot(bs, predicted.steps, color=pal["fit"], label="S(B) = S_min (1 + B_crit / B)")
        b.plot([base_batch], [goal_step], marker="o", color="black", linestyle="", label="base run (measured)")
        b.axvspan(*interval, color=pal["cbs"], alpha=0.12)
        b.axvline(recommended, color=pal["cbs"], linestyle="--", label=f"recommended {fmt_num(recommended)}")
        b.set_xscale("log", base=2)
        b.set_yscale("log")
        F.log2_axis(b.xaxis)
        b.set_xlabel("batch size B")
        b.set_ylabel("predicted steps to the goal")
        b.set_title("(b) predicted steps to the goal")
        b.legend(loc="best")
        return F.png_bytes(fig)


def advice_document(title: str, headline: list[str], noise: pd.DataFrame, critical: pd.DataFrame,
                    predicted: pd.DataFrame, cost: pd.DataFrame, base_batch: int, goal_step: int,
                    recommended: float, interval: tuple[float, float], notes: list[str],
                    top: float | None = None) -> Document:
    """The advice report: the headline, the figure, and the tables of B_simple and CBS along the
    run, the prediction per batch size and the cost; ``notes``: how it was measured; ``top``:
    the largest batch branched (a CBS there is a lower bound; None: not known)."""
    png = advice_figure(noise, critical, predicted, base_batch, goal_step, recommended, interval)
    along = pd.DataFrame({
        "fraction of H": [fmt_num(f, 3) for f in noise.fraction],
        "step": [fmt_num(int(s)) for s in noise.step],
        "B_simple ± SE": [f"{fmt_num(v, 3)} ± {fmt_num(e, 2)}" for v, e in zip(noise.b_simple, noise.b_simple_se)],
        "|G|² ± SE": [f"{fmt_num(v, 3)} ± {fmt_num(e, 2)}" for v, e in zip(noise.g_sq, noise.g_sq_se)],
        "tr Σ ± SE": [f"{fmt_num(v, 3)} ± {fmt_num(e, 2)}" for v, e in zip(noise.trace_sigma, noise.trace_sigma_se)],
        "CBS(t) [interval] (grid)": [_cbs(critical, s, top) for s in noise.step]})
    pred = pd.DataFrame({
        "batch size": [fmt_num(int(b)) for b in predicted.batch_size],
        "predicted steps [range]": [f"{fmt_num(round(s))} {fmt_interval(round(lo), round(hi))}"
                                    for s, lo, hi in zip(predicted.steps, predicted.steps_low, predicted.steps_high)],
        "regime": list(predicted.regime),
        "s per step (model; measured)": [f"{fmt_num(m, 3)}; {fmt_num(x, 3)}" for m, x in
                                         zip(predicted.step_seconds, predicted.measured_seconds)],
        "time to the goal (s)": [fmt_num(t, 3) for t in predicted.seconds]})
    costs = pd.DataFrame({"part": list(cost.part), "trial-steps": [f"{int(v):,}" for v in cost.trial_steps]})
    sections = (
        Section("Recommendation", 2, (Paragraphs(tuple(headline)),)),
        Section("Figure", 2, (Figure(FIGURE_NAME, "The advice", "(a) B_simple with ± 2 standard errors "
                                     "and CBS(t) with its bootstrap interval at the checkpoints of the base "
                                     "run; (b) steps to the goal predicted from the recommendation and the "
                                     "measured base run.", png),)),
        Section("Along the base run", 2, (Table(along),)),
        Section("Predicted steps and time to the goal", 2, (Table(pred),)),
        Section("Cost", 2, (Table(costs),)),
        Section("How it was measured", 2, (Paragraphs(tuple(notes), "note"),)),
    )
    return Document(title, sections)


def _cbs(critical: pd.DataFrame, step: int, top: float | None = None) -> str:
    """CBS at ``step`` with its interval and the branching grid's resolution."""
    row = critical[critical.step == step]
    if row.empty:
        return "–"
    r = row.iloc[0]
    return grid_interval(r.critical_batch, r.low, r.high,
                         open_above=top is not None and r.critical_batch >= top)


def cost_frame(parts: dict[str, int], sweep: int) -> pd.DataFrame:
    """The cost table's rows: each part, the total, the equivalent sweep and the fraction."""
    total = int(np.sum(list(parts.values())))
    rows = [*parts.items(), ("total", total), ("equivalent sweep", sweep)]
    return pd.DataFrame({"part": [p for p, _ in rows], "trial-steps": [v for _, v in rows]}).rename(
        columns={"trial-steps": "trial_steps"})
