"""Branching rules with known answers: CBS selection on synthetic loss tables, bootstrap intervals,
the learning-rate rule, checkpoints, window, cost and the warmup schedule."""

import math

import numpy as np
import pytest

from theory import branching as br
from theory.errors import TheoryError
from training import SparsescaleError
from training.schedules.batch_schedule import BatchSegment

KS = np.array([1, 2, 4, 8])


def table(gaps, base=1.0, seeds=1, multipliers=3):
    """Branch losses [1, len(KS), multipliers, seeds]: base * (1 + gap) per k, the same for every
    multiplier except that multiplier 0 is 10 % worse."""
    loss = base * (1.0 + np.asarray(gaps, dtype=float))
    out = np.repeat(np.repeat(loss[None, :, None, None], multipliers, 2), seeds, 3)
    out[:, :, 0] *= 1.1
    return out


def cbs(branch, base=1.0, **kw):
    return br.critical_batch([0], np.full(1, base), branch, base_batch=16, ks=KS, **kw)


@pytest.mark.parametrize(("gaps", "expected"), [
    ([0.0, 0.005, 0.02, 0.5], 32),       # k = 2 within 1 %, k = 4 not
    ([0.0, 0.02, 0.005, 0.5], 64),       # the largest passing k counts, even past a failing one
    ([0.02, 0.03, 0.04, 0.05], 0),       # none passes: below the smallest batch tried
    ([-0.1, -0.1, 0.0, 0.01], 128),      # every k passes (the tolerance is inclusive)
    ([0.0, 0.0, 0.0, 0.0100001], 64),
])
def test_cbs_is_the_largest_batch_within_tolerance(gaps, expected):
    res = cbs(table(gaps))
    assert res.critical_batch[0] == expected
    assert res.at_upper_end[0] == (expected == 128)
    np.testing.assert_allclose(res.relative_gap[0], gaps, atol=1e-12)
    assert list(res.best_multiplier[0]) == [1, 1, 1, 1]


def test_eps_sets_the_tolerance():
    branch = table([0.0, 0.03, 0.06, 0.2])
    assert [cbs(branch, eps=e).critical_batch[0] for e in (0.0, 0.01, 0.05, 0.1, 0.25)] == [16, 16, 32, 64, 128]


def test_best_multiplier_decides_and_a_diverged_one_is_ignored():
    branch = table([0.0, 0.0, 0.5, 0.5])
    branch[0, 2, 2] = 1.004           # only multiplier 2 keeps k = 4 within 1 %
    branch[0, 2, 1] = np.nan          # multiplier 1 diverged at k = 4
    res = cbs(branch)
    assert res.critical_batch[0] == 64 and res.best_multiplier[0, 2] == 2
    assert res.relative_gap[0, 2] == pytest.approx(0.004)
    branch[0, 3] = np.inf             # every multiplier diverged at k = 8
    res = cbs(branch)
    assert res.relative_gap[0, 3] == np.inf and res.best_multiplier[0, 3] == -1


def test_a_seed_that_diverged_fails_its_branch():
    branch = table([0.0, 0.0, 0.0, 0.0], seeds=3)
    branch[0, 3, :, 1] = np.nan       # k = 8 diverged in seed 1 at every multiplier
    assert cbs(branch).critical_batch[0] == 64


def test_several_checkpoints_are_independent():
    branch = np.concatenate([table([0, 0, 0.5, 0.5]), table([0, 0, 0, 0.5]), table([0.5] * 4)])
    res = br.critical_batch([0, 10, 20], [1.0, 1.0, 1.0], branch, base_batch=4, ks=KS)
    assert list(res.critical_batch) == [8, 16, 0]
    assert list(res.examples) == [0, 40, 80]


def test_exact_bootstrap_over_three_seeds():
    # k = 2: seeds 1.0, 1.0, 1.04 -> mean 1.0133 fails; a resample passes iff it omits seed 2,
    # with probability (2/3)^3 = 8/27, so CBS* = 16 w.p. 19/27 = 0.7037 and 32 w.p. 8/27
    branch = table([0.0, 0.5, 0.5, 0.5], seeds=3)
    branch[0, 1, 1:] = [1.0, 1.0, 1.04]
    res = cbs(branch, level=0.9)
    assert (res.critical_batch[0], res.low[0], res.high[0]) == (16, 16, 32)
    # upper quantile 1 - alpha = 0.70 < 19/27 -> 16; 0.71 > 19/27 -> 32 (exact, no sampling)
    assert cbs(branch, level=0.40).high[0] == 16
    assert cbs(branch, level=0.42).high[0] == 32
    assert cbs(branch, level=0.42, seed=7).high[0] == 32


def test_sampled_bootstrap_over_many_seeds():
    # 10 seeds, one at 1.2: mean 1.02 fails; a resample passes iff it omits that seed (0.9^10 = 0.349)
    branch = table([0.0, 0.5, 0.5, 0.5], seeds=10)
    branch[0, 1, 1:] = 1.0
    branch[0, 1, 1:, 0] = 1.2
    res = cbs(branch, level=0.5, n_boot=4000)
    assert (res.critical_batch[0], res.low[0], res.high[0]) == (16, 16, 32)   # 0.75 > 0.651
    assert cbs(branch, level=0.2, n_boot=4000).high[0] == 16                    # 0.60 < 0.651


def test_per_seed_base_pairs_the_comparison():
    # each seed's branch is 0.5 % above its own base: every paired resample passes; against the
    # pooled base mean, resamples of the worse seeds fail
    base = np.array([[1.0, 1.1, 1.2]])
    branch = table([0.0, 0.5, 0.5, 0.5], seeds=3)
    branch[0, 1, 1:] = base * 1.005
    branch[0, 0, 1:] = base
    paired = br.critical_batch([0], base, branch, base_batch=16, ks=KS)
    pooled = br.critical_batch([0], base.mean(1), branch, base_batch=16, ks=KS)
    assert (paired.critical_batch[0], paired.low[0], paired.high[0]) == (32, 32, 32)
    assert (pooled.critical_batch[0], pooled.low[0], pooled.high[0]) == (32, 16, 32)


def test_one_seed_gives_a_zero_width_interval():
    res = cbs(table([0.0, 0.0, 0.5, 0.5]))
    assert (res.low[0], res.high[0], res.n_seeds) == (32, 32, 1)


@pytest.mark.parametrize(("optimizer", "factor"), [("sgd", 4.0), ("momentum", 4.0), ("nesterov", 4.0),
                                                   ("adam", 2.0), ("adamw", 2.0)])
def test_lr_rule(optimizer, factor):
    assert br.lr_scale(4, optimizer) == factor
    np.testing.assert_allclose(br.branch_lrs(0.1, 4, optimizer), [0.05 * factor, 0.1 * factor, 0.2 * factor])
    assert br.lr_scale(2, optimizer) == pytest.approx(2.0 if factor == 4.0 else math.sqrt(2))


def test_checkpoints_window_factors_and_cost():
    assert list(br.checkpoint_steps(70)) == [0, 10, 20, 30, 40, 50, 60, 70]
    assert list(br.checkpoint_steps(10, 4)) == [0, 3, 7, 10]
    assert list(br.branch_factors(16)) == [1, 2, 4, 8, 16]
    assert br.default_window(10_000, 8, 16) == 1024       # 10 % = 1000, rounded up to 8 x 128
    assert br.default_window(100, 8, 16) == 128           # at least one step at the largest branch
    assert br.default_window(10_000, 8, 16, fraction=0.5) == 5120
    assert br.window_steps(1024, 64) == 16
    # per checkpoint 128 + 64 + 32 steps, x 3 multipliers x 3 seeds x 8 checkpoints
    assert br.branching_trial_steps(1024, 8, [1, 2, 4], 3, 3, 8) == 224 * 72


def test_warmup_schedule_follows_the_critical_batch():
    sched = br.warmup_schedule([0, 40, 80], [0, 16, 32], base_batch=4, optimizer="sgd")
    # 40 examples at B = 4 -> 10 steps; 40 more at 16 -> 2.5, rounded up to 3 steps
    assert sched.segments == (BatchSegment(0, 4, 1.0), BatchSegment(10, 16, 4.0), BatchSegment(13, 32, 8.0))
    assert sched.examples(13) == 88 and sched.at(12).batch_size == 16 and sched.at(100).batch_size == 32
    adam = br.warmup_schedule([0, 40, 80], [0, 16, 32], base_batch=4, optimizer="adam")
    assert [s.lr_scale for s in adam.segments] == [1.0, 2.0, math.sqrt(8)]


def test_warmup_rounds_down_to_powers_of_two_caps_and_merges():
    sched = br.warmup_schedule([0, 40, 80, 120], [10, 24, 31, 200], base_batch=4, optimizer="sgd", cap=32)
    assert [(s.start_step, s.batch_size) for s in sched.segments] == [(0, 8), (5, 16), (10, 32)]
    floor = br.warmup_schedule([0, 40], [0, 3], base_batch=4, optimizer="sgd", min_batch=2)
    assert [(s.start_step, s.batch_size, s.lr_scale) for s in floor.segments] == [(0, 2, 0.5)]


def test_warmup_drops_a_segment_that_the_previous_one_already_passed():
    # 64 examples consumed by step 2 (B = 32) already pass the checkpoint at 50: B = 64 never runs
    sched = br.warmup_schedule([0, 40, 50], [32, 64, 8], base_batch=4, optimizer="sgd")
    assert [(s.start_step, s.batch_size) for s in sched.segments] == [(0, 32), (2, 8)]


@pytest.mark.parametrize(("call", "match"), [
    (lambda: cbs(table([0] * 4)[:, :3]), "branch_loss must have shape"),
    (lambda: cbs(table([0] * 4, seeds=2)), "2 seeds"),
    (lambda: cbs(-table([0] * 4)), "branch_loss must be >= 0"),
    (lambda: cbs(table([0] * 4), base=0.0), "base_loss must be positive"),
    (lambda: br.critical_batch([0], np.ones((1, 2)), table([0] * 4, seeds=3), base_batch=1, ks=KS),
     "base_loss must have shape"),
    (lambda: br.critical_batch([0], [1.0], table([0] * 4), base_batch=1, ks=[1, 4, 2, 8]), "ks must be"),
    (lambda: br.critical_batch([5, 5], [1.0, 1.0], table([0] * 4), base_batch=1, ks=KS), "steps must be"),
    (lambda: cbs(table([0] * 4), eps=-0.1), "eps must be"),
    (lambda: cbs(table([0] * 4), level=1.0), "level must be"),
    (lambda: cbs(table([0] * 4), n_boot=0), "n_boot must be"),
    (lambda: br.lr_scale(2, "rmsprop"), "optimizer must be one of"),
    (lambda: br.lr_scale(0, "sgd"), "batch factor k"),
    (lambda: br.branch_lrs(0.1, 2, "sgd", [1.0, -1.0]), "multipliers"),
    (lambda: br.branch_factors(12), "k_max must be a power of two"),
    (lambda: br.checkpoint_steps(5, 8), "goal_step"),
    (lambda: br.default_window(100, 8, 16, fraction=0.0), "window fraction"),
    (lambda: br.window_steps(1000, 64), "multiple of batch_size"),
    (lambda: br.warmup_schedule([0, 10], [4], base_batch=4, optimizer="sgd"), "critical_batch must be"),
    (lambda: br.warmup_schedule([0, 10], [4, 8], base_batch=4, optimizer="sgd", cap=0), "cap must be"),
])
def test_bad_input_raises_a_clear_error(call, match):
    with pytest.raises(br.BranchingError, match=match) as err:
        call()
    assert isinstance(err.value, TheoryError) and isinstance(err.value, SparsescaleError)
