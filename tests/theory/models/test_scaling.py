"""fit_scaling against synthetic curves with known S_min and B_crit."""

import math

import numpy as np
import pytest

from theory.errors import TheoryError
from theory.models.scaling import fit_scaling, largest_useful_batch, regime_of_slope

BATCHES = 2.0 ** np.arange(0, 13)


def curve(s_min, b_crit, b=BATCHES):
    return s_min * (1.0 + b_crit / b)


def test_exact_curve_is_recovered_to_high_precision():
    fit = fit_scaling(BATCHES, curve(1234.0, 87.0), n_boot=50)
    assert fit.s_min == pytest.approx(1234.0, rel=1e-6)
    assert fit.b_crit == pytest.approx(87.0, rel=1e-6)
    assert fit.e_min == pytest.approx(1234.0 * 87.0, rel=1e-6)
    assert fit.residual_sd < 1e-6
    assert not fit.b_crit_at_bound


def test_recovers_parameters_within_5_percent_from_noisy_curves():
    rng = np.random.default_rng(0)
    for s_min, b_crit in [(500.0, 200.0), (3000.0, 30.0), (80.0, 1500.0), (20000.0, 8.0)]:
        for _ in range(5):
            steps = curve(s_min, b_crit) * np.exp(rng.normal(0.0, 0.02, len(BATCHES)))
            fit = fit_scaling(BATCHES, steps, n_boot=20)
            assert fit.s_min == pytest.approx(s_min, rel=0.05)
            assert fit.b_crit == pytest.approx(b_crit, rel=0.05)


def test_90_percent_intervals_cover_truth_in_at_least_85_of_100_repeats():
    rng = np.random.default_rng(1)
    covered = {"s_min": 0, "b_crit": 0}
    ratios = []
    for rep in range(100):
        steps = curve(500.0, 200.0) * np.exp(rng.normal(0.0, 0.05, len(BATCHES)))
        fit = fit_scaling(BATCHES, steps, n_boot=200, level=0.9, seed=rep)
        for key, truth in (("s_min", 500.0), ("b_crit", 200.0)):
            low, high = fit.intervals[key]
            covered[key] += low <= truth <= high
        ratios.append(fit.intervals["b_crit"][1] / fit.intervals["b_crit"][0])
    assert covered["s_min"] >= 85 and covered["b_crit"] >= 85, covered
    # ...and not by being trivially wide: 13 points with 5 % noise pin B_crit within ~15 %
    assert np.median(ratios) < 1.3


def test_intervals_shrink_with_noise_and_contain_the_estimate():
    rng = np.random.default_rng(2)
    noise = rng.normal(0.0, 1.0, len(BATCHES))
    widths = []
    for sd in (0.2, 0.05, 0.01):
        fit = fit_scaling(BATCHES, curve(500.0, 200.0) * np.exp(sd * noise), n_boot=300)
        low, high = fit.intervals["b_crit"]
        assert low < fit.b_crit < high
        widths.append(math.log(high / low))
    assert widths[0] > widths[1] > widths[2]


@pytest.mark.parametrize("resample", ["points", "residuals"])
def test_resampling_over_points(resample):
    rng = np.random.default_rng(3)
    steps = curve(500.0, 200.0) * np.exp(rng.normal(0.0, 0.05, len(BATCHES)))
    fit = fit_scaling(BATCHES, steps, n_boot=300, resample=resample)
    assert fit.resample == resample
    low, high = fit.intervals["b_crit"]
    assert low < 200.0 < high and high / low < 2.0


def test_seed_replicates_resample_whole_seeds_by_default():
    rng = np.random.default_rng(4)
    b = np.tile(BATCHES, 4)
    seeds = np.repeat(np.arange(4), len(BATCHES))
    # one shared offset per seed: points of a seed are correlated, seeds are independent
    offsets = rng.normal(0.0, 0.05, 4)[seeds]
    steps = curve(500.0, 200.0, b) * np.exp(offsets + rng.normal(0.0, 0.01, len(b)))
    fit = fit_scaling(b, steps, seeds=seeds, n_boot=300)
    assert fit.resample == "seeds"
    assert fit.batch_sizes == tuple(BATCHES)
    assert fit.intervals["s_min"][0] < fit.s_min < fit.intervals["s_min"][1]
    # the shared per-seed offset moves S_min, so the seed bootstrap must see that spread
    residual_fit = fit_scaling(b, steps, n_boot=300, resample="residuals")
    seed_width = np.log(fit.intervals["s_min"][1] / fit.intervals["s_min"][0])
    point_width = np.log(residual_fit.intervals["s_min"][1] / residual_fit.intervals["s_min"][0])
    assert seed_width > point_width


def test_regimes_follow_the_documented_slope_thresholds():
    fit = fit_scaling(BATCHES, curve(100.0, 50.0), n_boot=20)
    slopes = -50.0 / (BATCHES + 50.0)
    assert np.allclose(fit.slope(BATCHES), slopes, rtol=1e-5)
    expected = [
        "perfect scaling" if b <= 12.5 else "maximal data parallelism" if b >= 200 else "diminishing returns"
        for b in BATCHES
    ]
    assert list(fit.regimes) == expected
    assert fit.largest_useful_batch == pytest.approx(200.0, rel=1e-5)
    assert largest_useful_batch(10.0) == pytest.approx(40.0)
    assert regime_of_slope(-0.5) == "diminishing returns"
    assert np.allclose(fit.predict([1.0, 64.0]), [5100.0, 178.125], rtol=1e-5)


def test_perfect_scaling_everywhere_leaves_b_crit_unresolved_above():
    fit = fit_scaling([1, 2, 4, 8], [800.0, 400.0, 200.0, 100.0], n_boot=50)
    assert fit.b_crit_at_bound
    assert fit.b_crit > 1000 * 8
    assert fit.intervals["b_crit"][1] == math.inf
    assert set(fit.regimes) == {"perfect scaling"}


def test_flat_curve_leaves_b_crit_unresolved_below():
    fit = fit_scaling([64, 128, 256, 512], [300.0, 300.0, 300.0, 300.0], n_boot=50)
    assert fit.b_crit_at_bound and fit.b_crit < 1.0
    assert fit.intervals["b_crit"][0] == 0.0
    assert fit.s_min == pytest.approx(300.0, rel=1e-3)
    assert set(fit.regimes) == {"maximal data parallelism"}


def test_same_seed_gives_same_intervals():
    steps = curve(500.0, 200.0) * np.exp(np.random.default_rng(5).normal(0.0, 0.05, len(BATCHES)))
    fit = fit_scaling(BATCHES, steps, n_boot=100, seed=7)
    assert fit == fit_scaling(BATCHES, steps, n_boot=100, seed=7)
    assert fit != fit_scaling(BATCHES, steps, n_boot=100, seed=8)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_sizes": [1, 2, 4], "steps": [3, 2]}, "same length"),
        ({"batch_sizes": [1, 2, 4], "steps": [3, float("nan"), 1]}, r"steps\[1\]"),
        ({"batch_sizes": [1, 0, 4], "steps": [3, 2, 1]}, r"batch_sizes must be positive"),
        ({"batch_sizes": [1, 2, 4], "steps": [3, -2, 1]}, r"steps must be positive"),
        ({"batch_sizes": [1, 2, 2, 1], "steps": [3, 2, 2, 3]}, "at least 3 distinct"),
        ({"batch_sizes": [[1, 2, 4]], "steps": [[3, 2, 1]]}, "1-D"),
        ({"batch_sizes": ["a", 2, 4], "steps": [3, 2, 1]}, "batch_sizes"),
        ({"batch_sizes": [1, 2, 4], "steps": [3, 2, 1], "level": 1.5}, "level"),
        ({"batch_sizes": [1, 2, 4], "steps": [3, 2, 1], "n_boot": 0}, "n_boot"),
        ({"batch_sizes": [1, 2, 4], "steps": [3, 2, 1], "resample": "jackknife"}, "resample"),
        ({"batch_sizes": [1, 2, 4], "steps": [3, 2, 1], "resample": "seeds"}, "two distinct seeds"),
        ({"batch_sizes": [1, 2, 4], "steps": [3, 2, 1], "seeds": [0, 1]}, "seeds"),
    ],
)
def test_bad_input_raises_a_clear_error(kwargs, match):
    with pytest.raises(TheoryError, match=match):
        fit_scaling(**kwargs)
