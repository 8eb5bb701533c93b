"""The design's variance components against data simulated with known components (their
expectations and the closed-form ANOVA sums on a hand-sized table), and the sample sizes against
the normal-approximation formula n = k V ((z_{1-alpha/2} + z_power) / delta)^2."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from theory.errors import TheoryError
from theory.verdicts.design import (VarianceComponents, sample_size, sample_sizes,
                                    variance_components)


def simulate(rng, runs=400, points=6, between=0.04, within=0.09, shared=0.03,
             levels=(0.0, 0.9), level_means=(1.0, 1.3)):
    """Nested data: run (seed, trial) at each level; a run's effect is the sum of a part it
    shares with its partner at the other level (variance ``shared``) and its own part."""
    rows = []
    common = rng.normal(0, math.sqrt(shared), runs)
    for level, mu in zip(levels, level_means):
        own = rng.normal(0, math.sqrt(between - shared), runs)
        for i in range(runs):
            for j in range(points):
                rows.append((level, 32, 0, i, 1000 + 250 * j,
                             mu + common[i] + own[i] + rng.normal(0, math.sqrt(within))))
    return pd.DataFrame(rows, columns=["sparsity", "batch_size", "seed", "trial", "step", "log"])


def test_components_recover_the_simulated_ones():
    c = variance_components(simulate(np.random.default_rng(1)))
    assert c.runs == 800 and c.points == 4800 and c.cells == 2 and c.pairs == 400
    assert c.within == pytest.approx(0.09, rel=0.05)
    assert c.between == pytest.approx(0.04, rel=0.15)
    assert c.cov_paired == pytest.approx(0.03, rel=0.2)
    assert c.paired_correlation == pytest.approx(0.75, abs=0.12)
    # a run mean of 6 points: sigma_b^2 + sigma_w^2 / 6
    assert c.run_mean_sd ** 2 == pytest.approx(0.04 + 0.09 / 6, rel=0.15)


def test_anova_sums_by_hand():
    # one cell, runs of 2 and 3 points: ybar = (1, 4), grand mean (1+1+3+4+5)/5 = 2.8
    f = pd.DataFrame({"sparsity": 0.0, "batch_size": 8, "seed": 0, "trial": [0, 0, 1, 1, 1],
                      "log": [0.0, 2.0, 3.0, 4.0, 5.0]})
    c = variance_components(f, reference=None)
    ms_w = (1 + 1 + 1 + 0 + 1) / (5 - 2)
    ms_b = (2 * (1 - 2.8) ** 2 + 3 * (4 - 2.8) ** 2) / 1
    n0 = 5 - (4 + 9) / 5
    assert c.within == pytest.approx(ms_w)
    assert c.between == pytest.approx((ms_b - ms_w) / n0)
    assert math.isnan(c.cov_paired) and c.pairs == 0
    assert c.run_variance(4) == pytest.approx(c.between + ms_w / 4)


def test_one_point_per_run_leaves_between_only():
    rng = np.random.default_rng(2)
    f = pd.DataFrame({"sparsity": 0.0, "batch_size": 8, "seed": 0, "trial": range(50),
                      "log": rng.normal(0, 1, 50)})
    c = variance_components(f, reference=None)
    assert math.isnan(c.within)
    assert c.between == pytest.approx(np.var(f.log, ddof=1))


def test_bad_input_names_what_is_missing():
    with pytest.raises(TheoryError, match="lacks column"):
        variance_components(pd.DataFrame({"log": [1.0]}))
    one = pd.DataFrame({"sparsity": 0.0, "batch_size": 8, "seed": 0, "trial": 0,
                        "log": [1.0, 2.0]})
    with pytest.raises(TheoryError, match="two or more runs"):
        variance_components(one)


@pytest.mark.parametrize("paired, k", [(True, 1), (False, 2)])
def test_sample_size_is_the_normal_formula(paired, k):
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)
    v, delta = 0.18 ** 2, math.log(1.1)
    assert sample_size(v, delta, 0.9, 0.8, paired) == math.ceil(k * v * z * z / delta ** 2)
    # the pilot: an unpaired design needs about 45 runs a level
    assert sample_size(0.18 ** 2, delta, 0.9, 0.8, paired=False) == 45


def test_t_quantiles_satisfy_their_own_equation():
    v, delta = 0.05, 0.2
    n = sample_size(v, delta, 0.95, 0.9, True, t_quantiles=True)
    q = lambda m: stats.t.ppf(0.975, m - 1) + stats.t.ppf(0.9, m - 1)
    assert v * q(n) ** 2 / delta ** 2 <= n
    assert v * q(n - 1) ** 2 / delta ** 2 > n - 1
    assert n > sample_size(v, delta, 0.95, 0.9, True)


def test_sample_sizes_of_runs_and_pairs_per_points():
    c = VarianceComponents(between=0.02, within=0.1, cov_paired=0.015, runs=6, points=18,
                           cells=2, pairs=3, points_per_run=3, run_mean_sd=0.2)
    rows = sample_sizes(c, math.log(1.1), (3, 12))
    z2 = (stats.norm.ppf(0.95) + stats.norm.ppf(0.8)) ** 2
    d2 = math.log(1.1) ** 2
    # unpaired: V(m) per run, two levels' means (k = 2); paired: V_d(m) per pair (k = 1)
    want = {(3.0, False): 0.02 + 0.1 / 3, (12.0, False): 0.02 + 0.1 / 12,
            (3.0, True): 2 * 0.005 + 0.2 / 3, (12.0, True): 2 * 0.005 + 0.2 / 12}
    assert {(r.points, r.paired) for r in rows} == set(want)
    for r in rows:
        assert r.variance == pytest.approx(want[(r.points, r.paired)])
        k = 1 if r.paired else 2
        assert r.n == math.ceil(k * want[(r.points, r.paired)] * z2 / d2)
    with pytest.raises(TheoryError, match="points per run"):
        sample_sizes(c, 0.1, (0,))
    with pytest.raises(TheoryError, match="delta"):
        sample_size(0.1, 0.0)
