"""The shoot-out's summary against closed forms: the geometric mean and its t interval on the log
scale; the paired time ratio and the verdict; a best-fixed replicate that missed the goal counted
at its whole budget; the B trajectory in examples."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from experiments.report.schedules.view import censored, geometric, summary, trajectories


def rows(policy, steps, b=8, t=(1.0, 0.0), max_steps=100, schedule=None):
    return pd.DataFrame({
        "run": "r", "sparsity": 0.0, "seed": 0, "policy": policy, "replicate": range(len(steps)),
        "batch_size": b, "steps_to_result": pd.array(steps, dtype="Int64"),
        "examples_to_result": pd.array([None if s is None else s * b for s in steps], dtype="Int64"),
        "seconds_to_result": [math.nan if s is None else s * (t[0] + t[1] * b) for s in steps],
        "max_steps": max_steps, "t_fixed": t[0], "t_example": t[1], "measured_examples": 0,
        "schedule": json.dumps(schedule or [[0, b, 1.0]])})


def test_geometric_mean_and_t_interval():
    v = np.array([10.0, 20.0, 40.0, 15.0, 30.0])
    g, lo, hi = geometric(v)
    logs = np.log(v)
    half = stats.t.ppf(0.95, 4) * logs.std(ddof=1) / math.sqrt(5)
    assert g == pytest.approx(math.exp(logs.mean()))
    assert (lo, hi) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert all(math.isnan(x) for x in geometric(np.array([1.0, math.nan])))


def test_paired_ratio_and_verdicts():
    fixed = rows("best fixed", [100, 110, 90, 105, 95])
    fast = rows("goodput", [50, 56, 44, 52, 48])          # about half, every replicate
    same = rows("seesaw", [100, 90, 110, 95, 105])
    missed = rows("noise_ramp", [50, None, 44, 52, 48])
    t = summary(pd.concat([fixed, fast, same, missed], ignore_index=True)).set_index("policy")
    want = math.exp(np.mean(np.log(np.array([50, 56, 44, 52, 48]) / np.array([100, 110, 90, 105, 95]))))
    assert t.loc["goodput", "ratio"] == pytest.approx(want)
    assert t.loc["goodput", "verdict"] == "beats" and t.loc["goodput", "gain"] == pytest.approx(1 - want)
    assert t.loc["seesaw", "verdict"] == "inconclusive"
    assert t.loc["noise_ramp", "verdict"] == "not reached" and t.loc["noise_ramp", "reached"] == 4
    assert t.loc["best fixed", "steps"] == pytest.approx(geometric(np.array([100, 110, 90, 105, 95.0]))[0])


def test_a_missed_fixed_replicate_counts_at_its_budget():
    fixed = rows("best fixed", [100, None, 90, 105, 95], b=16, t=(1.0, 0.5), max_steps=300)
    c = censored(fixed)
    assert c.steps.tolist() == [100, 300, 90, 105, 95]
    assert c.seconds[1] == 300 * (1.0 + 0.5 * 16) and c.examples[1] == 300 * 16
    t = summary(pd.concat([fixed, rows("goodput", [50, 60, 40, 50, 50], b=16, t=(1.0, 0.5))],
                          ignore_index=True)).set_index("policy")
    assert bool(t.loc["goodput", "censored"]) and t.loc["goodput", "verdict"] == "beats"


def test_trajectory_in_examples():
    r = rows("seesaw", [25], schedule=[[0, 8, 1.0], [10, 16, 0.7], [20, 32, 0.5], [40, 64, 0.3]])
    got = trajectories(r)
    # 10 steps at 8, 10 at 16, then 5 at 32 to the goal at step 25 (the segment at 40 not reached)
    assert got.examples.tolist() == [0, 80, 240, 400] and got.batch_size.tolist() == [8, 16, 32, 32]
