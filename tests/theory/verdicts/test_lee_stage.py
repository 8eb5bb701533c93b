"""L at Lee et al.'s stage on synthetic schedule tables whose answers are worked out by hand."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from theory import TheoryError
from theory.verdicts.lee_stage import (
    early_ratio, initialization_ratio, overall_ratio, point_ratios, stage_points, stage_verdicts,
)
from theory.models.predict import MeasuredCurve

LN2 = math.log(2.0)


def rows(sparsity, values_by_trial, batch_size=64, seed=0, start=1000, every=1000):
    """Schedule rows: trial i has L = values_by_trial[i][k] at step start + k every."""
    return [(sparsity, seed, batch_size, trial, start + k * every, "local_lipschitz", float(v))
            for trial, values in enumerate(values_by_trial) for k, v in enumerate(values)]


def frame(*parts):
    return pd.DataFrame([r for p in parts for r in p],
                        columns=["sparsity", "seed", "batch_size", "trial", "step", "quantity",
                                 "value"])


def test_a_level_at_a_step_is_the_geometric_mean_over_runs_with_a_t_interval():
    # three runs with L = 2, 4, 8: log L = ln2 x (1, 2, 3), mean 2 ln2, sd ln2
    t = frame(rows(0.0, [[2.0], [4.0], [8.0]]))
    (p,) = stage_points(t, level=0.9)
    half = stats.t.ppf(0.95, 2) * LN2 / math.sqrt(3)
    assert (p.sparsity, p.batch_size, p.step, p.runs) == (0.0, 64, 1000, 3)
    assert p.value == pytest.approx(4.0)
    assert p.interval == pytest.approx((4 * math.exp(-half), 4 * math.exp(half)))
    # one run: a value, no interval
    (one,) = stage_points(frame(rows(0.0, [[5.0]])))
    assert one.value == pytest.approx(5.0) and all(math.isnan(x) for x in one.interval)


def test_points_before_the_stage_and_other_quantities_are_left_out():
    t = frame(rows(0.0, [[100.0, 3.0, 3.0]], start=0, every=500))   # steps 0, 500, 1000
    t.loc[len(t)] = (0.0, 0, 64, 0, 1000, "g_sq", 9.0)
    assert [(p.step, p.value) for p in stage_points(t)] == [(1000, pytest.approx(3.0))]


def test_the_ratio_at_a_common_step_has_a_welch_interval_on_log_L():
    t = frame(rows(0.0, [[2.0, 1.0], [4.0, 1.0], [8.0, 1.0]]),
              rows(0.9, [[4.0], [8.0], [16.0]]))   # the sparse runs end before step 2000
    (r,) = point_ratios(t)
    # equal spreads: variance 2 ln2^2 / 3, Welch df = 4
    half = stats.t.ppf(0.95, 4) * LN2 * math.sqrt(2 / 3)
    assert (r.sparsity, r.batch_size, r.step, r.runs) == (0.9, 64, 1000, (3, 3))
    assert r.value == pytest.approx(2.0)
    assert r.interval == pytest.approx((2 * math.exp(-half), 2 * math.exp(half)))


def test_the_overall_ratio_uses_the_steps_every_run_reached_and_averages_batch_sizes():
    # batch 64: dense runs reach 3000 and 2000; sparse runs 3000: common steps 1000, 2000
    dense = rows(0.0, [[1.0, 2.0, 50.0], [2.0, 4.0]])
    sparse = rows(0.5, [[4.0, 4.0, 0.01], [8.0, 8.0, 0.01]])
    r = overall_ratio(frame(dense, sparse), 0.5)
    run_means_d = [math.log(2.0) / 2, math.log(8.0) / 2]     # mean log over 1000, 2000
    run_means_s = [math.log(4.0), math.log(8.0)]
    d = np.mean(run_means_s) - np.mean(run_means_d)
    assert r.steps == (1000, 2000) and r.runs == (2, 2)
    assert r.value == pytest.approx(math.exp(d))
    var = np.var(run_means_s, ddof=1) / 2 + np.var(run_means_d, ddof=1) / 2
    half = stats.t.ppf(0.95, 2 * var**2 / (var**2)) * math.sqrt(var)   # equal spreads: df = 2
    assert r.interval == pytest.approx((math.exp(d - half), math.exp(d + half)))
    # a second batch size, the same difference: the average of the two strata
    both = frame(dense, sparse, rows(0.0, [[1.0], [1.0]], batch_size=128),
                 rows(0.5, [[math.exp(d)], [math.exp(d)]], batch_size=128))
    assert overall_ratio(both, 0.5).value == pytest.approx(math.exp(d))
    assert overall_ratio(both, 0.5).runs == (4, 4)


def test_paired_runs_carry_the_paired_t_interval_of_scipy():
    """Trial i of both levels is one pair: the paired interval is scipy's ttest_rel interval on
    the per-run log L (here at one step, then over the stage from each run's mean log L); the
    run-to-run spread that both levels share leaves it, not the Welch interval."""
    dense = [[2.0, 3.0], [6.0, 5.0], [13.0, 9.0]]
    sparse = [[2.6, 2.7], [6.9, 5.6], [18.0, 8.0]]
    t = frame(rows(0.0, dense), rows(0.9, sparse))
    at_1000 = point_ratios(t)[0]
    a, r = np.log([v[0] for v in sparse]), np.log([v[0] for v in dense])
    ci = stats.ttest_rel(a, r).confidence_interval(confidence_level=0.9)
    assert at_1000.step == 1000
    assert at_1000.paired == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    assert at_1000.paired[0] > 1 > at_1000.interval[0]      # paired: above 1; Welch: not
    a, r = (np.log(v).mean(axis=1) for v in (np.array(sparse), np.array(dense)))
    ci = stats.ttest_rel(a, r).confidence_interval(confidence_level=0.9)
    whole = overall_ratio(t, 0.9)
    assert whole.paired == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    # paired runs: the verdict's interval is the paired one (the primary, declared before data)
    rises = stage_verdicts(t, ())[0]
    assert rises.interval == whole.paired and "(primary)" in rises.reason
    assert rises.verdict == ("holds" if whole.paired[0] > 1 else "inconclusive")


def test_runs_that_are_not_the_same_on_both_sides_have_no_paired_interval():
    t = frame(rows(0.0, [[2.0], [4.0], [8.0]]), rows(0.9, [[4.0], [8.0]]))
    assert all(math.isnan(x) for x in point_ratios(t)[0].paired)
    assert all(math.isnan(x) for x in overall_ratio(t, 0.9).paired)
    other_seed = frame(rows(0.0, [[2.0], [4.0]]), rows(0.9, [[4.0], [8.0]], seed=1))
    assert all(math.isnan(x) for x in overall_ratio(other_seed, 0.9).paired)


def test_no_common_step_gives_no_ratio():
    r = overall_ratio(frame(rows(0.0, [[1.0]]), rows(0.5, [[1.0]], start=2000)), 0.5)
    assert math.isnan(r.value) and r.steps == ()


def curves(dense_steps, sparse_steps):
    bs = (16.0, 32.0, 64.0, 128.0, 256.0)   # five: enough for a 90 % interval over them
    return [MeasuredCurve(0.0, bs, tuple(dense_steps)), MeasuredCurve(0.9, bs, tuple(sparse_steps))]


def test_verdicts_say_whether_L_rises_and_whether_it_explains_the_steps():
    wobble = [0.9, 1.0, 1.1]
    dense = rows(0.0, [[3.0 * w] * 4 for w in wobble])
    sparse = rows(0.9, [[6.0 * w] * 4 for w in wobble])
    more = curves([4000, 2000, 1000, 600, 500], [8000, 4100, 2200, 1300, 1000])
    rises, explains = stage_verdicts(frame(dense, sparse), more)
    assert rises.claim == "lee_L_rises (steps >= 1000)" and rises.verdict == "holds"
    assert rises.value == pytest.approx(2.0) and rises.interval[0] > 1
    assert "4 of 4 intervals above 1" in rises.reason
    assert explains.verdict == "holds" and explains.threshold == (1.0, math.inf)
    # the sparse network took fewer steps: the same L ratio no longer explains them
    fewer = curves([4000, 2000, 1000, 600, 500], [2000, 1000, 500, 300, 250])
    assert stage_verdicts(frame(dense, sparse), fewer)[1].verdict == "does not hold"
    # L smaller when sparse (the sign the early probes showed): Lee's claim does not hold
    low = rows(0.9, [[1.5 * w] * 4 for w in wobble])
    rises, explains = stage_verdicts(frame(dense, low), more)
    assert rises.verdict == "does not hold" and explains.verdict == "does not hold"
    # one run per level: no interval, no verdict either way
    one = stage_verdicts(frame(rows(0.0, [[3.0] * 4]), rows(0.9, [[6.0] * 4])), more)
    assert [v.verdict for v in one] == ["inconclusive", "inconclusive"]


def test_a_level_that_met_the_goal_nowhere_the_reference_did_gets_the_L_claim_alone():
    wobble = [0.9, 1.0, 1.1]
    table = frame(rows(0.0, [[3.0 * w] * 4 for w in wobble]),
                  rows(0.9, [[6.0 * w] * 4 for w in wobble]))
    apart = [MeasuredCurve(0.0, (32.0,), (3000.0,)), MeasuredCurve(0.9, (64.0,), (2500.0,))]
    for given in (apart, apart[:1]):
        (rises,) = stage_verdicts(table, given)
        assert rises.claim == "lee_L_rises (steps >= 1000)" and rises.verdict == "holds"


def test_runs_that_missed_the_goal_count_as_censored_in_the_explains_claim():
    """Every sparse run stopped at its budget without meeting the goal, at five batch sizes
    where the dense runs met it: dropped, there would be no step ratio; censored, the sparse
    median lies beyond the budget, a ratio above 1 that L's rise explains."""
    wobble = [0.9, 1.0, 1.1]
    table = frame(rows(0.0, [[3.0 * w] * 4 for w in wobble]),
                  rows(0.9, [[6.0 * w] * 4 for w in wobble]))
    runs = pd.DataFrame([(s, b, 0, steps, s == 0.0) for b in (16, 32, 64, 128, 256)
                         for s, steps in ((0.0, 4000.0 * 16 / b), (0.9, 5000.0))],
                        columns=["sparsity", "batch_size", "run", "steps", "reached"])
    rises, explains = stage_verdicts(table, [], runs=runs)
    assert explains.verdict == "holds" and explains.statistic.startswith("Kaplan-Meier")
    assert "0/1 and 1/1 runs met the goal" in explains.reason


def test_verdicts_need_the_reference_level_at_the_stage():
    with pytest.raises(TheoryError, match="reference sparsity 0.0"):
        stage_verdicts(frame(rows(0.9, [[1.0]])), [])


def test_initialization_is_its_own_ratio_from_the_probes_at_step_0():
    probes = pd.DataFrame(
        [(0.0, seed, 64, 0, 0.0, "local_lipschitz", v) for seed, v in enumerate([80.0, 90.0])]
        + [(0.9, seed, 64, 0, 0.0, "local_lipschitz", v) for seed, v in enumerate([40.0, 45.0])]
        + [(0.9, 0, 64, 10, 1.0, "local_lipschitz", 999.0)],
        columns=["sparsity", "seed", "batch_size", "step", "fraction", "quantity", "value"])
    r = initialization_ratio(probes, 0.9)
    assert r.step == 0 and r.runs == (2, 2) and r.value == pytest.approx(0.5)


def test_the_early_stage_compares_equal_fractions_of_each_run_without_step_0():
    def run(sparsity, seed, horizon, values):
        steps = np.rint(np.linspace(0, horizon, len(values))).astype(int)
        return [(sparsity, seed, 64, int(t), t / horizon, "local_lipschitz", v)
                for t, v in zip(steps, values)]

    # step 0 is 100x in the sparse runs: it must not move the early ratio
    probes = pd.DataFrame(
        run(0.0, 0, 90, [5.0, 2.0, 2.0]) + run(0.0, 1, 60, [5.0, 4.0, 4.0])
        + run(0.9, 0, 150, [500.0, 4.0, 4.0]) + run(0.9, 1, 120, [500.0, 8.0, 8.0]),
        columns=["sparsity", "seed", "batch_size", "step", "fraction", "quantity", "value"])
    r = early_ratio(probes, 0.9)
    assert r.steps == (1, 2) and r.runs == (2, 2) and r.value == pytest.approx(2.0)


def test_a_sample_agrees_with_the_whole_split_within_the_run_to_run_spread():
    from theory.verdicts.lee_stage import sample_check

    # runs' L 1, e, e^2 at that point: SD of log L = 1; the sample 1.5x the whole split's
    c = sample_check(3.0, 2.0, [1.0, math.e, math.e ** 2])
    assert c.gap == pytest.approx(math.log(1.5)) and c.spread == pytest.approx(1.0)
    assert c.agrees is True
    assert sample_check(3 * math.e ** 2, 1.0, [1.0, math.e, math.e ** 2]).agrees is False
    one = sample_check(3.0, 2.0, [3.0])
    assert math.isnan(one.spread) and one.agrees is None
    with pytest.raises(TheoryError):
        sample_check(0.0, 2.0, [1.0, 2.0])
