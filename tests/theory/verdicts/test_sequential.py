"""Group-sequential boundaries against published constants (Jennison and Turnbull 2000,
tables 2.1 and 2.3), their crossing probability against a Monte Carlo of the Brownian looks,
and the decision at a look against the t test computed here."""

import math

import numpy as np
import pytest
from scipy import stats

from theory.errors import TheoryError
from theory.verdicts.sequential import boundary_constants, crossing_probability, look


@pytest.mark.parametrize("boundary, looks, alpha, first, last", [
    ("pocock", 5, 0.05, 2.413, 2.413),
    ("obrien_fleming", 5, 0.05, 2.040 * math.sqrt(5), 2.040),
    ("pocock", 2, 0.05, 2.178, 2.178),
    ("obrien_fleming", 2, 0.05, 2.797, 1.977),
    ("pocock", 3, 0.05, 2.289, 2.289),
    ("obrien_fleming", 4, 0.05, 2.024 * 2, 2.024),
    ("pocock", 1, 0.05, 1.960, 1.960),
])
def test_published_constants(boundary, looks, alpha, first, last):
    c = boundary_constants(boundary, looks, alpha)
    assert len(c) == looks
    assert c[0] == pytest.approx(first, abs=2e-3)
    assert c[-1] == pytest.approx(last, abs=2e-3)


def test_crossing_probability_matches_monte_carlo():
    rng = np.random.default_rng(0)
    z = np.cumsum(rng.standard_normal((200_000, 3)), axis=1) / np.sqrt([1, 2, 3])
    bounds = (2.5, 2.2, 2.0)
    mc = np.mean((np.abs(z) >= bounds).any(axis=1))
    assert crossing_probability(bounds) == pytest.approx(mc, abs=3e-3)


def test_look_is_the_t_test_at_the_nominal_level():
    d = np.array([0.12, 0.05, 0.2, 0.08, 0.15, 0.11])
    r = look(d, 2, 3, "pocock", 0.1)
    c = boundary_constants("pocock", 3, 0.1)[1]
    se = d.std(ddof=1) / math.sqrt(6)
    assert r.statistic == pytest.approx(d.mean() / se)
    assert r.nominal == pytest.approx(2 * stats.norm.sf(c))
    half = stats.t.isf(r.nominal / 2, 5) * se
    assert r.interval == pytest.approx((d.mean() - half, d.mean() + half))
    assert r.stop and r.why == "crossed"
    # no effect: not crossed; early looks go on, the last stops; a met resolution stops
    flat = np.array([0.1, -0.1, 0.05, -0.04, 0.02, -0.03])
    assert not look(flat, 1, 3).stop
    assert look(flat, 3, 3).why == "last look"
    assert look(flat, 1, 3, resolution=1.0).why == "resolved"


def test_bad_input():
    with pytest.raises(TheoryError, match="boundary must be one of"):
        boundary_constants("haybittle", 3)
    with pytest.raises(TheoryError, match="at most looks"):
        look([0.1, 0.2], 4, 3)
    with pytest.raises(TheoryError, match="two or more"):
        look([0.1], 1, 3)
