"""Noisy quadratic model with delayed gradients (fixed or uniform delays): exact expected loss,
stability threshold, steps to a target against batch size and delay.

The model of :mod:`theory.models.nqm` (Zhang et al. 2019): loss 1/2 sum_i h_i x_i^2, a mini-batch
gradient h_i x_i + noise of variance c_i / B, x_0 ~ N(0, diag(s0)). Delayed SGD applies at step k
the gradient computed at the iterate of step k - tau, with its own noise xi_{k-tau}. Before step
tau there is no such iterate; ``start`` says what happens then:

- ``"initial"`` (default): the gradient at x_0 with fresh noise, as when every worker starts from
  the initial weights: x_{k+1} = x_k - a (h x_{max(k - tau, 0)} + xi_k);
- ``"empty"``: no update (the queue starts empty), the convention of the bound in
  :mod:`theory.models.delay`: x_{k+1} = x_k - a [k >= tau] (h x_{k - tau} + xi_{k - tau}).

Each coordinate is linear in x_0 and the noises, so with z = a h, the deterministic path phi and
the impulse response psi of the recursion y_{k+1} = y_k - z y_{k-tau},

    phi_0 = 1, phi_{k+1} = phi_k - z phi_{k-tau}, phi_{<0} = 1 ("initial") or 0 ("empty");
    psi_0 = 1, psi_{m+1} = psi_m - z psi_{m-tau}, psi_{<0} = 0;
    E x_k^2 = phi_k^2 s0 + (a^2 c / B) sum_{m<k} psi_m^2                ("initial"),
    E x_k^2 = phi_k^2 s0 + (a^2 c / B) sum_{m<k-tau} psi_m^2            ("empty").

This is the exact second moment (the noises are independent and zero-mean); it is what the
recursion on the covariance of the last tau + 1 iterates gives, computed per coordinate in
O(tau) memory instead of O(tau^2). At tau = 0 it is :func:`theory.models.nqm.sgd_second_moments`.

Random delays (``distribution="uniform"``: tau_k uniform on 0..tau, drawn independently every
step, start ``"initial"``): the delayed iterate is no longer one fixed lag, and the state is the
covariance S of the last tau + 1 iterates per coordinate. With p_d the delay's probabilities
and the delay independent of the iterates,

    E x_{k+1}^2 = S_00 - 2 z sum_d p_d S_0d + z^2 sum_d p_d S_dd + a^2 c / B,
    E x_{k+1} x_{k-j} = S_0j - z sum_d p_d S_dj,   the rest shifts down one lag,

from S = s0 (all ones) at k = 0; the deterministic and the noise parts run as two such
recursions (the loss is A_k + C_k / B again). Every entry of S is a cross-moment
E x_t x_{t-l} of one of the last tau + 1 steps, so the state is kept as those rows of
cross-moments and S's row sums, O(tau) work per coordinate and step (:func:`_uniform_paths`).

Stability (closed form, fixed delay): the recursion's characteristic polynomial is
lam^(tau+1) - lam^tau + z; all its roots lie inside the unit circle iff
0 < z < 2 sin(pi / (2 (2 tau + 1))) (Levin & May 1976, for the delay-difference equation
x_{k+1} = x_k - z x_{k-tau}): 2 at tau = 0, 1 at tau = 1, about pi / (2 tau) for large tau. The
largest stable learning rate is that threshold over max_i p_i h_i, so it falls as 1/tau, the
shape of the learning-rate guideline of :mod:`theory.models.delay`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from theory.errors import TheoryError, check_int
from theory.models.nqm import SGD_LRS, Spectrum, _positive_vector

MAX_STEPS = 10**6
STARTS = ("initial", "empty")
DISTRIBUTIONS = ("fixed", "uniform")
# floats of state marched at once (64 MB): learning rates are taken in chunks that fit
_STATE_FLOATS = 8_000_000


def stability_threshold(delay: int) -> float:
    """z* = 2 sin(pi / (2 (2 tau + 1))): delayed gradient descent on a quadratic of curvature h
    converges iff 0 < a h < z*."""
    tau = check_int(delay, "delay", minimum=0)
    return float(2.0 * np.sin(np.pi / (2.0 * (2 * tau + 1))))


def max_stable_lr(spectrum: Spectrum, delay: int, precond: float = 0.0) -> float:
    """The largest learning rate at which every coordinate is stable: z* / max_i p_i h_i."""
    return stability_threshold(delay) / float(np.max(spectrum.h ** (1.0 - float(precond))))


def delayed_second_moments(spectrum: Spectrum, lr: ArrayLike, batch_size: float, delay: int,
                           steps: int, precond: float = 0.0, start: str = "initial",
                           distribution: str = "fixed") -> np.ndarray:
    """E x_i(k)^2 for k = 0..steps under delayed SGD: shape [steps + 1, len(lr), d]."""
    lrs = _positive_vector(lr, "lr")
    tau = check_int(delay, "delay", minimum=0)
    n_steps = check_int(steps, "steps", minimum=0)
    _check_options(start, distribution)
    z, n = _terms(spectrum, lrs, batch_size, precond)
    out = np.empty((n_steps + 1,) + z.shape)
    for k, (det, noise) in enumerate(_moment_paths(z, tau, start, distribution)):
        out[k] = det * spectrum.s0 + n * noise
        if k == n_steps:
            break
    return out


def delay_probabilities(distribution: str, delay: int) -> np.ndarray:
    """p_d for d = 0..tau: all mass at tau ("fixed") or 1 / (tau + 1) each ("uniform")."""
    tau = check_int(delay, "delay", minimum=0)
    _check_options("initial", distribution)
    if distribution == "fixed":
        return np.eye(tau + 1)[tau]
    return np.full(tau + 1, 1.0 / (tau + 1))


def _moment_paths(z: np.ndarray, tau: int, start: str, distribution: str):
    """Yield (deterministic part, noise part) of E x_k^2 for k = 0, 1, ...:
    E x^2 = det s0 + n noise."""
    if distribution == "fixed":
        return ((phi * phi, noise) for phi, noise in _paths(z, tau, start))
    return _uniform_paths(z, tau)


def _uniform_paths(z: np.ndarray, tau: int):
    """The covariance recursion of uniform delays (module docstring) in O(tau) per step.

    S_k[i, j] = E x_{k-i} x_{k-j} = R_{k - min(i, j)}(|i - j|) with R_t(l) = E x_t x_{t-l}, so the
    state is the last tau + 1 rows R_t (a ring buffer) and the row sums r_k(i) = sum_j S_k[i, j]:
    with q = 1 / (tau + 1), sum_d p_d S_dj = q r_k(j), and r_{k+1}(i) = R_{k+1}(i) + r_k(i - 1)
    - S_k[i - 1, tau] for i >= 1. Yields (deterministic part, noise part) of E x_k^2."""
    lags, q = tau + 1, 1.0 / (tau + 1)
    # [time slot t mod (tau + 1), lag, ...]: x_0 everywhere before step 0 (every R is s0 = 1)
    parts = [[np.ones((lags, lags) + z.shape), np.full((lags,) + z.shape, float(lags))],
             [np.zeros((lags, lags) + z.shape), np.zeros((lags,) + z.shape)]]
    back = np.arange(1, lags)                              # i = 1..tau
    k = 0
    while True:
        now = k % lags
        yield parts[0][0][now, 0], parts[1][0][now, 0]
        corner_slots, corner_lags = (k - back + 1) % lags, lags - back      # S_k[i-1, tau]
        with np.errstate(over="ignore", invalid="ignore"):   # a diverging point stays above target
            for injected, (hist, rows) in enumerate(parts):
                cur = hist[now]
                new = np.empty_like(cur)
                new[0] = (cur[0] - 2.0 * z * q * cur.sum(0) + z * z * q * hist[:, 0].sum(0)
                          + float(injected))                 # the noise part gets a unit noise
                new[1:] = cur[:-1] - z * q * rows[:-1]
                rows[1:] = new[1:] + rows[:-1] - hist[corner_slots, corner_lags]
                rows[0] = new.sum(0)
                hist[(k + 1) % lags] = new
        k += 1


def _paths(z: np.ndarray, tau: int, start: str):
    """Yield (phi_k, sum of psi_m^2 over the noises that reached step k) for k = 0, 1, 2, ...
    (module docstring). Ring buffers of the last tau + 1 values, updated in place: the yielded
    arrays change at the next step, so use them before asking for it."""
    phi = np.full((tau + 1,) + z.shape, 1.0 if start == "initial" else 0.0)
    psi = np.zeros((tau + 1,) + z.shape)
    phi[0] = psi[0] = 1.0                         # slot k mod (tau + 1) holds index k
    noise = np.zeros(z.shape)
    k = 0
    while True:
        now, old = k % (tau + 1), (k + 1) % (tau + 1)   # old: index k - tau, overwritten next
        yield phi[now], noise
        # "empty": the noise of step m reaches the iterates tau steps later (psi_{k-tau}, which
        # is 0 while k < tau)
        noise += psi[now if start == "initial" else old] ** 2
        phi[old] = phi[now] - z * phi[old]
        psi[old] = psi[now] - z * psi[old]
        k += 1


@dataclass(frozen=True, eq=False)
class DelayCurve:
    """Steps to target for every (batch size, delay): ``steps[i, j]`` at ``batch_sizes[i]`` and
    ``delays[j]``, inf where no learning rate of the grid reached the target within
    ``max_steps``; ``best_lr`` the grid point that reached it first."""

    batch_sizes: np.ndarray
    delays: np.ndarray
    steps: np.ndarray
    best_lr: np.ndarray
    target: float
    distribution: str = "fixed"


def steps_to_target(spectrum: Spectrum, target: float, batch_sizes: ArrayLike,
                    delays: ArrayLike = (0,), lrs: ArrayLike | None = None,
                    max_steps: int = 100_000, precond: float = 0.0,
                    start: str = "initial", distribution: str = "fixed") -> DelayCurve:
    """First step k with E loss(k) < ``target``, fewest over the learning-rate grid (default:
    nqm's SGD grid), for every batch size and delay (fixed, or uniform on 0..delay). The loss
    path of a delayed run may oscillate, so it is marched step by step rather than bisected.
    Fixed delays drop the grid points beyond the stability threshold; random delays have no
    closed-form threshold, and a diverging point simply never reaches the target."""
    if not (isinstance(target, (int, float)) and np.isfinite(target) and target > 0):
        raise TheoryError(f"target must be a positive loss value, got {target!r}")
    batches = _positive_vector(batch_sizes, "batch_sizes")
    taus = [check_int(int(t) if float(t).is_integer() else t, "delays", minimum=0)
            for t in np.atleast_1d(np.asarray(delays))]
    check_int(max_steps, "max_steps")
    _check_options(start, distribution)
    grid = _positive_vector(SGD_LRS if lrs is None else lrs, "lrs")
    steps = np.full((len(batches), len(taus)), np.inf)
    best = np.full((len(batches), len(taus)), np.nan)
    for j, tau in enumerate(taus):
        if spectrum.initial_loss() < target:
            steps[:, j] = 0.0
            continue
        # state per coordinate and learning rate: phi and psi buffers, or two histories and row sums
        if distribution == "fixed":
            stable, width = grid[grid < max_stable_lr(spectrum, tau, precond)], 2 * (tau + 1)
        else:
            stable, width = grid, 2 * (tau + 1) * (tau + 2)
        per_chunk = max(1, _STATE_FLOATS // (spectrum.dim * width))
        for s in range(0, len(stable), per_chunk):
            _first_hits(spectrum, target, stable[s:s + per_chunk], batches, tau, max_steps, precond,
                        (start, distribution), steps[:, j], best[:, j])
    return DelayCurve(batches, np.asarray(taus), steps, best, float(target), distribution)


def _first_hits(spectrum, target, lrs, batches, tau, max_steps, precond, options, steps,
                best) -> None:
    """Lower ``steps`` (and set ``best``, per batch size, in place) to the first step at which a
    learning rate of ``lrs`` is below target. The paths do not depend on B: the loss is
    A_k + C_k / B, with A_k = 1/2 sum h det_k s0 and C_k = 1/2 sum h a^2 p^2 c noise_k
    (:func:`_moment_paths`), so one march serves every batch size."""
    z, _ = _terms(spectrum, lrs, 1.0, precond)
    p = spectrum.h ** (-float(precond))
    weight_a = 0.5 * spectrum.h * spectrum.s0
    weight_c = 0.5 * spectrum.h * p * p * spectrum.c
    lr_sq = lrs * lrs
    open_ = np.ones(len(batches), dtype=bool)
    limit = min(max_steps, np.max(steps) - 1)     # a later chunk only matters if it is faster
    for k, (det, noise) in enumerate(_moment_paths(z, tau, *options)):
        with np.errstate(over="ignore", invalid="ignore"):   # a diverging point stays above target
            loss = ((det @ weight_a)[None, :]
                    + (lr_sq * (noise @ weight_c))[None, :] / batches[:, None])
        hit = (loss < target) & open_[:, None] & (k < steps)[:, None]
        for i in np.flatnonzero(hit.any(axis=1)):
            steps[i], best[i] = float(k), float(lrs[np.argmax(hit[i])])
        open_ &= ~hit.any(axis=1) & (k < steps)
        if not open_.any() or k >= limit:
            return


def _check_options(start: str, distribution: str) -> None:
    if start not in STARTS:
        raise TheoryError(f"start must be one of {', '.join(map(repr, STARTS))}, got {start!r}")
    if distribution not in DISTRIBUTIONS:
        raise TheoryError(f"distribution must be one of {', '.join(map(repr, DISTRIBUTIONS))}, "
                          f"got {distribution!r}")
    if distribution != "fixed" and start != "initial":
        raise TheoryError(f"start {start!r} is defined for fixed delays only; random delays start "
                          f"from x_0 ('initial')")


def _terms(spectrum: Spectrum, lrs: np.ndarray, batch_size: float, precond: float):
    """z = a p h and per-step injected noise n = a^2 p^2 c / B, shape [len(lrs), d]."""
    b = float(_positive_vector(batch_size, "batch_size")[0])
    p = spectrum.h ** (-float(precond))
    a = lrs[:, None]
    return a * p * spectrum.h, a * a * p * p * spectrum.c / b


__all__ = ["stability_threshold", "max_stable_lr", "delayed_second_moments", "delay_probabilities",
           "DelayCurve", "steps_to_target"]
