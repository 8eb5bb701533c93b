"""B_simple pooled over runs, against ratios of sums written out and bootstrap distributions
that can be enumerated."""

import math

import pandas as pd
import pytest

from theory import TheoryError
from theory.verdicts.claims import HOLDS, mccandlish
from theory.verdicts.noise_along import (
    NOISE_COLUMNS, b_simple_along, b_simple_at_goal, noise_points,
)

from .test_claims import fit


def points(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(NOISE_COLUMNS))


def test_a_constant_noise_scale_is_exact():
    """tr(Sigma) = 7 |G|^2 at every point of every run: B_simple is 7, with no spread."""
    rows = [(0.0, f"r{r}", f, g, 7 * g) for r in range(4) for f, g in
            ((0.1, 2.0 + r), (0.5, 1.0), (0.9, 0.5 + r))]
    [scale] = b_simple_at_goal(points(rows)).values()
    assert scale.value == pytest.approx(7.0) and scale.interval == pytest.approx((7.0, 7.0))
    assert (scale.runs, scale.points, scale.over) == (4, 4, "runs")


def test_bootstrap_over_two_runs_is_the_enumerated_distribution():
    """Run a sums tr(Sigma) 10 over |G|^2 1 at the goal, run b 30 over 1: pooled 40 / 2 = 20.
    Resampled, the pair gives 10, 20 or 30 with chances 1/4, 1/2, 1/4: 90 % interval [10, 30].
    Points before the last 20 % do not count."""
    rows = [(0.5, "a", 0.85, 0.5, 4.0), (0.5, "a", 1.0, 0.5, 6.0), (0.5, "a", 0.3, 9.0, 1.0),
            (0.5, "b", 0.9, 1.0, 30.0), (0.5, "b", 0.1, 1.0, 900.0)]
    scale = b_simple_at_goal(points(rows), n_boot=4000)[0.5]
    assert scale.value == pytest.approx(20.0) and scale.interval == (10.0, 30.0)
    assert (scale.runs, scale.points) == (2, 3)


def test_one_run_draws_its_points_and_says_so():
    rows = [(0.0, "a", 0.9, 1.0, 10.0), (0.0, "a", 1.0, 1.0, 30.0)]
    scale = b_simple_at_goal(points(rows), n_boot=4000)[0.0]
    assert scale.over == "points" and scale.value == 20.0 and scale.interval == (10.0, 30.0)


def test_along_training_bins_the_fractions():
    rows = [(0.0, r, f, 1.0, b) for r in ("a", "b") for f, b in ((0.0, 2.0), (0.45, 4.0),
                                                                 (1.0, 8.0))]
    along = b_simple_along(points(rows), bins=2)
    assert [(s.start, s.stop, s.value, s.points) for s in along] == [
        (0.0, 0.5, 3.0, 4), (0.5, 1.0, 8.0, 2)]


def test_noise_points_from_the_two_stored_tables():
    probes = pd.DataFrame([(0.0, 0, 64, step, step / 100, q, v) for step in (0, 100)
                           for q, v in (("g_sq", 2.0), ("trace_sigma", 8.0), ("loss", 1.0))],
                          columns=["sparsity", "seed", "batch_size", "step", "fraction",
                                   "quantity", "value"])
    stage = pd.DataFrame([(0.0, 0, 32, t, step, 4000, q, v) for t in (0, 1) for step in (1000, 4000)
                          for q, v in (("g_sq", 1.0), ("trace_sigma", 3.0 + t))],
                         columns=["sparsity", "seed", "batch_size", "trial", "step", "horizon",
                                  "quantity", "value"])
    table = noise_points(probes, stage)
    assert sorted(set(table["run"])) == ["probes:0/64", "stage:0/32/0", "stage:0/32/1"]
    assert sorted(table.loc[table["run"] == "stage:0/32/1", "fraction"]) == [0.25, 1.0]
    goal = b_simple_at_goal(table)[0.0]
    # at the goal: the probe run's step 100 (8 / 2) and each stage run's step 4,000 (3, 4)
    assert goal.value == pytest.approx((8 + 3 + 4) / (2 + 1 + 1)) and goal.runs == 3
    assert noise_points().empty
    with pytest.raises(TheoryError, match="lack column"):
        b_simple_at_goal(table.drop(columns="g_sq"))


def test_the_mccandlish_claim_uses_the_pooled_noise_scale():
    pooled = b_simple_at_goal(points([(0.0, "a", 1.0, 1.0, 300.0), (0.0, "b", 1.0, 1.0, 500.0)]))
    [paper, strict] = mccandlish((), {0.0: fit(100, 400)}, pooled)
    assert paper.value == pytest.approx(1.0) and paper.verdict == HOLDS
    assert "from 2 run(s)" in paper.reason and "bootstrap over runs" in paper.reason
    assert paper.interval == pytest.approx((0.75, 1.25)) and not math.isnan(strict.value)
