"""Planning a study for a stated resolution: the variance components of a per-run metric
measured at several points of each run, and the runs (or pairs) needed to resolve an effect.

The model (a one-way random-effects, nested design: points within runs within cells; Searle,
Casella and McCulloch 1992, ch. 3): in cell c (a sparsity level at a batch size), run i, point j,

    y_cij = mu_c + a_ci + e_cij,   a_ci ~ N(0, sigma_b^2),   e_cij ~ N(0, sigma_w^2),

where y is the metric on its analysis scale (log L at Lee et al. (2021)'s stage), a is what a
whole run shares (its initialization, mask and data order) and e the point-to-point movement
within a run. The closed-form ANOVA estimators, pooled over cells (each cell its own mean):

    MS_w = sum (y_cij - ybar_ci)^2 / (N - r),      MS_b = sum m_ci (ybar_ci - ybar_c)^2 / (r - C),
    n_0 = (N - sum_c sum_i m_ci^2 / N_c) / (r - C),
    sigma_w^2 = MS_w,                               sigma_b^2 = max(0, (MS_b - MS_w) / n_0),

with N points, r runs, C cells, m_ci points in run ci and N_c points in cell c. A run's value is
the mean of its m points, whose variance is V(m) = sigma_b^2 + sigma_w^2 / m.

Paired runs (the same seed and trial at two levels: the same initialization and data order) share
part of a: their covariance ``cov_b`` is the sample covariance of the paired run means, each
centred on its cell's mean (the within-run errors of two runs are independent, so the covariance
of run means estimates that of a). A pair's difference then has variance
V_d(m) = 2 (sigma_b^2 - cov_b) + 2 sigma_w^2 / m.

Sample size for a two-sided interval at ``level`` (alpha = 1 - level) to detect a difference
delta with probability ``power`` (the normal approximation; e.g. Chow, Shao and Wang 2008,
ch. 3): per level, unpaired, n = 2 V(m) (z_{1-alpha/2} + z_power)^2 / delta^2; pairs,
n = V_d(m) (z_{1-alpha/2} + z_power)^2 / delta^2; ``t_quantiles`` replaces z by Student's t on
n - 1 (paired) or 2 n - 2 (unpaired) degrees of freedom, iterated to a fixed point. An effect
of 10 % in L is delta = log 1.1 on the log scale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from theory.errors import TheoryError

RUN = ("seed", "trial")
CELL = ("sparsity", "batch_size")


@dataclass(frozen=True)
class VarianceComponents:
    """The nested ANOVA of a per-run metric (module docstring): ``between`` sigma_b^2 (runs),
    ``within`` sigma_w^2 (points within a run; NaN with one point per run), ``cov_paired``
    cov_b of paired runs (NaN without pairs); the counts ``runs``, ``points``, ``cells``,
    ``pairs``; ``points_per_run``: the mean number of points of a run; ``run_mean_sd`` the
    pooled SD of run means within cells."""

    between: float
    within: float
    cov_paired: float
    runs: int
    points: int
    cells: int
    pairs: int
    points_per_run: float
    run_mean_sd: float

    @property
    def paired_correlation(self) -> float:
        """cov_b / sigma_b^2: the share of the run effect that a pair shares (NaN without)."""
        return self.cov_paired / self.between if self.between > 0 else math.nan

    def run_variance(self, points: float) -> float:
        """V(m) = sigma_b^2 + sigma_w^2 / m: a run's mean over ``points`` points."""
        within = 0.0 if math.isnan(self.within) else self.within
        return self.between + within / points

    def pair_variance(self, points: float) -> float:
        """V_d(m) = 2 (sigma_b^2 - cov_b) + 2 sigma_w^2 / m: the difference of a pair's run
        means (NaN without pairs); cov_b is capped at sigma_b^2 (a variance cannot go below
        what the points leave)."""
        if math.isnan(self.cov_paired):
            return math.nan
        within = 0.0 if math.isnan(self.within) else self.within
        return 2 * (self.between - min(self.cov_paired, self.between)) + 2 * within / points


def variance_components(frame: pd.DataFrame, value: str = "log", run: Sequence[str] = RUN,
                        cell: Sequence[str] = CELL, level: str = "sparsity",
                        reference: float | None = 0.0) -> VarianceComponents:
    """The components of ``frame[value]`` (one row per point; module docstring): runs are the
    distinct ``cell`` + ``run`` keys, cells the ``cell`` keys. Pairs: the runs of a level other
    than ``reference`` whose ``run`` key (and the other ``cell`` keys) also holds a run at
    ``reference`` (None: no pairs)."""
    need = [value, *run, *cell]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise TheoryError(f"frame lacks column(s) {', '.join(missing)}; required: "
                          f"{', '.join(need)}")
    y = frame[need].copy()
    y = y[np.isfinite(y[value].to_numpy(dtype=float))]
    keys = [*cell, *run]
    runs = y.groupby(keys)[value].agg(["mean", "count", "sum"])
    r, n_points = len(runs), int(runs["count"].sum())
    c = runs.reset_index().groupby(list(cell)).ngroups if r else 0
    if r - c < 1:
        raise TheoryError(f"need two or more runs in some cell to separate runs, got {r} "
                          f"run(s) in {c} cell(s)")
    cell_mean = (runs.groupby(level=list(cell))["sum"].transform("sum")
                 / runs.groupby(level=list(cell))["count"].transform("sum"))
    ms_b = float((runs["count"] * (runs["mean"] - cell_mean) ** 2).sum() / (r - c))
    resid = y[value] - y.groupby(keys)[value].transform("mean")
    ms_w = float((resid**2).sum() / (n_points - r)) if n_points > r else math.nan
    cell_points = runs.groupby(level=list(cell))["count"].transform("sum")
    n0 = float((n_points - (runs["count"] ** 2 / cell_points).sum()) / (r - c))
    between = max(0.0, (ms_b - (0.0 if math.isnan(ms_w) else ms_w)) / n0)
    centred = (runs["mean"] - runs.groupby(level=list(cell))["mean"].transform("mean"))
    run_sd = float(math.sqrt((centred**2).sum() / (r - c)))
    cov, pairs = _paired_covariance(centred, cell, run, level, reference)
    return VarianceComponents(between, ms_w, cov, r, n_points, c, pairs,
                              n_points / r, run_sd)


def _paired_covariance(centred: pd.Series, cell: Sequence[str], run: Sequence[str], level: str,
                       reference: float | None) -> tuple[float, int]:
    """(cov_b, pairs): the covariance of the centred run means of each level other than
    ``reference`` with those of its partners at ``reference`` (module docstring), pooled over
    levels and the other cell keys; (NaN, pairs) with fewer than two pairs."""
    if reference is None or level not in cell:
        return math.nan, 0
    frame = centred.rename("y").reset_index()
    others = [k for k in cell if k != level]
    ref = frame[frame[level] == reference].drop(columns=level)
    sparse = frame[frame[level] != reference]
    both = sparse.merge(ref, on=[*others, *run], suffixes=("", "_ref"))
    if len(both) < 2:
        return math.nan, len(both)
    # each comparison (level, other cell keys) centred on its own pairs: one df lost per group
    groups = both.groupby([level, *others])
    dy = both.y - groups.y.transform("mean")
    dr = both.y_ref - groups.y_ref.transform("mean")
    df = len(both) - groups.ngroups
    if df < 1:
        return math.nan, len(both)
    return float((dy * dr).sum() / df), len(both)


@dataclass(frozen=True)
class SampleSize:
    """Runs per level (``paired`` False) or pairs (True) needed at ``points`` points per run
    for a two-sided interval at ``level`` to detect ``delta`` with probability ``power``;
    ``variance`` the per-unit variance used (V(m) or V_d(m))."""

    points: float
    paired: bool
    n: int
    variance: float
    delta: float
    level: float
    power: float


def sample_size(variance: float, delta: float, level: float = 0.9, power: float = 0.8,
                paired: bool = True, t_quantiles: bool = False) -> int:
    """n = k V (q_{1-alpha/2} + q_power)^2 / delta^2, rounded up, with k = 1 for pairs
    (``variance`` = V_d) and k = 2 per level unpaired (``variance`` = V(m)); q the normal
    quantiles, or with ``t_quantiles`` Student's t on the design's degrees of freedom,
    iterated from the normal n to a fixed point (module docstring). At least 2."""
    for name, x, lo, hi in (("level", level, 0, 1), ("power", power, 0, 1)):
        if not lo < x < hi:
            raise TheoryError(f"{name} must lie in (0, 1), got {x!r}")
    if not (delta > 0 and math.isfinite(delta)):
        raise TheoryError(f"delta must be a positive finite number, got {delta!r}")
    if not (variance >= 0 and math.isfinite(variance)):
        raise TheoryError(f"variance must be a finite number >= 0, got {variance!r}")
    k = 1 if paired else 2

    def n_for(q: float) -> int:
        return max(2, math.ceil(k * variance * q**2 / delta**2))

    n = n_for(stats.norm.ppf(0.5 + level / 2) + stats.norm.ppf(power))
    if not t_quantiles:
        return n
    seen = set()
    while n not in seen:
        seen.add(n)
        df = n - 1 if paired else 2 * n - 2
        n = n_for(stats.t.ppf(0.5 + level / 2, df) + stats.t.ppf(power, df))
    return max(seen)   # a 2-cycle between n and n + 1 resolves to the larger


def sample_sizes(components: VarianceComponents, delta: float, points: Sequence[float],
         level: float = 0.9, power: float = 0.8, t_quantiles: bool = False
         ) -> tuple[SampleSize, ...]:
    """For each number of points per run: the runs per level (unpaired) and, where the pilot
    has pairs, the pairs needed (:func:`sample_size`)."""
    out = []
    for m in points:
        if not m >= 1:
            raise TheoryError(f"points per run must be >= 1, got {m!r}")
        for paired, var in ((False, components.run_variance(m)),
                            (True, components.pair_variance(m))):
            if math.isnan(var):
                continue
            out.append(SampleSize(float(m), paired,
                                  sample_size(var, delta, level, power, paired, t_quantiles),
                                  var, delta, level, power))
    return tuple(out)
