"""Lee et al. (2021)'s smoothness claim judged where they measured it: L along the runs from step
1,000 on, level beside level, point by point, with intervals over runs.

Lee et al.'s released code (``namhoonlee/effect-dps-public``: ``edps/train.py``, ``check.py``,
``main.py``) logs L at every ``lipschitz_interval`` = 1,000 steps of each run until the goal (or
the step budget) ends it, never at initialization. Their explanation: a sparser network needs
more steps because its L is larger. The input here is the store's ``stage_probes`` table
(columns ``sparsity, seed, batch_size, trial, step, quantity, value``): a *run* is one (seed,
trial) of a (level, batch size); a *point* is a step k N of it.

- :func:`stage_points`: each level's L at each step >= :data:`STAGE_START` and batch size, the
  geometric mean over the runs that reached that step, with a ``level`` t interval on log L
  (n - 1 degrees of freedom; None with one run). Log scale: L spans orders of magnitude (Lee
  et al. plot it on a log axis) and the ratio of levels is the question.
- :func:`point_ratios`: at each (batch size, step) both levels reached, L_s / L_ref (ratio of
  geometric means) with a Welch interval on the difference of log means, and a paired one
  where both levels hold the same runs (below).
- :func:`overall_ratio`: one number per level: each run's mean log L over the steps >=
  :data:`STAGE_START` that every run of both levels at its batch size reached (so every run
  contributes the same steps), the difference of the levels' means per batch size (Welch), then
  averaged over batch sizes (strata), exponentiated.
- :func:`initialization_ratio` and :func:`early_ratio`: the same ratio at step 0 and along the
  early probes (the K points of [0, H], at equal fractions of each run), each on its own row
  beside the stage's, never pooled with it.
- :func:`stage_verdicts`: the claim in two parts, in the paper's tier (a direction): ``L rises
  with sparsity`` (the overall ratio's interval above 1: holds; below: does not hold) and
  ``L explains the steps`` (the measured step ratio lies on one side of 1 and the L ratio on
  the same side: holds; on the other side: does not hold). Initialization and the early
  stage are judged elsewhere (:func:`initialization_ratio`, :mod:`theory.verdicts.claims`) and never
  averaged in here.

Paired runs: in a study, trial i of every level starts from the same initialization
(:func:`training.initialization.trial_init_seed`) and sees the same data order
(:func:`training.schedules.order.trial_seed`): neither seed depends on the sparsity. Where both levels
hold the same runs (seed, trial), a ratio also carries the paired t interval on the per-run
differences of log L (n - 1 degrees of freedom), which removes what the runs share (their
data order: L at one step moves by 2x from run to run). The verdicts use the paired interval
wherever every batch size's runs are paired (declared here, before any data), else the Welch
one, which assumes no pairing; both are shown.

Why t intervals rather than the bootstrap of :mod:`theory.verdicts.summaries`: a study measures a few
runs per level (Lee et al. ran each metaparameter point once), and a percentile bootstrap over
three runs has ten distinct resamples and too narrow an interval; the t interval on log L states
that few runs give a wide interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats

from theory.verdicts.claims import FAILS, HOLDS, INCONCLUSIVE, Verdict
from theory.verdicts.step_ratio import (
    STATISTIC, censored_step_ratio, describe, runs_from_curves,
)
from theory.errors import TheoryError
from theory.models.predict import MeasuredCurve

# Lee et al.'s lipschitz_interval (edps/main.py): their stage starts at its first point
STAGE_START = 1000
STAGE_COLUMNS = ("sparsity", "seed", "batch_size", "trial", "step", "quantity", "value")
QUANTITY = "local_lipschitz"
NAN_INTERVAL = (math.nan, math.nan)
L_STATISTIC = "each run's mean log L over the stage, Welch t interval over runs"

Interval = tuple[float, float]


@dataclass(frozen=True)
class StagePoint:
    """L of one level at one (batch size, step): geometric mean over ``runs`` runs and its
    interval (NaN with one run)."""

    sparsity: float
    batch_size: int
    step: int
    value: float
    interval: Interval
    runs: int


@dataclass(frozen=True)
class StageRatio:
    """L_sparsity / L_reference at one (batch size, step), or over the stage (``step`` None,
    ``batch_size`` None when pooled over batch sizes), with its (Welch) interval; ``runs``:
    (sparse, reference) runs; ``steps``: the steps it covers; ``paired``: the paired interval
    where both levels hold the same two or more runs, else NaN (module docstring)."""

    sparsity: float
    reference: float
    batch_size: int | None
    step: int | None
    value: float
    interval: Interval
    runs: tuple[int, int]
    steps: tuple[int, ...] = ()
    paired: Interval = NAN_INTERVAL


def stage_table(table: pd.DataFrame, quantity: str = QUANTITY,
                start: int = STAGE_START) -> pd.DataFrame:
    """The rows of ``quantity`` at steps >= ``start`` with positive finite values, columns
    :data:`STAGE_COLUMNS` plus ``log`` (natural log of the value), checked."""
    if not isinstance(table, pd.DataFrame):
        raise TheoryError(f"table must be a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in STAGE_COLUMNS if c not in table.columns]
    if missing:
        raise TheoryError(f"table lacks column(s) {', '.join(missing)}; required: "
                          f"{', '.join(STAGE_COLUMNS)}")
    rows = table[(table.quantity == quantity) & (table.step >= start)][list(STAGE_COLUMNS)]
    values = rows.value.to_numpy(dtype=float)
    rows = rows[np.isfinite(values) & (values > 0)]
    keys = ["sparsity", "seed", "batch_size", "trial", "step"]
    if rows.duplicated(keys).any():
        row = rows[rows.duplicated(keys)].iloc[0]
        raise TheoryError("table has two values for " + ", ".join(f"{k}={row[k]}" for k in keys))
    return rows.assign(log=np.log(rows.value.to_numpy(dtype=float)))


def _mean_interval(logs: np.ndarray, level: float) -> tuple[float, Interval]:
    """exp(mean) and the t interval of exp(mean log) (NaN with one value)."""
    m = float(np.mean(logs))
    if len(logs) < 2:
        return math.exp(m), NAN_INTERVAL
    half = stats.t.ppf(0.5 + level / 2, len(logs) - 1) * np.std(logs, ddof=1) / math.sqrt(len(logs))
    return math.exp(m), (math.exp(m - half), math.exp(m + half))


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(mean a - mean b, its variance, Welch-Satterthwaite degrees of freedom; NaN when a
    side has one value)."""
    d = float(np.mean(a) - np.mean(b))
    if len(a) < 2 or len(b) < 2:
        return d, math.nan, math.nan
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    var = float(va + vb)
    df = var**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if var > 0 else math.inf
    return d, var, float(df)


def _paired(a: pd.Series, r: pd.Series) -> tuple[float, float, float]:
    """(mean of the per-run differences a - r, its variance, n - 1) for two series of log L
    indexed by run (seed, trial); NaN variance unless both hold the same two or more runs."""
    if len(a) < 2 or len(a) != len(r) or set(a.index) != set(r.index):
        return math.nan, math.nan, math.nan
    diff = (a - r.loc[a.index]).to_numpy(dtype=float)
    return float(diff.mean()), float(np.var(diff, ddof=1) / len(diff)), float(len(diff) - 1)


def _strata(parts: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """The mean of k strata's differences, its variance (sum / k^2) and the
    Welch-Satterthwaite degrees of freedom of that sum."""
    k = len(parts)
    d = sum(p[0] for p in parts) / k
    var = sum(p[1] for p in parts) / k**2
    df = (var**2 / sum((v / k**2) ** 2 / f for _, v, f in parts)
          if var > 0 and not math.isnan(var) else math.inf)
    return d, var, df


def _ratio_interval(d: float, var: float, df: float, level: float) -> Interval:
    if math.isnan(var):
        return NAN_INTERVAL
    half = stats.t.ppf(0.5 + level / 2, df) * math.sqrt(var) if var > 0 else 0.0
    return math.exp(d - half), math.exp(d + half)


def stage_points(table: pd.DataFrame, start: int = STAGE_START, level: float = 0.9,
                 quantity: str = QUANTITY) -> tuple[StagePoint, ...]:
    """Each level's ``quantity`` per (batch size, step >= ``start``) over the runs that reached
    it (module docstring), sorted by sparsity, batch size, step."""
    rows = stage_table(table, quantity, start)
    return tuple(StagePoint(float(s), int(b), int(t), *_mean_interval(g.log.to_numpy(), level),
                            len(g))
                 for (s, b, t), g in rows.groupby(["sparsity", "batch_size", "step"]))


def point_ratios(table: pd.DataFrame, reference: float = 0.0, start: int = STAGE_START,
                 level: float = 0.9) -> tuple[StageRatio, ...]:
    """L_s / L_reference at every (batch size, step >= ``start``) both reached, per
    non-reference level (module docstring)."""
    rows = stage_table(table, start=start)
    by_run = ["seed", "trial"]
    ref = {k: g.set_index(by_run).log for k, g in rows[rows.sparsity == reference].groupby(
        ["batch_size", "step"])}
    out = []
    for (s, b, t), g in rows[rows.sparsity != reference].groupby(["sparsity", "batch_size", "step"]):
        if (b, t) not in ref:
            continue
        a, r = g.set_index(by_run).log, ref[(b, t)]
        d, var, df = _welch(a.to_numpy(), r.to_numpy())
        _, pvar, pdf = _paired(a, r)
        out.append(StageRatio(float(s), reference, int(b), int(t), math.exp(d),
                              _ratio_interval(d, var, df, level), (len(a), len(r)), (int(t),),
                              _ratio_interval(d, pvar, pdf, level)))
    return tuple(out)


def overall_ratio(table: pd.DataFrame, sparsity: float, reference: float = 0.0,
                  start: int = STAGE_START, level: float = 0.9,
                  by_batch_size: bool = True) -> StageRatio:
    """L_sparsity / L_reference over the stage (module docstring): per batch size the steps
    every run of both levels reached, each run's mean log L over them, Welch per batch size,
    averaged over the batch sizes that have such steps. NaN value when none has. Without
    ``by_batch_size`` the runs of every batch size form one stratum (runs compared at equal
    fractions, :func:`early_ratio`)."""
    rows = stage_table(table, start=start)
    if not by_batch_size:
        rows = rows.assign(trial=rows.batch_size * 1_000_000 + rows.trial, batch_size=0)
    welch, paired, steps, runs = [], [], set(), [0, 0]
    for b, g in rows[rows.sparsity.isin([sparsity, reference])].groupby("batch_size"):
        per_run = g.groupby(["sparsity", "seed", "trial"]).step.apply(set)
        if set(per_run.index.get_level_values("sparsity")) != {sparsity, reference}:
            continue
        common = set.intersection(*per_run)
        if not common:
            continue
        means = g[g.step.isin(common)].groupby(["sparsity", "seed", "trial"]).log.mean()
        a, r = means.loc[sparsity], means.loc[reference]
        welch.append(_welch(a.to_numpy(), r.to_numpy()))
        paired.append(_paired(a, r))
        steps |= common
        runs[0] += len(a)
        runs[1] += len(r)
    if not welch:
        return StageRatio(sparsity, reference, None, None, math.nan, NAN_INTERVAL, (0, 0))
    d, var, df = _strata(welch)
    pd_, pvar, pdf = _strata(paired)
    # the paired interval only where every stratum is paired (its mean is then d too)
    return StageRatio(sparsity, reference, None, None, math.exp(d),
                      _ratio_interval(d, var, df, level), (runs[0], runs[1]), tuple(sorted(steps)),
                      _ratio_interval(pd_, pvar, pdf, level))


def initialization_ratio(probes: pd.DataFrame, sparsity: float, reference: float = 0.0,
                         level: float = 0.9) -> StageRatio:
    """L_sparsity / L_reference at step 0 from the probes along [0, H] (``theory.verdicts.summaries``'
    table: one run per (seed, batch size)), with a Welch interval on log L over runs."""
    rows = probes[(probes.quantity == QUANTITY) & (probes.step == 0)]
    values = rows.value.to_numpy(dtype=float)
    rows = rows[np.isfinite(values) & (values > 0)]
    a = np.log(rows[rows.sparsity == sparsity].value.to_numpy(dtype=float))
    r = np.log(rows[rows.sparsity == reference].value.to_numpy(dtype=float))
    if not len(a) or not len(r):
        return StageRatio(sparsity, reference, None, 0, math.nan, NAN_INTERVAL, (len(a), len(r)))
    d, var, df = _welch(a, r)
    return StageRatio(sparsity, reference, None, 0, math.exp(d),
                      _ratio_interval(d, var, df, level), (len(a), len(r)), (0,))


def early_ratio(probes: pd.DataFrame, sparsity: float, reference: float = 0.0,
                level: float = 0.9) -> StageRatio:
    """L_sparsity / L_reference along the early probes (``theory.verdicts.summaries``' table, the K
    points of [0, H] of one run per (seed, batch size)) at equal fractions of each run: the
    k-th point of every run stands for fraction ~ k / (K - 1), step 0 (k = 0) left out; then
    :func:`overall_ratio` over the points every run has, the runs of all batch sizes in one
    stratum (at equal fractions the batch sizes line up; the summaries of
    :mod:`theory.verdicts.summaries` pool them too). ``steps`` holds the point indices."""
    rows = probes[probes.quantity == QUANTITY].sort_values(["sparsity", "seed", "batch_size",
                                                            "step"])
    rows = rows.assign(trial=0, step=rows.groupby(["sparsity", "seed", "batch_size"]).cumcount())
    ratio = overall_ratio(rows, sparsity, reference, start=1, level=level, by_batch_size=False)
    # each level's early probes follow its own best trial, not one trial of every level: no pairs
    return replace(ratio, paired=NAN_INTERVAL)


def interval_side(interval: Interval) -> int:
    """+1: the interval lies above 1; -1: below; 0: it contains 1 or is undefined."""
    lo, hi = interval
    if math.isnan(lo) or math.isnan(hi):
        return 0
    return 1 if lo > 1 else -1 if hi < 1 else 0


def _fmt(r: StageRatio | tuple[float, Interval]) -> str:
    value, iv = (r.value, r.interval) if isinstance(r, StageRatio) else r
    if math.isnan(iv[0]):
        return f"{value:.3g} (no interval: one run)"
    return f"{value:.3g} [{iv[0]:.3g}, {iv[1]:.3g}]"


def stage_verdicts(table: pd.DataFrame, curves: Sequence[MeasuredCurve],
                   reference: float = 0.0, start: int = STAGE_START, level: float = 0.9,
                   n_boot: int = 1000, rng: int = 0,
                   runs: pd.DataFrame | None = None) -> tuple[Verdict, ...]:
    """Lee et al.'s claim at their stage for every non-reference level of ``table`` (module
    docstring): ``lee_L_rises (steps >= start)`` and ``lee_L_explains (steps >= start)``, both
    in the paper's tier; the measured step ratio is
    :func:`theory.verdicts.step_ratio.censored_step_ratio` over ``runs`` (every run, those that
    missed the goal censored at their budget; default: the curves' points)."""
    runs = runs_from_curves(curves) if runs is None else runs
    rows = stage_table(table, start=start)
    if reference not in set(rows.sparsity):
        raise TheoryError(f"no L at steps >= {start} for the reference sparsity {reference}")
    points = point_ratios(table, reference, start, level)
    out = []
    for s in sorted(set(rows.sparsity) - {reference}):
        ratio = overall_ratio(table, s, reference, start, level)
        mine = [p for p in points if p.sparsity == s]
        above = sum(interval_side(p.interval) > 0 for p in mine)
        below = sum(interval_side(p.interval) < 0 for p in mine)
        where = (f"over steps {ratio.steps[0]}-{ratio.steps[-1]} ({len(ratio.steps)} steps, "
                 f"{ratio.runs[0]} and {ratio.runs[1]} runs)" if ratio.steps else
                 "no step reached by every run of both levels")
        numbers = (f"L_s/L_d at steps >= {start} = {_fmt(ratio)} {where}; point by point "
                   f"{above} of {len(mine)} intervals above 1, {below} below")
        # the paired interval is the primary one wherever every stratum is paired (declared
        # here, before any data: trial i of every level shares its initialization and order)
        paired = not math.isnan(ratio.paired[0])
        primary = ratio.paired if paired else ratio.interval
        numbers += (f"; paired interval [{primary[0]:.3g}, {primary[1]:.3g}] (primary)"
                    if paired else "; Welch interval (primary: the runs are not paired)")
        side = interval_side(primary)
        verdict = {1: HOLDS, -1: FAILS, 0: INCONCLUSIVE}[side]
        says = {HOLDS: "L is larger in the sparse network at Lee's stage",
                FAILS: "L is smaller in the sparse network at Lee's stage",
                INCONCLUSIVE: "the interval contains 1 (or there is no interval)"}[verdict]
        claim = f"lee_L_rises (steps >= {start})"
        out.append(Verdict(claim, "paper", s, ratio.value, primary, (1.0, math.inf),
                           verdict, f"{numbers}; {says}", L_STATISTIC))
        # a level with no runs at a batch size the reference ran has no step ratio to explain
        if not (set(runs.loc[runs["sparsity"] == s, "batch_size"])
                & set(runs.loc[runs["sparsity"] == reference, "batch_size"])):
            continue
        steps = censored_step_ratio(runs, s, reference, level, n_boot, rng)
        m_side = interval_side(steps.interval)
        if m_side == 0:
            explains, why = INCONCLUSIVE, "the measured step ratio's interval contains 1"
        elif side == 0:
            explains, why = INCONCLUSIVE, "the L ratio's interval contains 1"
        elif side == m_side:
            explains, why = HOLDS, "the L ratio lies on the measured step ratio's side of 1"
        else:
            explains, why = FAILS, ("the L ratio lies on the other side of 1 from the measured "
                                    "step ratio: Lee et al.'s explanation does not explain this "
                                    "workload at their stage")
        allowed = (1.0, math.inf) if m_side > 0 else (0.0, 1.0) if m_side < 0 else NAN_INTERVAL
        out.append(Verdict(f"lee_L_explains (steps >= {start})", "paper", s, ratio.value,
                           primary, allowed, explains,
                           f"L_s/L_d = {_fmt(ratio)}, measured {describe(steps)}; {why}",
                           STATISTIC))
    return tuple(out)


@dataclass(frozen=True)
class SampleCheck:
    """L on its fixed sample against L on the whole split at one point (the same update):
    ``gap`` = |log(sample / full)|, ``spread`` = the SD (n - 1) of log L over the runs of the
    level and batch size at that step (NaN with fewer than two), ``agrees`` = gap <= spread
    (None without a spread): the sample's error is within the run-to-run spread the study's
    intervals already carry."""

    gap: float
    spread: float
    agrees: bool | None


def sample_check(sample: float, full: float, runs: Sequence[float]) -> SampleCheck:
    """:class:`SampleCheck` of L = ``sample`` on the sample and ``full`` on the whole split,
    with ``runs`` the sample's L of every run at that (level, batch size, step)."""
    if not (sample > 0 and full > 0):
        raise TheoryError(f"L must be positive, got sample {sample!r}, full {full!r}")
    logs = np.log(np.asarray([v for v in runs if v > 0], dtype=float))
    spread = float(logs.std(ddof=1)) if len(logs) > 1 else math.nan
    gap = abs(math.log(sample / full))
    return SampleCheck(gap, spread, None if math.isnan(spread) else gap <= spread)
