"""The papers' claims, tested in their own terms, with intervals and plain verdicts.

Every claim compares a measured quantity with what a paper says about it. A value comes with an
interval; the verdict is "holds" when the whole interval lies inside the allowed range, "does
not hold" when it lies wholly outside, and "inconclusive" when it straddles the line. Two tiers:
the paper's own tolerance, and a strict one (within 2x).

- ``mccandlish`` (McCandlish et al. 2018 find that the simple noise scale predicts the critical
  batch size to within about an order of magnitude across tasks): B_simple at the goal against
  the fitted B_crit; pooled over every probed run with a bootstrap over runs where given
  (:func:`theory.verdicts.noise_along.b_simple_at_goal`), else the summaries'
  (:mod:`theory.verdicts.summaries`). Paper: ratio within 10x; strict: 2x.
- ``lee_sparsity`` (Lee et al. 2021: sparser networks need more steps because their
  local Lipschitz constant L is larger; the bound's S_min is proportional to L Delta): the
  predicted sparse/reference ratio (L_s Delta_s) / (L_d Delta_d) against the measured one, as the
  fitted S_min ratio and as the step ratio of
  :func:`theory.verdicts.step_ratio.censored_step_ratio`
  (Kaplan-Meier medians over runs, runs that missed the goal censored at their budget, median
  over batch sizes, bootstrap over batch sizes and runs; best-of-N beside it). Paper: the measured
  ratio has a direction (its interval excludes 1), the prediction and the L ratio point the same
  way with intervals excluding 1, and, with >= 3 sparsity levels, prediction and measurement are
  ordered alike and monotone in sparsity. Strict: predicted / measured within 2x.
- ``shape_slope`` (Shallue et al. 2019; Lee et al. 2021: perfect scaling at small
  batch sizes): least-squares slope of log steps on log batch size over the smallest
  ``small`` batch sizes, in [-1.1, -0.8].
- ``shape_plateau`` (same papers: maximal data parallelism): steps at the largest batch size
  within 2x of the fitted S_min.

Not scored: the bound's own critical batch 4 sigma^2 / eps. With one eps shared by all levels it
scales as sigma_s^2 / sigma_ref^2 by construction, a property of the bound, not a prediction.

Interval arithmetic: a ratio of two independent estimates with only intervals known (fits) uses
the conservative [low_a / high_b, high_a / low_b]; ratios of probe summaries use their bootstrap
replicates (levels are independent runs).

Every :class:`Verdict` records in ``statistic`` which statistic its measured side is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from theory.errors import TheoryError, check_int
from theory.models.predict import MeasuredCurve
from theory.models.scaling import ScalingFit
from theory.verdicts.noise_along import NoiseScale, describe as describe_noise
from theory.verdicts.step_ratio import (
    STATISTIC, censored_step_ratio, describe, runs_from_curves,
)
from theory.verdicts.summaries import Summary, find

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE)
MCCANDLISH_FACTOR = 10.0
STRICT_FACTOR = 2.0
SLOPE_RANGE = (-1.1, -0.8)
PLATEAU_FACTOR = 2.0
SMALL_BATCHES = 3
ABOVE, BELOW = (1.0, math.inf), (0.0, 1.0)

Interval = tuple[float, float]
# the statistics of the measured side, as Verdict.statistic names them
FIT_STATISTIC = "fitted S(B) = S_min (1 + B_crit / B), bootstrap over seeds or residuals"
NOISE_STATISTIC = "B_simple at the goal (ratio of sums over runs) over the fitted B_crit"
SLOPE_STATISTIC = "least-squares slope of log steps on log B, t interval"
PLATEAU_STATISTIC = "geometric mean over seeds at the largest B over the fitted S_min"


@dataclass(frozen=True)
class Verdict:
    """One claim at one sparsity level and tier: ``value`` and its ``interval``, the allowed
    range ``threshold`` (low, high), the ``verdict`` (one of :data:`VERDICTS`), a plain
    ``reason`` giving the numbers behind it, and the ``statistic`` the measured side uses
    (e.g. :data:`theory.verdicts.step_ratio.STATISTIC`)."""

    claim: str
    tier: str
    sparsity: float
    value: float
    interval: Interval
    threshold: Interval
    verdict: str
    reason: str
    statistic: str = ""


def judge(interval: Interval, allowed: Interval) -> str:
    """"holds" if ``interval`` lies inside ``allowed``, "does not hold" if wholly outside,
    "inconclusive" if it straddles a bound (or is undefined)."""
    lo, hi = interval
    a, b = allowed
    if math.isnan(lo) or math.isnan(hi):
        return INCONCLUSIVE
    if a <= lo and hi <= b:
        return HOLDS
    if hi < a or lo > b:
        return FAILS
    return INCONCLUSIVE


def combine(*verdicts: str) -> str:
    """All parts of a claim: any "does not hold" fails it, else any "inconclusive" leaves it open."""
    if FAILS in verdicts:
        return FAILS
    return INCONCLUSIVE if INCONCLUSIVE in verdicts else HOLDS


def ratio_interval(num: Interval, den: Interval) -> Interval:
    """Conservative interval of a / b from intervals of positive a and b."""
    return (num[0] / den[1] if den[1] > 0 else math.nan,
            num[1] / den[0] if den[0] > 0 else math.inf)


def _fmt(value: float, interval: Interval) -> str:
    return f"{value:.3g} [{interval[0]:.3g}, {interval[1]:.3g}]"


def _replicate_interval(reps: np.ndarray, level: float) -> Interval:
    alpha = (1.0 - level) / 2.0
    finite = reps[np.isfinite(reps)]
    if finite.size == 0:
        return math.nan, math.nan
    return tuple(float(q) for q in np.quantile(finite, [alpha, 1.0 - alpha]))


def mccandlish(summaries: Sequence[Summary], fits: Mapping[float, ScalingFit],
               b_simple: Mapping[float, NoiseScale] | None = None) -> tuple[Verdict, ...]:
    """Fitted B_crit against B_simple at the goal, per level in ``fits`` (module docstring):
    ``b_simple`` (sparsity -> pooled over runs) where it has the level, else the summaries'."""
    out = []
    for sparsity, fit in sorted(fits.items()):
        pooled = (b_simple or {}).get(sparsity)
        bs = pooled or find(summaries, sparsity, "b_simple_goal")
        value = bs.value / fit.b_crit
        interval = ratio_interval(bs.interval, fit.intervals["b_crit"])
        source = f" ({describe_noise(pooled)})" if pooled else ""
        numbers = (f"B_simple at the goal {_fmt(bs.value, bs.interval)}{source} / fitted B_crit "
                   f"{_fmt(fit.b_crit, fit.intervals['b_crit'])} = {_fmt(value, interval)}")
        for tier, factor in (("paper", MCCANDLISH_FACTOR), ("strict", STRICT_FACTOR)):
            verdict = judge(interval, (1.0 / factor, factor))
            says = {HOLDS: f"within {factor:g}x",
                    FAILS: f"outside {factor:g}x: the noise scale does not predict the critical "
                           "batch size on this workload",
                    INCONCLUSIVE: f"the interval straddles the {factor:g}x line"}[verdict]
            out.append(Verdict("mccandlish", tier, sparsity, value, interval,
                               (1.0 / factor, factor), verdict, f"{numbers}; {says}",
                               NOISE_STATISTIC))
    return tuple(out)


@dataclass(frozen=True)
class _Ratio:
    value: float
    interval: Interval


def _side(measured: Interval) -> Interval | None:
    """The side of 1 the measured ratio lies on (its interval excludes 1), else None."""
    for side in (ABOVE, BELOW):
        if judge(measured, side) == HOLDS:
            return side
    return None


def _direction(a: Interval, b: Interval) -> int:
    """+1 if interval b lies wholly above a, -1 wholly below, 0 if they overlap."""
    return 1 if b[0] > a[1] else -1 if b[1] < a[0] else 0


def ordering(measured: Sequence[Interval], predicted: Sequence[Interval]) -> tuple[str, str]:
    """Lee et al.'s monotone ordering across >= 3 levels (sorted by sparsity, reference first as
    (1, 1)): measured and predicted ratios step the same way between neighbouring levels, and
    the measured steps all go one way. Returns (verdict, reason)."""
    dm = [_direction(a, b) for a, b in zip(measured, measured[1:])]
    dp = [_direction(a, b) for a, b in zip(predicted, predicted[1:])]
    if len({d for d in dm if d}) > 1:
        return FAILS, "measured steps are not monotone in sparsity"
    if any(m and p and m != p for m, p in zip(dm, dp)):
        return FAILS, "predicted and measured ratios are ordered differently across levels"
    if 0 in dm or 0 in dp:
        return INCONCLUSIVE, "neighbouring levels' intervals overlap, so their order is unresolved"
    return HOLDS, "prediction and measurement ordered alike, monotone in sparsity"


def lee_sparsity(summaries: Sequence[Summary], fits: Mapping[float, ScalingFit],
                 curves: Sequence[MeasuredCurve], reference: float = 0.0, level: float = 0.9,
                 n_boot: int = 1000, rng: int = 0,
                 runs: pd.DataFrame | None = None) -> tuple[Verdict, ...]:
    """Lee et al.'s sparsity claim per non-reference level, against the fitted S_min ratio and
    the step ratio, in both tiers (module docstring). ``runs``: every run with its steps or
    budget (:data:`theory.verdicts.step_ratio.RUN_COLUMNS`); default: the curves' points, all
    of which met the goal."""
    curve_by = {c.sparsity: c for c in curves}
    runs = runs_from_curves(curves) if runs is None else runs
    levels = sorted(fits)
    for s in levels:
        if s not in curve_by:
            raise TheoryError(f"no measured curve for sparsity {s}")
    if reference not in fits:
        raise TheoryError(f"reference sparsity {reference} has no fit; fits: {levels}")
    lr, dr = find(summaries, reference, "L_mean"), find(summaries, reference, "delta")
    l_ratio, predicted, measured = {}, {}, {"S_min ratio": {}, "median step ratio": {}}
    said = {}
    for s in levels:
        if s == reference:
            continue
        ls, ds = find(summaries, s, "L_mean"), find(summaries, s, "delta")
        if len({len(x.replicates) for x in (ls, ds, lr, dr)}) > 1:
            raise TheoryError("summaries of different levels have different numbers of bootstrap "
                              "replicates: summarize every level in one call")
        reps = ls.replicates / lr.replicates
        l_ratio[s] = _Ratio(ls.value / lr.value, _replicate_interval(reps, level))
        reps = reps * ds.replicates / dr.replicates
        predicted[s] = _Ratio(ls.value * ds.value / (lr.value * dr.value), _replicate_interval(reps, level))
        fit, ref = fits[s], fits[reference]
        measured["S_min ratio"][s] = _Ratio(fit.s_min / ref.s_min, ratio_interval(
            fit.intervals["s_min"], ref.intervals["s_min"]))
        steps = censored_step_ratio(runs, s, reference, level, n_boot, rng)
        measured["median step ratio"][s] = _Ratio(steps.value, steps.interval)
        said[s] = describe(steps)
    out = []
    for view, meas in measured.items():
        order = None
        if len(levels) >= 3:
            one = (1.0, 1.0)
            order = ordering([one] + [meas[s].interval for s in levels if s != reference],
                             [one] + [predicted[s].interval for s in levels if s != reference])
        statistic = FIT_STATISTIC if view == "S_min ratio" else STATISTIC
        for s in meas:
            out += _lee_level(s, view, predicted[s], meas[s], l_ratio[s], order, statistic,
                              "" if view == "S_min ratio" else f" ({said[s]})")
    return tuple(out)


def _lee_level(sparsity: float, view: str, pred: _Ratio, meas: _Ratio, l_ratio: _Ratio,
               order: tuple[str, str] | None, statistic: str, detail: str) -> list[Verdict]:
    claim = f"lee_sparsity ({view})"
    numbers = (f"predicted (L_s Delta_s)/(L_d Delta_d) = {_fmt(pred.value, pred.interval)}, "
               f"L_s/L_d = {_fmt(l_ratio.value, l_ratio.interval)}, measured {view} "
               f"{_fmt(meas.value, meas.interval)}{detail}")
    side = _side(meas.interval)
    if side is None:
        paper, why = INCONCLUSIVE, f"the measured {view}'s interval contains 1: no direction to explain"
        threshold = (math.nan, math.nan)
    else:
        threshold = side
        word = "above" if side == ABOVE else "below"
        parts = [judge(pred.interval, side), judge(l_ratio.interval, side)]
        why = {HOLDS: f"prediction and L ratio lie {word} 1 with the measurement",
               FAILS: f"the measurement lies {word} 1 but the prediction or the L ratio lies on the "
                      "other side: Lee et al.'s smoothness explanation does not explain this workload",
               INCONCLUSIVE: "the prediction's or the L ratio's interval contains 1"}[combine(*parts)]
        if order is not None:
            parts.append(order[0])
            why += f"; ordering across levels: {order[1]}"
        paper = combine(*parts)
    strict_iv = ratio_interval(pred.interval, meas.interval)
    strict_value = pred.value / meas.value
    strict = judge(strict_iv, (1.0 / STRICT_FACTOR, STRICT_FACTOR))
    strict_why = {HOLDS: "within 2x", FAILS: "off by more than 2x",
                  INCONCLUSIVE: "the interval straddles the 2x line"}[strict]
    return [Verdict(claim, "paper", sparsity, pred.value, pred.interval, threshold, paper,
                    f"{numbers}; {why}", statistic),
            Verdict(claim, "strict", sparsity, strict_value, strict_iv,
                    (1.0 / STRICT_FACTOR, STRICT_FACTOR), strict,
                    f"predicted / measured {view} = {_fmt(strict_value, strict_iv)}; {strict_why}",
                    statistic)]


def small_batch_slope(curve: MeasuredCurve, small: int = SMALL_BATCHES,
                      level: float = 0.9) -> tuple[float, Interval]:
    """Least-squares slope of log steps on log batch size over every point (all seeds) at the
    ``small`` smallest batch sizes, with a ``level`` t interval (infinite with < 3 points)."""
    b = np.asarray(curve.batch_sizes, dtype=float)
    s = np.asarray(curve.steps, dtype=float)
    keep = np.isin(b, np.unique(b)[:check_int(small, "small", minimum=2)])
    x, y = np.log(b[keep]), np.log(s[keep])
    if len(np.unique(x)) < 2:
        raise TheoryError(f"sparsity {curve.sparsity}: need >= 2 distinct batch sizes for a slope")
    res = stats.linregress(x, y)
    dof = len(x) - 2
    if dof < 1:
        return float(res.slope), (-math.inf, math.inf)
    half = stats.t.ppf(0.5 + level / 2, dof) * res.stderr
    return float(res.slope), (float(res.slope - half), float(res.slope + half))


def shape(fits: Mapping[float, ScalingFit], curves: Sequence[MeasuredCurve],
          small: int = SMALL_BATCHES, level: float = 0.9) -> tuple[Verdict, ...]:
    """Perfect scaling at small batch sizes and a plateau at the largest, per level in ``fits``
    (module docstring)."""
    curve_by = {c.sparsity: c for c in curves}
    out = []
    for sparsity, fit in sorted(fits.items()):
        if sparsity not in curve_by:
            raise TheoryError(f"no measured curve for sparsity {sparsity}")
        curve = curve_by[sparsity]
        slope, iv = small_batch_slope(curve, small, level)
        verdict = judge(iv, SLOPE_RANGE)
        out.append(Verdict("shape_slope", "paper", sparsity, slope, iv, SLOPE_RANGE, verdict,
                           f"slope of log steps over the {small} smallest batch sizes "
                           f"{_fmt(slope, iv)}; perfect scaling is -1 (allowed -1.1 to -0.8)",
                           SLOPE_STATISTIC))
        largest = max(curve.batch_sizes)
        steps = np.log(np.asarray(curve.steps, dtype=float)[np.asarray(curve.batch_sizes) == largest])
        if len(steps) > 1:
            half = stats.t.ppf(0.5 + level / 2, len(steps) - 1) * steps.std(ddof=1) / math.sqrt(len(steps))
        else:
            half = 0.0
        steps_iv = (math.exp(steps.mean() - half), math.exp(steps.mean() + half))
        value = math.exp(steps.mean()) / fit.s_min
        iv = ratio_interval(steps_iv, fit.intervals["s_min"])
        verdict = judge(iv, (0.0, PLATEAU_FACTOR))
        out.append(Verdict("shape_plateau", "paper", sparsity, value, iv, (0.0, PLATEAU_FACTOR),
                           verdict, f"steps at the largest batch size {largest:g} / fitted S_min "
                           f"= {_fmt(value, iv)} (a plateau: within {PLATEAU_FACTOR:g}x)",
                           PLATEAU_STATISTIC))
    return tuple(out)


def judge_claims(summaries: Sequence[Summary], fits: Mapping[float, ScalingFit],
                 curves: Sequence[MeasuredCurve], reference: float = 0.0, level: float = 0.9,
                 n_boot: int = 1000, rng: int = 0,
                 runs: pd.DataFrame | None = None,
                 b_simple: Mapping[float, NoiseScale] | None = None) -> tuple[Verdict, ...]:
    """Every scored claim: McCandlish (``b_simple`` as :func:`mccandlish`), Lee's sparsity claim
    (when the study has a reference and another level; ``runs`` as :func:`lee_sparsity`), and
    the shape claims."""
    out = mccandlish(summaries, fits, b_simple)
    if reference in fits and len(fits) > 1:
        out += lee_sparsity(summaries, fits, curves, reference, level, n_boot, rng, runs)
    return out + shape(fits, curves, level=level)
