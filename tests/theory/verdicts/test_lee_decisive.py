"""The decisive rows of Lee's stage (issue 47) on synthetic tables worked out by hand: what a
paired interval resolves, the step ratio's row, and the bias control's comparison of two
tables."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from theory import TheoryError
from theory.verdicts.claims import FAILS, HOLDS, INCONCLUSIVE
from theory.verdicts.lee_decisive import compare, resolution, tuned_steps_verdict
from theory.verdicts.lee_stage import NAN_INTERVAL, StageRatio
from theory.verdicts.step_ratio import censored_step_ratio

COLUMNS = ["sparsity", "seed", "batch_size", "trial", "step", "quantity", "value"]


def ratio(value, paired, interval=(0.1, 10.0)):
    return StageRatio(0.9, 0.0, None, None, value, interval, (8, 8), (1000, 1250), paired)


@pytest.mark.parametrize("paired, verdict, x, words", [
    ((0.95, 1.08), HOLDS, 0.08, "within +-8.0 %"),            # X = max(0.08, 0.05)
    ((0.93, 1.02), HOLDS, 0.07, "within +-7.0 %"),            # X = max(0.02, 0.07)
    ((1.02, 1.30), HOLDS, 0.30, "decided: the interval excludes 1, L is larger"),
    ((0.70, 0.98), HOLDS, 0.30, "L is smaller"),
    ((0.85, 1.12), INCONCLUSIVE, 0.15, "unresolved: the interval spans +-15.0 %"),
])
def test_resolution_is_decided_or_the_smallest_symmetric_difference_excluded(
        paired, verdict, x, words):
    v = resolution(ratio(1.0, paired), effect=0.1)
    assert (v.verdict, v.interval, v.threshold) == (verdict, paired, (0.0, 0.1))
    assert v.value == pytest.approx(x) and words in v.reason


def test_resolution_uses_welch_where_the_runs_are_not_paired_and_needs_an_interval():
    v = resolution(ratio(1.0, NAN_INTERVAL, (0.96, 1.05)), effect=0.1)
    assert v.value == pytest.approx(0.05) and "Welch" in v.reason and v.verdict == HOLDS
    none = resolution(ratio(1.0, NAN_INTERVAL, NAN_INTERVAL), effect=0.1)
    assert none.verdict == INCONCLUSIVE and math.isnan(none.value)
    with pytest.raises(TheoryError, match="effect must be > 0"):
        resolution(ratio(1.0, (0.9, 1.1)), effect=0.0)


def runs(sparsity, steps, reached=None):
    reached = [True] * len(steps) if reached is None else reached
    return pd.DataFrame({"sparsity": sparsity, "batch_size": 64, "run": range(len(steps)),
                         "steps": [float(s) for s in steps], "reached": reached})


def test_the_step_row_is_the_censored_ratio_with_its_interval_over_runs():
    # five paired runs, the sparse one exactly twice the steps: every bootstrap draw is 2
    both = pd.concat([runs(0.9, [200, 240, 260, 300, 320]), runs(0.0, [100, 120, 130, 150, 160])])
    v = tuned_steps_verdict(censored_step_ratio(both, 0.9, 0.0))
    assert (v.value, v.interval, v.verdict) == (2.0, (2.0, 2.0), HOLDS)
    assert "best of N 2" in v.reason
    # a sparse level faster in every run: does not hold
    fast = pd.concat([runs(0.9, [50, 60, 65, 75, 80]), runs(0.0, [100, 120, 130, 150, 160])])
    assert tuned_steps_verdict(censored_step_ratio(fast, 0.9, 0.0)).verdict == FAILS


def table(sparsity, log_l, steps=(1000, 1250)):
    """Run i has log L = log_l[i] at every step (a flat run: its mean is that value)."""
    return pd.DataFrame([(sparsity, 0, 64, i, t, "local_lipschitz", math.exp(v))
                         for i, v in enumerate(log_l) for t in steps], columns=COLUMNS)


def test_compare_pairs_runs_across_two_tables():
    """Reference runs log L = a_i, the other a_i + d_i with d = (0.1, 0.2, 0.3): the paired
    mean 0.2 and sd 0.1 give exp(0.2 +- t_{0.95, 2} 0.1 / sqrt 3); steps exactly 1.5x."""
    a = np.array([0.5, 1.5, 1.0])
    d = np.array([0.1, 0.2, 0.3])
    ref = table(0.0, a)
    other = table(0.0, a + d)   # two tables may hold the same level (dense with, without biases)
    ref_runs = runs(0.0, [100, 120, 140, 160, 180])
    other_runs = runs(0.0, [150, 180, 210, 240, 270])
    l_row, step_row = compare(other, ref, other_runs, ref_runs, 0.0, 0.0, "biases")
    half = stats.t.ppf(0.95, 2) * 0.1 / math.sqrt(3)
    assert l_row.claim == "lee_L_rises: biases removed" and l_row.verdict == HOLDS
    assert l_row.value == pytest.approx(math.exp(0.2))
    assert l_row.interval == pytest.approx((math.exp(0.2 - half), math.exp(0.2 + half)))
    assert step_row.claim == "lee_steps: biases removed" and step_row.sparsity == 0.0
    assert (step_row.value, step_row.interval) == (pytest.approx(1.5), pytest.approx((1.5, 1.5)))
    with pytest.raises(TheoryError, match="unknown cause 'bias'"):
        compare(other, ref, other_runs, ref_runs, 0.0, 0.0, "bias")
