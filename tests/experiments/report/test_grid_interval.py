"""Intervals on a batch-size grid state the grid's resolution (issue 40: `sparsescale advise`
printed "256 [256, 256]" where a doubling grid cannot tell 256 from 181 or 362)."""

import math

from experiments.report.formatting import grid_interval


def test_one_grid_point_is_widened_to_the_midpoints_of_its_neighbours():
    # 256 / sqrt 2 = 181.02, 256 sqrt 2 = 362.04
    assert grid_interval(256, 256, 256) == "256 (grid of doublings: between 181 and 362)"
    assert math.isclose(256 / math.sqrt(2), 181.02, rel_tol=1e-4)


def test_an_interval_over_several_points_keeps_its_ends_and_states_the_edges():
    assert grid_interval(256, 128, 256) == "256 [128, 256] (grid of doublings: between 90.5 and 362)"
    # another grid ratio: x4 steps, edges at half and twice
    assert grid_interval(64, 64, 64, ratio=4.0) == "64 (grid of x4 steps: between 32 and 128)"


def test_a_lower_bound_has_no_upper_edge_and_zero_is_below_the_grid():
    assert grid_interval(64, 32, 64, open_above=True) == "≥ 64 [32, 64] (grid of doublings: 22.6 or more)"
    assert grid_interval(0, 0, 0) == "0 (below the grid's first batch size)"
    assert grid_interval(16, 0, 16) == "16 [0, 16] (grid of doublings: between 0 and 22.6)"
    assert grid_interval(float("nan"), 1, 2) == "–"
