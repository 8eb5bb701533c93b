"""McCandlish et al. (2018)'s simple noise scale along training, pooled over every probed run.

B_simple = tr(Sigma) / |G|^2, with tr(Sigma) the per-example gradient covariance's trace and
|G|^2 the squared true gradient (McCandlish et al. 2018, eq. 2.8); they average the numerator
and the denominator separately, so a pooled value is a ratio of sums. A *run* is one probed
trajectory of a level: the early probes' (seed, batch size) runs, and the runs measured at Lee
et al.'s stage (seed, batch size, trial); a point's ``fraction`` is its step over the run's end
H (its goal step).

- :func:`noise_points`: the points of every run, one row per (level, run, step) with
  ``fraction``, ``g_sq`` and ``trace_sigma`` (:data:`NOISE_COLUMNS`), from the two stored
  tables.
- :func:`b_simple_along`: per level and fraction bin, the ratio of sums over the runs' points
  in the bin: B_simple along training.
- :func:`b_simple_at_goal`: per level, the ratio of sums over the points in the last
  ``window`` (20 %) of every run, the statistic the McCandlish claim compares with the fitted
  B_crit (:func:`theory.verdicts.claims.mccandlish`).

Intervals: percentile bootstrap over runs (runs drawn with replacement, each with all its
points; the nearest replicate outward, :func:`theory.verdicts.step_ratio.outward_interval`);
a level with one run gets the bootstrap over that run's points instead, and says so
(``over``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from theory.errors import TheoryError, check_int
from theory.verdicts.step_ratio import outward_interval

NOISE_COLUMNS = ("sparsity", "run", "fraction", "g_sq", "trace_sigma")
GOAL_WINDOW = 0.2
BINS = 5

Interval = tuple[float, float]


@dataclass(frozen=True)
class NoiseScale:
    """B_simple of one level over the points a statistic takes (``start`` <= fraction <=
    ``stop``): ``value`` (ratio of sums), its ``interval``, the ``runs`` and ``points`` pooled,
    and what the bootstrap drew (``over``: "runs" or "points")."""

    sparsity: float
    start: float
    stop: float
    value: float
    interval: Interval
    runs: int
    points: int
    over: str


def noise_points(probes: pd.DataFrame | None = None,
                 stage: pd.DataFrame | None = None) -> pd.DataFrame:
    """:data:`NOISE_COLUMNS` from the early probes (``sparsity, seed, batch_size, step,
    fraction, quantity, value``) and the stage's (``... trial, step, horizon, quantity,
    value``); points where either quantity is missing or not finite are left out."""
    parts = []
    for table, keys, at_stage in ((probes, ["seed", "batch_size"], False),
                                  (stage, ["seed", "batch_size", "trial"], True)):
        if table is None or not len(table):
            continue
        rows = table[table["quantity"].isin(["g_sq", "trace_sigma"])]
        index = ["sparsity", *keys, "step"] + (["horizon"] if at_stage else ["fraction"])
        wide = rows.pivot_table(index=index, columns="quantity", values="value",
                                aggfunc="first").reset_index()
        if not {"g_sq", "trace_sigma"} <= set(wide.columns):
            continue
        if at_stage:
            wide["fraction"] = wide["step"] / wide["horizon"].clip(lower=1)
        prefix = "stage" if at_stage else "probes"
        wide["run"] = [f"{prefix}:" + "/".join(str(int(x)) for x in r)
                       for r in wide[keys].itertuples(index=False)]
        parts.append(wide[list(NOISE_COLUMNS)])
    if not parts:
        return pd.DataFrame(columns=list(NOISE_COLUMNS))
    out = pd.concat(parts, ignore_index=True)
    ok = np.isfinite(out["g_sq"].astype(float)) & np.isfinite(out["trace_sigma"].astype(float))
    return out[ok].reset_index(drop=True)


# a point at the goal has fraction 1 up to float round-off in stored fractions
_END = 1.0 + 1e-9


def _scale(points: pd.DataFrame, sparsity: float, start: float, stop: float, level: float,
           n_boot: int, gen: np.random.Generator) -> NoiseScale | None:
    """B_simple over the points with start <= fraction < stop (<= at the run's end)."""
    f = points["fraction"]
    sel = points[(f >= start) & ((f < stop) | ((stop >= 1.0) & (f <= _END)))]
    if not len(sel):
        return None
    sums = sel.groupby("run")[["trace_sigma", "g_sq"]].sum()
    s, g = sums["trace_sigma"].to_numpy(float), sums["g_sq"].to_numpy(float)
    over = "runs" if len(sums) > 1 else "points"
    if over == "points":
        s, g = sel["trace_sigma"].to_numpy(float), sel["g_sq"].to_numpy(float)
    pick = gen.integers(0, len(s), (n_boot, len(s)))
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = s[pick].sum(1) / g[pick].sum(1)
        value = float(s.sum() / g.sum())
    return NoiseScale(sparsity, start, stop, value, outward_interval(reps, level), len(sums),
                      len(sel), over)


def _checked(points: pd.DataFrame, level: float, n_boot: int) -> int:
    missing = [c for c in NOISE_COLUMNS if c not in points.columns]
    if missing:
        raise TheoryError(f"noise points lack column(s) {', '.join(missing)}; required: "
                          f"{', '.join(NOISE_COLUMNS)}")
    if not 0.0 < level < 1.0:
        raise TheoryError(f"level must be in (0, 1), got {level!r}")
    return check_int(n_boot, "n_boot")


def b_simple_at_goal(points: pd.DataFrame, window: float = GOAL_WINDOW, level: float = 0.9,
                     n_boot: int = 1000, rng: int = 0) -> dict[float, NoiseScale]:
    """Per level, B_simple over the last ``window`` of every run (module docstring)."""
    n_boot = _checked(points, level, n_boot)
    if not 0.0 < window <= 1.0:
        raise TheoryError(f"window must be in (0, 1], got {window!r}")
    gen = np.random.default_rng(rng)
    out = {}
    for s, part in points.groupby("sparsity", sort=True):
        found = _scale(part, float(s), 1.0 - window, 1.0, level, n_boot, gen)
        if found is not None:
            out[float(s)] = found
    return out


def b_simple_along(points: pd.DataFrame, bins: int = BINS, level: float = 0.9,
                   n_boot: int = 1000, rng: int = 0) -> tuple[NoiseScale, ...]:
    """Per level and each of ``bins`` equal fraction bins of [0, 1] (the last one closed),
    B_simple over the runs' points in it (module docstring), by level then bin."""
    n_boot = _checked(points, level, n_boot)
    bins = check_int(bins, "bins")
    gen = np.random.default_rng(rng)
    edges = np.linspace(0.0, 1.0, bins + 1)
    out = []
    for s, part in points.groupby("sparsity", sort=True):
        for lo, hi in zip(edges[:-1], edges[1:]):
            found = _scale(part, float(s), float(lo), float(hi), level, n_boot, gen)
            if found is not None:
                out.append(found)
    return tuple(out)


def describe(scale: NoiseScale) -> str:
    """How a B_simple was pooled, in words."""
    lo, hi = scale.interval
    return (f"B_simple {scale.value:.3g} [{lo:.3g}, {hi:.3g}] from {scale.runs} run(s), "
            f"{scale.points} points at fractions {scale.start:.2g}-{scale.stop:.2g} "
            f"(bootstrap over {scale.over})")

