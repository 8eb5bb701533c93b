"""Large batches and stale gradients under one noise parameter: critical batch, critical delay,
learning-rate guideline and the delayed-SGD bound on steps.

Stich, Mohtashami & Jaggi (2021, AISTATS, arXiv 2103.02351) state that the speedup of
distributed SGD saturates beyond a critical batch size and beyond a critical gradient delay, and
that one data-dependent parameter explains both. Their full text was not reachable while this
module was written (only the abstract, and Koloskova, Stich & Jaggi 2022's summary: "a
connection of large batches and delays, depending on the maximum delay"). Every formula below is
therefore a **reconstruction** from the abstract and the standard delayed-SGD analysis (the
virtual-sequence argument of Stich & Karimireddy 2020, JMLR 21(237)) under the noise model of
Stich (2019), not the paper's own statement or constants.

Noise model: per-example stochastic gradients with

    E||g(w) - grad f(w)||^2 <= M ||grad f(w)||^2 + sigma^2,

so a batch of B has variance (M ||grad f||^2 + sigma^2) / B. The library measures the left side
as tr(Sigma) and ||grad f||^2 as |G|^2 (:mod:`theory.estimators.noise`); :func:`fit_noise_model`
fits M and sigma^2 to those measurements along a run. With sigma^2 = 0, M is the pooled simple
noise scale B_simple = sum tr(Sigma) / sum |G|^2 (McCandlish et al. 2018).

Bound (derived here; delay tau fixed, the first tau updates applying nothing, L-smooth f,
Delta = f(w_0) - f_inf). With the virtual iterate v_t = w_t - eta (sum of the tau gradients
computed but not yet applied), v_{t+1} = v_t - eta g(w_t); smoothness at v_t,
<a, b> >= |b|^2/2 - |a - b|^2/2, ||v_t - w_t||^2 <= 2 eta^2 (tau sum |grad f|^2 + sum of the
noise variances over the window) and every gradient in at most tau windows give, for

    eta <= eta_max(B, tau) = 1 / (4 L (1 + M/B + tau)),

    (1/K) sum_k E||grad f(w_k)||^2 <= 4 Delta / (eta K) + 3 eta L sigma^2 / B.

Hence (this is :func:`theory.models.bounds`'s bound with sigma^2 -> 3 sigma^2 / 2 and
eps -> eps / 2, under a tighter step cap):

1. K(eta) = 4 Delta B / (eta (eps B - 3 eta L sigma^2)) steps to reach eps;
2. eta*(B, tau) = min(eps B / (6 L sigma^2), eta_max(B, tau)), the learning-rate guideline:
   linear in B while the noise term binds, then 1 / (4 L (1 + M/B + tau)); relative to no delay,
   in the capped regime, eta*(B, tau) / eta*(B, 0) = (1 + M/B) / (1 + M/B + tau);
3. S_min(tau) = lim_{B -> oo} K*(B, tau) = 16 L Delta (1 + tau) / eps;
4. E_min = lim_{B -> 0} B K*(B, tau) = 48 L Delta sigma^2 / eps^2 if M <= 3 sigma^2 / (2 eps),
   else 16 L Delta M / (eps - 3 sigma^2 / (4 M));
5. critical batch B_crit(tau) = E_min / S_min(tau) (the crossing of the asymptotes, as in
   McCandlish et al. 2018): M / (1 + tau) when sigma^2 = 0, 3 sigma^2 / (eps (1 + tau)) when
   M = 0;
6. critical delay tau_crit(B) = K*(B, 0) / S_min(0): for tau >> tau_crit the steps grow as
   S_min(0) tau, i.e. the crossing of the asymptotes in tau; with sigma^2 = 0 it is 1 + M/B.

One parameter for both saturations: with sigma^2 = 0, B_crit(0) = M and tau_crit(B) = 1 + M/B,
so W asynchronous workers of batch B each (tau = W - 1) stop gaining once W B exceeds about M,
the same number of examples in flight at which synchronous SGD stops gaining. With sigma^2 > 0,
tau_crit(B) is about 1 + B_crit(0) / B in the same sense.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from theory.errors import TheoryError
from theory.models.bounds import Number, _check_positive, _scalar_or_array


@dataclass(frozen=True)
class NoiseModel:
    """M and sigma^2 of E||g - grad f||^2 <= M ||grad f||^2 + sigma^2 (Stich 2019), fitted to
    ``points`` measurements; ``residual`` is the root mean square of the relative misfit
    (tr(Sigma) - M |G|^2 - sigma^2) / tr(Sigma) over them."""

    M: float
    sigma2: float
    points: int
    residual: float


def fit_noise_model(g_sq: ArrayLike, trace_sigma: ArrayLike, additive: bool = True) -> NoiseModel:
    """Fit tr(Sigma)_j = M |G|^2_j + sigma^2 to measurements j along a run: non-negative least
    squares on relative errors, as the measurements span orders of magnitude along a run (the
    late, small ones would otherwise not count). ``additive=False`` fixes sigma^2 = 0 and returns
    the pooled simple noise scale M = sum tr(Sigma) / sum |G|^2 (a ratio of sums, as
    :mod:`theory.estimators.noise` pools)."""
    g = np.atleast_1d(np.asarray(g_sq, dtype=float))
    t = np.atleast_1d(np.asarray(trace_sigma, dtype=float))
    if g.ndim != 1 or g.shape != t.shape or g.size == 0:
        raise TheoryError(f"g_sq and trace_sigma must be 1-D of equal non-zero length, got shapes "
                          f"{g.shape} and {t.shape}")
    _check_positive(g, "g_sq")
    _check_positive(t, "trace_sigma")
    if not additive:
        m, s2 = float(t.sum() / g.sum()), 0.0
    else:
        if g.size < 2:
            raise TheoryError("fitting M and sigma^2 needs at least 2 measurements; "
                              "pass additive=False to fit M alone")
        # imported here: scipy.optimize costs a second at import
        from scipy.optimize import nnls

        (m, s2), _ = nnls(np.stack([g / t, 1.0 / t], axis=1), np.ones_like(t))
    res = float(np.sqrt(np.mean(((t - m * g - s2) / t) ** 2)))
    return NoiseModel(M=float(m), sigma2=float(s2), points=int(g.size), residual=res)


def noise_model_from(estimates: Sequence[object], additive: bool = True) -> NoiseModel:
    """:func:`fit_noise_model` on the ``g_sq`` and ``trace_sigma`` of noise estimates (e.g.
    :class:`theory.NoiseEstimate` or probe summaries along a run)."""
    try:
        g = [float(e.g_sq) for e in estimates]
        t = [float(e.trace_sigma) for e in estimates]
    except AttributeError:
        raise TheoryError("estimates must have g_sq and trace_sigma "
                          "(e.g. theory.NoiseEstimate)") from None
    return fit_noise_model(g, t, additive)


def lr_cap(L: ArrayLike, M: ArrayLike, batch_size: ArrayLike, delay: ArrayLike) -> Number:
    """eta_max(B, tau) = 1 / (4 L (1 + M/B + tau)), the largest step the delayed bound allows."""
    L, m = _check_positive(L, "L"), _nonneg(M, "M")
    b, tau = _check_positive(batch_size, "batch_size"), _nonneg(delay, "delay")
    return _scalar_or_array(1.0 / (4.0 * L * (1.0 + m / b + tau)))


def steps_at_lr(L: ArrayLike, M: ArrayLike, sigma2: ArrayLike, delta: ArrayLike, eps: ArrayLike,
                batch_size: ArrayLike, delay: ArrayLike, lr: ArrayLike) -> Number:
    """K(eta) = 4 Delta B / (eta (eps B - 3 eta L sigma^2)); inf where the step exceeds
    eta_max(B, tau) or the noise term alone is >= eps."""
    s2, d = _nonneg(sigma2, "sigma2"), _check_positive(delta, "delta")
    e = _check_positive(eps, "eps")
    b, lr_ = _check_positive(batch_size, "batch_size"), _check_positive(lr, "lr")
    cap = lr_cap(L, M, batch_size, delay)
    room = e * b - 3.0 * lr_ * np.asarray(L, dtype=float) * s2
    with np.errstate(divide="ignore"):
        k = np.where(room > 0, 4.0 * d * b / (lr_ * np.where(room > 0, room, 1.0)), np.inf)
    return _scalar_or_array(np.where(lr_ <= np.asarray(cap) * (1 + 1e-12), k, np.inf))


def optimal_lr(L: ArrayLike, M: ArrayLike, sigma2: ArrayLike, eps: ArrayLike,
               batch_size: ArrayLike, delay: ArrayLike = 0.0) -> Number:
    """The guideline eta*(B, tau) = min(eps B / (6 L sigma^2), 1 / (4 L (1 + M/B + tau)))."""
    cap = np.asarray(lr_cap(L, M, batch_size, delay))
    s2, e = _nonneg(sigma2, "sigma2"), _check_positive(eps, "eps")
    b, lip = np.asarray(batch_size, dtype=float), np.asarray(L, dtype=float)
    with np.errstate(divide="ignore"):
        noise = np.where(s2 > 0, e * b / (6.0 * lip * np.where(s2 > 0, s2, 1.0)), np.inf)
    return _scalar_or_array(np.minimum(noise, cap))


def lr_ratio(M: ArrayLike, batch_size: ArrayLike, delay: ArrayLike) -> Number:
    """eta*(B, tau) / eta*(B, 0) = (1 + M/B) / (1 + M/B + tau) where the cap binds: the
    guideline's learning rate at delay tau relative to no delay, free of L and of the bound's
    constant (what a tuned learning-rate ratio is compared with)."""
    m, b, tau = _nonneg(M, "M"), _check_positive(batch_size, "batch_size"), _nonneg(delay, "delay")
    return _scalar_or_array((1.0 + m / b) / (1.0 + m / b + tau))


def delayed_steps(L: ArrayLike, M: ArrayLike, sigma2: ArrayLike, delta: ArrayLike, eps: ArrayLike,
                  batch_size: ArrayLike, delay: ArrayLike = 0.0) -> Number:
    """K*(B, tau): the fewest steps the bound guarantees, at the guideline's step."""
    lr = optimal_lr(L, M, sigma2, eps, batch_size, delay)
    return steps_at_lr(L, M, sigma2, delta, eps, batch_size, delay, lr)


def min_steps(L: ArrayLike, delta: ArrayLike, eps: ArrayLike, delay: ArrayLike = 0.0) -> Number:
    """S_min(tau) = 16 L Delta (1 + tau) / eps, the large-batch limit of K*(B, tau)."""
    L, d, e, tau = (_check_positive(L, "L"), _check_positive(delta, "delta"),
                    _check_positive(eps, "eps"), _nonneg(delay, "delay"))
    return _scalar_or_array(16.0 * L * d * (1.0 + tau) / e)


def critical_batch(M: ArrayLike, sigma2: ArrayLike, eps: ArrayLike,
                   delay: ArrayLike = 0.0) -> Number:
    """B_crit(tau) = E_min / S_min(tau) (module docstring, steps 4-5): M / (1 + tau) without
    additive noise, 3 sigma^2 / (eps (1 + tau)) without relative noise."""
    m, s2 = _nonneg(M, "M"), _nonneg(sigma2, "sigma2")
    e, tau = _check_positive(eps, "eps"), _nonneg(delay, "delay")
    if np.any((m == 0) & (s2 == 0)):
        raise TheoryError("M and sigma2 are both 0: the bound has no noise and no critical batch")
    noise = 3.0 * s2 / e
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = m / (1.0 - 3.0 * s2 / (4.0 * m * e))
    per_unit_delay = np.where(m <= 3.0 * s2 / (2.0 * e), noise, relative)
    return _scalar_or_array(per_unit_delay / (1.0 + tau))


def critical_delay(M: ArrayLike, sigma2: ArrayLike, eps: ArrayLike,
                   batch_size: ArrayLike) -> Number:
    """tau_crit(B) = K*(B, 0) / S_min(0): 1 + M/B without additive noise (steps 5-6 of the module
    docstring); L and Delta cancel."""
    return _scalar_or_array(np.asarray(delayed_steps(1.0, M, sigma2, 1.0, eps, batch_size, 0.0))
                            / min_steps(1.0, 1.0, eps))


@dataclass(frozen=True)
class DelayFit:
    """S(tau) = s0 (1 + tau / tau_crit) fitted to measured steps at one batch size; ``tau_crit`` is
    inf when the steps do not grow with the delay."""

    s0: float
    tau_crit: float
    points: int


def fit_critical_delay(delays: ArrayLike, steps: ArrayLike) -> DelayFit:
    """The measured counterpart of :func:`critical_delay`: least squares of S(tau) = a + c tau
    over the measured delays, s0 = a and tau_crit = a / c, the delay at which the steps have
    doubled. Without additive noise the bound's K*(B, tau) is exactly of this form, with
    tau_crit = 1 + M/B; with it, K* is flat and then linear, and the line is an approximation."""
    tau = _nonneg(np.atleast_1d(delays), "delays")
    s = _check_positive(np.atleast_1d(steps), "steps")
    if tau.ndim != 1 or tau.shape != s.shape or len(np.unique(tau)) < 2:
        raise TheoryError(f"delays and steps must be 1-D of equal length with at least 2 distinct "
                          f"delays, got {np.atleast_1d(delays).tolist()} and "
                          f"{np.atleast_1d(steps).tolist()}")
    c, a = np.polyfit(tau, s, 1)
    if a <= 0:
        raise TheoryError(f"the fitted steps at delay 0 are {a:.3g} <= 0: the line does not "
                          f"describe these steps {s.tolist()}")
    return DelayFit(s0=float(a), tau_crit=float(a / c) if c > 0 else np.inf, points=int(len(s)))


@dataclass(frozen=True)
class LrBeside:
    """A tuned learning rate at (B, tau) relative to the tuned one at (B, 0), beside the
    guideline's ratio (1 + M/B) / (1 + M/B + tau)."""

    batch_size: int
    delay: int
    tuned_lr: float
    tuned_ratio: float
    guideline_ratio: float


def lr_beside_guideline(tuned: Mapping[tuple[int, int], float], M: float) -> list[LrBeside]:
    """For every (B, tau) in ``tuned`` (best learning rates a sweep found) whose batch size also
    has tau = 0: the tuned ratio lr(B, tau) / lr(B, 0) and :func:`lr_ratio`'s, ordered by B, tau."""
    rows = []
    for (b, tau), lr in sorted(tuned.items()):
        base = tuned.get((b, 0))
        if base is None:
            continue
        _check_positive([lr, base], f"tuned[{(b, tau)}]")
        rows.append(LrBeside(b, tau, float(lr), float(lr / base), float(lr_ratio(M, b, tau))))
    if not rows:
        raise TheoryError("tuned has no batch size measured at delay 0: the ratios need lr(B, 0)")
    return rows


def _nonneg(value, name: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise TheoryError(f"{name} must be a number or array of numbers, got {value!r}") from None
    if not np.all(np.isfinite(arr) & (arr >= 0)):
        raise TheoryError(f"{name} must be finite and >= 0, got {value!r}")
    return arr


__all__ = [
    "NoiseModel", "fit_noise_model", "noise_model_from", "lr_cap", "steps_at_lr", "optimal_lr",
    "lr_ratio", "delayed_steps", "min_steps", "critical_batch", "critical_delay", "DelayFit",
    "fit_critical_delay", "LrBeside", "lr_beside_guideline",
]
