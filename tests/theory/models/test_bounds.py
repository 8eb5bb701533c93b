"""The sympy-derived bound functions against brute-force minimisation of the bound itself."""

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar

from theory import bounds
from theory.errors import TheoryError


def bound(eta, k, L, sigma2, delta, batch, mu=0.0):
    """Right-hand side of the bound, written independently of the module (effective step)."""
    eff = eta / (1.0 - mu)
    return 2.0 * delta / (eff * k) + eff * L * sigma2 / batch


def brute_force(L, sigma2, delta, eps, batch, mu=0.0):
    """min over eta <= (1 - mu)/L of the smallest K with bound(eta, K) <= eps, found numerically."""
    return minimise_steps(lambda eta, k: bound(eta, k, L, sigma2, delta, batch, mu), eps, (1.0 - mu) / L)


def minimise_steps(rhs, eps, cap):
    """(log K, eta): min over eta <= cap of the smallest K with rhs(eta, K) <= eps, numerically
    (``rhs`` decreasing in K)."""

    def steps_needed(eta):
        if rhs(eta, 1e300) >= eps:
            return np.inf
        hi = 1.0
        while rhs(eta, hi) > eps:
            hi *= 2.0
        return brentq(lambda k: rhs(eta, k) - eps, hi / 2.0, hi, rtol=1e-13)

    grid = cap * np.logspace(-8, 0, 400)
    values = np.array([steps_needed(e) for e in grid])
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    res = minimize_scalar(lambda e: np.log(steps_needed(e)), bounds=(lo, hi), method="bounded",
                          options={"xatol": lo * 1e-10})
    return (res.fun, res.x) if np.exp(res.fun) < values[i] else (np.log(values[i]), grid[i])


def random_points(n, seed):
    rng = np.random.default_rng(seed)
    logu = lambda a, b: float(np.exp(rng.uniform(np.log(a), np.log(b))))  # noqa: E731
    return [(logu(0.1, 100), logu(0.01, 100), logu(0.1, 10), logu(1e-3, 1), logu(1, 1e4)) for _ in range(n)]


def test_optimal_steps_match_brute_force_at_20_random_points():
    branches = set()
    for L, s2, d, eps, b in random_points(20, seed=0):
        log_k, eta = brute_force(L, s2, d, eps, b)
        assert bounds.sgd_steps(L, s2, d, eps, b) == pytest.approx(np.exp(log_k), rel=1e-6)
        assert bounds.optimal_lr(L, s2, eps, b) == pytest.approx(eta, rel=1e-3)
        branches.add(b <= bounds.kink_batch(s2, eps))
    assert branches == {True, False}  # both sides of the step-size cap were exercised


def test_momentum_optimum_matches_brute_force_in_the_effective_step():
    for (L, s2, d, eps, b), mu in zip(random_points(6, seed=1), [0.0, 0.5, 0.9, 0.99, 0.3, 0.95]):
        log_k, eta = brute_force(L, s2, d, eps, b, mu)
        assert bounds.momentum_steps(L, s2, d, eps, b, mu) == pytest.approx(np.exp(log_k), rel=1e-6)
        assert bounds.optimal_lr(L, s2, eps, b, mu=mu) == pytest.approx(eta, rel=1e-3)
        assert bounds.optimal_lr(L, s2, eps, b, mu=mu) == pytest.approx((1 - mu) * bounds.optimal_lr(L, s2, eps, b))


def test_critical_batch_constant_is_four():
    d = bounds.derivation()
    assert d.b_crit.equals(4 * bounds.SIGMA2 / bounds.EPS)
    assert d.kink_batch.equals(2 * bounds.SIGMA2 / bounds.EPS)
    L, s2, delta, eps = 3.0, 2.0, 0.7, 0.05
    assert bounds.critical_batch(s2, eps) == pytest.approx(4 * s2 / eps)
    # B_crit = E_min / S_min from the numeric curve's own limits
    s_min = bounds.sgd_steps(L, s2, delta, eps, 1e12)
    e_min = 1e-6 * bounds.sgd_steps(L, s2, delta, eps, 1e-6)
    assert s_min == pytest.approx(bounds.min_steps(L, delta, eps), rel=1e-6)
    assert e_min == pytest.approx(bounds.min_examples(L, s2, delta, eps), rel=1e-12)
    assert e_min / s_min == pytest.approx(4 * s2 / eps, rel=1e-6)
    # the exact curve is 4/3 S_min at B_crit; the asymptotic form gives 2 S_min
    b_crit = 4 * s2 / eps
    assert bounds.sgd_steps(L, s2, delta, eps, b_crit) == pytest.approx(4 / 3 * s_min)
    assert bounds.approx_steps(L, s2, delta, eps, b_crit) == pytest.approx(2 * s_min)


def test_steps_scale_with_L_delta_and_critical_batch_does_not_depend_on_L():
    batches = np.logspace(0, 4, 9)
    base = bounds.sgd_steps(1.0, 2.0, 1.0, 0.1, batches)
    assert np.allclose(bounds.sgd_steps(5.0, 2.0, 3.0, 0.1, batches), 15.0 * base)
    assert np.all(np.diff(base) < 0)


def test_steps_at_lr_is_infinite_where_the_bound_cannot_reach_the_goal():
    # L sigma^2 / B = 0.6: the goal 0.1 needs eta < 1/6; the cap is eta <= 1/2
    k = bounds.steps_at_lr(2.0, 3.0, 1.5, 0.1, 10, [0.1, 0.4, 0.6])
    assert k[0] == pytest.approx(2 * 1.5 / (0.1 * (0.1 - 0.1 * 0.6)))
    assert np.isinf(k[1]) and np.isinf(k[2])
    assert bounds.steps_at_lr(2.0, 3.0, 1.5, 0.1, 1e6, 0.6) == np.inf  # above the 1/L cap


def test_latex_of_every_expression():
    tex = bounds.latex()
    assert set(tex) == set(bounds.Derivation.__dataclass_fields__)
    assert tex["b_crit"] == r"\frac{4 \sigma^{2}}{\varepsilon}"
    assert r"\mu" in bounds.latex(momentum=True)["lr_opt"]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: bounds.sgd_steps(-1.0, 1.0, 1.0, 0.1, 8), "L must be positive"),
        (lambda: bounds.sgd_steps(1.0, 1.0, 1.0, 0.1, [8, float("nan")]), "batch_size"),
        (lambda: bounds.critical_batch(1.0, 0.0), "eps"),
        (lambda: bounds.optimal_lr(1.0, 1.0, 0.1, 8, mu=1.0), "mu must be in"),
        (lambda: bounds.momentum_steps(1.0, 1.0, 1.0, 0.1, 8, -0.1), "mu"),
        (lambda: bounds.sgd_steps("x", 1.0, 1.0, 0.1, 8), "L must be a number"),
    ],
)
def test_bad_input_raises_a_clear_error(call, match):
    with pytest.raises(TheoryError, match=match):
        call()
