"""The report's figures of the measurement (Figures 1-4) and the style every figure shares:
matplotlib (Agg) with seaborn styling and its colour-blind palette (Figures 5 and 6, the
theory's, are in :mod:`experiments.report.figures.theory`; a measurement's own, in its folder
under :mod:`experiments.measures`, use :func:`style` and :func:`png_bytes`).

Every function takes plain DataFrames (see :mod:`experiments.report.analysis`) and returns a matplotlib
Figure; :func:`png_bytes` renders it deterministically (no software/time metadata), so the same
store gives byte-identical PNGs. Batch sizes are drawn on log2 axes with powers-of-two ticks and
every axis names its quantity.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator  # noqa: E402


DPI = 110
PALETTE = "colorblind"
# Regime bands (light, distinguishable without colour by their legend and order left to right).
REGIME_COLORS = {"perfect scaling": "#cfe3f3", "diminishing returns": "#f6e3c6",
                 "maximal data parallelism": "#e4e4e4"}
_cb = sns.color_palette(PALETTE)
STATUS_STYLE = {"reached": (_cb[2], "o", "met the goal"), "not_reached": (_cb[0], "s", "did not"),
                "diverged": (_cb[3], "X", "diverged")}


def colors(series: list[str]) -> dict[str, tuple]:
    """One colour-blind-safe colour per series, in report order (repeats after 10)."""
    pal = sns.color_palette(PALETTE, max(len(series), 1))
    return {s: pal[i % len(pal)] for i, s in enumerate(series)}


@contextmanager
def style() -> Iterator[None]:
    """seaborn's whitegrid/paper style, scoped (the caller's rcParams are left untouched)."""
    rc = {**sns.axes_style("whitegrid"), **sns.plotting_context("paper"), "svg.hashsalt": "sparsescale",
          "axes.titlesize": 9, "legend.fontsize": 7.5, "figure.dpi": DPI}
    with plt.rc_context(rc):
        yield


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes; fixed metadata so identical figures give identical bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _pow2(value: float, _pos=None) -> str:
    if value >= 1:
        return f"{value:.0f}"
    return f"1/{1 / value:.0f}"


def log2_axis(axis) -> None:
    """Log base 2 with ticks at powers of two labelled as plain numbers (8, 16, 32, ...)."""
    scale_setter = axis.axes.set_xscale if axis is axis.axes.xaxis else axis.axes.set_yscale
    scale_setter("log", base=2)
    axis.set_major_locator(LogLocator(base=2, numticks=12))
    axis.set_major_formatter(FuncFormatter(_pow2))
    axis.set_minor_locator(NullLocator())


def log10_axis(axis, subs: tuple[float, ...] = (1.0, 2.0, 5.0)) -> None:
    """Log base 10 with ticks at ``subs`` x 10^k labelled as plain numbers; no minor ticks (they
    dominate rendering time and the grid shows major ticks only)."""
    scale_setter = axis.axes.set_xscale if axis is axis.axes.xaxis else axis.axes.set_yscale
    scale_setter("log")
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=8))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(NullLocator())


def empty_panel(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=8,
            color="0.35", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _grid(n: int, ncols: int, width: float, height: float, extra_height: float = 0.0, **kw):
    """``n`` panels in rows of ``ncols`` (at least 7.5 in wide, plus room for a legend)."""
    ncols = max(1, min(ncols, n))
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(width * ncols, 7.5), height * nrows + extra_height),
                             squeeze=False, layout="constrained", **kw)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _b_range(points: pd.DataFrame) -> tuple[float, float]:
    b = points["batch_size"].to_numpy(float)
    return (b.min() / 1.4, b.max() * 1.4) if len(b) else (1.0, 2.0)


# ---------------------------------------------------------------------------------------------
# 1. steps-to-result vs batch size


def steps_figure(points: pd.DataFrame, fits: pd.DataFrame, predicted: pd.DataFrame,
                 series: list[str], cmap: dict[str, tuple], ncols: int = 3):
    """One panel per series: measured steps-to-result, the perfect-scaling line anchored at the
    smallest batch size, the fitted S_min (1 + B_crit / B), the theory's prediction and the
    regime bands of the fit; batch sizes without a point are marked (x) along the top. Panels run in
    rows of ``ncols`` (e.g. one row per study when combining runs)."""
    with style():
        fig, axes = _grid(len(series), ncols, 3.6, 2.9, extra_height=0.9, sharex=True, sharey=True)
        lo, hi = _b_range(points)
        grid = np.geomspace(lo, hi, 64)
        gaps = {}
        for ax, name in zip(axes, series):
            p = points[points["series"] == name]
            reached = p[p["status"] == "reached"]
            f = fits[fits["series"] == name]
            if len(f) and not pd.isna(f["b_crit"].iloc[0]):
                row = f.iloc[0]
                edges = [lo, row["perfect_until"], row["largest_useful_batch"], hi]
                for (a, b), regime in zip(zip(edges, edges[1:]), REGIME_COLORS):
                    if b > a and a < hi and b > lo:
                        ax.axvspan(max(a, lo), min(b, hi), color=REGIME_COLORS[regime], lw=0, zorder=0)
                ax.plot(grid, row["s_min"] * (1 + row["b_crit"] / grid), color=cmap[name], lw=1.2,
                        zorder=2)
            if len(reached):
                b0, s0 = reached["batch_size"].iloc[0], reached["steps"].iloc[0]
                ax.plot(grid, s0 * b0 / grid, color="black", ls="--", lw=0.9, zorder=2)
            pr = predicted[predicted["series"] == name] if len(predicted) else predicted
            if len(pr):
                ax.plot(pr["batch_size"], pr["steps"], color="0.3", ls=":", lw=1.5, zorder=3)
            ax.plot(reached["batch_size"], reached["steps"], "o", color=cmap[name], ms=5,
                    mec="white", mew=0.6, zorder=4)
            gaps[ax] = p[p["status"] != "reached"]["batch_size"]
            ax.set_title(name)
            log2_axis(ax.xaxis)
            log2_axis(ax.yaxis)
            ax.set_xlim(lo, hi)
        # batch sizes without a point: x marks along the top of the (shared) steps axis
        y_lo, y_hi = axes[0].get_ylim()
        for ax in axes:
            ax.plot(gaps[ax], np.full(len(gaps[ax]), y_hi / 1.15), "x", color="0.2", ms=5, zorder=5)
            ax.set_ylim(y_lo, y_hi)
            ax.set_xlabel("batch size B")
            ax.set_ylabel("steps to reach the goal")
            ax.label_outer()
        handles = [Line2D([], [], marker="o", ls="", color="0.4", label="measured (median over seeds)"),
                   Line2D([], [], ls="--", color="black", label="perfect scaling"),
                   Line2D([], [], ls="-", color="0.4", label="fit S_min (1 + B_crit / B)"),
                   Line2D([], [], ls=":", color="0.3", lw=1.5, label="theory prediction"),
                   Line2D([], [], marker="x", ls="", color="0.2",
                          label="no point (not reached, failed, missing)"),
                   *[Patch(color=c, label=r) for r, c in REGIME_COLORS.items()]]
        fig.legend(handles=handles, loc="outside lower center", frameon=False,
                   ncol=max(1, int(fig.get_figwidth() / 2.6)))
        return fig


# ---------------------------------------------------------------------------------------------
# 2. normalized steps (Lee et al.) and the sparse / dense ratio


def normalized_panel(ax, points: pd.DataFrame, series: list[str], cmap: dict[str, tuple]) -> None:
    """Each series' steps divided by its steps at its smallest reached batch size, with the
    perfect-scaling line B0 / B from every distinct anchor B0."""
    reached = points[points["status"] == "reached"]
    if reached.empty:
        empty_panel(ax, "no batch size reached the goal yet")
        return
    anchors = set()
    for name in series:
        p = reached[reached["series"] == name]
        if len(p):
            anchors.add(float(p["batch_size"].iloc[0]))
            ax.plot(p["batch_size"], p["steps"] / p["steps"].iloc[0], "o-", color=cmap[name], ms=4, lw=1.2,
                    label=name)
    lo, hi = _b_range(points)
    grid = np.geomspace(lo, hi, 32)
    for i, b0 in enumerate(sorted(anchors)):
        ax.plot(grid, b0 / grid, ls="--", color="black", lw=0.9, label="perfect scaling" if i == 0 else None)
    log2_axis(ax.xaxis)
    log2_axis(ax.yaxis)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("steps / steps at smallest B")
    ax.legend(loc="lower left")


def placeholder(text: str):
    """A small figure saying why a figure has nothing to show (e.g. no group stored yet)."""
    with style():
        fig, ax = plt.subplots(figsize=(6, 1.6), layout="constrained")
        empty_panel(ax, text)
        return fig


def normalized_figure(points: pd.DataFrame, ratios: pd.DataFrame, series: list[str],
                      cmap: dict[str, tuple]):
    """(a) steps / steps at the series' smallest batch size (Lee et al. 2021's comparison view)
    with the perfect-scaling line; (b) measured sparse / dense steps at each batch size."""
    with style():
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.2, 3.4), layout="constrained")
        normalized_panel(ax, points, series, cmap)
        ax.set_title("(a) normalized steps to result")
        lo, hi = _b_range(points)
        if len(ratios):
            for name in [s for s in series if s in set(ratios["series"])]:
                r = ratios[ratios["series"] == name]
                bx.plot(r["batch_size"], r["ratio"], "o-", color=cmap[name], ms=4, lw=1.2, label=name)
            bx.axhline(1.0, color="black", lw=0.8, ls="--")
            log2_axis(bx.xaxis)
            bx.set_xlim(lo, hi)
            log10_axis(bx.yaxis)
            bx.set_xlabel("batch size B")
            bx.set_ylabel("steps sparse / steps dense")
            bx.legend(loc="upper left")
        else:
            empty_panel(bx, "no sparse and dense curves\nreached the goal at a common batch size")
        bx.set_title("(b) cost of sparsity in steps")
        return fig


# ---------------------------------------------------------------------------------------------
# 3. optimal metaparameters vs batch size (Shallue et al.)


def _momentum_note(fixed: set[float]) -> str:
    if fixed == {0.0}:
        return "momentum not used\n(plain SGD, or Adam-type)"
    return "momentum not searched\n(fixed at " + ", ".join(f"{v:g}" for v in sorted(fixed)) + ")"


def metaparameters_figure(points: pd.DataFrame, edges: pd.DataFrame, series: list[str],
                          cmap: dict[str, tuple]):
    """Best trial's learning rate, 1 - momentum and effective lr / (1 - momentum) vs B, with the
    linear (y0 B / B0, SGD-type) and square-root (y0 sqrt(B / B0), the usual rule for Adam-type
    optimizers) heuristics anchored at the smallest B (Shallue et al. 2019); values in the outer
    10 % of the search range are ringed. Adam-type runs record momentum 0 (their step size does
    not scale with 1 / (1 - beta1)), so their effective lr is their lr."""
    panels = (("lr", "learning rate (best trial)"), ("momentum", "1 − momentum (best trial)"),
              ("effective_lr", "effective lr = lr / (1 − momentum)"))
    data = points.join(edges)
    with style():
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.5), layout="constrained")
        lo, hi = _b_range(points)
        for ax, (key, label) in zip(axes, panels):
            drawn, fixed = False, set()
            for name in series:
                p = data[(data["series"] == name) & data[key].notna()]
                if not len(p):
                    continue
                y = 1.0 - p[key] if key == "momentum" else p[key]
                if key == "momentum" and p[key].nunique() == 1:
                    fixed.add(float(p[key].iloc[0]))
                    continue
                drawn = True
                ax.plot(p["batch_size"], y, "o-", color=cmap[name], ms=4, lw=1.1, label=name)
                if key != "momentum":
                    b = p["batch_size"].to_numpy(float)
                    b0, y0 = b[0], float(y.iloc[0])
                    ax.plot(b, y0 * b / b0, ls="--", color=cmap[name], lw=0.8, alpha=0.7)
                    ax.plot(b, y0 * np.sqrt(b / b0), ls=":", color=cmap[name], lw=1.0, alpha=0.9)
                edge_col = f"{key}_at_edge" if key != "effective_lr" else None
                if edge_col and edge_col in p:
                    e = p[p[edge_col]]
                    ey = 1.0 - e[key] if key == "momentum" else e[key]
                    ax.plot(e["batch_size"], ey, "o", mfc="none", mec="black", ms=10, mew=1.1)
            if not drawn:
                empty_panel(ax, _momentum_note(fixed) if key == "momentum" and fixed else "no best trials")
                ax.set_title(label)
                continue
            log2_axis(ax.xaxis)
            log10_axis(ax.yaxis)
            ax.set_xlim(lo, hi)
            ax.set_xlabel("batch size B")
            ax.set_ylabel(label)
            ax.set_title(label)
        handles = [Line2D([], [], color=cmap[s], marker="o", label=s) for s in series
                   if s in set(points["series"])]
        handles += [Line2D([], [], ls="--", color="0.3", label="linear heuristic y0·B/B0"),
                    Line2D([], [], ls=":", color="0.3",
                           label="square-root heuristic y0·√(B/B0) (Adam-type rule)"),
                    Line2D([], [], marker="o", ls="", mfc="none", mec="black", ms=9,
                           label="in the outer 10 % of the search range")]
        fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)), frameon=False)
        return fig


# ---------------------------------------------------------------------------------------------
# 4. every trial: learning rate x (1 - momentum), coloured by outcome


TRIAL_COLUMNS = 6   # batch sizes per row of Figure 4; a series with more batch sizes wraps


def trials_figure(trials: pd.DataFrame, series: list[str], target: float | None,
                  metric: str = "error"):
    """One panel per (series, batch size): each trial at (learning rate, 1 - momentum), marked by
    whether it met the goal, did not, or diverged. For a series without a momentum search the
    vertical axis is the final validation metric (diverged trials just above the worst one).
    Each series takes one row of up to ``TRIAL_COLUMNS`` batch sizes (more rows if it has more)."""
    names = [s for s in series if s in set(trials["series"])]
    sizes = sorted(set(trials["batch_size"]))
    finite = trials["final_metric"].dropna()
    ceiling = 1.1 * finite.max() if len(finite) else 1.0
    with style():
        if not names:
            fig, ax = plt.subplots(figsize=(4, 2), layout="constrained")
            empty_panel(ax, "no trials stored")
            return fig
        ncols = min(len(sizes), TRIAL_COLUMNS)
        wraps = math.ceil(len(sizes) / ncols)
        nrows = len(names) * wraps
        # a regular grid with fixed margins in inches: a layout engine costs more than the drawing
        width, height = 1.55 * ncols + 1.1, 1.6 * nrows + 0.8
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, sharex=True,
                                 sharey="row")
        fig.subplots_adjust(left=1.0 / width, right=1 - 0.1 / width, top=1 - 0.3 / height,
                            bottom=0.8 / height, wspace=0.08, hspace=0.35)
        any_metric_row = False
        for i, name in enumerate(names):
            mine = trials[trials["series"] == name]
            momentum_searched = mine["momentum"].nunique() > 1
            any_metric_row |= not momentum_searched
            for k in range(wraps * ncols):
                ax = axes[i * wraps + k // ncols, k % ncols]
                t = mine[mine["batch_size"] == sizes[k]] if k < len(sizes) else mine.iloc[:0]
                if not len(t):   # columns are batch sizes of every series: not all have each
                    ax.set_visible(False)
                    continue
                b = sizes[k]
                for status, (color, marker, _) in STATUS_STYLE.items():
                    s = t[t["status"] == status]
                    y = 1.0 - s["momentum"] if momentum_searched else s["final_metric"].fillna(ceiling)
                    ax.scatter(s["lr"], y, c=[color], marker=marker, s=14, lw=0)
                if not momentum_searched and target is not None:
                    ax.axhline(target, color="black", lw=0.7, ls="--")
                log10_axis(ax.xaxis, subs=(1.0,))
                if momentum_searched:
                    log10_axis(ax.yaxis)
                ax.set_title(f"B = {b}", fontsize=8)
                if k % ncols == 0:
                    quantity = "1 − momentum" if momentum_searched else f"final {metric}"
                    ax.set_ylabel(name.replace(", ", ",\n") + "\n" + quantity, fontsize=7)
                ax.tick_params(labelsize=6, labelbottom=True)
        for ax in axes[-1]:
            ax.set_xlabel("learning rate")
        handles = [Line2D([], [], marker=m, ls="", color=c, label=lab) for c, m, lab in STATUS_STYLE.values()]
        if any_metric_row and target is not None:
            handles.append(Line2D([], [], ls="--", color="black", label=f"goal: {metric} {target:g}"))
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
        return fig
