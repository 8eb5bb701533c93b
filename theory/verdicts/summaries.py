"""Summaries per sparsity level of probes measured along the run, with bootstrap intervals.

Input: a long-format probe table, one row per measurement, with the columns
``sparsity, seed, batch_size, step, fraction, quantity, value`` (extra columns ignored).
``fraction`` = step / H, H the run's steps-to-result; a *run* is one (seed, batch size) of a
level. Quantities used: ``g_sq`` and ``trace_sigma`` (|G|^2 and tr(Sigma), McCandlish et al.
2018), ``local_lipschitz`` (Lee et al. 2021's L on the run's own update), ``hessian_top``
(lambda_max) and ``loss`` (the training loss).

Statistics (:data:`STATISTICS`):

- ``b_simple_goal``: B_simple at the goal, sum tr(Sigma) / sum |G|^2 over the points in the last
  ``goal_window`` (20 %) of every run (a ratio of sums, as McCandlish et al. average the
  numerator and denominator separately); ``b_simple_at_h`` the same at step H only;
  ``b_simple_run`` over the whole run;
- ``L_mean`` (Lee et al.'s summary: the trajectory mean), ``L_median``, ``L_max``: each run's
  mean / median / max of L along its trajectory after step 0, averaged over runs. Lee et al.
  never measure L at initialization (their ``edps/train.py`` logs it from step 1,000 on), and
  at step 0 it can be 10-30x its later values (issue 40's runs): the initialization is
  ``L_init``, its own statistic, never averaged into the trajectory's;
- ``lambda_max_mean``, ``lambda_max_max``: the same for the top Hessian eigenvalue;
- ``delta``: the training loss at step 0, Delta = f(w_0) - f_inf with f_inf = 0 (cross-entropy).

Intervals: hierarchical percentile bootstrap over runs and, within each resampled run, over its
probe points (Davison and Hinkley 1997, sec. 3.8), so they cover seed-to-seed and along-the-run
variation. ``Summary.replicates`` keeps the bootstrap replicates, so ratios between levels
(independent runs) get intervals from replicate ratios.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from theory.errors import TheoryError, check_int

PROBE_COLUMNS = ("sparsity", "seed", "batch_size", "step", "fraction", "quantity", "value")
GOAL_WINDOW = 0.2
# the first fraction after step 0: the trajectory statistics of L start here
_AFTER_START = 1e-12
# a probe at step H has fraction exactly 1; allow for float round-off in stored fractions
_AT_END = 1.0 - 1e-9


@dataclass(frozen=True)
class Statistic:
    """How one summary is computed: ``quantity`` (or ``quantity`` / ``denominator`` as a ratio of
    sums pooled over runs), on the points with fraction in [``start``, ``stop``] (``start="goal"``:
    1 - the goal window), each run reduced by ``reduce`` (mean over runs) unless it is a ratio."""

    quantity: str
    start: float | str = 0.0
    stop: float = 1.0
    denominator: str | None = None
    reduce: Callable[[np.ndarray], np.ndarray] | None = None


def _goal_start(window: float) -> float:
    return 1.0 - window - 1e-9


STATISTICS: dict[str, Statistic] = {
    "b_simple_goal": Statistic("trace_sigma", "goal", denominator="g_sq"),
    "b_simple_at_h": Statistic("trace_sigma", _AT_END, denominator="g_sq"),
    "b_simple_run": Statistic("trace_sigma", denominator="g_sq"),
    "L_mean": Statistic("local_lipschitz", _AFTER_START, reduce=lambda a: a.mean(-1)),
    "L_median": Statistic("local_lipschitz", _AFTER_START, reduce=lambda a: np.median(a, -1)),
    "L_max": Statistic("local_lipschitz", _AFTER_START, reduce=lambda a: a.max(-1)),
    "L_init": Statistic("local_lipschitz", 0.0, 0.0, reduce=lambda a: a.mean(-1)),
    "lambda_max_mean": Statistic("hessian_top", reduce=lambda a: a.mean(-1)),
    "lambda_max_max": Statistic("hessian_top", reduce=lambda a: a.max(-1)),
    "delta": Statistic("loss", 0.0, 0.0, reduce=lambda a: a.mean(-1)),
}


@dataclass(frozen=True)
class Summary:
    """One statistic of one sparsity level (and batch size, when summarized per batch size):
    ``value`` with its ``level`` bootstrap ``interval`` over ``runs`` runs and ``points`` probe
    points in all."""

    sparsity: float
    statistic: str
    value: float
    interval: tuple[float, float]
    level: float
    runs: int
    points: int
    batch_size: int | None = None
    replicates: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)


def check_probe_table(probes: pd.DataFrame) -> pd.DataFrame:
    """The table with the :data:`PROBE_COLUMNS`, checked: fractions in [0, 1], one value per
    (sparsity, seed, batch_size, step, quantity); rows with a non-finite value dropped."""
    if not isinstance(probes, pd.DataFrame):
        raise TheoryError(f"probes must be a pandas DataFrame, got {type(probes).__name__}")
    missing = [c for c in PROBE_COLUMNS if c not in probes.columns]
    if missing:
        raise TheoryError(f"probes lacks column(s) {', '.join(missing)}; "
                          f"required: {', '.join(PROBE_COLUMNS)}")
    table = probes[list(PROBE_COLUMNS)]
    frac = table.fraction.to_numpy(dtype=float)
    if not np.all((frac >= 0) & (frac <= 1)):
        raise TheoryError(f"probes.fraction must be in [0, 1], found {frac[(frac < 0) | (frac > 1)][0]!r}")
    keys = ["sparsity", "seed", "batch_size", "step", "quantity"]
    dup = table.duplicated(keys)
    if dup.any():
        row = table[dup].iloc[0]
        raise TheoryError("probes has two values for " + ", ".join(f"{k}={row[k]}" for k in keys))
    return table[np.isfinite(table.value.to_numpy(dtype=float))]


def _run_arrays(table: pd.DataFrame, stat: Statistic, goal_window: float) -> list[np.ndarray]:
    """Per run, a [2 or 1, points] array of the statistic's selected values (rows: numerator,
    denominator), points where every needed quantity is present."""
    start = _goal_start(goal_window) if stat.start == "goal" else stat.start
    quantities = [stat.quantity] + ([stat.denominator] if stat.denominator else [])
    rows = table[table.quantity.isin(quantities) & (table.fraction >= start)
                 & (table.fraction <= stat.stop + 1e-12)]
    wide = rows.pivot_table(index=["seed", "batch_size", "step"], columns="quantity",
                            values="value", aggfunc="first")
    if any(q not in wide.columns for q in quantities):
        return []
    wide = wide[quantities].dropna()
    return [g.to_numpy(dtype=float).T for _, g in wide.groupby(level=["seed", "batch_size"])]


def _per_run(stat: Statistic, values: np.ndarray) -> np.ndarray:
    """A run's contribution ``[..., k]`` from its values ``[rows, ..., points]``: the sums of
    numerator and denominator for a ratio, else the run's reduction."""
    if stat.denominator is not None:
        return np.stack([values[0].sum(-1), values[1].sum(-1)], -1)
    return stat.reduce(values[0])[..., None]


def _level(stat: Statistic, parts: np.ndarray) -> np.ndarray:
    """The level value from run contributions ``[..., runs, k]``: pooled ratio of sums, or the
    mean over runs."""
    if stat.denominator is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            return parts[..., 0].sum(-1) / parts[..., 1].sum(-1)
    return parts[..., 0].mean(-1)


def _bootstrap(stat: Statistic, runs: list[np.ndarray], n_boot: int,
               gen: np.random.Generator) -> np.ndarray:
    """Replicates: draw runs with replacement, then every drawn run's points with replacement
    (independently for each slot, so a run drawn twice gets two point resamples)."""
    picks = gen.integers(0, len(runs), size=(n_boot, len(runs)))
    parts = np.empty((n_boot, len(runs), 2 if stat.denominator else 1))
    for r, values in enumerate(runs):
        idx = gen.integers(0, values.shape[1], size=(n_boot, len(runs), values.shape[1]))
        drawn = picks == r
        parts[drawn] = _per_run(stat, values[:, idx])[drawn]
    return _level(stat, parts)


def summarize(probes: pd.DataFrame, level: float = 0.9, n_boot: int = 1000, seed: int = 0,
              goal_window: float = GOAL_WINDOW, by_batch_size: bool = False,
              statistics: tuple[str, ...] = tuple(STATISTICS)) -> tuple[Summary, ...]:
    """Every statistic of ``statistics`` (module docstring) per sparsity level (and per batch
    size with ``by_batch_size``) that the table has data for, with ``level`` hierarchical
    bootstrap intervals from ``n_boot`` replicates seeded by ``seed``."""
    table = check_probe_table(probes)
    n_boot = check_int(n_boot, "n_boot")
    if not 0.0 < level < 1.0:
        raise TheoryError(f"level must be in (0, 1), got {level!r}")
    if not 0.0 < goal_window <= 1.0:
        raise TheoryError(f"goal_window must be in (0, 1], got {goal_window!r}")
    unknown = [s for s in statistics if s not in STATISTICS]
    if unknown:
        raise TheoryError(f"unknown statistic(s) {', '.join(unknown)}; allowed: {', '.join(STATISTICS)}")
    gen = np.random.default_rng(seed)
    alpha = (1.0 - level) / 2.0
    keys = ["sparsity", "batch_size"] if by_batch_size else ["sparsity"]
    out = []
    for key, part in table.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        for name in statistics:
            stat = STATISTICS[name]
            runs = _run_arrays(part, stat, goal_window)
            if not runs:
                continue
            reps = _bootstrap(stat, runs, n_boot, gen)
            low, high = np.nanquantile(reps, [alpha, 1 - alpha]) if np.any(np.isfinite(reps)) \
                else (math.nan, math.nan)
            out.append(Summary(sparsity=float(key[0]), statistic=name,
                               value=float(_level(stat, np.stack([_per_run(stat, r) for r in runs]))), interval=(float(low), float(high)),
                               level=level, runs=len(runs), points=sum(r.shape[1] for r in runs),
                               batch_size=int(key[1]) if by_batch_size else None, replicates=reps))
    return tuple(out)


def find(summaries: tuple[Summary, ...], sparsity: float, statistic: str,
         batch_size: int | None = None) -> Summary:
    """The summary of ``statistic`` at ``sparsity`` (and ``batch_size``); a TheoryError naming
    what is missing otherwise."""
    for s in summaries:
        if s.sparsity == sparsity and s.statistic == statistic and s.batch_size == batch_size:
            return s
    raise TheoryError(f"no {statistic} summary for sparsity {sparsity}"
                      + ("" if batch_size is None else f", batch size {batch_size}")
                      + " (missing probe quantities?)")
