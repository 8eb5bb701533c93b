"""Fit measured steps-to-result curves with S(B) = S_min (1 + B_crit / B).

The form is McCandlish et al. (2018)'s steps/batch trade-off; Shallue et al. (2019) describe the
same curves by three regimes. The fit is nonlinear least squares on log S:

    log S_j = log S_min + log(1 + B_crit / B_j) + e_j,

solved by profiling: for fixed c = log B_crit the best log S_min is the (weighted) mean of
log S_j - log(1 + e^c / B_j), which leaves a one-dimensional problem in c (a grid, then a golden
section search). Every bootstrap replicate is solved in the same vectorized pass.

Intervals are bootstrap-t intervals in log space for ``"residuals"`` / ``"points"`` (Davison &
Hinkley 1997, sec. 5.2.1), percentile intervals for ``"seeds"``, and percentile intervals open on
the unresolved side when B_crit sits at the edge of the search range. ``resample``:

- ``"seeds"``: replicates exist (several seeds per batch size): resample whole seeds (each seed's
  curve is one independent unit), the default when ``seeds`` names at least two seeds;
- ``"residuals"``: one curve: the batch sizes are a fixed design, so resample the fit's residuals
  (centred, inflated by sqrt(n / (n - 2)) for the two fitted parameters) onto the fitted curve;
  the default without replicates;
- ``"points"``: resample (B, S) pairs with replacement.

Regimes (thresholds on the fitted curve's local slope d log S / d log B = -B_crit / (B + B_crit)):

- ``"perfect scaling"``: slope <= -0.8, i.e. B <= B_crit / 4 (doubling B saves >= 43 % of steps);
- ``"maximal data parallelism"``: slope >= -0.2, i.e. B >= 4 B_crit (doubling B saves <= 13 %);
- ``"diminishing returns"``: in between.

The largest useful batch size is where the slope reaches -0.2: 4 B_crit; beyond it steps are
within 25 % of S_min and larger batches buy little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from theory.errors import TheoryError, check_int

PERFECT_SLOPE = -0.8
MAXIMAL_SLOPE = -0.2
REGIMES = ("perfect scaling", "diminishing returns", "maximal data parallelism")
RESAMPLE = ("auto", "seeds", "residuals", "points")

# B_crit is searched within this factor below the smallest / above the largest batch size; a fit at
# that edge means the curve does not pin B_crit down (flat or perfectly scaling everywhere).
_SEARCH_FACTOR = 1e4
_GRID = 161
_GOLDEN_ITERS = 48


@dataclass(frozen=True)
class ScalingFit:
    """Fitted S(B) = S_min (1 + B_crit / B).

    ``intervals``: ``{"s_min", "b_crit", "largest_useful_batch": (low, high)}`` at ``level``;
    ``batch_sizes``: the distinct measured batch sizes (ascending), ``regimes`` one label each;
    ``residual_sd``: standard deviation of the log-space residuals (dof n - 2);
    ``b_crit_at_bound``: the fit hit the edge of the search range, so B_crit lies outside what
    the measured batch sizes resolve (its value is then a bound, not an estimate).
    """

    s_min: float
    b_crit: float
    intervals: dict[str, tuple[float, float]]
    regimes: tuple[str, ...]
    batch_sizes: tuple[float, ...]
    largest_useful_batch: float
    residual_sd: float
    level: float
    n_boot: int
    resample: str
    b_crit_at_bound: bool

    @property
    def e_min(self) -> float:
        """Minimum number of examples E_min = S_min B_crit (McCandlish et al. 2018)."""
        return self.s_min * self.b_crit

    def predict(self, batch_size: ArrayLike) -> np.ndarray:
        """Fitted steps S_min (1 + B_crit / B) at ``batch_size`` (scalar or array)."""
        b = _positive_array(batch_size, "batch_size")
        return self.s_min * (1.0 + self.b_crit / b)

    def slope(self, batch_size: ArrayLike) -> np.ndarray:
        """Local slope d log S / d log B = -B_crit / (B + B_crit) of the fitted curve."""
        b = _positive_array(batch_size, "batch_size")
        return -self.b_crit / (b + self.b_crit)

    def regime(self, batch_size: ArrayLike) -> list[str]:
        """Regime label of each batch size (thresholds in the module docstring)."""
        return [regime_of_slope(s) for s in np.atleast_1d(self.slope(batch_size))]


def regime_of_slope(slope: float) -> str:
    """Regime for a local slope d log S / d log B."""
    if slope <= PERFECT_SLOPE:
        return REGIMES[0]
    if slope >= MAXIMAL_SLOPE:
        return REGIMES[2]
    return REGIMES[1]


def batch_at_slope(b_crit: ArrayLike, slope: float) -> float | np.ndarray:
    """Batch size where the fitted curve's slope -B_crit / (B + B_crit) equals ``slope`` in
    (-1, 0): B = B_crit (1 + slope) / -slope."""
    return b_crit * (1.0 + slope) / -slope


def largest_useful_batch(b_crit: ArrayLike) -> float | np.ndarray:
    """Batch size where the slope reaches MAXIMAL_SLOPE (= 4 B_crit)."""
    return batch_at_slope(b_crit, MAXIMAL_SLOPE)


def fit_scaling(
    batch_sizes: ArrayLike,
    steps: ArrayLike,
    seeds: ArrayLike | None = None,
    n_boot: int = 1000,
    level: float = 0.9,
    seed: int | np.random.Generator = 0,
    resample: str = "auto",
) -> ScalingFit:
    """Fit S(B) = S_min (1 + B_crit / B) to measured ``steps`` at ``batch_sizes`` (log-space
    least squares, McCandlish et al. 2018), with ``level`` bootstrap intervals from ``n_boot``
    replicates (``resample`` in the module docstring) and regime labels.

    ``seeds`` (optional, same length) labels replicate curves: several points may share a batch
    size. ``seed``: the bootstrap's random seed (or a ``numpy.random.Generator``). Example::

        fit = fit_scaling([16, 32, 64, 128, 256], [5100, 2700, 1600, 1100, 880])
        fit.s_min, fit.b_crit, fit.intervals["b_crit"], fit.regimes
    """
    b, s = _check_curve(batch_sizes, steps)
    seed_ids = _check_seeds(seeds, len(b))
    n_boot = check_int(n_boot, "n_boot")
    if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
        raise TheoryError(f"level must be a number in (0, 1), got {level!r}")
    method = _resolve_resample(resample, seed_ids)
    gen = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    y = np.log(s)
    search = (math.log(b.min() / _SEARCH_FACTOR), math.log(b.max() * _SEARCH_FACTOR))
    log_smin, log_bcrit = _profile_fit(b, y[None, :], np.ones((1, len(b))), search)
    fitted = log_smin[0] + np.log1p(np.exp(log_bcrit[0]) / b)
    resid = y - fitted
    dof = len(b) - 2
    residual_sd = float(math.sqrt(np.sum(resid**2) / dof)) if dof > 0 else 0.0

    ys, ws = _replicates(method, y, fitted, _modified_residuals(b, resid, log_bcrit[0]), seed_ids, n_boot, gen)
    boot = np.stack(_profile_fit(b, ys, ws, search), 1)
    theta = np.array([log_smin[0], log_bcrit[0]])
    edge = 1e-6 * (search[1] - search[0])
    at_bound = 1 if theta[1] - search[0] < edge else -1 if search[1] - theta[1] < edge else 0
    if at_bound or method == "seeds":
        low, high = _percentile_intervals(boot, level, at_bound)
    else:
        se = _standard_errors(b, y[None, :], np.ones((1, len(b))), theta[None, :])[0]
        low, high = _studentized_intervals(theta, se, boot, _standard_errors(b, ys, ws, boot), level)

    b_crit = float(math.exp(theta[1]))
    distinct = np.unique(b)
    return ScalingFit(
        s_min=float(math.exp(theta[0])),
        b_crit=b_crit,
        intervals={
            "s_min": (float(low[0]), float(high[0])),
            "b_crit": (float(low[1]), float(high[1])),
            "largest_useful_batch": (float(largest_useful_batch(low[1])), float(largest_useful_batch(high[1]))),
        },
        regimes=tuple(regime_of_slope(-b_crit / (bb + b_crit)) for bb in distinct),
        batch_sizes=tuple(float(x) for x in distinct),
        largest_useful_batch=float(largest_useful_batch(b_crit)),
        residual_sd=residual_sd,
        level=float(level),
        n_boot=n_boot,
        resample=method,
        b_crit_at_bound=bool(at_bound),
    )


def _studentized_intervals(theta, se, boot, boot_se, level):
    """Bootstrap-t intervals (Davison & Hinkley 1997, sec. 5.2.1) for (log S_min, log B_crit),
    returned on the original scale: theta - q(1 - a) se .. theta - q(a) se, q the quantiles of
    (theta* - theta) / se* over replicates (replicates with undefined se* are dropped). A curve
    the model fits exactly (se = 0) gets the point itself."""
    if not np.all(se > 0):
        return np.exp(theta), np.exp(theta)
    alpha = (1.0 - level) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        t_stat = (boot - theta) / boot_se
    t_stat[~np.isfinite(t_stat)] = np.nan
    t_lo, t_hi = np.nanquantile(t_stat, [alpha, 1.0 - alpha], axis=0)
    with np.errstate(over="ignore"):
        return np.exp(theta - t_hi * se), np.exp(theta - t_lo * se)


def _percentile_intervals(boot, level, at_bound: int):
    """Percentile intervals. Used for the seed bootstrap (its per-replicate Gauss-Newton errors
    ignore the correlation within a seed, so they do not studentize) and when B_crit sits at the
    search edge, where the unresolved side is open: ``at_bound`` -1 at the upper edge (perfect
    scaling throughout: B_crit >= low, and S_min, fixed only through S_min B_crit, <= high), +1 at
    the lower edge (B_crit <= high)."""
    alpha = (1.0 - level) / 2.0
    with np.errstate(over="ignore"):   # a bound beyond float range is an open (inf) bound
        low, high = np.exp(np.quantile(boot, [alpha, 1.0 - alpha], axis=0))
    if at_bound < 0:
        low[0], high[1] = 0.0, math.inf
    elif at_bound > 0:
        low[1] = 0.0
    return low, high


def _profile_fit(b: np.ndarray, y: np.ndarray, w: np.ndarray, bounds: tuple[float, float]):
    """Weighted least squares of y[r] on log S_min + log(1 + e^c / b) for every row r at once.

    Returns (log S_min, c) arrays of shape [R]. For fixed c the best log S_min is the weighted
    mean of y - f(c), so the residual sum of squares is a function of c alone.
    """
    grid = np.linspace(bounds[0], bounds[1], _GRID)
    f = np.log1p(np.exp(grid)[:, None] / b[None, :])            # [G, n]
    wsum = w.sum(1, keepdims=True)                              # [R, 1]
    wy = w * y
    rss = (
        (wy * y).sum(1, keepdims=True)
        - 2.0 * wy @ f.T
        + w @ (f * f).T
        - (wy.sum(1, keepdims=True) - w @ f.T) ** 2 / wsum
    )                                                           # [R, G]
    k = rss.argmin(1)
    step = grid[1] - grid[0]
    lo = np.maximum(grid[k] - step, bounds[0])
    hi = np.minimum(grid[k] + step, bounds[1])

    def profile(c: np.ndarray):
        fc = np.log1p(np.exp(c)[:, None] / b[None, :])
        a = (w * (y - fc)).sum(1) / wsum[:, 0]
        return ((w * (y - fc - a[:, None]) ** 2).sum(1)), a

    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    f1, f2 = profile(x1)[0], profile(x2)[0]
    for _ in range(_GOLDEN_ITERS):
        left = f1 < f2
        hi = np.where(left, x2, hi)
        lo = np.where(left, lo, x1)
        x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        f1, f2 = profile(x1)[0], profile(x2)[0]
    c = (lo + hi) / 2.0
    return profile(c)[1], c


def _standard_errors(b, y, w, theta) -> np.ndarray:
    """Gauss-Newton standard errors of (log S_min, log B_crit) per row, shape [R, 2]:
    sqrt(diag(s^2 (J^T W J)^-1)) with s^2 = weighted RSS / (sum w - 2) and the Jacobian rows
    (1, B_crit / (B + B_crit)) of the log-space model."""
    bc = np.exp(theta[:, 1:2])
    fitted = theta[:, :1] + np.log1p(bc / b[None, :])
    dof = np.maximum(w.sum(1) - 2.0, 1.0)
    s2 = (w * (y - fitted) ** 2).sum(1) / dof
    jc = bc / (b[None, :] + bc)
    a11, a12, a22 = w.sum(1), (w * jc).sum(1), (w * jc * jc).sum(1)
    det = a11 * a22 - a12**2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(np.stack([s2 * a22 / det, s2 * a11 / det], 1))


def _modified_residuals(b: np.ndarray, resid: np.ndarray, log_bcrit: float) -> np.ndarray:
    """Residuals divided by sqrt(1 - h_jj), h the leverages of the linearised fit, so that they
    have the error variance (Davison & Hinkley 1997, eq. 6.9)."""
    bc = math.exp(log_bcrit)
    jac = np.stack([np.ones_like(b), bc / (b + bc)], 1)
    lev = np.einsum("ij,jk,ik->i", jac, np.linalg.pinv(jac.T @ jac), jac)
    return resid / np.sqrt(np.clip(1.0 - lev, 1e-12, None))


def _replicates(method, y, fitted, resid, seed_ids, n_boot, gen):
    """Bootstrap data as (y [R, n], weights [R, n]): weights count how often a point is drawn."""
    n = len(y)
    if method == "residuals":
        centred = resid - resid.mean()
        draws = centred[gen.integers(0, n, size=(n_boot, n))]
        return fitted[None, :] + draws, np.ones((n_boot, n))
    if method == "points":
        idx = gen.integers(0, n, size=(n_boot, n))
        w = np.zeros((n_boot, n))
        np.add.at(w, (np.arange(n_boot)[:, None], idx), 1.0)
    else:
        units, inverse = np.unique(seed_ids, return_inverse=True)
        counts = np.zeros((n_boot, len(units)))
        np.add.at(counts, (np.arange(n_boot)[:, None], gen.integers(0, len(units), (n_boot, len(units)))), 1.0)
        w = counts[:, inverse]
    return np.broadcast_to(y, (n_boot, n)), w


def _resolve_resample(resample: str, seed_ids) -> str:
    if resample not in RESAMPLE:
        raise TheoryError(f"resample must be one of {', '.join(RESAMPLE)}; got {resample!r}")
    replicated = seed_ids is not None and len(np.unique(seed_ids)) >= 2
    if resample == "seeds" and not replicated:
        raise TheoryError("resample='seeds' needs seeds naming at least two distinct seeds")
    if resample == "auto":
        return "seeds" if replicated else "residuals"
    return resample


def _check_curve(batch_sizes, steps) -> tuple[np.ndarray, np.ndarray]:
    b = _finite_array(batch_sizes, "batch_sizes")
    s = _finite_array(steps, "steps")
    if len(b) != len(s):
        raise TheoryError(f"batch_sizes and steps must have the same length, got {len(b)} and {len(s)}")
    for name, arr in (("batch_sizes", b), ("steps", s)):
        bad = np.flatnonzero(arr <= 0)
        if bad.size:
            raise TheoryError(f"{name} must be positive; {name}[{bad[0]}] = {arr[bad[0]]!r}")
    if len(np.unique(b)) < 3:
        raise TheoryError(
            f"fit_scaling needs at least 3 distinct batch sizes (2 parameters + 1 residual), got {len(np.unique(b))}"
        )
    return b, s


def _check_seeds(seeds, n: int):
    if seeds is None:
        return None
    ids = np.asarray(seeds)
    if ids.ndim != 1 or len(ids) != n:
        raise TheoryError(f"seeds must be a 1-D sequence of the same length as steps ({n}), got shape {ids.shape}")
    return ids


def _finite_array(values, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TheoryError(f"{name} must be a 1-D sequence of numbers: {exc}") from None
    if arr.ndim != 1:
        raise TheoryError(f"{name} must be 1-D, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise TheoryError(f"{name} must be finite; {name}[{bad[0]}] = {arr[bad[0]]!r} (NaN/inf not allowed)")
    return arr


def _positive_array(values, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(arr) & (arr > 0)):
        raise TheoryError(f"{name} must be positive and finite, got {values!r}")
    return arr
