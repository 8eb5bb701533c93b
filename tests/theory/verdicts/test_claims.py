"""Verdict rules on synthetic probe tables and hand-made fits whose answers are known: claims
that hold, one where the theory fails (Lee's mechanism with a lower sparse L), and inconclusive
ones whose intervals straddle the line."""

import math

import numpy as np
import pytest

from theory import TheoryError
from theory.verdicts.claims import (
    FAILS, HOLDS, INCONCLUSIVE, combine, judge, judge_claims, lee_sparsity, mccandlish,
    ordering, ratio_interval, shape, small_batch_slope,
)
from theory.models.predict import MeasuredCurve
from theory.models.scaling import ScalingFit
from theory.verdicts.summaries import summarize

from ..conftest import level_rows, table

BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024)


def fit(s_min, b_crit, s_iv=None, b_iv=None):
    s_iv = s_iv or (s_min, s_min)
    b_iv = b_iv or (b_crit, b_crit)
    return ScalingFit(s_min=s_min, b_crit=b_crit,
                      intervals={"s_min": s_iv, "b_crit": b_iv,
                                 "largest_useful_batch": (4 * b_iv[0], 4 * b_iv[1])},
                      regimes=(), batch_sizes=BATCHES, largest_useful_batch=4 * b_crit,
                      residual_sd=0.0, level=0.9, n_boot=0, resample="seeds", b_crit_at_bound=False)


def curve(sparsity, s_min, b_crit, seeds=(0, 1, 2), noise=0.0, batches=BATCHES):
    gen = np.random.default_rng(int(sparsity * 100))
    b = [x for _ in seeds for x in batches]
    steps = [s_min * (1 + b_crit / x) * math.exp(noise * gen.standard_normal()) for x in b]
    return MeasuredCurve(sparsity, tuple(b), tuple(steps), tuple(s for s in seeds for _ in batches))


def summaries(*levels, n_boot=400):
    rows = []
    for sparsity, L, spread in levels:
        rows += level_rows(sparsity, L=L, delta=2.3, b_simple=481.0 if sparsity == 0 else 390.0,
                           lam=L / 2, spread=spread)
    return summarize(table(rows), n_boot=n_boot)


def by(verdicts, claim, tier, sparsity):
    return next(v for v in verdicts if v.claim == claim and v.tier == tier and v.sparsity == sparsity)


def test_judge_combine_and_ratio_intervals():
    assert judge((0.5, 2.0), (0.1, 10.0)) == HOLDS
    assert judge((11.0, 20.0), (0.1, 10.0)) == FAILS and judge((0.01, 0.05), (0.1, 10.0)) == FAILS
    assert judge((5.0, 20.0), (0.1, 10.0)) == INCONCLUSIVE
    assert judge((math.nan, 1.0), (0.1, 10.0)) == INCONCLUSIVE
    assert judge((2.0, math.inf), (1.0, math.inf)) == HOLDS
    assert combine(HOLDS, HOLDS) == HOLDS and combine(HOLDS, INCONCLUSIVE) == INCONCLUSIVE
    assert combine(INCONCLUSIVE, FAILS, HOLDS) == FAILS
    assert ratio_interval((2.0, 4.0), (1.0, 2.0)) == (1.0, 4.0)
    assert ratio_interval((2.0, 4.0), (0.0, 2.0)) == (1.0, math.inf)


def test_mccandlish_holds_at_the_paper_tier_and_not_strictly_for_sparse():
    s = summaries((0.0, 2.0, 0.0), (0.9, 1.0, 0.0))
    v = mccandlish(s, {0.0: fit(300, 461, b_iv=(400, 530)), 0.9: fit(700, 660, b_iv=(500, 900))})
    dense, sparse = by(v, "mccandlish", "paper", 0.0), by(v, "mccandlish", "paper", 0.9)
    assert dense.value == pytest.approx(481 / 461) and dense.interval == pytest.approx((481 / 530, 481 / 400))
    assert dense.verdict == HOLDS and by(v, "mccandlish", "strict", 0.0).verdict == HOLDS
    assert sparse.value == pytest.approx(390 / 660) and sparse.verdict == HOLDS
    # 390 / 900 = 0.43 < 0.5 < 390 / 500 = 0.78: the strict tier cannot tell
    assert by(v, "mccandlish", "strict", 0.9).verdict == INCONCLUSIVE
    assert "straddles the 2x line" in by(v, "mccandlish", "strict", 0.9).reason
    assert sparse.threshold == (0.1, 10.0) and "within 10x" in sparse.reason


def test_mccandlish_fails_and_is_inconclusive():
    s = summaries((0.0, 2.0, 0.0))
    failing = mccandlish(s, {0.0: fit(300, 20_000, b_iv=(15_000, 30_000))})
    assert by(failing, "mccandlish", "paper", 0.0).verdict == FAILS
    assert "does not predict the critical batch size" in by(failing, "mccandlish", "paper", 0.0).reason
    wide = mccandlish(s, {0.0: fit(300, 461, b_iv=(30, 800))})   # ratio interval [0.6, 16]
    assert by(wide, "mccandlish", "paper", 0.0).verdict == INCONCLUSIVE


def lee_case(l_sparse, s_min_sparse, spread=0.05, s_iv=0.1):
    s = summaries((0.0, 2.0, spread), (0.9, l_sparse, spread))
    fits = {0.0: fit(100, 200, s_iv=(100 * (1 - s_iv), 100 * (1 + s_iv))),
            0.9: fit(s_min_sparse, 200, s_iv=(s_min_sparse * (1 - s_iv), s_min_sparse * (1 + s_iv)))}
    curves = [curve(0.0, 100, 200), curve(0.9, s_min_sparse, 200)]
    return lee_sparsity(s, fits, curves, n_boot=200)


def test_lee_holds_when_L_rises_with_the_steps():
    v = lee_case(l_sparse=4.0, s_min_sparse=210)
    paper = by(v, "lee_sparsity (S_min ratio)", "paper", 0.9)
    assert paper.value == pytest.approx(2.0) and paper.verdict == HOLDS
    assert paper.interval[0] > 1 and paper.threshold == (1.0, math.inf)
    strict = by(v, "lee_sparsity (S_min ratio)", "strict", 0.9)
    assert strict.value == pytest.approx(2.0 / 2.1) and strict.verdict == HOLDS
    median = by(v, "lee_sparsity (median step ratio)", "paper", 0.9)
    assert median.verdict == HOLDS and "measured median step ratio 2.1" in median.reason


def test_lee_fails_when_the_sparse_network_is_smoother_but_slower():
    # the MLP: L_s / L_d about 0.5 while sparse needs 2.5x the steps
    v = lee_case(l_sparse=1.0, s_min_sparse=250)
    paper = by(v, "lee_sparsity (S_min ratio)", "paper", 0.9)
    assert paper.verdict == FAILS and paper.value == pytest.approx(0.5)
    assert "L_s/L_d = 0.5" in paper.reason and "does not explain this workload" in paper.reason
    assert by(v, "lee_sparsity (S_min ratio)", "strict", 0.9).verdict == FAILS


def test_lee_inconclusive_when_the_L_ratio_straddles_one():
    # seeds disagree (L x 0.7, 1.0, 1.3): the L ratio's interval contains 1
    v = lee_case(l_sparse=2.2, s_min_sparse=200, spread=0.3)
    paper = by(v, "lee_sparsity (S_min ratio)", "paper", 0.9)
    assert paper.interval[0] < 1 < paper.interval[1]
    assert paper.verdict == INCONCLUSIVE
    # and when the measured ratio itself has no direction
    v = lee_case(l_sparse=4.0, s_min_sparse=105, s_iv=0.2)
    paper = by(v, "lee_sparsity (S_min ratio)", "paper", 0.9)
    assert paper.verdict == INCONCLUSIVE and "no direction" in paper.reason


def test_lee_ordering_across_four_levels():
    fits = {0.0: fit(100, 200, (95, 105)), 0.5: fit(150, 200, (140, 160)),
            0.7: fit(200, 200, (190, 210)), 0.9: fit(250, 200, (240, 260))}
    curves = [curve(s, f.s_min, 200) for s, f in fits.items()]
    rising = summaries((0.0, 2.0, 0.02), (0.5, 3.0, 0.02), (0.7, 4.0, 0.02), (0.9, 5.0, 0.02))
    v = lee_sparsity(rising, fits, curves, n_boot=200)
    assert all(x.verdict == HOLDS for x in v if x.tier == "paper")
    assert "ordered alike" in by(v, "lee_sparsity (S_min ratio)", "paper", 0.7).reason
    crossed = summaries((0.0, 2.0, 0.02), (0.5, 5.0, 0.02), (0.7, 4.0, 0.02), (0.9, 3.0, 0.02))
    v = lee_sparsity(crossed, fits, curves, n_boot=200)
    # every level is slower and has a larger L than dense, but the order across levels is wrong
    paper = by(v, "lee_sparsity (S_min ratio)", "paper", 0.9)
    assert paper.verdict == FAILS and "ordered differently" in paper.reason


def test_ordering_rules():
    one = (1.0, 1.0)
    assert ordering([one, (1.5, 1.7), (2.0, 2.2)], [one, (1.2, 1.3), (1.4, 1.5)])[0] == HOLDS
    assert ordering([one, (1.5, 1.7), (1.2, 1.3)], [one, (1.2, 1.3), (1.4, 1.5)])[0] == FAILS
    assert "not monotone" in ordering([one, (1.5, 1.7), (1.2, 1.3)], [one, (2, 3), (1.4, 1.5)])[1]
    assert ordering([one, (1.5, 1.7), (1.6, 2.2)], [one, (1.2, 1.3), (1.4, 1.5)])[0] == INCONCLUSIVE


def test_shape_slope_and_plateau():
    perfect = curve(0.0, 100, 1e5)            # slope -1 at every measured batch size
    flat = curve(0.5, 100, 10)                # mostly plateau
    v = shape({0.0: fit(100, 1e5), 0.5: fit(100, 10)}, [perfect, flat])
    assert by(v, "shape_slope", "paper", 0.0).verdict == HOLDS
    assert by(v, "shape_slope", "paper", 0.0).value == pytest.approx(-1.0, abs=0.01)
    assert by(v, "shape_slope", "paper", 0.5).verdict == FAILS
    assert by(v, "shape_plateau", "paper", 0.5).verdict == HOLDS
    assert by(v, "shape_plateau", "paper", 0.5).value == pytest.approx(1 + 10 / 1024)
    assert by(v, "shape_plateau", "paper", 0.0).verdict == FAILS     # still scaling at B = 1024


def test_shape_slope_is_inconclusive_with_few_noisy_points():
    noisy = curve(0.0, 100, 1e5, seeds=(0,), noise=0.15)
    slope, interval = small_batch_slope(noisy)
    assert interval[0] < -1.1 or interval[1] > -0.8
    v = shape({0.0: fit(100, 1e5)}, [noisy])
    assert by(v, "shape_slope", "paper", 0.0).verdict == INCONCLUSIVE
    two_points = curve(0.0, 100, 1e5, seeds=(0,), batches=(8, 16))
    assert small_batch_slope(two_points)[1] == (-math.inf, math.inf)


def test_judge_claims_lists_every_scored_claim():
    s = summaries((0.0, 2.0, 0.05), (0.9, 4.0, 0.05))
    fits = {0.0: fit(100, 461, (90, 110), (400, 530)), 0.9: fit(210, 390, (190, 230), (300, 500))}
    v = judge_claims(s, fits, [curve(0.0, 100, 461), curve(0.9, 210, 390)], n_boot=100)
    assert {x.claim for x in v} == {"mccandlish", "lee_sparsity (S_min ratio)",
                                    "lee_sparsity (median step ratio)", "shape_slope", "shape_plateau"}
    assert all(x.verdict in (HOLDS, FAILS, INCONCLUSIVE) for x in v)
    only_dense = judge_claims(s, {0.0: fits[0.0]}, [curve(0.0, 100, 461)])
    assert not any(x.claim.startswith("lee") for x in only_dense)
    with pytest.raises(TheoryError, match="no measured curve"):
        shape(fits, [curve(0.0, 100, 461)])
    mixed = summaries((0.0, 2.0, 0.05), n_boot=50) + summaries((0.9, 4.0, 0.05), n_boot=60)
    with pytest.raises(TheoryError, match="one call"):
        lee_sparsity(mixed, fits, [curve(0.0, 100, 461), curve(0.9, 210, 390)])
