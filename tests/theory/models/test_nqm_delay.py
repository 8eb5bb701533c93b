"""The delayed noisy quadratic model against a direct Monte-Carlo simulation of delayed SGD, the
undelayed closed form of theory.models.nqm, and the stability threshold against the companion
matrix's spectral radius."""

import numpy as np
import pytest

from theory.errors import TheoryError
from theory.models import delay, nqm, nqm_delay

SPEC = nqm.Spectrum(h=np.array([1.0, 0.3, 0.05]), c=np.array([2.0, 0.5, 0.1]),
                    s0=np.array([1.0, 2.0, 0.5]))


def monte_carlo(spec, lr, batch, tau, steps, runs, seed, start="initial"):
    """Delayed SGD on the quadratic, float64: a queue of past iterates, x_0 ~ N(0, s0), the
    gradient at step k taken at x_{max(k - tau, 0)} with fresh noise of variance c / B; with
    ``start="empty"`` no update before step tau."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((runs, spec.dim)) * np.sqrt(spec.s0)
    queue = [x.copy() for _ in range(tau + 1)]       # x_{k-tau}, ..., x_k
    losses = [0.5 * (x * x * spec.h).sum(1)]
    for k in range(steps):
        noise = rng.standard_normal((runs, spec.dim)) * np.sqrt(spec.c / batch)
        if start == "initial" or k >= tau:
            x = queue[-1] - lr * (spec.h * queue[0] + noise)
        else:
            x = queue[-1]
        queue = queue[1:] + [x]
        losses.append(0.5 * (x * x * spec.h).sum(1))
    return np.array(losses)                           # [steps + 1, runs]


@pytest.mark.parametrize("start", ["initial", "empty"])
@pytest.mark.parametrize("tau,lr", [(0, 0.9), (1, 0.6), (3, 0.4), (6, 0.2)])
def test_expected_loss_matches_monte_carlo_within_its_standard_error(tau, lr, start):
    steps, runs = 60, 40_000
    mc = monte_carlo(SPEC, lr, 4.0, tau, steps, runs, seed=tau, start=start)
    moments = nqm_delay.delayed_second_moments(SPEC, [lr], 4.0, tau, steps, start=start)
    exact = nqm.expected_loss(moments[:, 0], SPEC)
    mean, se = mc.mean(1), mc.std(1, ddof=1) / np.sqrt(runs)
    z = (mean - exact) / se
    assert np.all(np.abs(z) < 4.5), f"max |z| = {np.abs(z).max():.2f}"
    assert exact[0] == pytest.approx(SPEC.initial_loss())


@pytest.mark.parametrize("tau", [0, 1, 4, 16])
def test_the_delayed_bound_holds_on_the_quadratic(tau):
    """(1/K) sum_k E||grad f(x_k)||^2 <= 4 Delta / (eta K) + 3 eta L sigma^2 / B
    (theory.models.delay; M = 0, sigma^2 = sum c, Delta = E f(x_0)) for steps up to its cap,
    with the queue starting empty."""
    spec = nqm.Spectrum(h=np.array([2.0, 0.7, 0.1, 0.01]), c=np.array([3.0, 1.0, 0.2, 0.5]),
                        s0=np.array([1.0, 1.0, 4.0, 9.0]))
    L, sigma2, delta, batch = 2.0, spec.c.sum(), spec.initial_loss(), 8.0
    cap = delay.lr_cap(L, 0.0, batch, tau)
    lrs = cap * np.array([1.0, 0.5, 0.1, 0.01])
    moments = nqm_delay.delayed_second_moments(spec, lrs, batch, tau, 3000, start="empty")
    grad_sq = (moments * spec.h**2).sum(-1)                   # [k, lr]
    mean = np.cumsum(grad_sq, axis=0) / np.arange(1, len(grad_sq) + 1)[:, None]
    k = np.arange(1, len(grad_sq) + 1)[:, None]
    rhs = 4.0 * delta / (lrs * k) + 3.0 * lrs * L * sigma2 / batch
    assert np.all(mean <= rhs)


def test_no_delay_is_the_sgd_closed_form():
    lrs = np.array([0.1, 0.5, 1.5])
    got = nqm_delay.delayed_second_moments(SPEC, lrs, 8.0, 0, 40)
    for k in (0, 1, 7, 40):
        closed = nqm.sgd_second_moments(SPEC, lrs, 8.0, np.full(3, k))
        np.testing.assert_allclose(got[k], closed, rtol=1e-10)


@pytest.mark.parametrize("tau", [0, 1, 2, 5, 16])
def test_stability_threshold_is_where_the_companion_matrix_reaches_the_unit_circle(tau):
    def radius(z):
        a = np.zeros((tau + 1, tau + 1))        # state (x_k, ..., x_{k-tau})
        a[0, 0] += 1.0
        a[0, tau] -= z
        a[1:, :-1] += np.eye(tau)
        return np.abs(np.linalg.eigvals(a)).max()

    z_star = nqm_delay.stability_threshold(tau)
    assert radius(z_star * (1 - 1e-6)) < 1.0 < radius(z_star * (1 + 1e-6))
    assert nqm_delay.max_stable_lr(SPEC, tau) == pytest.approx(z_star / 1.0)


def test_steps_to_target_against_a_direct_scan_and_its_monotone_shape():
    spec = nqm.paper_spectrum(50)
    target = 0.5 * spec.initial_loss() / 10
    lrs = np.logspace(-2, 0.3, 12)
    curve = nqm_delay.steps_to_target(spec, target, [1, 4, 64], delays=[0, 2, 8], lrs=lrs,
                                      max_steps=20_000)
    # direct scan of the exact loss path at one point
    i, j = 1, 1
    lr_ok = lrs[lrs < nqm_delay.max_stable_lr(spec, 2)]
    path = nqm.expected_loss(nqm_delay.delayed_second_moments(spec, lr_ok, 4.0, 2, 3000), spec)
    first = np.array([np.argmax(p < target) if (p < target).any() else np.inf for p in path.T])
    assert curve.steps[i, j] == first.min()
    assert curve.best_lr[i, j] == lr_ok[np.argmin(first)]
    # more delay never helps at the best grid point; a larger batch never hurts
    assert np.all(np.diff(curve.steps, axis=1) >= 0)
    assert np.all(np.diff(curve.steps, axis=0) <= 0)
    with pytest.raises(TheoryError, match="delays"):
        nqm_delay.steps_to_target(spec, target, [1], delays=[-1])
    with pytest.raises(TheoryError, match="start must be one of 'initial', 'empty', got 'full'"):
        nqm_delay.steps_to_target(spec, target, [1], start="full")


def test_one_march_for_all_batch_sizes_and_chunks_of_the_grid_agree(monkeypatch):
    spec = nqm.paper_spectrum(40)
    target = 0.02 * spec.initial_loss()
    lrs = np.logspace(-2, 0.3, 9)
    together = nqm_delay.steps_to_target(spec, target, [1, 8, 64], delays=[0, 3], lrs=lrs,
                                         start="empty")
    monkeypatch.setattr(nqm_delay, "_STATE_FLOATS", 8 * spec.dim)   # 4 or 1 learning rates a chunk
    for i, b in enumerate([1, 8, 64]):
        alone = nqm_delay.steps_to_target(spec, target, [b], delays=[0, 3], lrs=lrs, start="empty")
        np.testing.assert_array_equal(alone.steps[0], together.steps[i])
        np.testing.assert_array_equal(alone.best_lr[0], together.best_lr[i])


def monte_carlo_uniform(spec, lr, batch, tau, steps, runs, seed):
    """Delayed SGD with a delay drawn uniformly on 0..tau at every step of every run, float64:
    the gradient at x_{max(k - d, 0)} with fresh noise."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((runs, spec.dim)) * np.sqrt(spec.s0)
    queue = np.repeat(x[None], tau + 1, axis=0)      # [lag, runs, d]: x_k, x_{k-1}, ..., x_{k-tau}
    losses = [0.5 * (x * x * spec.h).sum(1)]
    for _ in range(steps):
        d = rng.integers(0, tau + 1, runs)
        stale = queue[d, np.arange(runs)]
        noise = rng.standard_normal((runs, spec.dim)) * np.sqrt(spec.c / batch)
        x = queue[0] - lr * (spec.h * stale + noise)
        queue = np.concatenate([x[None], queue[:-1]])
        losses.append(0.5 * (x * x * spec.h).sum(1))
    return np.array(losses)


@pytest.mark.parametrize("tau,lr", [(1, 0.8), (4, 0.5)])
def test_uniform_delays_match_monte_carlo_within_its_standard_error(tau, lr):
    steps, runs = 50, 40_000
    mc = monte_carlo_uniform(SPEC, lr, 4.0, tau, steps, runs, seed=10 + tau)
    moments = nqm_delay.delayed_second_moments(SPEC, [lr], 4.0, tau, steps, distribution="uniform")
    exact = nqm.expected_loss(moments[:, 0], SPEC)
    z = (mc.mean(1) - exact) / (mc.std(1, ddof=1) / np.sqrt(runs))
    assert np.all(np.abs(z) < 4.5), f"max |z| = {np.abs(z).max():.2f}"


def covariance_recursion(spec, lr, batch, probs, steps):
    """E x_k^2 from the full covariance of X = (x_k, ..., x_{k-tau}) per coordinate, written out:
    x_{k+1} = x_k - lr (h x_{k-d} + xi) with P(d) = probs, starting from x_0 at every lag."""
    lags, z, n = len(probs), lr * spec.h, lr * lr * spec.c / batch
    cov = np.ones((spec.dim, lags, lags)) * spec.s0[:, None, None]
    out = [cov[:, 0, 0].copy()]
    for _ in range(steps):
        rows = [np.eye(lags)[0] - zi * np.eye(lags) for zi in z]      # v_d = e_0 - z e_d, as rows
        new = np.zeros_like(cov)
        new[:, 1:, 1:] = cov[:, :-1, :-1]
        for i in range(spec.dim):
            mean_row = probs @ rows[i]                                 # e_0 - z p
            cross = mean_row @ cov[i]
            new[i, 0, 1:] = new[i, 1:, 0] = cross[:-1]
            new[i, 0, 0] = sum(p * r @ cov[i] @ r for p, r in zip(probs, rows[i])) + n[i]
        cov = new
        out.append(cov[:, 0, 0].copy())
    return np.array(out)


@pytest.mark.parametrize("tau", [0, 1, 3, 6])
def test_uniform_delays_match_the_full_covariance_recursion(tau):
    lr, steps = 0.4, 40
    reference = covariance_recursion(SPEC, lr, 4.0, np.full(tau + 1, 1.0 / (tau + 1)), steps)
    got = nqm_delay.delayed_second_moments(SPEC, [lr], 4.0, tau, steps, distribution="uniform")
    got = got[:, 0]
    np.testing.assert_allclose(got, reference, rtol=1e-10)


@pytest.mark.parametrize("tau", [0, 2, 5])
def test_the_covariance_recursion_with_one_delay_is_the_fixed_delay_path(tau):
    """The reference above, given all mass at tau, is the fixed-delay path."""
    fixed = nqm_delay.delayed_second_moments(SPEC, [0.3], 4.0, tau, 30)[:, 0]
    reference = covariance_recursion(SPEC, 0.3, 4.0, np.eye(tau + 1)[tau], 30)
    np.testing.assert_allclose(reference, fixed, rtol=1e-10)
    np.testing.assert_array_equal(nqm_delay.delay_probabilities("uniform", 3), np.full(4, 0.25))


def test_steps_to_target_under_uniform_delays_lie_between_no_delay_and_the_fixed_maximum():
    spec = nqm.paper_spectrum(30)
    target = 0.05 * spec.initial_loss()
    lrs = np.logspace(-2, 0.3, 10)
    kw = dict(batch_sizes=[1, 16], lrs=lrs, max_steps=20_000)
    none = nqm_delay.steps_to_target(spec, target, delays=[0], **kw).steps[:, 0]
    fixed = nqm_delay.steps_to_target(spec, target, delays=[6], **kw).steps[:, 0]
    uniform = nqm_delay.steps_to_target(spec, target, delays=[6], distribution="uniform", **kw)
    assert uniform.distribution == "uniform"
    assert np.all((none <= uniform.steps[:, 0]) & (uniform.steps[:, 0] <= fixed))
    with pytest.raises(TheoryError, match="fixed delays only"):
        nqm_delay.steps_to_target(spec, target, [1], distribution="uniform", start="empty")
    with pytest.raises(TheoryError, match="distribution must be one of 'fixed', 'uniform'"):
        nqm_delay.delay_probabilities("poisson", 3)
