"""Branching on the noisy quadratic model: the known answer (branched CBS vs the analytic noise
scale), a sampled run with branch seeds against it, and the branch dynamics against a Monte Carlo
run with torch.optim's momentum buffer."""

import numpy as np
import pytest

from theory import nqm
from theory.estimators.branching import DEFAULT_MULTIPLIERS, BranchingError, branch_lrs, critical_batch
from theory.models.nqm_branching import branch_nqm, noise_scale

SPEC = nqm.paper_spectrum(1000)
BATCH, GOAL = 4, 0.5


def tuned_lr(momentum):
    """The base run's lr as a study would pick it: the one that reaches the goal first at BATCH."""
    curve = nqm.steps_to_target(SPEC, GOAL, [BATCH], optimizer="momentum" if momentum else "sgd",
                                lrs=np.logspace(-3, 0.3, 60), momenta=[momentum] if momentum else None)
    return float(curve.best_lr[0])


def tuned_base(momentum):
    return branch_nqm(SPEC, lr=tuned_lr(momentum), batch_size=BATCH, goal_loss=GOAL, momentum=momentum)


@pytest.fixture(scope="module", params=[0.0, 0.9], ids=["sgd", "heavy-ball"])
def measured(request):
    return tuned_base(request.param)


def test_branched_critical_batch_matches_the_noise_scale_within_2x(measured):
    res = measured.result
    ratio = res.critical_batch / measured.b_noise
    within = (ratio >= 0.5) & (ratio <= 2.0)
    assert within.sum() >= 5, (res.critical_batch, measured.b_noise)
    # the late half of the run, where B_noise has settled, agrees everywhere
    assert within[4:].all()
    assert len(res.steps) == 8 and res.steps[-1] == measured.goal_step
    assert not res.at_upper_end.any()


def test_noise_scale_starts_near_one_and_rises(measured):
    # at initialization E x^2 = 1: B_noise = sum h c / sum h^3 = zeta(2) / zeta(3) for d -> inf
    assert measured.b_noise[0] == pytest.approx(1.6449 / 1.2021, rel=1e-3)
    assert measured.b_noise[-1] > 10 * measured.b_noise[0]
    assert measured.result.critical_batch[-1] >= 4 * BATCH


def test_k1_multiplier1_branch_is_the_base_run(measured):
    np.testing.assert_allclose(measured.branch_loss[:, 0, 1], measured.base_loss, rtol=1e-12)
    np.testing.assert_array_equal(measured.result.relative_gap[:, 0] <= 0, True)


def test_sampled_branching_with_seeds_recovers_the_expected_answer():
    # one sampled SGD base run (Gaussian gradient noise of variance c / B), branches with 5 seeds:
    # the bootstrap intervals cover the exact (in-expectation) CBS and track B_noise
    lr, seeds = tuned_lr(0.0), 5
    exact = branch_nqm(SPEC, lr=lr, batch_size=BATCH, goal_loss=GOAL)
    res = exact.result
    rng = np.random.default_rng(0)

    def sgd(x, rates, batch, n, gen):
        for _ in range(n):
            x = x - rates[:, None] * (SPEC.h * x + gen.standard_normal(x.shape) * np.sqrt(SPEC.c / batch))
        return x

    x, states = rng.standard_normal((1, SPEC.dim)), {}
    for t in range(res.steps[-1] + 1):
        states[t] = x
        x = sgd(x, np.array([lr]), BATCH, 1, rng)
    branch = np.full((len(res.steps), len(res.ks), len(DEFAULT_MULTIPLIERS), seeds), np.inf)
    for i, t in enumerate(res.steps):
        for j, k in enumerate(res.ks):
            rates = np.repeat(branch_lrs(lr, k, "sgd"), seeds)
            stable = rates * SPEC.h.max() < 2.0
            end = sgd(np.repeat(states[t], stable.sum(), 0), rates[stable], k * BATCH, exact.window // (k * BATCH),
                      np.random.default_rng([i, j]))
            losses = np.full(len(rates), np.inf)
            losses[stable] = 0.5 * np.sum(SPEC.h * end**2, -1)
            branch[i, j] = losses.reshape(-1, seeds)
    sampled = critical_batch(res.steps, branch[:, 0, 1], branch, base_batch=BATCH, ks=res.ks)
    covered = (sampled.low <= res.critical_batch) & (res.critical_batch <= sampled.high)
    ratio = sampled.critical_batch / exact.b_noise
    assert covered.sum() >= 6 and ((ratio >= 0.5) & (ratio <= 2.0)).sum() >= 5


def test_noise_scale_formula():
    spec = nqm.Spectrum(h=np.array([2.0, 1.0]), c=np.array([3.0, 5.0]), s0=np.ones(2))
    assert noise_scale(spec, np.array([0.5, 4.0])) == pytest.approx((6 + 5) / (8 * 0.5 + 1 * 4.0))


def test_branch_matches_monte_carlo_with_a_carried_momentum_buffer():
    # torch.optim.SGD: buf = mu buf + g, x -= lr buf; the branch changes lr and batch, keeps buf
    spec = nqm.paper_spectrum(4)
    lr, mom, batch = 0.3, 0.6, 2
    out = branch_nqm(spec, lr=lr, batch_size=batch, goal_loss=0.3, momentum=mom, k_max=4, checkpoints=3)
    t, window = int(out.result.steps[1]), out.window
    rng = np.random.default_rng(0)
    runs = 40_000
    x = rng.normal(size=(runs, 4))
    buf = np.zeros_like(x)

    def step(x, buf, rate, b):
        g = spec.h * x + rng.normal(size=x.shape) * np.sqrt(spec.c / b)
        buf = mom * buf + g
        return x - rate * buf, buf

    for _ in range(t):
        x, buf = step(x, buf, lr, batch)
    k, m = 4, 1.0                                # branch_loss index [1, 2, 1]
    for _ in range(window // (k * batch)):
        x, buf = step(x, buf, lr * k * m, k * batch)
    assert out.branch_loss[1, 2, 1] == pytest.approx(0.5 * np.sum(spec.h * (x**2).mean(0)), rel=0.04)


def test_unreachable_goal_is_a_clear_error():
    with pytest.raises(BranchingError, match="never reaches goal_loss 0.01"):
        branch_nqm(nqm.paper_spectrum(100), lr=0.5, batch_size=1, goal_loss=0.01)
