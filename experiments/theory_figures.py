"""The report's theory figures: probes of smoothness and gradient noise (Figure 5) and the noisy
quadratic model beside the measurement (Figure 6), in the style of :mod:`experiments.figures`.

Each function takes plain DataFrames and returns a matplotlib Figure
(:func:`experiments.figures.png_bytes` renders it deterministically).
"""

from __future__ import annotations

import math
import textwrap

# first: experiments.figures selects the Agg backend before pyplot is loaded
from .figures import PHASE_MARKERS, empty_panel, log2_axis, log10_axis, normalized_panel, style

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402


PROBE_PANELS = (("local_lipschitz", "local Lipschitz constant L"),
                ("hessian_top", "top Hessian eigenvalue λ_max"),
                ("b_simple", "noise scale B_simple = tr Σ / |G|²"))


def probes_figure(probes: pd.DataFrame, series: list[str], runs: list[str], cmap: dict[str, tuple]):
    """Top: each quantity vs sparsity, at initialization and along the reference trajectory
    (median over its snapshots, bars from min to max), one line per run. Bottom: the same
    quantities over training steps, one line per series. Local Lipschitz (Lee et al. 2021),
    Lanczos top eigenvalue, McCandlish et al. (2018)'s B_simple (B_noise dashed where measured)."""
    run_colors = (dict(zip(runs, sns.color_palette("dark", len(runs)))) if len(runs) > 1
                  else {runs[0]: (0.2, 0.2, 0.2)})
    with style():
        fig, axes = plt.subplots(2, 3, figsize=(12, 7.0))
        for k, (q, label) in enumerate(PROBE_PANELS):
            top, bottom = axes[0, k], axes[1, k]
            d = probes[(probes["quantity"] == q) & probes["value"].notna()]
            if not len(d):
                empty_panel(top, f"{label}:\nnot measured")
                empty_panel(bottom, f"{label}:\nnot measured")
                continue
            for run in runs:
                for phase, (marker, _) in PHASE_MARKERS.items():
                    g = d[(d["run"] == run) & (d["phase"] == phase)].groupby("sparsity")["value"]
                    if not len(g):
                        continue
                    med, mn, mx = g.median(), g.min(), g.max()
                    color = run_colors[run]
                    top.errorbar(100 * med.index.to_numpy(float), med.to_numpy(), yerr=[med - mn, mx - med],
                                 marker=marker, ls="-" if phase == "trajectory" else ":", color=color,
                                 ms=5, capsize=2, lw=1, mfc=color if phase == "trajectory" else "white")
            top.set_xlabel("sparsity (%)")
            top.set_ylabel(label)
            log10_axis(top.yaxis)
            top.set_title(f"{label} vs sparsity")
            traj = d[d["phase"] == "trajectory"]
            for name in series:
                g = traj[traj["series"] == name]
                if len(g):
                    bottom.plot(g["step"], g["value"], "o-", color=cmap[name], ms=3.5, lw=1.1)
                if q == "b_simple":
                    n = probes[(probes["quantity"] == "b_noise") & (probes["phase"] == "trajectory")
                               & (probes["series"] == name) & probes["value"].notna()]
                    bottom.plot(n["step"], n["value"], ls="--", color=cmap[name], lw=0.9)
            if len(traj):
                log10_axis(bottom.xaxis)
                log10_axis(bottom.yaxis)
                bottom.set_xlabel("training step (reference trajectory)")
                bottom.set_ylabel(label)
            else:
                empty_panel(bottom, f"{label}:\nno trajectory probes")
            bottom.set_title(f"{label} over training")
        handles = [Line2D([], [], marker=m, ls="", color="0.2", mfc="white" if p == "init" else "0.2",
                          label=lab) for p, (m, lab) in PHASE_MARKERS.items()]
        if len(runs) > 1:
            handles += [Line2D([], [], color=c, label=f"{r} (top row)") for r, c in run_colors.items()]
        handles += [Line2D([], [], color=cmap[s], marker="o", ms=3.5, label=s) for s in series
                    if s in set(probes["series"])]
        handles.append(Line2D([], [], ls="--", color="0.3", label="B_noise = tr(HΣ) / GᵀHG"))
        fig.legend(handles=handles, loc="lower center", ncol=min(5, len(handles)), frameon=False)
        # a regular grid with fixed margins (a layout engine costs more than the drawing); the
        # bottom margin leaves 0.6 in for the x labels plus one legend row per 5 entries
        rows = math.ceil(len(handles) / 5)
        fig.subplots_adjust(left=0.06, right=0.99, top=0.96, bottom=(0.6 + 0.17 * rows) / 7.0,
                            wspace=0.28, hspace=0.38)
        return fig


# ---------------------------------------------------------------------------------------------
# 6. noisy quadratic model beside the measured curves


def nqm_figure(points: pd.DataFrame, nqm: pd.DataFrame, series: list[str], cmap: dict[str, tuple],
               note: str):
    """(a) measured steps normalized at the smallest batch size; (b) the noisy quadratic model
    (Zhang et al. 2019) for the study's optimizer(s), normalized the same way, in its own units."""
    with style():
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.2, 3.4), layout="constrained")
        normalized_panel(ax, points, series, cmap)
        ax.set_title("(a) measured")
        if not len(nqm):
            empty_panel(bx, "the NQM reached the target at no batch size")
        else:
            styles = {"sgd": "-", "momentum": "-."}
            pal = sns.color_palette("dark", 4)
            for i, (opt, g) in enumerate(nqm.groupby("optimizer", sort=True)):
                bx.plot(g["batch_size"], g["steps"] / g["steps"].iloc[0], ls=styles.get(opt, "-"),
                        marker="o", ms=3.5, color=pal[i], lw=1.3, label=f"NQM, {opt}")
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
