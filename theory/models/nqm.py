"""Noisy quadratic model (Zhang et al. 2019): closed-form SGD and heavy-ball dynamics.

Loss 1/2 x^T H x with H = diag(h_i); a mini-batch gradient is H x + noise with per-coordinate
variance c_i / B (the paper takes C = H, so c_i = h_i); x_0 ~ N(0, diag(s0)). Preconditioner
p_i = h_i^-gamma (``precond`` = gamma), learning rate a, z_i = a p_i h_i, noise injected per step
n_i = a^2 p_i^2 c_i / B.

SGD: s_i(k) = E x_i(k)^2 = s_i* + beta_i^k (s_i(0) - s_i*), beta_i = (1 - z_i)^2,
s_i* = n_i / (z_i (2 - z_i)); stable iff 0 < z_i < 2.

Heavy ball (v' = b v - a p g, x' = x + v'): (E x^2, E v^2, E xv) evolves by the 3x3 map
M = [[(1-z)^2, b^2, 2(1-z)b], [z^2, b^2, -2zb], [-(1-z)z, b^2, (1-2z)b]] plus n (1, 1, 1).
M acts on the covariance S of (x, v) as S -> A S A^T with A = [[1-z, b], [-z, b]], so
M^k S = A^k S A^kT and A^k = F_k A - b F_{k-1} I, where F_k = (lam+^k - lam-^k)/(lam+ - lam-)
over the eigenvalues lam+- of A (lam+ lam- = b, lam+ + lam- = 1 - z + b); for complex lam,
F_k = b^((k-1)/2) sin(k theta) / sin(theta). The fixed point u* = (I - M)^-1 n (1, 1, 1) is solved
with sympy. Stable iff 0 <= b < 1 and 0 < z < 2 (1 + b).

Steps to target: the first step with expected loss < target, minimised over a learning-rate grid
(SGD) or learning-rate x momentum grid, by bisection on k as in Zhang et al.'s notebook. One
bisection serves the whole grid: it starts at the lower bound T >= d / (2 C B) (Zhang et al. 2019),
doubles until some grid point reaches the target, and drops every grid point that is not below
target at the current upper end. This is exact when each loss path crosses the target once (SGD
with s_i(0) >= s_i*, e.g. the paper's setting); for oscillating momentum paths it returns a
crossing step, as the notebook's bisection does. Heavy ball (v' = b v - a p g, x' = x + v') is
Shallue et al.'s momentum form with v = -lr a.

Adam-like preconditioning (Zhang et al. 2019, Sec. 3.3): Adam divides the step by sqrt(v_i), the
root of a running mean of g_i^2; when the gradient noise dominates, E g_i^2 ~ c_i / B = h_i / B
(C = H), so its preconditioner is p_i ~ h_i^-1/2: power ``ADAM_POWER`` = 1/2 with heavy-ball
momentum (Adam's beta1). The same closed forms hold with z_i = a p_i h_i and n_i = a^2 p_i^2 c_i
/ B; the paper predicts that preconditioning needs fewer steps at every batch size and extends
perfect scaling to a larger critical batch than momentum alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import sympy as sp
from numpy.typing import ArrayLike

from theory.errors import TheoryError, check_int

SGD_LRS = np.logspace(-5, 0.5, 100)
MOMENTUM_LRS = np.logspace(-8, 1, 100)
MOMENTA = 1.0 - np.logspace(-5, 0, 20)
DEFAULT_DIM = 10_000
# preconditioning power of an Adam-like optimizer in the NQM: p_i = h_i^-1/2 (module docstring)
ADAM_POWER = 0.5
MAX_STEPS = 10**8
# coordinates x grid points evaluated at once (bounds memory to a few tens of MB)
_CHUNK = 400_000


# eq=False below: fields hold numpy arrays, so dataclass equality would be ambiguous
@dataclass(frozen=True, eq=False)
class Spectrum:
    """Diagonal model: curvatures ``h``, gradient-noise variances ``c`` (per example) and
    initial second moments ``s0``, one entry per coordinate."""

    h: np.ndarray
    c: np.ndarray
    s0: np.ndarray

    def __post_init__(self) -> None:
        for name in ("h", "c", "s0"):
            arr = np.asarray(getattr(self, name), dtype=float)
            if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr) & (arr > 0)):
                raise TheoryError(f"Spectrum.{name} must be a non-empty 1-D array of positive finite numbers")
            object.__setattr__(self, name, arr)
        if not len(self.h) == len(self.c) == len(self.s0):
            lengths = f"{len(self.h)}, {len(self.c)}, {len(self.s0)}"
            raise TheoryError(f"Spectrum h, c, s0 must have equal lengths, got {lengths}")

    @property
    def dim(self) -> int:
        return len(self.h)

    def initial_loss(self) -> float:
        return float(0.5 * np.sum(self.h * self.s0))


def paper_spectrum(dim: int = DEFAULT_DIM) -> Spectrum:
    """Zhang et al. 2019: h_i = 1/i, C = H, x_0 ~ N(0, I)."""
    check_int(dim, "dim")
    h = 1.0 / np.arange(1, dim + 1)
    return Spectrum(h=h, c=h.copy(), s0=np.ones(dim))


@dataclass(frozen=True)
class PowerLawTail:
    """h_i = scale * i^-exponent fitted to measured top eigenvalues (log-log least squares)."""

    scale: float
    exponent: float


def fit_power_law(top_eigenvalues: ArrayLike) -> PowerLawTail:
    """Least-squares fit of log h_i = log scale - exponent log i to the sorted top eigenvalues."""
    top = _positive_vector(top_eigenvalues, "top_eigenvalues")
    if len(top) < 2:
        raise TheoryError("top_eigenvalues needs at least 2 values to fit a power-law tail")
    top = np.sort(top)[::-1]
    slope, intercept = np.polyfit(np.log(np.arange(1, len(top) + 1)), np.log(top), 1)
    return PowerLawTail(scale=float(np.exp(intercept)), exponent=float(-slope))


def measured_spectrum(top_eigenvalues: ArrayLike, dim: int, noise_scale: float = 1.0) -> Spectrum:
    """Measured top-k Hessian eigenvalues, extended to ``dim`` coordinates by a fitted power-law
    tail; noise C = noise_scale * H (the paper's C = H up to scale), x_0 ~ N(0, I)."""
    top = np.sort(_positive_vector(top_eigenvalues, "top_eigenvalues"))[::-1]
    check_int(dim, "dim")
    if dim < len(top):
        raise TheoryError(f"dim ({dim}) must be >= the number of measured eigenvalues ({len(top)})")
    if not (np.isfinite(noise_scale) and noise_scale > 0):
        raise TheoryError(f"noise_scale must be positive, got {noise_scale!r}")
    tail = fit_power_law(top)
    h = np.concatenate([top, tail.scale * np.arange(len(top) + 1, dim + 1, dtype=float) ** -tail.exponent])
    return Spectrum(h=h, c=noise_scale * h, s0=np.ones(dim))


@dataclass(frozen=True, eq=False)
class NQMCurve:
    """Steps to target per batch size with the best grid point; ``steps`` is inf where no grid
    point reaches the target within ``max_steps``; ``best_momentum`` is 0 for SGD."""

    batch_sizes: np.ndarray
    steps: np.ndarray
    best_lr: np.ndarray
    best_momentum: np.ndarray
    lower_bound: np.ndarray
    target: float
    optimizer: str
    precond: float


@cache
def _steady_state():
    """u* = (I - M)^-1 n (1, 1, 1) for heavy ball, solved symbolically once; returns E x^2*, E v^2*, E xv*."""
    z, b, n = sp.symbols("z b n")
    m = sp.Matrix([
        [(1 - z) ** 2, b**2, 2 * (1 - z) * b],
        [z**2, b**2, -2 * z * b],
        [-(1 - z) * z, b**2, (1 - 2 * z) * b],
    ])
    u = (sp.eye(3) - m).LUsolve(sp.Matrix([n, n, n]))
    return sp.lambdify((z, b, n), [sp.factor(e) for e in u], modules="numpy")


def sgd_second_moments(spectrum: Spectrum, lr: ArrayLike, batch_size: ArrayLike, steps: ArrayLike,
                       precond: float = 0.0) -> np.ndarray:
    """E x_i(k)^2 under SGD, closed form; broadcasts lr / batch_size / steps against coordinates
    (last axis)."""
    z, n = _step_terms(spectrum, lr, batch_size, precond)
    beta = (1.0 - z) ** 2
    s_star = n / (z * (2.0 - z))
    k = np.asarray(steps, dtype=float)[..., None]
    return s_star + _ipow(beta, k, False) * (spectrum.s0 - s_star)


def momentum_second_moments(spectrum: Spectrum, lr: ArrayLike, momentum: ArrayLike, batch_size: ArrayLike,
                            steps: ArrayLike, precond: float = 0.0) -> np.ndarray:
    """E x_i(k)^2 under heavy-ball momentum, closed form via A^k = F_k A - b F_{k-1} I."""
    z, n = _step_terms(spectrum, lr, batch_size, precond)
    b = np.asarray(momentum, dtype=float)[..., None]
    u = _steady_state()(z, b, n)
    w1, w2, w3 = spectrum.s0 - u[0], -u[1], -u[2]
    p, q, _, _ = _transfer(z, b, steps)
    return u[0] + p * p * w1 + 2.0 * p * q * w3 + q * q * w2


def momentum_moments(spectrum: Spectrum, lr: ArrayLike, momentum: ArrayLike, batch_size: ArrayLike,
                     steps: ArrayLike, start: tuple[ArrayLike, ArrayLike, ArrayLike],
                     precond: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(E x^2, E v^2, E xv) after ``steps`` heavy-ball updates from the moments ``start`` =
    (E x^2, E v^2, E xv) (``spectrum.s0`` is not used): u* + A^k (S - u*) A^kT per coordinate,
    A^k = [[p, q], [r, s]]. Continues a run from any state, e.g. a checkpoint; b = 0 is SGD."""
    z, n = _step_terms(spectrum, lr, batch_size, precond)
    b = np.asarray(momentum, dtype=float)[..., None]
    u = _steady_state()(z, b, n)
    w1, w2, w3 = (np.asarray(m, dtype=float) - ui for m, ui in zip(start, u))
    p, q, r, s = _transfer(z, b, steps)
    return (u[0] + p * p * w1 + 2.0 * p * q * w3 + q * q * w2,
            u[1] + r * r * w1 + 2.0 * r * s * w3 + s * s * w2,
            u[2] + p * r * w1 + (p * s + q * r) * w3 + q * s * w2)


def _transfer(z, b, steps):
    """Entries (p, q, r, s) of A^k = F_k A - b F_{k-1} I with A = [[1 - z, b], [-z, b]]."""
    f_k, bf_km1 = _powers(z, b, np.asarray(steps, dtype=float)[..., None])
    q = b * f_k
    return (1.0 - z) * f_k - bf_km1, q, -z * f_k, q - bf_km1


def _powers(z, b, k):
    """(F_k, b F_{k-1}) with F_k = (lam+^k - lam-^k) / (lam+ - lam-) over the roots of
    lam^2 - (1 - z + b) lam + b (so b F_{k-1} = (lam- lam+^k - lam+ lam-^k) / (lam+ - lam-),
    defined at b = 0 too). Complex pair rho e^{+-i theta}: F_k = rho^(k-1) sin(k theta) / sin(theta),
    b F_{k-1} = rho^k sin((k-1) theta) / sin(theta); repeated root lam: k lam^(k-1), (k-1) lam^k.
    Each element is computed only by its own case (this is the NQM's inner loop)."""
    odd = np.mod(k, 2.0) == 1.0  # before broadcasting: k is usually one value per grid point
    z, b, k, odd = np.broadcast_arrays(z, b, k, odd)
    t = 1.0 - z + b
    disc = t * t - 4.0 * b
    root = np.sqrt(np.abs(disc))
    tiny = root == 0.0
    f, g = np.empty_like(t), np.empty_like(t)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        # real roots m (1 +- e), m = t / 2: near a repeated root (small e) the difference of powers
        # cancels, so for k d < 1 write m^k ((1+e)^k - (1-e)^k) / (2e) = m^k exp(k a) sinh(k d) / e
        # with a, d = (log1p(e) +- log1p(-e)) / 2, accurate as e -> 0; for k d >= 1 there is no
        # cancellation and the powers are taken directly (in logs, so nothing overflows)
        i = ~tiny & (disc > 0) & (root < np.abs(t) / 2.0)
        m, ki, oi = t[i] / 2.0, k[i], odd[i]
        e = root[i] / np.abs(t[i])
        log_m = np.log(np.abs(m))
        lp, lm = np.log1p(e), np.log1p(-e)
        kd = ki * (lp - lm) / 2.0
        sign = np.where((m < 0) & oi, -1.0, 1.0)
        near = kd < 1.0
        grow = sign * np.exp(ki * (log_m + (lp + lm) / 2.0))
        big_p, big_q = sign * np.exp(ki * (log_m + lp)), sign * np.exp(ki * (log_m + lm))
        diff = np.where(near, grow * np.sinh(kd) / e, (big_p - big_q) / (2.0 * e))  # m^k ((1+e)^k - (1-e)^k) / 2e
        total = np.where(near, grow * np.cosh(kd), (big_p + big_q) / 2.0)             # m^k ((1+e)^k + (1-e)^k) / 2
        f[i], g[i] = diff / m, diff - total
        # real roots of opposite sign (or one zero): no cancellation
        i = ~tiny & (disc > 0) & (root >= np.abs(t) / 2.0)
        ti, ri, ki, oi = t[i], root[i], k[i], odd[i]
        lp, lm = (ti + ri) / 2.0, (ti - ri) / 2.0
        pp, pm = _ipow(lp, ki, oi), _ipow(lm, ki, oi)
        f[i], g[i] = (pp - pm) / ri, (lm * pp - lp * pm) / ri
        i = ~tiny & (disc <= 0)
        ti, ri, ki, bi = t[i], root[i], k[i], b[i]
        theta = np.arctan2(ri, ti)
        rho_k = np.exp(0.5 * ki * np.log(bi))
        scale = rho_k / np.sin(theta)
        f[i], g[i] = scale / np.sqrt(bi) * np.sin(ki * theta), scale * np.sin((ki - 1.0) * theta)
        half, ki, oi = t[tiny] / 2.0, k[tiny], odd[tiny]
        f[tiny] = ki * _ipow(half, ki - 1.0, ~oi)
        g[tiny] = (ki - 1.0) * _ipow(half, ki, oi)
    return f, g


def _ipow(x, k, odd):
    """x^k for real x (possibly negative) and integer-valued k (``odd``: k is odd); exp-log is
    several times faster than numpy's float power here."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mag = np.where(k == 0, 1.0, np.exp(k * np.log(np.abs(x))))
    return np.where((x < 0) & odd, -mag, mag)


def expected_loss(second_moments: np.ndarray, spectrum: Spectrum) -> np.ndarray:
    """E loss = 1/2 sum_i h_i E x_i^2 (over the last axis)."""
    return 0.5 * (second_moments * spectrum.h).sum(-1)


def steps_to_target(
    spectrum: Spectrum,
    target: float,
    batch_sizes: ArrayLike,
    optimizer: str = "sgd",
    lrs: ArrayLike | None = None,
    momenta: ArrayLike | None = None,
    precond: float = 0.0,
    max_steps: int = MAX_STEPS,
) -> NQMCurve:
    """Fewest steps to expected loss < ``target`` per batch size, best over the lr grid (SGD) or
    lr x momentum grid (``"momentum"``); default grids as in Zhang et al. 2019's notebook."""
    if optimizer not in ("sgd", "momentum"):
        raise TheoryError(f"optimizer must be 'sgd' or 'momentum', got {optimizer!r}")
    if not (isinstance(target, (int, float)) and np.isfinite(target) and target > 0):
        raise TheoryError(f"target must be a positive loss value, got {target!r}")
    batches = _positive_vector(batch_sizes, "batch_sizes")
    check_int(max_steps, "max_steps")
    if optimizer == "sgd":
        lr_grid = _positive_vector(SGD_LRS if lrs is None else lrs, "lrs")
        mom_grid = np.zeros(1)
        if momenta is not None:
            raise TheoryError("momenta is only used with optimizer='momentum'")
    else:
        lr_grid = _positive_vector(MOMENTUM_LRS if lrs is None else lrs, "lrs")
        mom_grid = np.asarray(MOMENTA if momenta is None else momenta, dtype=float)
        if mom_grid.ndim != 1 or not np.all((mom_grid >= 0) & (mom_grid < 1)):
            raise TheoryError("momenta must be a 1-D array with values in [0, 1)")
    lr_all, mom_all = (g.ravel() for g in np.meshgrid(lr_grid, mom_grid, indexing="ij"))

    steps, best_lr, best_mom = (np.full(len(batches), np.nan) for _ in range(3))
    # A larger batch only lowers the injected noise, so every grid point's loss path drops and
    # the best steps at the previous (smaller) batch are reachable: start the search there.
    start = np.floor(lower_bound_steps(spectrum.dim, target, batches.min()))
    for j in np.argsort(batches, kind="stable"):
        k, i = _bisect_steps(spectrum, target, batches[j], lr_all, mom_all, optimizer, precond, max_steps, start)
        steps[j] = k
        if i >= 0:
            best_lr[j], best_mom[j], start = lr_all[i], mom_all[i], k
    return NQMCurve(
        batch_sizes=batches,
        steps=steps,
        best_lr=best_lr,
        best_momentum=best_mom,
        lower_bound=lower_bound_steps(spectrum.dim, target, batches),
        target=float(target),
        optimizer=optimizer,
        precond=float(precond),
    )


def lower_bound_steps(dim: int, target: float, batch_size: ArrayLike) -> np.ndarray:
    """T >= d / (2 C B): Zhang et al. 2019's lower bound on steps to reach loss C at batch B."""
    return dim / (2.0 * target * np.asarray(batch_size, dtype=float))


def _bisect_steps(spectrum, target, batch, lrs, moms, optimizer, precond, max_steps, start) -> tuple[float, int]:
    """(fewest steps, grid index) over grid points, by one bisection on k shared by all points.

    A grid point whose loss is not below target at the current upper end cannot be the best and
    is dropped, so the work shrinks as the bracket closes. The search tries k = ``start`` first
    and doubles until some point reaches the target. Assumes each point's loss path crosses the
    target once (Zhang et al.'s bisection).
    """
    if spectrum.initial_loss() < target:
        return 0.0, 0
    # stable iff every z_i = a p_i h_i < 2 (1 + b), i.e. at the largest p_i h_i
    z_max = lrs * np.max(spectrum.h ** (1.0 - float(precond)))
    candidates = np.flatnonzero(z_max < 2.0 * (1.0 + moms))

    def chunks(idx):
        per_chunk = max(1, _CHUNK // spectrum.dim)
        return (idx[s : s + per_chunk] for s in range(0, len(idx), per_chunk))

    # the noise floor (k -> inf) must lie below target
    floor = np.concatenate([np.empty(0)] + [
        expected_loss(_steady_state()(*_terms_with_momentum(spectrum, lrs[part], moms[part], batch, precond))[0],
                      spectrum)
        for part in chunks(candidates)
    ])
    active = candidates[floor < target]
    if active.size == 0:
        return np.inf, -1

    def below(idx, k):
        out = []
        for part in chunks(idx):
            if optimizer == "sgd":
                m = sgd_second_moments(spectrum, lrs[part], batch, np.full(len(part), k), precond)
            else:
                m = momentum_second_moments(spectrum, lrs[part], moms[part], batch, np.full(len(part), k), precond)
            out.append(expected_loss(m, spectrum) < target)
        return np.concatenate(out)

    lo, k = 0.0, float(min(max(1.0, start), max_steps))
    while True:
        hit = below(active, k)
        if hit.any():
            hi, active = k, active[hit]
            break
        if k >= max_steps:
            return np.inf, -1
        lo, k = k, float(min(2.0 * k, max_steps))
    while hi - lo > 1:
        mid = np.floor((lo + hi) / 2.0)
        hit = below(active, mid)
        if hit.any():
            hi, active = mid, active[hit]
        else:
            lo = mid
    return hi, int(active[0])


def _terms_with_momentum(spectrum: Spectrum, lr, momentum, batch_size, precond: float):
    """(z, b, n) for the steady-state formula, broadcast as [grid points, d]."""
    z, n = _step_terms(spectrum, lr, batch_size, precond)
    return z, np.asarray(momentum, dtype=float)[:, None], n


def _step_terms(spectrum: Spectrum, lr, batch_size, precond: float):
    """z_i = a p_i h_i and injected noise n_i = a^2 p_i^2 c_i / B, broadcast as [..., d]."""
    p = spectrum.h ** (-float(precond))
    a = np.asarray(lr, dtype=float)[..., None]
    bsz = np.asarray(batch_size, dtype=float)
    bsz = bsz[..., None] if bsz.ndim else bsz
    return a * p * spectrum.h, a * a * p * p * spectrum.c / bsz


def _positive_vector(values, name: str) -> np.ndarray:
    try:
        arr = np.atleast_1d(np.asarray(values, dtype=float))
    except (TypeError, ValueError):
        raise TheoryError(f"{name} must be numbers, got {values!r}") from None
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr) & (arr > 0)):
        raise TheoryError(f"{name} must be a non-empty 1-D array of positive finite numbers, got {values!r}")
    return arr
