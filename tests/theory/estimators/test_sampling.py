"""Split estimates from samples: exact unbiasedness by enumerating every sample of a small
population, the jackknife against a brute-force delete-a-group recomputation, and the standard
error against the spread over many samples."""

import itertools
import math

import numpy as np
import pytest
import torch

from theory import TheoryError
from theory.estimators.sampling import GroupMoments, noise_scale, split_coefficients, split_estimate, to_split


def population(n, dim, seed, shift=0.7):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=gen, dtype=torch.float64) + shift


def truth(g):
    mean = g.mean(0)
    return float(mean @ mean), float((g - mean).pow(2).sum(1).mean())  # divide by N


def moments(sample, groups):
    return GroupMoments.of_chunks([[part] for part in torch.tensor_split(sample, groups)])


def test_unbiased_over_every_sample_without_replacement():
    g = population(8, 3, seed=0)
    g_sq, trace = truth(g)
    for n in (2, 3, 5, 8):
        ests = [split_estimate(moments(g[list(idx)], 1), 8)
                for idx in itertools.combinations(range(8), n)]
        assert np.mean([e.g_sq for e in ests]) == pytest.approx(g_sq, rel=1e-12, abs=1e-14)
        assert np.mean([e.trace_sigma for e in ests]) == pytest.approx(trace, rel=1e-12)
    # the finite-set statistics are biased: |m|^2 overshoots by (1 - n/N) S^2 / n
    ests = [split_estimate(moments(g[list(idx)], 1), 8) for idx in itertools.combinations(range(8), 3)]
    s2 = trace * 8 / 7
    assert np.mean([e.finite_g_sq for e in ests]) == pytest.approx(g_sq + (1 - 3 / 8) * s2 / 3, rel=1e-12)


def test_whole_population_is_exact_with_zero_error():
    g = population(30, 4, seed=1)
    est = split_estimate(moments(g, 6), 30)
    g_sq, trace = truth(g)
    assert est.g_sq == pytest.approx(g_sq, rel=1e-13) and est.trace_sigma == pytest.approx(trace, rel=1e-13)
    assert (est.finite_g_sq, est.finite_trace_sigma) == (est.g_sq, est.trace_sigma)
    assert est.g_sq_se == est.trace_sigma_se == est.b_simple_se == 0.0
    assert est.b_simple == pytest.approx(trace / g_sq, rel=1e-13)


def test_group_moments_merge_to_the_sample_statistics():
    g = population(53, 5, seed=2)
    n, mean, m2 = moments(g, 7).total()
    assert n == 53
    assert torch.allclose(mean, g.mean(0), rtol=1e-14, atol=1e-15)
    assert m2 == pytest.approx(float((g - g.mean(0)).pow(2).sum()), rel=1e-13)


def test_jackknife_equals_brute_force_delete_a_group():
    g, big_n, k = population(40, 3, seed=3), 500, 8
    est = split_estimate(moments(g, k), big_n)
    reps = []
    for part in torch.tensor_split(torch.arange(40), k):
        keep = torch.ones(40, dtype=torch.bool)
        keep[part] = False
        rest = g[keep]
        mean = rest.mean(0)
        n = rest.shape[0]
        s2 = float((rest - mean).pow(2).sum()) / (n - 1)
        g_sq = float(mean @ mean) - (1 - n / big_n) * s2 / n
        trace = (big_n - 1) / big_n * s2
        reps.append((g_sq, trace, trace / g_sq))
    reps = np.array(reps)
    factor = (1 - 40 / big_n) * (k - 1) / k
    expected = np.sqrt(factor * ((reps - reps.mean(0)) ** 2).sum(0))
    np.testing.assert_allclose([est.g_sq_se, est.trace_sigma_se, est.b_simple_se], expected, rtol=1e-10)


def test_standard_errors_match_the_spread_over_samples():
    g = population(4000, 6, seed=4, shift=0.3)
    g_sq, trace = truth(g)
    gen = torch.Generator().manual_seed(5)
    ests = [split_estimate(moments(g[torch.randperm(4000, generator=gen)[:200]], 20), 4000)
            for _ in range(400)]
    for name, exact in (("g_sq", g_sq), ("trace_sigma", trace)):
        values = np.array([getattr(e, name) for e in ests])
        se = np.sqrt(np.mean([getattr(e, f"{name}_se") ** 2 for e in ests]))
        assert abs(values.mean() - exact) < 4 * values.std() / math.sqrt(len(values)), name
        # the jackknife is conservative (Efron and Stein 1981) but close
        assert 0.9 < se / values.std(ddof=1) < 1.3, name


def test_linear_map_and_noise_scale():
    assert split_coefficients(10, 10) == (0.0, 1.0)
    bias, scale = split_coefficients(10, 100)
    assert bias == pytest.approx(0.9 / 9) and scale == pytest.approx(99 / 100 * 10 / 9)
    g, t = to_split(np.array([2.0, 3.0]), np.array([9.0, 0.0]), 10, 100)
    np.testing.assert_allclose(g, [2.0 - 0.9, 3.0]) and np.testing.assert_allclose(t, [9.9, 0.0])
    assert noise_scale(4.0, 2.0) == 2.0
    assert noise_scale(4.0, -1.0) == math.inf and noise_scale(4.0, 0.0) == math.inf
    assert math.isnan(noise_scale(0.0, 0.0))
    np.testing.assert_array_equal(noise_scale([4.0, 1.0], [2.0, -3.0]), [2.0, math.inf])


def test_noisy_sample_reports_unresolved_noise_scale():
    # a sample whose mean is zero: the |G|^2 estimate is -bias T_n < 0, so B_simple is inf
    g = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]], dtype=torch.float64)
    est = split_estimate(moments(g, 2), 400)
    assert est.finite_g_sq == 0.0 and est.g_sq == pytest.approx(-(1 - 4 / 400) / 3 * 1.0)
    assert est.b_simple == math.inf and math.isnan(est.b_simple_se)


def test_bad_sizes_are_named():
    with pytest.raises(TheoryError, match="sample size"):
        split_coefficients(11, 10)
    with pytest.raises(TheoryError, match="n >= 2"):
        split_coefficients(1, 10)
