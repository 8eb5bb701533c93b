"""The probes' figures, in the style of :mod:`experiments.report.figures.measurement`: B_simple
along the run against the fitted B_crit (Figure 5) and L and lambda_max along the run, dense
beside sparse (Figure 6). Each function takes plain DataFrames and returns a matplotlib Figure
(:func:`experiments.report.figures.measurement.png_bytes` renders it deterministically)."""

from __future__ import annotations

import pandas as pd

# first: experiments.report.figures.measurement selects the Agg backend before pyplot is loaded
from experiments.report.figures.measurement import empty_panel, log10_axis, style
from experiments.report.figures.theory import along_the_run, b_crit_band, series_panels

import matplotlib.pyplot as plt  # noqa: E402


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
