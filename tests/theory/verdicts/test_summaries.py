"""Summaries per level on synthetic probe tables whose answers are worked out by hand."""

import numpy as np
import pytest

from theory import TheoryError
from theory.verdicts.summaries import STATISTICS, find, summarize

from ..conftest import FRACTIONS, level_rows, run_rows, table


def test_b_simple_is_a_ratio_of_sums_over_the_last_fifth_of_the_run():
    # points at fractions 8/9 and 1 form the goal window: (|G|^2, tr) = (1, 100) and (3, 100)
    g = np.ones(10)
    g[9] = 3.0
    t = np.full(10, 100.0)
    t[:8] = 10.0
    s = summarize(table(run_rows(0.0, 0, 64, 900, g_sq=g, trace_sigma=t)), n_boot=50)
    assert find(s, 0.0, "b_simple_goal").value == pytest.approx(200 / 4)   # not (100 + 33.3) / 2
    assert find(s, 0.0, "b_simple_at_h").value == pytest.approx(100 / 3)
    assert find(s, 0.0, "b_simple_run").value == pytest.approx((80 + 200) / 12)
    assert find(s, 0.0, "b_simple_goal").points == 2 and find(s, 0.0, "b_simple_run").points == 10
    assert find(s, 0.0, "b_simple_goal", ).runs == 1


def test_goal_window_is_configurable():
    t = np.arange(1.0, 11.0)
    s = summarize(table(run_rows(0.0, 0, 64, 900, g_sq=1.0, trace_sigma=t)), n_boot=20,
                  goal_window=0.5)
    assert find(s, 0.0, "b_simple_goal").value == pytest.approx(np.mean(t[FRACTIONS >= 0.5]))


def test_L_lambda_and_delta_per_run_then_mean_over_runs():
    L1 = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 30.0])
    L2 = np.full(10, 4.0)
    rows = (run_rows(0.5, 0, 64, 900, local_lipschitz=L1, hessian_top=L1 / 2, loss=np.linspace(2.3, 1, 10))
            + run_rows(0.5, 1, 64, 900, local_lipschitz=L2, hessian_top=L2 / 2, loss=np.linspace(2.1, 1, 10)))
    s = summarize(table(rows), n_boot=50)
    # L along the run leaves step 0 out (Lee et al. never measured there): it is L_init
    assert find(s, 0.5, "L_mean").value == pytest.approx((L1[1:].mean() + 4.0) / 2)
    assert find(s, 0.5, "L_median").value == pytest.approx((6.0 + 4.0) / 2)
    assert find(s, 0.5, "L_max").value == pytest.approx((30 + 4.0) / 2)
    assert find(s, 0.5, "L_init").value == pytest.approx((1.0 + 4.0) / 2)
    assert find(s, 0.5, "L_mean").points == 18 and find(s, 0.5, "L_init").points == 2
    assert find(s, 0.5, "lambda_max_mean").value == pytest.approx((L1.mean() + 4.0) / 4)
    assert find(s, 0.5, "lambda_max_max").value == pytest.approx((15 + 2.0) / 2)
    assert find(s, 0.5, "delta").value == pytest.approx(2.2)
    assert find(s, 0.5, "delta").points == 2


def test_hierarchical_bootstrap_interval_over_runs_and_points():
    # two runs, constant within each (L = 2 and 4): replicates are 2, 3, 4 with prob. 1/4, 1/2, 1/4
    rows = run_rows(0.0, 0, 64, 900, local_lipschitz=2.0) + run_rows(0.0, 1, 64, 900, local_lipschitz=4.0)
    s = find(summarize(table(rows), n_boot=2000, statistics=("L_mean",)), 0.0, "L_mean")
    assert s.value == 3.0 and s.interval == (2.0, 4.0) and len(s.replicates) == 2000
    assert np.mean(s.replicates == 3.0) == pytest.approx(0.5, abs=0.05)
    # one run: only its points vary; within-run spread gives a non-degenerate interval
    one = find(summarize(table(run_rows(0.0, 0, 64, 900, local_lipschitz=np.arange(10.0))), n_boot=500,
                         statistics=("L_mean",)), 0.0, "L_mean")
    assert one.interval[0] < 4.5 < one.interval[1] and one.interval[1] - one.interval[0] < 4.0
    # identical runs of constant values: no uncertainty
    flat = summarize(table(level_rows(0.9, L=3.0, delta=2.3, b_simple=200.0, lam=1.0)), n_boot=100)
    assert find(flat, 0.9, "b_simple_goal").interval == (200.0, 200.0)


def test_bootstrap_is_reproducible_and_levels_are_separate():
    rows = level_rows(0.0, L=3.0, delta=2.3, b_simple=200.0, lam=1.0, spread=0.2) \
        + level_rows(0.9, L=5.0, delta=2.3, b_simple=100.0, lam=2.0, spread=0.2)
    a, b = summarize(table(rows), n_boot=100, seed=3), summarize(table(rows), n_boot=100, seed=3)
    assert [x.interval for x in a] == [x.interval for x in b]
    assert {x.sparsity for x in a} == {0.0, 0.9} and len(a) == 2 * len(STATISTICS)
    assert find(a, 0.9, "L_mean").value == pytest.approx(5.0)
    assert find(a, 0.9, "L_mean").runs == 9 and find(a, 0.9, "L_mean").points == 81
    per_b = summarize(table(rows), n_boot=20, by_batch_size=True, statistics=("b_simple_goal",))
    assert len(per_b) == 6 and find(per_b, 0.0, "b_simple_goal", batch_size=64).runs == 3


def test_missing_quantities_are_skipped_not_invented():
    s = summarize(table(run_rows(0.0, 0, 64, 900, loss=2.0)), n_boot=10)
    assert [x.statistic for x in s] == ["delta"]
    with pytest.raises(TheoryError, match="no L_mean summary for sparsity 0.0"):
        find(s, 0.0, "L_mean")


def test_bad_tables_are_named():
    good = table(run_rows(0.0, 0, 64, 900, loss=2.0))
    with pytest.raises(TheoryError, match="lacks column.*fraction"):
        summarize(good.drop(columns="fraction"))
    bad = good.copy()
    bad.loc[0, "fraction"] = 1.5
    with pytest.raises(TheoryError, match="fraction must be in"):
        summarize(bad)
    with pytest.raises(TheoryError, match="two values for"):
        summarize(table(run_rows(0.0, 0, 64, 900, loss=2.0) * 2))
    with pytest.raises(TheoryError, match="unknown statistic"):
        summarize(good, statistics=("b_crit",))
    with pytest.raises(TheoryError, match="level"):
        summarize(good, level=1.5)
