"""The delay axis's figures: steps to result against batch size, one line per gradient delay;
and the critical delay against the critical batch size, with the one-parameter prediction."""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns

from experiments.report.figures.measurement import (
    _grid, empty_panel, log2_axis, log10_axis, style,
)


def steps_by_delay_figure(points: pd.DataFrame, series: list[str]):
    """One panel per series (run and level): S(B, tau) against B on log2 axes, one line per
    delay tau (darker: longer), ×: a delay that did not reach the goal at that B, drawn at its
    step budget."""
    delays = sorted(points["delay"].unique())
    pal = dict(zip(delays, sns.color_palette("viridis_r", len(delays))))
    with style():
        fig, axes = _grid(len(series), min(3, len(series)), 3.4, 2.9)
        for ax, name in zip(axes, series):
            mine = points[points["series"] == name]
            if mine["steps"].isna().all():
                empty_panel(ax, f"{name}: no delay reached the goal")
                continue
            for tau in delays:
                d = mine[mine["delay"] == tau].sort_values("batch_size")
                ax.plot(d["batch_size"], d["steps"], "o-", color=pal[tau], ms=3.5, lw=1.2,
                        label=f"τ = {tau}")
                miss = d[d["steps"].isna()]
                ax.plot(miss["batch_size"], miss["max_steps"], "x", color=pal[tau], ms=5)
            log2_axis(ax.xaxis)
            log10_axis(ax.yaxis)
            ax.set_title(name)
            ax.set_xlabel("batch size B")
            ax.set_ylabel("steps to result S(B, τ)")
        axes[0].legend(loc="lower left", ncols=2)
        return fig


def critical_figure(critical: pd.DataFrame, b_crit: pd.DataFrame, m: dict[str, float],
                    series: list[str], cmap: dict[str, tuple]):
    """Delay against batch size, y = 1 + tau on log axes: circles, the measured critical delay
    tau_crit(B) at each batch size (open: a bound); squares, the fitted critical batch size
    B_crit(tau) at each delay tau > 0; lines, what one parameter M (``m``: series -> its
    synchronous B_crit) predicts: 1 + tau_crit = 2 + M / B (dashed) and 1 + tau = M / B_crit
    (dotted)."""
    with style():
        fig, ax = _grid(1, 1, 5.2, 3.6)
        ax = ax[0]
        if not len(critical):
            empty_panel(ax, "no critical delay measured")
            return fig
        lo = min(critical["batch_size"].min(), b_crit["b_crit"].min(skipna=True) or np.inf)
        hi = max(critical["batch_size"].max(), b_crit["b_crit"].max(skipna=True) or 0)
        grid = np.geomspace(max(lo / 2, 0.5), hi * 2, 64)
        for name in series:
            c = cmap[name]
            mine = critical[(critical["series"] == name) & critical["tau_crit"].notna()]
            exact = mine[mine["kind"] == ""]
            bound = mine[mine["kind"] != ""]
            ax.plot(exact["batch_size"], 1 + exact["tau_crit"], "o", color=c,
                    label=f"{name}: τ_crit(B)")
            ax.plot(bound["batch_size"], 1 + bound["tau_crit"], "o", mfc="none", color=c)
            fits = b_crit[(b_crit["level"] == name) & (b_crit["delay"] > 0)]
            ax.plot(fits["b_crit"], 1 + fits["delay"], "s", color=c, label=f"{name}: B_crit(τ)")
            if name in m:
                ax.plot(grid, 2 + m[name] / grid, "--", color=c, lw=1)
                ax.plot(grid, m[name] / grid, ":", color=c, lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        top = 1 + max(critical["tau_crit"].max(skipna=True), b_crit["delay"].max())
        ax.set_ylim(0.8, 2 * top)
        ax.set_xlim(grid[0], grid[-1])
        ax.set_xlabel("batch size B")
        ax.set_ylabel("1 + delay τ")
        ax.legend(loc="upper right", fontsize=6.5)
        return fig
