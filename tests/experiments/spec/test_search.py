"""Quasi-random search: scales, determinism, same points at every batch size, edge flag."""

import math

import numpy as np
import pytest
from scipy.stats import qmc

from experiments.spec.search import at_edge, from_scale, sample, to_scale, unit_points
from experiments.spec.study import Dimension

LR = Dimension("log", 1e-4, 10.0)
MU = Dimension("reverse-log", 0.9, 0.9999)
EF = Dimension("linear", 0.0, 0.5)


def test_scales_closed_forms():
    assert to_scale(0.0, LR) == pytest.approx(1e-4) and to_scale(1.0, LR) == pytest.approx(10.0)
    assert to_scale(0.5, LR) == pytest.approx(math.sqrt(1e-4 * 10.0))
    # reverse-log: 1 - mu is log-uniform between 0.1 and 0.0001
    assert to_scale(0.5, MU) == pytest.approx(1 - math.sqrt(0.1 * 0.0001))
    assert to_scale(0.25, EF) == pytest.approx(0.125)
    for dim in (LR, MU, EF):
        for u in (0.0, 0.3, 0.9):
            assert from_scale(to_scale(u, dim), dim) == pytest.approx(u, abs=1e-12)


def test_points_are_scrambled_sobol_and_deterministic():
    u = unit_points(16, 3, seed=5)
    assert np.array_equal(u, unit_points(16, 3, seed=5))
    assert not np.array_equal(u, unit_points(16, 3, seed=6))
    # a scrambled Sobol prefix of 16 points is far more uniform than i.i.d. draws
    iid = np.random.default_rng(0).random((16, 3))
    assert qmc.discrepancy(u) < qmc.discrepancy(iid)
    # each 1-D projection has exactly one point in each of the 16 bins (0,m,s)-net property
    for j in range(3):
        assert sorted(np.floor(u[:, j] * 16).astype(int)) == list(range(16))


def test_sample_fixed_dims_take_no_coordinate_and_relative_decay():
    space = {"lr": LR, "momentum": Dimension("linear", 0.9, 0.9),
             "decay_steps": Dimension("linear", 0.5, 1.0, relative=True)}
    pts = sample(space, 8, seed=0, max_steps=1000)
    u = unit_points(8, 2, seed=0)
    for p, row in zip(pts, u):
        assert p["lr"] == pytest.approx(to_scale(row[0], LR))
        assert p["momentum"] == 0.9 and p["end_factor"] == 1.0
        assert p["decay_steps"] == round(1000 * (0.5 + 0.5 * row[1]))
    assert sample(space, 8, seed=0, max_steps=1000) == pts


def test_same_points_at_every_batch_size(tiny_toml):
    from experiments import load_spec, plan

    groups = plan(load_spec(tiny_toml))
    lrs = {tuple(t["lr"] for t in g.trials) for g in groups}
    assert len(lrs) == 1 and len(groups) == 6
    assert len({g.key for g in groups}) == 6


def test_sgd_records_zero_momentum():
    pts = sample({"lr": LR, "momentum": MU}, 4, seed=0, momentum_used=False)
    assert all(p["momentum"] == 0.0 for p in pts)


def test_edge_flag_outer_ten_percent_of_log_range():
    # log10 range is [-4, 1]: the outer 10 % are below 10**-3.5 and above 10**0.5
    assert at_edge(10 ** -3.6, LR) and at_edge(10 ** 0.6, LR)
    assert not at_edge(10 ** -3.4, LR) and not at_edge(10 ** 0.4, LR)
    assert not at_edge(0.1, Dimension("linear", 0.1, 0.1))


def test_adam_keys_are_drawn_after_the_others_and_train_as_trials():
    """beta1 / beta2 on a reverse-log scale (1 - beta log-uniform), weight decay on a log one,
    Sobol coordinates in the order of SEARCH_KEYS; every point is a valid ``training.Trial``."""
    import training

    b1, b2 = Dimension("reverse-log", 0.5, 0.99), Dimension("reverse-log", 0.9, 0.9999)
    wd = Dimension("log", 1e-5, 1e-1)
    space = {"lr": LR, "beta1": b1, "beta2": b2, "eps": Dimension("linear", 1e-8, 1e-8),
             "weight_decay": wd}
    pts = sample(space, 8, seed=3, momentum_used=False)
    u = unit_points(8, 4, seed=3)
    for p, row in zip(pts, u):
        assert p["lr"] == pytest.approx(to_scale(row[0], LR))
        assert 1 - p["beta1"] == pytest.approx(0.5 * (0.01 / 0.5) ** row[1])
        assert 1 - p["beta2"] == pytest.approx(0.1 * (1e-4 / 0.1) ** row[2])
        assert p["weight_decay"] == pytest.approx(1e-5 * 1e4 ** row[3])
        assert p["eps"] == 1e-8 and p["momentum"] == 0.0
        assert training.Trial.from_dict(p).beta2 == p["beta2"]
