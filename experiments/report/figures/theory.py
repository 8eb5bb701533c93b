"""The report's theory figures: B_simple along the run against the fitted B_crit (Figure 5), L and
lambda_max along the run (Figure 6), and the noisy quadratic model beside the measurement
(Figure 7), in the style of :mod:`experiments.report.figures.measurement`.

Each function takes plain DataFrames and returns a matplotlib Figure
(:func:`experiments.report.figures.png_bytes` renders it deterministically).
"""

from __future__ import annotations

import textwrap

# first: experiments.report.figures.measurement selects the Agg backend before pyplot is loaded
from experiments.report.figures.measurement import empty_panel, log2_axis, log10_axis, normalized_panel, style

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402


def b_simple_figure(probes: pd.DataFrame, fits: pd.DataFrame, series: list[str], cmap: dict[str, tuple]):
    """B_simple(t) = tr Sigma / |G|^2 along the run (fraction of H) at each probed batch size
    (line style by batch size rank), one panel per series, against the series' fitted B_crit
    with its interval (band): McCandlish et al. (2018) compare the two at the goal."""
    with style():
        fig, panels = series_panels(set(probes["series"]), series)
        for ax, name in panels:
            d = probes[(probes["series"] == name) & (probes["quantity"] == "b_simple")
                       & probes["value"].notna()]
            if not len(d):
                empty_panel(ax, f"{name}:\nno probes")
                continue
            for k, (b, g) in enumerate(d.groupby("batch_size")):
                m = g.groupby("fraction")["value"].median()
                ax.plot(m.index, m.to_numpy(), ["-", "--", ":", "-."][k % 4], marker="o", ms=3,
                        color=cmap[name], lw=1.2, label=f"B = {int(b)}")
            b_crit_band(ax, fits, name)
            log10_axis(ax.yaxis)
            along_the_run(ax, "B_simple = tr Σ / |G|²", name)
        return fig


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


def smoothness_figure(probes: pd.DataFrame, series: list[str], cmap: dict[str, tuple]):
    """Lee et al. (2021)'s local Lipschitz constant L(t) on the run's own update and the top
    Hessian eigenvalue lambda_max(t) along the run, dense beside sparse: one line per series
    (colour) and probed batch size (line style by batch size rank, as Figure 5), the median
    over seeds at each fraction of H. The batch sizes are not pooled: runs at different batch
    sizes share fractions of H, and a median over them jumps between runs."""
    with style():
        fig, axes = plt.subplots(1, 2, figsize=(9.2, 3.4), layout="constrained")
        for ax, (q, label) in zip(axes, (("local_lipschitz", "local Lipschitz constant L"),
                                         ("hessian_top", "top Hessian eigenvalue λ_max"))):
            d = probes[(probes["quantity"] == q) & probes["value"].notna()]
            if not len(d):
                empty_panel(ax, f"{label}:\nnot measured")
                continue
            for name in series:
                for k, (b, g) in enumerate(d[d["series"] == name].groupby("batch_size")):
                    m = g.groupby("fraction")["value"].median()
                    ax.plot(m.index, m.to_numpy(), ["-", "--", ":", "-."][k % 4], marker="o",
                            ms=3, color=cmap[name], lw=1.2, label=f"{name}, B = {int(b)}")
            log10_axis(ax.yaxis)
            ax.set_xlabel("fraction of the run (step / H)")
            ax.set_ylabel(label)
            ax.legend(loc="best", fontsize=7)
        return fig


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
