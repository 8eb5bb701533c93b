"""The sweep's figures: steps to result against batch size with the fit and the bound
(Figure 1), normalized steps and the cost of sparsity (Figure 2), the best metaparameters
(Figure 3), every trial (Figure 4) and the noisy quadratic model beside the measurement
(Figure 7), each with its caption (drawn by :mod:`experiments.report.figures`)."""

from __future__ import annotations

from experiments.measurement import ReportContext
from experiments.report.figures import measurement as F
from experiments.report.figures import theory as TF
from experiments.report.formatting import goal_text
from experiments.report.sections import Figure
from experiments.report.theory_view import NQM_NOTE, NQM_OPTIMIZER


def sweep_figures(ctx: ReportContext) -> list[Figure]:
    """The five figures of the sweep and the theory, with their captions."""
    runs, points, fits, theory = ctx.runs, ctx.points, ctx.fits, ctx.theory
    order = list(runs.order)
    cmap = F.colors(order)
    first = runs.runs[0].spec   # the dashed goal line of Figure 4 (combined runs normally share it)
    goals = "; ".join(dict.fromkeys(goal_text(r.spec) for r in runs.runs))
    optimizers = [r.optimizer for r in runs.runs]

    def drawn(make) -> bytes:
        """PNG of ``make()``, or of a placeholder when no group is stored at all."""
        stored = (points["status"] != "missing").any()
        return F.png_bytes(make() if stored else F.placeholder("no group of this study is in the store yet"))

    return [
        Figure("fig1_steps", "Figure 1. Steps to result vs batch size",
               "Measured steps-to-result (median over seeds) per series on log2 axes; dashed: perfect "
               "scaling anchored at the smallest batch size that reached the goal; solid: the fit "
               "S_min (1 + B_crit / B) to the measured points (fitted); dotted: the convergence bound "
               "scaled by the one constant calibrated on the dense curve (on dense: calibrated; on "
               "sparse levels: predicted from their probes); bands: regimes of the fit (perfect scaling "
               "B ≤ B_crit / 4, maximal data parallelism B ≥ 4 B_crit); ×: batch sizes without a point.",
               drawn(lambda: F.steps_figure(points, fits.table, theory.curves, order, cmap,
                                            ncols=min(4, max(len(r.spec.sparsities) for r in runs.runs))))),
        Figure("fig2_normalized", "Figure 2. Normalized steps and the cost of sparsity",
               "(a) Steps divided by the steps at each series' smallest batch size (Lee et al. 2021's "
               "view); dashed: perfect scaling. (b) Measured steps of each sparse series over its "
               "run's dense series at the same batch size (1 = no extra cost).",
               drawn(lambda: F.normalized_figure(points, ctx.ratios, order, cmap))),
        Figure("fig3_metaparameters", "Figure 3. Optimal metaparameters vs batch size",
               "Learning rate, 1 − momentum and effective learning rate lr / (1 − momentum) of the best "
               "trial at each batch size (Shallue et al. 2019), with the linear (dashed, SGD-type) and "
               "square-root (dotted, the usual rule for Adam-type optimizers) heuristics anchored at the "
               "smallest batch size; ringed: best value in the outer "
               "10 % of the searched range (the optimum may lie outside the search space).",
               drawn(lambda: F.metaparameters_figure(points, ctx.edges, order, cmap))),
        Figure("fig4_trials", "Figure 4. Every trial: learning rate × (1 − momentum)",
               f"Each trial of every group, marked by outcome for the goal ({goals}). Groups stop "
               "at the first evaluation where any trial meets the goal unless the study ran with "
               "stop = \"all\", so \"did not\" means not met by then.",
               drawn(lambda: F.trials_figure(runs.trials, order, first.target, first.metric))),
        Figure("fig7_nqm", "Figure 7. Noisy quadratic model beside the measurement",
               nqm_caption(optimizers),
               F.png_bytes(TF.nqm_figure(points, theory.nqm, order, cmap, NQM_NOTE))),
    ]


def nqm_caption(optimizers: list[str]) -> str:
    """Figure 7's caption: the NQM's three optimizers, and which of them each of the study's
    optimizers maps to."""
    nqm_opts = ", ".join(f"{o} → {NQM_OPTIMIZER[o]}" for o in dict.fromkeys(optimizers))
    return ("(a) Measured steps-to-result of every series divided by its value at the smallest "
            "batch size. (b) The noisy quadratic model (Zhang et al. 2019) with SGD, heavy-ball "
            "momentum and Adam-like preconditioning (the study's optimizers map to "
            f"{nqm_opts}), normalized the same way; dashed: perfect scaling. Nothing is fitted: "
            "compare where each curve leaves perfect scaling and whether momentum or "
            "preconditioning extends it. " + NQM_NOTE)
