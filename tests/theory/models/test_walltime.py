"""Time-to-result predictions on synthetic curves and cost models with known optima."""

import math

import pytest

from theory.models.walltime import WallTimeError, format_table, predict_time_to_result
from training.distributed.costmodel import CostModel

S_MIN, B_CRIT = 1000, 256
BATCHES = [2 ** i for i in range(3, 13)]  # 8 .. 4096


def curve(s_min=S_MIN, b_crit=B_CRIT):
    """S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018), exact integers on these B."""
    return {b: s_min + s_min * b_crit // b for b in BATCHES}


def test_points_follow_the_closed_form():
    cost = CostModel(t_fixed=1e-3, t_example=1e-5, alpha=1e-4, beta=1e-9, n_params=10_000)
    pred = predict_time_to_result(curve(), cost, workers=(1, 4))
    p = pred.at(64, 4)
    steps = S_MIN * (1 + B_CRIT / 64)
    step = 1e-3 + 1e-5 * 16 + 6 * 1e-4 + 1.5 * 1e-9 * 40_000
    assert p.steps == steps
    assert p.time == pytest.approx(steps * step, rel=1e-12)
    assert p.worker_seconds == pytest.approx(4 * steps * step, rel=1e-12)
    assert len(pred.points) == 2 * len(BATCHES)


def test_fastest_batch_is_the_continuous_optimum():
    """Without communication T(B, k) = S_min (1 + Bc / B)(t_f + t_e B / k) is minimal at
    B* = sqrt(Bc t_f k / t_e); choose constants so that B* is a power of two."""
    t_e = 1e-6
    t_f = 256 * t_e  # B* = sqrt(256 * 256 * k) = 256 sqrt(k)
    cost = CostModel(t_fixed=t_f, t_example=t_e, alpha=0.0, beta=0.0, n_params=1)
    pred = predict_time_to_result(curve(), cost, workers=(1, 4, 16))
    for k in (1, 4, 16):
        assert pred.fastest(k).batch_size == 256 * math.isqrt(k)
    assert pred.fastest().workers == 16  # free communication: more workers are always faster


def test_communication_can_make_one_worker_fastest():
    cost = CostModel(t_fixed=1e-4, t_example=1e-6, alpha=1.0, beta=0.0, n_params=1)
    pred = predict_time_to_result(curve(), cost, workers=(1, 2))
    assert pred.fastest().workers == 1
    best = pred.best_by_workers()
    assert [p.workers for p in best] == [1, 2]
    assert best[1].time > best[0].time


def test_skips_unreached_and_indivisible_batches():
    steps = {6: 100, 8: None, 16: 50}
    cost = CostModel(1e-3, 1e-5, 0.0, 0.0, 1)
    pred = predict_time_to_result(steps, cost, workers=(1, 4))
    assert sorted((p.batch_size, p.workers) for p in pred.points) == [(6, 1), (16, 1), (16, 4)]


@pytest.mark.parametrize("steps, workers, match", [
    ({}, (1,), "empty"),
    ({8: 10}, (0,), "workers"),
    ({0: 10}, (1,), "batch sizes"),
    ({8: -1}, (1,), r"steps_to_result\[8\]"),
    ({6: 10}, (4,), "divisible"),
])
def test_bad_input(steps, workers, match):
    with pytest.raises(WallTimeError, match=match):
        predict_time_to_result(steps, CostModel(1e-3, 1e-5, 0.0, 0.0, 1), workers)


def test_table_has_every_batch_and_worker_count():
    cost = CostModel(t_fixed=1e-3, t_example=1e-5, alpha=1e-4, beta=1e-9, n_params=10_000)
    pred = predict_time_to_result(curve(), cost, workers=(1, 2, 4))
    text = format_table(pred)
    assert "| k = 1 | k = 2 | k = 4 |" in text
    for b in BATCHES:
        assert f"\n| {b} | {curve()[b]} |" in text
    best = pred.fastest(2)
    assert f"\n| 2 | {best.batch_size} | {best.batch_size // 2} | {best.steps} |" in text
    with pytest.raises(WallTimeError, match="workers=3"):
        pred.fastest(3)
