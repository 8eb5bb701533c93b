"""The papers' claims judged on the probes along the runs (the probes' part of Theory vs
measurement).

Per run, :func:`verdicts` summarizes the probe table per level (``theory.summarize``: B_simple
at the goal, L along the run, lambda_max, with hierarchical bootstrap intervals) and judges every
claim of ``theory.verdicts.claims`` against the fitted curves: McCandlish et al. (2018), Lee et al.
(2021)'s sparsity claim, and the shape of the curve (Shallue et al. 2019), each in the paper's
tier and a strict one, with its interval and a verdict "holds", "does not hold" or
"inconclusive" (rows of :data:`experiments.report.verdicts.VERDICT_COLUMNS`).
:func:`noise_along_table` gives B_simple along training, pooled over the probed runs; when a
claim (any part's) does not hold, :func:`failure_sentences` gives the probes' quantities that
show why.

The step ratios count every run, those that missed the goal censored at their budget
(:func:`experiments.report.verdicts.level_runs`, :mod:`theory.verdicts.step_ratio`); each
verdict records its statistic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from theory.errors import TheoryError
from theory.verdicts.claims import FAILS, judge_claims
from theory.verdicts.noise_along import b_simple_along, b_simple_at_goal, noise_points
from theory.verdicts.summaries import find, summarize

from experiments.report.analysis import Fits, reached_groups
from experiments.report.formatting import fmt_interval, fmt_num, sparsity_label
from experiments.report.verdicts import VERDICT_COLUMNS, level_curves, level_runs

STEPS_DEFINITION = (
    "Steps-to-result: the first scheduled evaluation (every [eval] step) whose validation metric "
    "meets the goal, refined to the step inside the replay window; a trial's metric can dip below "
    "the target between two evaluations and come back, so [eval] every = 1 gives the "
    "schedule-free answer.")


def verdicts(groups: pd.DataFrame, probes: pd.DataFrame, fits: Fits, runs: Sequence[str],
             trials: pd.DataFrame | None = None, replicates: Sequence[str] = (),
             stage: pd.DataFrame | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Every claim's verdict per run and level (columns :data:`VERDICT_COLUMNS`), and per run
    why none could be judged (when so). ``trials`` and ``replicates``: as :func:`level_runs`
    (without ``trials``, each reached group is a run); ``stage``: the probes at Lee et al.'s
    stage, whose runs that met the goal join the early probes' in B_simple at the goal
    (:func:`goal_noise`)."""
    reached = reached_groups(groups)
    rows, skipped = [], []
    for run in runs:
        mine = probes[probes["run"] == run] if "run" in probes else probes.iloc[:0]
        g = reached[reached["run"] == run]
        series_of = dict(zip(g["sparsity"], g["series"]))
        level_fits = {s: fits.objects[name] for s, name in series_of.items() if name in fits.objects}
        if mine.empty or not level_fits:
            skipped.append(f"{run}: no claim judged ({'no probes' if mine.empty else 'no fitted curve'}).")
            continue
        curves = level_curves(g)
        try:
            summaries = summarize(mine)
            probed = {s: f for s, f in level_fits.items() if _has(summaries, s)}
            judged = judge_claims(summaries, probed, curves, runs=level_runs(
                groups[groups["run"] == run], trials, run in replicates),
                b_simple=goal_noise(mine, stage, trials, run))
        except TheoryError as exc:
            skipped.append(f"{run}: no claim judged ({exc}).")
            continue
        rows += [{"run": run, "series": series_of[v.sparsity], "sparsity": v.sparsity,
                  "claim": v.claim, "tier": v.tier, "value": v.value, "low": v.interval[0],
                  "high": v.interval[1], "allowed_low": v.threshold[0],
                  "allowed_high": v.threshold[1], "verdict": v.verdict, "reason": v.reason,
                  "statistic": v.statistic}
                 for v in judged]
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS), skipped


def goal_noise(probes: pd.DataFrame, stage: pd.DataFrame | None,
               trials: pd.DataFrame | None, run: str) -> dict:
    """B_simple at the goal per level of one run, pooled over its early probes' runs and the
    runs at Lee et al.'s stage that met the goal (``theory.verdicts.noise_along``)."""
    return b_simple_at_goal(noise_points(probes, _met(stage, trials, run)))


def _met(stage: pd.DataFrame | None, trials: pd.DataFrame | None,
         run: str) -> pd.DataFrame | None:
    """The rows at Lee et al.'s stage of one run's trials that met the goal (the others end at
    their budget, not at the goal)."""
    if stage is None or not len(stage) or trials is None or not len(trials):
        return None
    met = trials[(trials["run"] == run) & (trials["status"] == "reached")]
    keys = ["sparsity", "seed", "batch_size", "trial"]
    return stage[stage["run"] == run].merge(met[keys].drop_duplicates(), on=keys)


def noise_along_table(groups: pd.DataFrame, probes: pd.DataFrame,
                      stage: pd.DataFrame | None, trials: pd.DataFrame | None,
                      runs: Sequence[str]) -> pd.DataFrame:
    """B_simple along training per series, pooled over its probed runs (the early probes' and
    those at Lee et al.'s stage that met the goal) in fifths of the run, with bootstrap
    intervals over runs (``theory.verdicts.noise_along.b_simple_along``)."""
    rows = []
    for run in runs:
        mine = probes[probes["run"] == run] if "run" in probes else probes.iloc[:0]
        series = dict(zip(groups.loc[groups["run"] == run, "sparsity"],
                          groups.loc[groups["run"] == run, "series"]))
        for x in b_simple_along(noise_points(mine, _met(stage, trials, run))):
            rows.append({"series": series.get(x.sparsity, sparsity_label(x.sparsity)),
                         "fraction of the run": f"{x.start:.1f}-{x.stop:.1f}",
                         "B_simple [90 %]": f"{fmt_num(x.value, 3)} "
                                            f"{fmt_interval(*x.interval)}",
                         "runs": x.runs, "points": x.points, "interval over": x.over})
    return pd.DataFrame(rows, columns=["series", "fraction of the run", "B_simple [90 %]", "runs",
                                       "points", "interval over"])


def _has(summaries, sparsity: float) -> bool:
    try:
        find(summaries, sparsity, "b_simple_goal")
    except TheoryError:
        return False
    return True


def failure_sentences(table: pd.DataFrame, probes: pd.DataFrame) -> list[str]:
    """When a claim does not hold: L, lambda_max and |G|^2 along the runs, per level (dense beside
    sparse), and a plain statement that the theory does not explain this workload."""
    failed = table[table["verdict"] == FAILS]
    out = []
    for run, f in failed.groupby("run", sort=False):
        mine = probes[(probes["run"] == run)]
        parts = []
        for sparsity, g in mine.groupby("sparsity"):
            med = g.groupby("quantity")["value"].median()
            parts.append(f"{sparsity_label(sparsity)}: median along the runs L = "
                         f"{fmt_num(med.get('local_lipschitz', np.nan), 3)}, λ_max = "
                         f"{fmt_num(med.get('hessian_top', np.nan), 3)}, |G|² = "
                         f"{fmt_num(med.get('g_sq', np.nan), 3)}")
        claims = ", ".join(sorted(set(f["claim"])))
        out.append(f"{run}: {claims} does not hold, so the theory does not explain this workload "
                   f"({'; '.join(parts)}).")
    return out
