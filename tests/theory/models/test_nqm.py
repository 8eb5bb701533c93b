"""Noisy quadratic model: closed forms against iteration and simulation, and the paper's findings."""

import numpy as np
import pytest

from theory import nqm
from theory.errors import TheoryError
from theory.models.scaling import fit_scaling

BATCHES = 2.0 ** np.arange(0, 15)


def iterate_moments(spec, lr, mom, batch, steps, precond=0.0):
    """E x^2 by applying the 3x3 second-moment map of heavy-ball SGD on each NQM coordinate
    (Zhang et al. 2019, "Which algorithmic choices matter at which batch sizes?") step by step
    (momentum 0 is SGD)."""
    p = spec.h**-precond
    z, n = lr * p * spec.h, lr**2 * p**2 * spec.c / batch
    x2, v2, xv = spec.s0.copy(), np.zeros_like(spec.s0), np.zeros_like(spec.s0)
    out = [x2]
    for _ in range(steps):
        x2, v2, xv = (
            (1 - z) ** 2 * x2 + mom**2 * v2 + 2 * (1 - z) * mom * xv + n,
            z**2 * x2 + mom**2 * v2 - 2 * z * mom * xv + n,
            -(1 - z) * z * x2 + mom**2 * v2 + (1 - 2 * z) * mom * xv + n,
        )
        out.append(x2)
    return np.array(out)


@pytest.mark.parametrize(
    ("lr", "mom", "batch", "precond"),
    [(0.5, 0.0, 4, 0.0), (1.9, 0.0, 1, 0.0), (1.5, 0.9, 2, 0.0), (0.3, 0.5, 8, 0.5), (0.01, 0.99, 16, 0.0),
     (2.5, 0.3, 1, 0.0), (0.2, 0.2, 3, 1.0)],
)
def test_closed_forms_match_iterating_the_moment_map(lr, mom, batch, precond):
    spec = nqm.paper_spectrum(40)
    ref = iterate_moments(spec, lr, mom, batch, 80, precond)
    k = np.arange(81)
    got = nqm.momentum_second_moments(spec, np.full(81, lr), np.full(81, mom), batch, k, precond)
    np.testing.assert_allclose(got, ref, rtol=1e-9)
    if mom == 0.0:
        np.testing.assert_allclose(nqm.sgd_second_moments(spec, np.full(81, lr), batch, k, precond), ref, rtol=1e-9)


@pytest.mark.parametrize("offset", [0.0, 1e-12, 1e-9, 1e-6, 1e-3, -1e-9, -1e-6])
def test_near_repeated_roots_are_accurate_over_many_steps(offset):
    # z = (1 - sqrt(b))^2 makes the heavy-ball characteristic polynomial a perfect square
    b = 0.64
    spec = nqm.Spectrum(h=np.array([1.0]), c=np.array([1.0]), s0=np.array([1.0]))
    lr = (1 - np.sqrt(b)) ** 2 * (1 + offset)
    ref = iterate_moments(spec, lr, b, 2.0, 3000)
    k = np.arange(3001)
    got = nqm.momentum_second_moments(spec, np.full(len(k), lr), np.full(len(k), b), 2.0, k)
    np.testing.assert_allclose(got, ref, rtol=1e-9)


@pytest.mark.parametrize(("lr", "mom", "precond"), [(0.5, 0.0, 0.0), (1.5, 0.9, 0.0), (0.3, 0.5, 0.5), (2.5, 0.3, 0.0)])
def test_all_three_moments_from_any_start_match_iterating_the_moment_map(lr, mom, precond):
    rng = np.random.default_rng(1)
    spec = nqm.paper_spectrum(30)
    p = spec.h**-precond
    z, n = lr * p * spec.h, lr**2 * p**2 * spec.c / 4.0
    x2, v2 = rng.uniform(0.1, 2.0, 30), rng.uniform(0.1, 2.0, 30)
    start = (x2, v2, rng.uniform(-1, 1, 30) * np.sqrt(x2 * v2))   # a valid covariance per coordinate
    state, ref = start, []
    for _ in range(60):
        a, b, c = state
        state = ((1 - z) ** 2 * a + mom**2 * b + 2 * (1 - z) * mom * c + n,
                 z**2 * a + mom**2 * b - 2 * z * mom * c + n,
                 -(1 - z) * z * a + mom**2 * b + (1 - 2 * z) * mom * c + n)
        ref.append(state)
    k = np.arange(1, 61)
    got = nqm.momentum_moments(spec, np.full(60, lr), np.full(60, mom), 4.0, k, start, precond)
    for i in range(3):
        np.testing.assert_allclose(got[i], np.array([r[i] for r in ref]), rtol=1e-9, atol=1e-12)


def test_moment_map_matches_monte_carlo_heavy_ball():
    rng = np.random.default_rng(0)
    spec = nqm.paper_spectrum(4)
    lr, mom, batch, steps, runs = 0.4, 0.6, 2.0, 25, 40_000
    x = rng.normal(size=(runs, 4))
    v = np.zeros_like(x)
    for _ in range(steps):
        grad = spec.h * x + rng.normal(size=x.shape) * np.sqrt(spec.c / batch)
        v = mom * v - lr * grad
        x = x + v
    exact = nqm.momentum_second_moments(spec, np.array([lr]), np.array([mom]), batch, np.array([steps]))[0]
    np.testing.assert_allclose((x**2).mean(0), exact, rtol=0.04)


def test_preconditioned_heavy_ball_matches_monte_carlo():
    """Adam-like preconditioning p_i = h_i^-1/2 simulated step by step with sampled noise, against
    the closed form with ``precond``."""
    rng = np.random.default_rng(1)
    spec = nqm.paper_spectrum(5)
    lr, mom, batch, steps, runs = 0.15, 0.7, 4.0, 30, 40_000
    p = spec.h ** -nqm.ADAM_POWER
    x = rng.normal(size=(runs, 5))
    v = np.zeros_like(x)
    for _ in range(steps):
        grad = spec.h * x + rng.normal(size=x.shape) * np.sqrt(spec.c / batch)
        v = mom * v - lr * p * grad
        x = x + v
    exact = nqm.momentum_second_moments(spec, np.array([lr]), np.array([mom]), batch, np.array([steps]),
                                        precond=nqm.ADAM_POWER)[0]
    np.testing.assert_allclose((x**2).mean(0), exact, rtol=0.04)
    # the preconditioner matters here: without it the second moments are far off
    plain = nqm.momentum_second_moments(spec, np.array([lr]), np.array([mom]), batch, np.array([steps]))[0]
    assert np.max(np.abs(plain / exact - 1)) > 0.5


def test_adam_like_preconditioning_extends_perfect_scaling_beyond_momentum():
    """Zhang et al. 2019: preconditioning needs fewer steps at every batch size and leaves perfect
    scaling at a larger batch than momentum (d = 1000: at d = 200 the two critical batches are
    within each other's intervals)."""
    spec = nqm.paper_spectrum(1000)
    batches = 2.0 ** np.arange(0, 17, 2)
    grids = dict(optimizer="momentum", lrs=np.logspace(-7, 1, 40), momenta=1.0 - np.logspace(-3, 0, 8))
    mom = nqm.steps_to_target(spec, 0.05, batches, **grids)
    pre = nqm.steps_to_target(spec, 0.05, batches, precond=nqm.ADAM_POWER, **grids)
    assert pre.precond == 0.5 and np.all(pre.steps < mom.steps)
    assert pre.steps[0] < 0.5 * mom.steps[0]
    fit_mom = fit_scaling(mom.batch_sizes, mom.steps, n_boot=100, seed=0)
    fit_pre = fit_scaling(pre.batch_sizes, pre.steps, n_boot=100, seed=0)
    assert fit_pre.intervals["b_crit"][0] > fit_mom.intervals["b_crit"][1]
    # the best learning rates lie inside the grid
    assert np.all(pre.best_lr > 1e-7) and np.all(mom.best_lr > 1e-7)


def test_bisection_equals_a_linear_scan_for_sgd():
    spec = nqm.paper_spectrum(30)
    lrs = np.logspace(-2, 0.3, 25)
    target = 0.2
    for batch in (1.0, 16.0):
        curve = nqm.steps_to_target(spec, target, [batch], lrs=lrs)
        ks = np.arange(4000)
        best = np.inf
        for lr in lrs:
            loss = nqm.expected_loss(nqm.sgd_second_moments(spec, np.full(len(ks), lr), batch, ks), spec)
            hit = np.flatnonzero(loss < target)
            if hit.size and hit[0] < best:
                best, best_lr = hit[0], lr
        assert 0 < best < ks[-1] and curve.steps[0] == best
        assert curve.best_lr[0] == best_lr


@pytest.fixture(scope="module")
def sgd_curve():
    return nqm.steps_to_target(nqm.paper_spectrum(500), 0.05, BATCHES)


def test_sgd_perfect_scaling_at_small_batch_and_flat_at_large(sgd_curve):
    logb, logs = np.log(BATCHES), np.log(sgd_curve.steps)
    assert np.polyfit(logb[:4], logs[:4], 1)[0] == pytest.approx(-1.0, abs=0.05)
    assert abs((logs[-1] - logs[-2]) / (logb[-1] - logb[-2])) < 0.05
    assert np.all(np.diff(sgd_curve.steps) <= 0)


def test_optimal_lr_grows_linearly_at_small_batch(sgd_curve):
    slope = np.polyfit(np.log(BATCHES[:4]), np.log(sgd_curve.best_lr[:4]), 1)[0]
    assert slope == pytest.approx(1.0, abs=0.1)
    assert np.all(sgd_curve.best_momentum == 0.0)


def test_lower_bound_always_holds(sgd_curve, momentum_curves):
    assert np.all(sgd_curve.steps >= sgd_curve.lower_bound)
    np.testing.assert_allclose(sgd_curve.lower_bound, 500 / (2 * 0.05 * BATCHES))
    for curve in momentum_curves:
        assert np.all(curve.steps >= curve.lower_bound)


@pytest.fixture(scope="module")
def momentum_curves():
    spec = nqm.paper_spectrum(200)
    batches = 2.0 ** np.arange(0, 15, 2)
    sgd = nqm.steps_to_target(spec, 0.05, batches)
    mom = nqm.steps_to_target(spec, 0.05, batches, optimizer="momentum", lrs=np.logspace(-6, 1, 40),
                              momenta=1.0 - np.logspace(-3, 0, 8))
    return sgd, mom


def test_momentum_extends_perfect_scaling(momentum_curves):
    sgd, mom = momentum_curves
    # about the same at small batch, far fewer steps at large batch
    assert mom.steps[0] == pytest.approx(sgd.steps[0], rel=0.1)
    assert mom.steps[-1] < 0.5 * sgd.steps[-1]
    b_sgd = fit_scaling(sgd.batch_sizes, sgd.steps, n_boot=20).b_crit
    b_mom = fit_scaling(mom.batch_sizes, mom.steps, n_boot=20).b_crit
    assert b_mom > 2 * b_sgd
    assert np.all(mom.best_momentum[-3:] > 0.5)


def test_momentum_result_is_a_crossing_of_the_best_grid_point(momentum_curves):
    _, mom = momentum_curves
    spec = nqm.paper_spectrum(200)
    for b, k, lr, mu in zip(mom.batch_sizes, mom.steps, mom.best_lr, mom.best_momentum):
        m = nqm.momentum_second_moments(spec, np.full(2, lr), np.full(2, mu), b, np.array([k - 1, k]))
        before, at = nqm.expected_loss(m, spec)
        assert at < 0.05 <= before


def test_batch_order_does_not_change_the_answer():
    spec = nqm.paper_spectrum(100)
    batches = [64.0, 1.0, 8.0, 512.0]
    shuffled = nqm.steps_to_target(spec, 0.05, batches)
    for b, k, lr in zip(batches, shuffled.steps, shuffled.best_lr):
        single = nqm.steps_to_target(spec, 0.05, [b])
        assert single.steps[0] == k and single.best_lr[0] == lr


def test_preconditioning_helps_at_every_batch_size():
    spec = nqm.paper_spectrum(200)
    plain = nqm.steps_to_target(spec, 0.05, [1.0, 64.0, 4096.0])
    pre = nqm.steps_to_target(spec, 0.05, [1.0, 64.0, 4096.0], precond=0.5, lrs=np.logspace(-5, 0.5, 100))
    assert np.all(pre.steps < plain.steps)


def test_unreachable_target_gives_inf_and_reached_start_gives_zero():
    spec = nqm.paper_spectrum(50)
    # noise floor at B = 1 with lr <= 1e-3 cannot be reached within 10 steps
    far = nqm.steps_to_target(spec, 1e-3, [1.0], lrs=[1e-3], max_steps=10)
    assert far.steps[0] == np.inf and np.isnan(far.best_lr[0])
    assert nqm.steps_to_target(spec, 100.0, [1.0]).steps[0] == 0


def test_measured_spectrum_fits_a_power_law_tail():
    exact = 3.0 * np.arange(1, 1001, dtype=float) ** -1.5
    tail = nqm.fit_power_law(exact[:20][::-1])
    assert tail.scale == pytest.approx(3.0) and tail.exponent == pytest.approx(1.5)
    spec = nqm.measured_spectrum(exact[:20], dim=1000, noise_scale=2.0)
    np.testing.assert_allclose(spec.h, exact, rtol=1e-9)
    np.testing.assert_allclose(spec.c, 2.0 * exact)
    assert spec.dim == 1000


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: nqm.paper_spectrum(0), "dim"),
        (lambda: nqm.measured_spectrum([1.0], 10), "at least 2"),
        (lambda: nqm.measured_spectrum([1.0, -0.5], 10), "top_eigenvalues"),
        (lambda: nqm.measured_spectrum([1.0, 0.5, 0.2], 2), "dim"),
        (lambda: nqm.steps_to_target(nqm.paper_spectrum(5), 0.1, [1], optimizer="adam"), "optimizer"),
        (lambda: nqm.steps_to_target(nqm.paper_spectrum(5), -1.0, [1]), "target"),
        (lambda: nqm.steps_to_target(nqm.paper_spectrum(5), 0.1, [0]), "batch_sizes"),
        (lambda: nqm.steps_to_target(nqm.paper_spectrum(5), 0.1, [1], momenta=[0.9]), "momenta"),
        (lambda: nqm.steps_to_target(nqm.paper_spectrum(5), 0.1, [1], optimizer="momentum", momenta=[1.0]),
         "momenta"),
        (lambda: nqm.Spectrum(np.ones(3), np.ones(2), np.ones(3)), "equal lengths"),
    ],
)
def test_bad_input_raises_a_clear_error(call, match):
    with pytest.raises(TheoryError, match=match):
        call()
