"""Step ratios with censored runs, against hand-computed Kaplan-Meier medians, a textbook
Kaplan-Meier written out here, and bootstrap distributions that can be enumerated."""

import math

import numpy as np
import pandas as pd
import pytest

from theory import TheoryError
from theory.models.predict import MeasuredCurve
from theory.verdicts.step_ratio import (
    RUN_COLUMNS, STATISTIC, km_median, km_medians, runs_from_curves, censored_step_ratio,
    units_needed,
)


def textbook_km_median(steps, reached) -> float:
    """Kaplan-Meier by its definition: distinct hit times, grouped hits d_j over runs at risk
    n_j; the first time S <= 1/2 (the midpoint to the next hit where S is exactly 1/2)."""
    steps, reached = np.asarray(steps, float), np.asarray(reached, bool)
    times = sorted(set(steps[reached]))
    s, curve = 1.0, []
    for t in times:
        n = int((steps >= t).sum())
        d = int(((steps == t) & reached).sum())
        s *= 1 - d / n
        curve.append((t, s))
    for k, (t, s) in enumerate(curve):
        if s <= 0.5 + 1e-12:
            if abs(s - 0.5) < 1e-12 and k + 1 < len(curve):
                return (t + curve[k + 1][0]) / 2
            return t
    return math.inf


def runs(cells: dict) -> pd.DataFrame:
    """{(sparsity, batch size): [(run, steps, reached), ...]} as a runs table."""
    return pd.DataFrame([(s, b, r, float(t), bool(h)) for (s, b), rows in cells.items()
                         for r, t, h in rows], columns=list(RUN_COLUMNS))


def test_km_median_by_hand():
    assert km_median([1, 2, 3, 4], [1, 1, 1, 1]) == 2.5           # no censoring: the median
    assert km_median([5, 1, 3], [1, 1, 1]) == 3.0
    # 1 hit (S = 5/6), 2 censored, 3 hit (4 at risk: 5/8), 4 hit (3 at risk: 5/12 <= 1/2)
    assert km_median([1, 2, 3, 4, 5, 6], [1, 0, 1, 1, 0, 1]) == 4.0
    # S = 3/4 then exactly 1/2 at 2, flat to the next hit at 4: the midpoint
    assert km_median([1, 2, 3, 4], [1, 1, 0, 1]) == 3.0
    # two of three dense runs met the goal by 4,020 (issue 47's B = 32): S = 2/3, then 1/3
    assert km_median([3283, 4020, 5000], [1, 1, 0]) == 4020.0
    # one of three met it: more than half may still be short at the budget
    assert km_median([3344, 3500, 3500], [1, 0, 0]) == math.inf
    # a censored run tied with a hit was at risk at that step
    assert km_median([2, 2, 3], [1, 0, 1]) == 3.0


def test_km_medians_match_the_textbook_and_the_median_without_censoring():
    gen = np.random.default_rng(0)
    for n in (1, 2, 3, 4, 7, 10):
        steps = gen.integers(1, 8, (200, n)).astype(float)     # ties, often
        reached = gen.random((200, n)) < 0.7
        got = km_medians(steps, reached)
        want = [textbook_km_median(t, d) for t, d in zip(steps, reached)]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(km_medians(steps, np.ones_like(reached)),
                                      np.median(steps, axis=1))


def test_paired_constant_ratio_has_exactly_that_interval():
    dense = [(r, 100.0 * (r + 1), True) for r in range(5)]   # five pairs: 90 % resolvable
    cells = {(0.0, 32): dense, (0.5, 32): [(r, 2 * t, h) for r, t, h in dense],
             (0.0, 64): dense, (0.5, 64): [(r, 2 * t, h) for r, t, h in dense]}
    ratio = censored_step_ratio(runs(cells), 0.5, n_boot=500)
    assert ratio.paired and ratio.value == 2.0 and ratio.interval == (2.0, 2.0)
    assert ratio.best == 2.0 and ratio.statistic == STATISTIC


def test_bootstrap_over_runs_is_the_enumerated_distribution():
    """Dense: five runs at 100. Sparse (other runs, unpaired): three at 100, two at 300. A
    resample's median is 300 when three or more of its five draws are (chance 0.317), else
    100: the 90 % interval is [1, 3]."""
    cells = {(0.0, 64): [(f"d{i}", 100, True) for i in range(5)],
             (0.9, 64): [(f"s{i}", t, True) for i, t in enumerate((100, 100, 100, 300, 300))]}
    ratio = censored_step_ratio(runs(cells), 0.9, n_boot=4000)
    assert not ratio.paired and ratio.resolved
    assert ratio.value == 1.0 and ratio.best == 1.0 and ratio.interval == (1.0, 3.0)
    # at 70 % the quantiles 0.15 and 0.85 still fall on 1 and 3 (3 has chance 0.317)
    assert censored_step_ratio(runs(cells), 0.9, level=0.7, n_boot=4000).interval == (1.0, 3.0)


def test_too_few_units_give_no_interval():
    """[min, max] of k units covers a median with chance 1 - 2^(1 - k): 5 units for 90 %."""
    assert [units_needed(x) for x in (0.5, 0.75, 0.9, 0.95)] == [2, 3, 5, 6]
    cells = {(0.0, 64): [(i, 100 * (i + 1), True) for i in range(4)],
             (0.9, 64): [(i, 200 * (i + 1), True) for i in range(4)]}
    few = censored_step_ratio(runs(cells), 0.9, n_boot=500)
    assert not few.resolved and few.interval == (0.0, math.inf) and few.value == 2.0
    assert censored_step_ratio(runs(cells), 0.9, level=0.75, n_boot=500).interval == (2.0, 2.0)


def test_censored_runs_count_and_best_of_n_stands_beside_the_median():
    """Issue 47's B = 64 cell: the best-of-3 ratio is 1.27, the medians' 1.00; at B = 32 no
    sparse run met the goal within 5,000 steps, so the sparse median lies beyond the budget."""
    cells = {(0.0, 64): [(0, 2327, 1), (1, 3251, 1), (2, 3256, 1)],
             (0.5, 64): [(0, 2944, 1), (1, 3255, 1), (2, 3500, 0)],
             (0.0, 32): [(0, 3283, 1), (1, 4020, 1), (2, 5000, 0)],
             (0.5, 32): [(0, 5000, 0), (1, 5000, 0), (2, 5000, 0)]}
    only64 = censored_step_ratio(runs({k: v for k, v in cells.items() if k[1] == 64}), 0.5, n_boot=2000)
    assert only64.value == pytest.approx(3255 / 3251)
    assert only64.best == pytest.approx(2944 / 2327)
    # three pairs and one batch size: no 90 % interval (the bootstrap alone would say
    # [1.001, inf], from ten distinct resamples)
    assert not only64.resolved and only64.interval == (0.0, math.inf)
    both = censored_step_ratio(runs(cells), 0.5, n_boot=2000, level=0.75)
    b32 = both.batches[0]
    assert (b32.batch_size, b32.median, b32.ratio, b32.best_ratio, b32.reached) == (
        32, (math.inf, 4020.0), math.inf, math.inf, (0, 2))
    # the median of {1.001, inf} over batch sizes is inf
    assert both.resolved and both.value == math.inf and both.interval[1] == math.inf


def test_curves_without_censoring_and_bad_tables():
    dense = MeasuredCurve(0.0, (16, 32, 64, 64), (100.0, 60.0, 40.0, 10.0), (0, 0, 0, 1))
    sparse = MeasuredCurve(0.9, (16, 32, 64, 128), (300.0, 90.0, 40.0, 30.0), (0, 0, 0, 0))
    ratio = censored_step_ratio(runs_from_curves([dense, sparse]), 0.9, n_boot=300)
    # per B: 3, 1.5 and, at B = 64, 40 over the median of the dense seeds (25): 1.6
    assert [x.ratio for x in ratio.batches] == [3.0, 1.5, 1.6] and ratio.value == 1.6
    with pytest.raises(TheoryError, match="share no batch size"):
        censored_step_ratio(runs_from_curves([dense, MeasuredCurve(0.9, (8,), (1.0,))]), 0.9)
    table = runs_from_curves([dense])
    with pytest.raises(TheoryError, match="lacks column"):
        censored_step_ratio(table.drop(columns="reached"), 0.9)
    with pytest.raises(TheoryError, match="positive and finite"):
        censored_step_ratio(table.assign(steps=math.nan), 0.9)
