"""The delayed-SGD bound functions against brute-force minimisation of the bound, its limits and
the closed forms of the module docstring."""

import numpy as np
import pytest

from theory.errors import TheoryError
from theory.models import bounds, delay
from tests.theory.models.test_bounds import minimise_steps


def bound(eta, k, L, sigma2, d, batch):
    """Right-hand side of the delayed bound, written independently of the module."""
    return 4.0 * d / (eta * k) + 3.0 * eta * L * sigma2 / batch


def brute_force(L, M, sigma2, d, eps, batch, tau):
    """min over eta <= 1 / (4 L (1 + M/B + tau)) of the smallest K with bound <= eps."""
    cap = 1.0 / (4.0 * L * (1.0 + M / batch + tau))
    return minimise_steps(lambda eta, k: bound(eta, k, L, sigma2, d, batch), eps, cap)


def test_optimal_steps_and_lr_match_brute_force_on_both_sides_of_the_cap():
    rng = np.random.default_rng(0)
    logu = lambda a, b: float(np.exp(rng.uniform(np.log(a), np.log(b))))  # noqa: E731
    capped = set()
    for _ in range(16):
        L, M, s2, d = logu(0.1, 10), logu(0.1, 1e3), logu(0.01, 10), logu(0.1, 10)
        eps, b = logu(1e-3, 1), logu(1, 1e3)
        tau = int(rng.integers(0, 17))
        log_k, eta = brute_force(L, M, s2, d, eps, b, tau)
        steps = delay.delayed_steps(L, M, s2, d, eps, b, tau)
        assert steps == pytest.approx(np.exp(log_k), rel=1e-6)
        assert delay.optimal_lr(L, M, s2, eps, b, tau) == pytest.approx(eta, rel=1e-3)
        capped.add(delay.optimal_lr(L, M, s2, eps, b, tau) == delay.lr_cap(L, M, b, tau))
    assert capped == {True, False}


def test_without_delay_and_relative_noise_it_is_the_sgd_bound_rescaled():
    """4 Delta / (eta K) + 3 eta L sigma^2 / B <= eps is bounds' 2 Delta / (eta K) + eta L s'^2 / B
    <= eps / 2 with s'^2 = 3 sigma^2 / 2."""
    lr = np.array([1e-4, 1e-3, 1e-2])
    ours = delay.steps_at_lr(2.0, 0.0, 0.5, 1.5, 0.1, 32, 0, lr)
    theirs = bounds.steps_at_lr(2.0, 0.75, 1.5, 0.05, 32, lr)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def test_steps_beyond_the_cap_or_the_noise_floor_are_infinite():
    cap = delay.lr_cap(1.0, 10.0, 10, 3)
    assert cap == pytest.approx(1.0 / (4.0 * (1 + 1 + 3)))
    assert delay.steps_at_lr(1.0, 10.0, 0.0, 1.0, 0.1, 10, 3, cap * 1.01) == np.inf
    assert delay.steps_at_lr(1.0, 10.0, 0.0, 1.0, 0.1, 10, 3, cap) == pytest.approx(4.0 / (cap * 0.1))
    # noise term alone: 3 eta L sigma^2 / B >= eps
    assert delay.steps_at_lr(1.0, 0.0, 10.0, 1.0, 0.1, 1, 0, 0.01) == np.inf


def test_limits_give_s_min_and_e_min_and_their_ratio_is_the_critical_batch():
    L, d, eps = 1.7, 2.3, 0.05
    for M, s2, tau in [(50.0, 0.5, 0), (50.0, 0.5, 4), (1.0, 2.0, 0), (1.0, 2.0, 7), (200.0, 0.0, 3)]:
        s_min = delay.min_steps(L, d, eps, tau)
        assert s_min == pytest.approx(16 * L * d * (1 + tau) / eps)
        assert delay.delayed_steps(L, M, s2, d, eps, 1e12, tau) == pytest.approx(s_min, rel=1e-6)
        small = 1e-7
        e_min = small * delay.delayed_steps(L, M, s2, d, eps, small, tau)
        expected = (48 * L * d * s2 / eps**2 if M <= 1.5 * s2 / eps
                    else 16 * L * d * M / (eps - 0.75 * s2 / M))
        assert e_min == pytest.approx(expected, rel=1e-5)
        assert delay.critical_batch(M, s2, eps, tau) == pytest.approx(expected / s_min, rel=1e-5)


def test_one_parameter_without_additive_noise():
    """sigma^2 = 0: B_crit(tau) = M / (1 + tau), tau_crit(B) = 1 + M / B, and the guideline's
    learning rate at delay tau relative to none is (1 + M/B) / (1 + M/B + tau)."""
    M = 300.0
    assert delay.critical_batch(M, 0.0, 0.01) == pytest.approx(M)
    assert delay.critical_batch(M, 0.0, 0.01, 2) == pytest.approx(M / 3)
    for b in (1, 10, 300, 3000):
        assert delay.critical_delay(M, 0.0, 0.01, b) == pytest.approx(1 + M / b)
        for tau in (0, 1, 8):
            ratio = (delay.optimal_lr(1.0, M, 0.0, 0.01, b, tau)
                     / delay.optimal_lr(1.0, M, 0.0, 0.01, b, 0))
            assert ratio == pytest.approx(delay.lr_ratio(M, b, tau))
            assert delay.lr_ratio(M, b, tau) == pytest.approx((1 + M / b) / (1 + M / b + tau))
    # additive noise only: B_crit = 3 sigma^2 / eps, tau_crit(B) ~ 1 + B_crit / B for B << B_crit
    assert delay.critical_batch(0.0, 2.0, 0.01) == pytest.approx(600.0)
    assert delay.critical_delay(0.0, 2.0, 0.01, 1) == pytest.approx(600.0 * 1, rel=0.01)
    with pytest.raises(TheoryError, match="both 0"):
        delay.critical_batch(0.0, 0.0, 0.01)


def test_noise_model_fit_recovers_exact_data_and_pools_without_additive_noise():
    g = np.array([4.0, 2.0, 1.0, 0.5])
    fit = delay.fit_noise_model(g, 7.0 * g + 0.3)
    assert (fit.M, fit.sigma2, fit.points) == (pytest.approx(7.0), pytest.approx(0.3), 4)
    assert fit.residual == pytest.approx(0.0, abs=1e-12)
    t = np.array([10.0, 9.0, 3.0, 1.0])
    pooled = delay.fit_noise_model(g, t, additive=False)
    assert pooled.M == pytest.approx(t.sum() / g.sum()) and pooled.sigma2 == 0.0

    class Estimate:
        def __init__(self, g_sq, trace_sigma):
            self.g_sq, self.trace_sigma = g_sq, trace_sigma

    fit2 = delay.noise_model_from([Estimate(a, 7.0 * a + 0.3) for a in g])
    assert fit2.M == pytest.approx(7.0)
    with pytest.raises(TheoryError, match="at least 2"):
        delay.fit_noise_model([1.0], [2.0])
    with pytest.raises(TheoryError, match="g_sq and trace_sigma"):
        delay.noise_model_from([object()])
    with pytest.raises(TheoryError, match="delay must be finite and >= 0"):
        delay.lr_cap(1.0, 1.0, 1, -1)


def test_the_fitted_critical_delay_recovers_the_bound_without_additive_noise():
    M, b = 120.0, 8
    taus = np.array([0, 1, 2, 4, 8, 16])
    steps = delay.delayed_steps(1.3, M, 0.0, 0.7, 0.01, b, taus)
    fit = delay.fit_critical_delay(taus, steps)
    assert fit.tau_crit == pytest.approx(delay.critical_delay(M, 0.0, 0.01, b))
    assert fit.tau_crit == pytest.approx(1 + M / b)
    assert fit.s0 == pytest.approx(steps[0]) and fit.points == 6
    assert delay.fit_critical_delay([0, 4], [100, 90]).tau_crit == np.inf
    with pytest.raises(TheoryError, match="at least 2 distinct"):
        delay.fit_critical_delay([2, 2], [10, 20])


def test_tuned_learning_rates_beside_the_guideline():
    tuned = {(8, 0): 0.4, (8, 1): 0.2, (8, 4): 0.1, (32, 2): 0.3, (64, 0): 0.8, (64, 8): 0.1}
    rows = delay.lr_beside_guideline(tuned, M=24.0)
    assert [(r.batch_size, r.delay) for r in rows] == [(8, 0), (8, 1), (8, 4), (64, 0), (64, 8)]
    r = rows[2]
    assert r.tuned_ratio == pytest.approx(0.25)
    assert r.guideline_ratio == pytest.approx((1 + 3) / (1 + 3 + 4))
    assert rows[4].guideline_ratio == pytest.approx(1.375 / 9.375)
    with pytest.raises(TheoryError, match="delay 0"):
        delay.lr_beside_guideline({(8, 1): 0.1}, M=1.0)


def test_functions_broadcast_over_a_grid_of_batch_sizes_and_delays():
    b = np.array([1.0, 16.0, 256.0])[:, None]
    tau = np.array([0, 1, 4, 16])[None, :]
    grid = delay.delayed_steps(2.0, 50.0, 0.3, 1.0, 0.05, b, tau)
    assert grid.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            assert grid[i, j] == delay.delayed_steps(2.0, 50.0, 0.3, 1.0, 0.05, b[i, 0], tau[0, j])
    assert np.all(np.diff(grid, axis=1) >= 0)           # delay never lowers the bound's steps
    assert delay.critical_batch(50.0, 0.3, 0.05, tau).shape == (1, 4)


def test_the_noise_fit_weighs_measurements_by_relative_error():
    """A run's |G|^2 falls by orders of magnitude; a 10 % error on the largest point must not
    swamp the small ones: relative least squares keeps sigma^2 near its value at the end."""
    g = np.array([100.0, 10.0, 1.0, 0.1, 0.01])
    t = 3.0 * g + 0.05
    t[0] *= 1.1
    fit = delay.fit_noise_model(g, t)
    assert fit.sigma2 == pytest.approx(0.05, rel=0.05)
    assert fit.M == pytest.approx(3.0, rel=0.05)
    misfit = (t - fit.M * g - fit.sigma2) / t
    assert fit.residual == pytest.approx(np.sqrt(np.mean(misfit**2)))
