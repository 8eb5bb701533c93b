"""The report's theory figures: the noisy quadratic model beside the measurement (Figure 7), and
the panels of the figures along the run (one panel per series, the fitted B_crit's band, the
axes' labels) that the probes' (:mod:`experiments.measures.probes.figures`) and branching's
figures share, in the style of :mod:`experiments.report.figures.measurement`.

Each function takes plain DataFrames and returns a matplotlib Figure
(:func:`experiments.report.figures.png_bytes` renders it deterministically).
"""

from __future__ import annotations

import textwrap

# first: experiments.report.figures.measurement selects the Agg backend before pyplot is loaded
from experiments.report.figures.measurement import empty_panel, log2_axis, normalized_panel, style

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402


def series_panels(present: set[str], series: list[str]):
    """A figure with one panel per series of ``series`` that ``present`` holds (else the first),
    and its (axis, series) pairs."""
    names = [s for s in series if s in present] or series[:1]
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.6), squeeze=False,
                             layout="constrained")
    return fig, list(zip(axes[0], names))


def b_crit_band(ax, fits: pd.DataFrame, name: str) -> None:
    """The series' fitted B_crit (black line) and its interval (grey band), when it was fitted."""
    fit = fits.set_index("series")
    if name in fit.index and not pd.isna(fit.loc[name, "b_crit"]):
        ax.axhspan(fit.loc[name, "b_crit_lo"], fit.loc[name, "b_crit_hi"], color="0.85", zorder=0)
        ax.axhline(fit.loc[name, "b_crit"], color="black", lw=0.9, label="fitted B_crit")


def along_the_run(ax, ylabel: str, title: str) -> None:
    """Labels of a panel whose x axis is the fraction of the run, and its legend."""
    ax.set_xlabel("fraction of the run (step / H)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=7)


# ---------------------------------------------------------------------------------------------
# 6. noisy quadratic model beside the measured curves


def nqm_figure(points: pd.DataFrame, nqm: pd.DataFrame, series: list[str], cmap: dict[str, tuple],
               note: str):
    """(a) measured steps normalized at the smallest batch size; (b) the noisy quadratic model
    (Zhang et al. 2019) with SGD, momentum and Adam-like preconditioning (one curve per
    ``nqm["optimizer"]``), normalized the same way, in its own units."""
    with style():
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.2, 3.4), layout="constrained")
        normalized_panel(ax, points, series, cmap)
        ax.set_title("(a) measured")
        if not len(nqm):
            empty_panel(bx, "the NQM reached the target at no batch size")
        else:
            styles = {"sgd": "-", "momentum": "-.", "preconditioned": ":"}
            pal = sns.color_palette("dark", 4)
            for i, (opt, g) in enumerate(nqm.groupby("optimizer", sort=True)):
                bx.plot(g["batch_size"], g["steps"] / g["steps"].iloc[0], ls=styles.get(opt, "-"),
                        marker="o", ms=3.5, color=pal[i], lw=1.3,
                        label=f"NQM, {opt}" + (" (Adam-like)" if opt == "preconditioned" else ""))
            b = nqm["batch_size"]
            grid = np.geomspace(b.min(), b.max(), 32)
            bx.plot(grid, b.min() / grid, ls="--", color="black", lw=0.9, label="perfect scaling")
            log2_axis(bx.xaxis)
            log2_axis(bx.yaxis)
            bx.set_xlabel("batch size B (NQM units)")
            bx.set_ylabel("steps / steps at smallest B")
            bx.legend(loc="lower left")
        bx.set_title("(b) noisy quadratic model")
        fig.supxlabel(textwrap.fill(note, 160), fontsize=7, color="0.3")
        return fig
