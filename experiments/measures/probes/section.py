"""The probes' part of the report (:func:`probes_part`): their claims' verdicts and the failed
claims' quantities (:mod:`~experiments.measures.probes.verdicts`) and, in Theory vs measurement, the definition of
steps-to-result used, the claims' table (every part's verdicts), Figure 5 (B_simple along the
run), B_simple along training pooled over the probed runs, and Figure 6 (L and lambda_max along
the run)."""

from __future__ import annotations

import pandas as pd

from experiments.measurement import Part, ReportContext
from experiments.measures.probes import figures as PF
from experiments.measures.probes.verdicts import (
    STEPS_DEFINITION, failure_sentences, noise_along_table, verdicts,
)
from experiments.report.figures import measurement as F
from experiments.report.formatting import eval_text
from experiments.report.sections import Figure, Paragraphs, Section, table_section
from experiments.report.theory_view import probe_definition_text
from experiments.report.verdicts import verdict_table

CLAIMS_NOTE = (
    "Paper's tier: McCandlish et al. (2018) B_simple at the goal within 10x of the "
    "fitted B_crit; Lee et al. (2021) the sparse/dense step ratio explained by "
    "(L_s Δ_s)/(L_d Δ_d) in direction (and ordering with >= 3 levels); shape: small-B "
    "slope in [-1.1, -0.8], plateau within 2x of S_min. Strict tier: within 2x. "
    "\"holds\": the whole interval inside the allowed range; \"does not hold\": wholly "
    "outside; \"inconclusive\": it straddles the line.")


def probes_part(ctx: ReportContext) -> Part:
    """The claims judged on the probes, the findings (every failed claim's probe quantities,
    then per run why no claim could be judged) and the probes' blocks of Theory vs
    measurement."""
    runs = ctx.runs
    judged, unjudged = verdicts(runs.groups, runs.probes, ctx.fits, runs.labels, runs.trials,
                                [r.label for r in runs.runs
                                 if getattr(r.spec, "stop", "") == "all"], runs.stage)
    # a failed claim, whichever part judged it, is explained by the probes' quantities
    failed = lambda every: failure_sentences(every, runs.probes)   # noqa: E731
    return Part(findings=(failed, *unjudged), verdicts=judged, theory=_theory_blocks(ctx))


def claims_section(judged: pd.DataFrame) -> Section:
    """Claims in their own terms: every part's verdicts (``judged``), tier by tier."""
    return table_section("Claims in their own terms", verdict_table(judged),
                         CLAIMS_NOTE if len(judged) else
                         "No claim could be judged (no probes or no fitted curve).")


def _theory_blocks(ctx: ReportContext) -> tuple:
    """The steps-to-result definition used, the claims' table, the two figures along the runs
    and B_simple along training between them."""
    runs = ctx.runs
    order = list(runs.order)
    cmap = F.colors(order)
    evals = "; ".join(dict.fromkeys(f"{r.label}: {eval_text(r.spec)}"
                                    for r in runs.runs))
    probed = [f"{r.label}: {text}" for r in runs.runs
              if (text := probe_definition_text(r.results.run_dir)) is not None]
    noise = noise_along_table(runs.groups, runs.probes, runs.stage, runs.trials, runs.labels)
    return (
        Paragraphs((STEPS_DEFINITION + f" This report used: {evals}.", *probed)),
        claims_section,
        Figure("fig5_b_simple", "Figure 5. B_simple along the run against the fitted B_crit",
               "McCandlish et al. (2018)'s simple noise scale tr Σ / |G|² at K evenly spaced points of "
               "each probed run (x: step / H, H its steps-to-result, or its budget where no run "
               "of its group met the goal), one line per probed batch size (median over seeds); "
               "black line and grey band: the series' fitted B_crit and its interval.",
               F.png_bytes(PF.b_simple_figure(runs.probes, ctx.fits.table, order, cmap))),
        *([table_section("B_simple along training, pooled over the probed runs", noise,
                         "Ratio of sums tr Σ / |G|² over every probed run's points in each fifth of "
                         "the run (McCandlish et al. 2018), bootstrap over runs (over one run's points "
                         "where a level has one run).")] if len(noise) else []),
        Figure("fig6_smoothness", "Figure 6. L and λ_max along the run, dense beside sparse",
               "Lee et al. (2021)'s local Lipschitz constant on the run's own update (their γ grid, "
               "full training split, masked gradients) and the top Hessian eigenvalue (Lanczos), "
               "one line per series (colour) and probed batch size (line style), median over "
               "seeds at each point of the run.",
               F.png_bytes(PF.smoothness_figure(runs.probes, order, cmap))),
    )
