"""The report's theory figures: B_simple along the run against the fitted B_crit (Figure 5), L and
lambda_max along the run (Figure 6), and the noisy quadratic model beside the measurement
(Figure 7), in the style of :mod:`experiments.figures`.

Each function takes plain DataFrames and returns a matplotlib Figure
(:func:`experiments.figures.png_bytes` renders it deterministically).
"""

from __future__ import annotations

import textwrap

# first: experiments.figures selects the Agg backend before pyplot is loaded
from .figures import empty_panel, log2_axis, log10_axis, normalized_panel, style

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402


def b_simple_figure(probes: pd.DataFrame, fits: pd.DataFrame, series: list[str], cmap: dict[str, tuple]):
    """B_simple(t) = tr Sigma / |G|^2 along the run (fraction of H) at each probed batch size
    (line style by batch size rank), one panel per series, against the series' fitted B_crit
    with its interval (band): McCandlish et al. (2018) compare the two at the goal."""
    names = [s for s in series if s in set(probes["series"])] or series[:1]
    with style():
        fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.6), squeeze=False,
                                 layout="constrained")
        fit = fits.set_index("series")
        for ax, name in zip(axes[0], names):
            d = probes[(probes["series"] == name) & (probes["quantity"] == "b_simple")
                       & probes["value"].notna()]
            if not len(d):
                empty_panel(ax, f"{name}:\nno probes")
                continue
            for k, (b, g) in enumerate(d.groupby("batch_size")):
                m = g.groupby("fraction")["value"].median()
                ax.plot(m.index, m.to_numpy(), ["-", "--", ":", "-."][k % 4], marker="o", ms=3,
                        color=cmap[name], lw=1.2, label=f"B = {int(b)}")
            if name in fit.index and not pd.isna(fit.loc[name, "b_crit"]):
                ax.axhspan(fit.loc[name, "b_crit_lo"], fit.loc[name, "b_crit_hi"], color="0.85", zorder=0)
                ax.axhline(fit.loc[name, "b_crit"], color="black", lw=0.9, label="fitted B_crit")
            log10_axis(ax.yaxis)
            ax.set_xlabel("fraction of the run (step / H)")
            ax.set_ylabel("B_simple = tr Σ / |G|²")
            ax.set_title(name)
            ax.legend(loc="best", fontsize=7)
        return fig


def smoothness_figure(probes: pd.DataFrame, series: list[str], cmap: dict[str, tuple]):
    """Lee et al. (2021)'s local Lipschitz constant L(t) on the run's own update and the top
    Hessian eigenvalue lambda_max(t) along the run, dense beside sparse (median over seeds and
    probed batch sizes at each fraction of H)."""
    with style():
        fig, axes = plt.subplots(1, 2, figsize=(9.2, 3.4), layout="constrained")
        for ax, (q, label) in zip(axes, (("local_lipschitz", "local Lipschitz constant L"),
                                         ("hessian_top", "top Hessian eigenvalue λ_max"))):
            d = probes[(probes["quantity"] == q) & probes["value"].notna()]
            if not len(d):
                empty_panel(ax, f"{label}:\nnot measured")
                continue
            for name in series:
                m = d[d["series"] == name].groupby("fraction")["value"].median()
                if len(m):
                    ax.plot(m.index, m.to_numpy(), "o-", ms=3, color=cmap[name], lw=1.2, label=name)
            log10_axis(ax.yaxis)
            ax.set_xlabel("fraction of the run (step / H)")
            ax.set_ylabel(label)
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
