"""L at Lee et al.'s stage in the report (:func:`stage_part`): its verdicts and sentences
(:mod:`~experiments.measures.stage.view`), and in Theory vs measurement its tables and
Figure 10 (:func:`stage_figure`: L every N steps of the runs)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.measurement import Part, ReportContext
# first: experiments.report.figures.measurement selects the Agg backend before pyplot is loaded
from experiments.report.figures import measurement as F
from experiments.report.figures.measurement import empty_panel, log10_axis, style
from experiments.measures.stage.view import StagePart, stage_sentences, stage_tables, stage_view
from experiments.report.sections import Figure, Paragraphs, Section, Table

import matplotlib.pyplot as plt  # noqa: E402


def stage_part(ctx: ReportContext) -> Part:
    """The stage's verdicts (with the decisive rows and the bias control's), its sentences
    among the findings, and its sub-section of Theory vs measurement where it was measured."""
    stage = stage_view(ctx.runs)
    return Part(findings=tuple(stage_sentences(stage)),
                verdicts=stage.verdicts if len(stage.verdicts) else None,
                theory=(stage_section(stage, list(ctx.runs.order)),) if stage.measured else ())


def stage_section(stage: StagePart, order: list[str]) -> Section:
    """L at Lee et al.'s stage: its tables and Figure 10."""
    cmap = F.colors(order)
    return Section("L at Lee et al.'s stage", 3, (
        *(Section(title, 4, (*((Table(frame),) if len(frame) else ()), Paragraphs((note,), "note")))
          for title, frame, note in stage_tables(stage)),
        Figure("fig10_lipschitz_stage", "Figure 10. L every N steps of the runs, Lee et al.'s view",
               "Lee et al. (2021)'s local Lipschitz constant of the update into each step k N of "
               "the probed runs (their edps/train.py), up to each run's goal or, for a run that "
               "did not meet it, its budget; one panel per probed batch size, one line per "
               "series: the geometric mean over its runs (seeds and trials), band: its 90 % t "
               "interval; log scale. ×: L on the whole training split "
               "where the study checked its sample.",
               F.png_bytes(stage_figure(stage.points, stage.check, order, cmap))),
    ))


def stage_figure(points: pd.DataFrame, check: pd.DataFrame, series: list[str],
                 cmap: dict[str, tuple]):
    """Lee et al. (2021)'s view of L(t): L every N steps of the runs (x: step, y: log scale), one
    panel per probed batch size, one line per series (the geometric mean over its runs at each
    step) with its interval as a band; x: L on the whole training split where the study
    checked its sample against it."""
    sizes = sorted(set(points["batch_size"])) or [0]
    with style():
        fig, axes = plt.subplots(1, len(sizes), figsize=(4.6 * len(sizes), 3.6), squeeze=False,
                                 layout="constrained")
        for ax, b in zip(axes[0], sizes):
            d = points[points["batch_size"] == b]
            if not len(d):
                empty_panel(ax, "L was not measured at Lee's stage")
                continue
            for name in [s for s in series if s in set(d["series"])]:
                g = d[d["series"] == name].sort_values("step")
                ax.plot(g["step"], g["value"], marker="o", ms=3, lw=1.3, color=cmap[name],
                        label=name)
                band = g[np.isfinite(g["low"].astype(float))]
                if len(band):
                    ax.fill_between(band["step"], band["low"].astype(float),
                                    band["high"].astype(float), color=cmap[name], alpha=0.18, lw=0)
            c = check[check["batch_size"] == b]
            if len(c):
                ax.plot(c["step"], c["full"], "x", color="black", ms=6,
                        label="L on the whole split")
            log10_axis(ax.yaxis)
            ax.set_xlabel("step")
            ax.set_ylabel("local Lipschitz constant L")
            ax.set_title(f"B = {int(b)}")
            ax.legend(loc="best", fontsize=7)
        return fig
