"""Sparse/dense step ratios from runs, with the runs that missed the goal kept as censored.

Lee et al. (2021) compare the steps a sparse and a dense network need to reach a goal. A run
that stops at its budget without meeting the goal did not take "budget" steps: it needs more
than that. Dropping it biases the steps down exactly where a level struggles, so here it is
**right-censored at its budget** (Kaplan and Meier 1958), never dropped.

Input: a table with columns :data:`RUN_COLUMNS`, one row per run: ``sparsity``, ``batch_size``,
``run`` (a key; the same key at two levels marks a pair: same initialization seed and data
order), ``steps`` (its steps-to-result, or its budget where it missed the goal) and ``reached``.

- :func:`km_median`: the Kaplan-Meier median of steps-to-result: the first step where the
  estimated share of runs still short of the goal, S(t) = prod over hits t_j <= t of
  (1 - d_j / n_j), falls to 1/2 or below (n_j: runs at risk at t_j, d_j: hits there). Where S
  stays at exactly 1/2 between two hits, the midpoint of the two (so without censoring it is
  the ordinary sample median). Infinite when more than half the runs may still be short of the
  goal at the last hit (the median lies beyond the budget).
- :func:`censored_step_ratio`: per batch size both levels ran, the ratio of their medians; the level's
  value is the median of those ratios over batch sizes. Beside it the best-of-N ratio (the
  fewest steps of any run, Shallue et al. 2019's tuned steps-to-result when runs are the
  points of a search), per batch size and as the median over batch sizes. Interval: percentile
  bootstrap (Efron and Tibshirani 1993) over batch sizes and, within each drawn batch size,
  over runs; runs held at both levels under the same key are drawn together (paired), others
  independently. The lower and upper quantiles take the nearest replicate outward (no
  interpolation), so an infinite median (no direction lost) stays infinite.
- Too few units for the level: a percentile bootstrap over k units has few distinct
  resamples, and even the widest distribution-free interval, [min, max] of k units, covers a
  median with chance 1 - 2^(1 - k) only. Where neither the batch sizes nor the smallest cell's
  runs number :func:`units_needed` (5 at 90 %), the interval is (0, inf) and ``resolved`` is
  False: the design cannot give an interval at that level.

:data:`STATISTIC` names the statistic a verdict that uses :func:`censored_step_ratio` records.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from theory.errors import TheoryError, check_int

RUN_COLUMNS = ("sparsity", "batch_size", "run", "steps", "reached")
STATISTIC = ("Kaplan-Meier median over runs (missed goal: censored at the budget), median over "
             "batch sizes; bootstrap over batch sizes and runs")
BEST_STATISTIC = "best of N runs, median over batch sizes"
# S(t) within this of 1/2 counts as exactly 1/2 (a product of ratios of small integers)
_HALF_TOL = 1e-9

Interval = tuple[float, float]


@dataclass(frozen=True)
class BatchRatio:
    """One batch size: each level's median steps and best run (inf: none met the goal), their
    ratios, runs and runs that met the goal (sparse, reference)."""

    batch_size: int
    median: tuple[float, float]
    best: tuple[float, float]
    ratio: float
    best_ratio: float
    runs: tuple[int, int]
    reached: tuple[int, int]


@dataclass(frozen=True)
class StepRatio:
    """Steps of ``sparsity`` over steps of ``reference``: ``value`` (median over batch sizes of
    the Kaplan-Meier median ratios) with its bootstrap ``interval``, ``best`` (best-of-N, the
    same median over batch sizes), each batch size in ``batches``; ``paired``: runs drawn in
    pairs in the bootstrap at every batch size."""

    sparsity: float
    reference: float
    value: float
    interval: Interval
    best: float
    batches: tuple[BatchRatio, ...]
    paired: bool
    resolved: bool = True
    statistic: str = STATISTIC


def units_needed(level: float) -> int:
    """The fewest units k whose [min, max] covers a median with chance ``level``:
    1 - 2^(1 - k) >= level (module docstring)."""
    return math.ceil(1.0 + math.log2(1.0 / (1.0 - level)) - 1e-12)


def km_medians(steps: np.ndarray, reached: np.ndarray) -> np.ndarray:
    """Kaplan-Meier median of each row of ``steps`` [R, n] with hit flags ``reached`` [R, n]
    (module docstring); a 1-D input is one row."""
    t = np.atleast_2d(np.asarray(steps, dtype=float))
    d = np.atleast_2d(np.asarray(reached, dtype=bool))
    if t.shape != d.shape or t.shape[-1] == 0:
        raise TheoryError(f"steps {t.shape} and reached {d.shape} must match and hold a run")
    # by steps, a hit before a censored run at the same step (it was at risk there)
    order = np.lexsort((~d, t), axis=-1)
    t, d = np.take_along_axis(t, order, -1), np.take_along_axis(d, order, -1)
    n = t.shape[-1]
    # a censored run leaves the risk set with factor 1: the sequential product is exact KM
    surv = np.cumprod(np.where(d, 1.0 - 1.0 / (n - np.arange(n)), 1.0), axis=-1)
    rows = np.arange(t.shape[0])
    below = d & (surv <= 0.5 + _HALF_TOL)
    i = below.argmax(-1)
    median = np.where(below.any(-1), t[rows, i], math.inf)
    later = d & (np.arange(n) > i[:, None])
    j = later.argmax(-1)
    flat = below.any(-1) & (np.abs(surv[rows, i] - 0.5) <= _HALF_TOL) & later.any(-1)
    return np.where(flat, (t[rows, i] + t[rows, j]) / 2.0, median)


def km_median(steps, reached) -> float:
    """The Kaplan-Meier median of one set of runs (:func:`km_medians`)."""
    return float(km_medians(steps, reached)[0])


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b for steps that may be infinite: inf / finite = inf, finite / inf = 0, inf / inf =
    NaN (neither level met the goal: no ratio)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isinf(a) & np.isinf(b), math.nan, a / b)


def _median(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Median ignoring NaN (a batch size without a ratio), infinite values kept."""
    # an all-NaN row (no batch size with a ratio) is NaN, not a warning
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(x, axis=axis)


def outward_interval(reps: np.ndarray, level: float) -> Interval:
    """Percentile interval of bootstrap replicates, each end at the nearest replicate outward (no
    interpolation, so infinite replicates stay usable); NaN replicates left out."""
    alpha = (1.0 - level) / 2.0
    reps = reps[~np.isnan(reps)]
    if reps.size == 0:
        return math.nan, math.nan
    return (float(np.quantile(reps, alpha, method="lower")),
            float(np.quantile(reps, 1.0 - alpha, method="higher")))


def check_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` checked: a DataFrame with :data:`RUN_COLUMNS`, positive steps, one row per
    (sparsity, batch size, run)."""
    if not isinstance(runs, pd.DataFrame):
        raise TheoryError(f"runs must be a pandas DataFrame, got {type(runs).__name__}")
    missing = [c for c in RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise TheoryError(f"runs lacks column(s) {', '.join(missing)}; required: "
                          f"{', '.join(RUN_COLUMNS)}")
    steps = runs["steps"].to_numpy(dtype=float)
    if not np.all(np.isfinite(steps) & (steps > 0)):
        raise TheoryError("runs' steps must be positive and finite (a run that missed the goal "
                          "carries its budget)")
    keys = ["sparsity", "batch_size", "run"]
    if runs.duplicated(keys).any():
        row = runs[runs.duplicated(keys)].iloc[0]
        raise TheoryError("runs has two rows for " + ", ".join(f"{k}={row[k]}" for k in keys))
    return runs


def _cell(runs: pd.DataFrame, sparsity: float, b: int) -> pd.DataFrame:
    return runs[(runs["sparsity"] == sparsity) & (runs["batch_size"] == b)].sort_values("run")


def _best(cell: pd.DataFrame) -> float:
    hit = cell.loc[cell["reached"].astype(bool), "steps"]
    return float(hit.min()) if len(hit) else math.inf


def censored_step_ratio(runs: pd.DataFrame, sparsity: float, reference: float = 0.0, level: float = 0.9,
               n_boot: int = 1000, rng: int = 0) -> StepRatio:
    """Steps of ``sparsity`` over ``reference`` at the batch sizes both ran (module docstring)."""
    runs = check_runs(runs)
    n_boot = check_int(n_boot, "n_boot")
    shared = sorted(set(runs.loc[runs["sparsity"] == sparsity, "batch_size"])
                    & set(runs.loc[runs["sparsity"] == reference, "batch_size"]))
    if not shared:
        raise TheoryError(f"sparsity {sparsity} and the reference {reference} share no batch size")
    gen = np.random.default_rng(rng)
    batches, draws, paired_all = [], [], True
    for b in shared:
        a, r = _cell(runs, sparsity, b), _cell(runs, reference, b)
        ta, da = a["steps"].to_numpy(float), a["reached"].to_numpy(bool)
        tr, dr = r["steps"].to_numpy(float), r["reached"].to_numpy(bool)
        ma, mr = km_median(ta, da), km_median(tr, dr)
        ba, br = _best(a), _best(r)
        batches.append(BatchRatio(int(b), (ma, mr), (ba, br), float(_ratio(ma, mr)),
                                  float(_ratio(ba, br)), (len(a), len(r)),
                                  (int(da.sum()), int(dr.sum()))))
        paired = len(a) > 1 and list(a["run"]) == list(r["run"])
        paired_all &= paired
        ia = gen.integers(0, len(a), (n_boot, len(a)))
        ir = ia if paired else gen.integers(0, len(r), (n_boot, len(r)))
        draws.append(_ratio(km_medians(ta[ia], da[ia]), km_medians(tr[ir], dr[ir])))
    per_b = np.stack(draws, axis=1)                            # [n_boot, batch sizes]
    pick = gen.integers(0, len(shared), (n_boot, len(shared)))
    reps = _median(np.take_along_axis(per_b, pick, 1))
    value = float(_median(np.array([x.ratio for x in batches])))
    best = float(_median(np.array([x.best_ratio for x in batches])))
    units = max(len(shared), min(min(x.runs) for x in batches))
    resolved = units >= units_needed(level)
    interval = outward_interval(reps, level) if resolved else (0.0, math.inf)
    return StepRatio(sparsity, reference, value, interval, best, tuple(batches), paired_all,
                     resolved)


def runs_from_curves(curves) -> pd.DataFrame:
    """The runs table of measured curves (``theory.models.predict.MeasuredCurve``) whose every
    point met the goal: a point's run is its seed where the curve has seeds (so the same seed
    pairs across levels), else its place among its batch size's points."""
    rows = []
    for c in curves:
        seen: dict[float, int] = {}
        for i, (b, s) in enumerate(zip(c.batch_sizes, c.steps)):
            key = c.seeds[i] if c.seeds is not None else seen.get(b, 0)
            seen[b] = seen.get(b, 0) + 1
            rows.append((float(c.sparsity), b, key, float(s), True))
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS))


def describe(ratio: StepRatio) -> str:
    """The ratio in words: value [interval], best of N beside it, how many runs met the goal."""
    def num(x: float) -> str:
        return "inf" if math.isinf(x) else f"{x:.3g}"

    cells = "; ".join(f"B = {x.batch_size}: {num(x.ratio)} (best {num(x.best_ratio)}; "
                      f"{x.reached[0]}/{x.runs[0]} and {x.reached[1]}/{x.runs[1]} runs met the goal)"
                      for x in ratio.batches)
    lo, hi = ratio.interval
    how = (f"{'paired' if ratio.paired else 'unpaired'} bootstrap over batch sizes and runs"
           if ratio.resolved else
           f"no interval: {len(ratio.batches)} batch size(s) and at most "
           f"{min(min(x.runs) for x in ratio.batches)} runs a level, too few for it")
    return (f"median steps ratio {num(ratio.value)} [{num(lo)}, {num(hi)}] ({how}; runs "
            f"that missed the goal censored at their budget), best of N {num(ratio.best)}; "
            f"{cells}")
