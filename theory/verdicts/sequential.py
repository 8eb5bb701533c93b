"""Group-sequential boundaries and the decision at each look: a study that looks at its data
after each round of paired runs, and stops only where a corrected boundary allows.

K equally spaced looks at a two-sided test of level alpha. The standardized statistics
Z_1 .. Z_K of the accumulating data are those of a Brownian motion at times 1 .. K
(corr(Z_i, Z_j) = sqrt(i / j)); the boundary at look k is c_k with
P(|Z_k| >= c_k for some k | H_0) = alpha:

- Pocock (1977): one constant, c_k = c;
- O'Brien and Fleming (1979): c_k = C sqrt(K / k) (wide early, near the fixed-n value at the end).

The constant is found by root finding on the crossing probability, which is computed by the
recursive numerical integration of Armitage, McPherson and Rowe (1969): the sub-density of the
partial sum S_k = sqrt(k) Z_k on the continuation region, propagated look by look by
convolution with the N(0, 1) increment (trapezoid rule on a fine grid). Published values
(Jennison and Turnbull 2000, tables 2.1 and 2.3; alpha = 0.05): K = 5, Pocock 2.413,
O'Brien-Fleming C = 2.040.

At look k a paired study holds n_k pair differences d (on the analysis scale, e.g. log L);
its statistic is t = mean(d) / (sd(d) / sqrt(n_k)), and it crosses where t's two-sided p-value
is at most the boundary's nominal level 2 (1 - Phi(c_k)) (the nominal-significance form for a
statistic estimated with few degrees of freedom; Jennison and Turnbull 2000, sec. 3.6). The
repeated confidence interval mean(d) +- t_{n_k - 1}(1 - p_k / 2) se holds its coverage
1 - alpha simultaneously over the looks whatever the stopping (Jennison and Turnbull 1989), so
a study may also stop once that interval is narrower than the resolution it was planned for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

from theory.errors import TheoryError, check_int

BOUNDARIES = ("obrien_fleming", "pocock")
# grid step on the partial-sum scale: the constants to 3 decimals (checked in the tests)
GRID_STEP = 0.01


def _shape(boundary: str, looks: int) -> np.ndarray:
    """c_k / C at looks 1 .. K."""
    k = np.arange(1, looks + 1, dtype=float)
    if boundary == "pocock":
        return np.ones(looks)
    if boundary == "obrien_fleming":
        return np.sqrt(looks / k)
    raise TheoryError(f"boundary must be one of {', '.join(BOUNDARIES)}, got {boundary!r}")


def _nodes(bound: float) -> tuple[np.ndarray, np.ndarray]:
    """The grid on [-bound, bound] (both ends on it, step at most :data:`GRID_STEP`) and its
    trapezoid weights."""
    n = int(math.ceil(2 * bound / GRID_STEP)) + 1
    grid = np.linspace(-bound, bound, n)
    weights = np.full(n, grid[1] - grid[0])
    weights[[0, -1]] /= 2
    return grid, weights


def _phi(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def crossing_probability(bounds: Sequence[float]) -> float:
    """P(|Z_k| >= bounds[k-1] for some look k) under H_0 (Z at Brownian times 1 .. K;
    module docstring), by recursive numerical integration."""
    b = np.asarray(bounds, dtype=float) * np.sqrt(np.arange(1, len(bounds) + 1))
    grid, weights = _nodes(b[0])
    density = _phi(grid)
    for k in range(1, len(b)):
        nxt, nxt_weights = _nodes(b[k])
        density = _phi(nxt[:, None] - grid[None, :]) @ (density * weights)
        grid, weights = nxt, nxt_weights
    return float(1 - density @ weights)


@lru_cache(maxsize=64)
def boundary_constants(boundary: str, looks: int, alpha: float = 0.05) -> tuple[float, ...]:
    """The critical values c_1 .. c_K of a two-sided ``boundary`` (``"pocock"`` or
    ``"obrien_fleming"``) at ``looks`` equally spaced looks with overall level ``alpha``."""
    looks = check_int(looks, "looks")
    if not 0 < alpha < 1:
        raise TheoryError(f"alpha must lie in (0, 1), got {alpha!r}")
    shape = _shape(boundary, looks)
    fixed = stats.norm.ppf(1 - alpha / 2)
    if looks == 1:
        return (float(fixed),)
    c = optimize.brentq(lambda c: crossing_probability(c * shape) - alpha, fixed,
                        fixed * 2 * math.sqrt(looks), xtol=1e-6)
    return tuple(float(c * s) for s in shape)


@dataclass(frozen=True)
class Look:
    """The decision at one look: ``look`` k of ``looks``, ``pairs`` n_k, the mean paired
    difference and its repeated confidence interval (analysis scale), ``statistic`` t,
    ``boundary`` c_k and its ``nominal`` level, and ``stop`` with ``why`` (``"crossed"``,
    ``"resolved"``, ``"last look"`` or ``""``)."""

    look: int
    looks: int
    pairs: int
    mean: float
    interval: tuple[float, float]
    statistic: float
    boundary: float
    nominal: float
    stop: bool
    why: str


def look(differences: Sequence[float], k: int, looks: int, boundary: str = "obrien_fleming",
         alpha: float = 0.05, resolution: float | None = None) -> Look:
    """The decision at look ``k`` of ``looks`` on the paired ``differences`` accumulated so
    far (module docstring): stop when t crosses the boundary, when the repeated interval's
    half-width is at most ``resolution`` (None: never on width), or at the last look."""
    k, looks = check_int(k, "k"), check_int(looks, "looks")
    if k > looks:
        raise TheoryError(f"k must be at most looks ({looks}), got {k}")
    d = np.asarray(differences, dtype=float)
    if len(d) < 2 or not np.isfinite(d).all():
        raise TheoryError(f"need two or more finite paired differences, got {len(d)}")
    c = boundary_constants(boundary, looks, alpha)[k - 1]
    nominal = float(2 * stats.norm.sf(c))
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    p = float(2 * stats.t.sf(abs(t), len(d) - 1))
    half = float(stats.t.isf(nominal / 2, len(d) - 1) * se)
    why = ("crossed" if p <= nominal else
           "resolved" if resolution is not None and half <= resolution else
           "last look" if k == looks else "")
    return Look(k, looks, len(d), mean, (mean - half, mean + half), t, c, nominal, bool(why), why)
