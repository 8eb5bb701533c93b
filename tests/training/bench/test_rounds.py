"""The interleaved-rounds protocol of the trainer benchmark, on fake trainers whose step loops
take known times (no clock is read)."""

import math

import pytest

from training.bench.rounds import MAX_STEPS, Rounds, interleave, median_index, warm_up


def fake(per_step, order, name, first_extra=0.0):
    """A run whose step loop takes ``per_step(k)`` seconds a step in its k-th call (0-based),
    the first call ``first_extra`` more (one-off costs), recording (name, steps) in ``order``."""
    calls = [0]

    def run(steps):
        k = calls[0]
        calls[0] += 1
        order.append((name, steps))
        return steps * per_step(k) + (first_extra if k == 0 else 0.0)

    return run


def test_rounds_interleave_after_each_trainers_warm_up():
    order = []
    runs = {"plain": fake(lambda k: 0.01, order, "plain"),
            "vectorized": fake(lambda k: 0.05, order, "vectorized")}
    got = interleave(runs, seconds=3.0, rounds=3)
    # a round is 1 s a trainer: warm-up runs grow from one step until one lasts a quarter of it
    warm = [("plain", 1), ("plain", 50), ("vectorized", 1), ("vectorized", 10)]
    assert order[:4] == warm
    assert got.steps == {"plain": 100, "vectorized": 20}
    assert order[4:] == [("plain", 100), ("vectorized", 20)] * 3
    assert got.order == tuple(order) and got.count == 3
    assert got.rates("plain") == pytest.approx([100.0] * 3)
    assert got.rates("vectorized") == pytest.approx([20.0] * 3)


def test_each_round_has_its_own_rates():
    """Load that changes between rounds changes that round's rates only: a round's two rates are
    measured together, so the ratio of each round is of the same moment."""
    order = []
    # calls 0 and 1 are the warm-up: call 3 is the second round, where both run at half speed
    runs = {"plain": fake(lambda k: 0.01 * (2.0 if k == 3 else 1.0), order, "plain"),
            "vectorized": fake(lambda k: 0.04 * (2.0 if k == 3 else 1.0), order, "vectorized")}
    got = interleave(runs, seconds=3.0, rounds=3)
    assert got.rates("plain") == pytest.approx([100.0, 50.0, 100.0])
    assert got.rates("vectorized") == pytest.approx([25.0, 12.5, 25.0])
    ratios = [v / p for v, p in zip(got.rates("vectorized"), got.rates("plain"))]
    assert ratios == pytest.approx([0.25] * 3)


def test_one_off_costs_of_the_first_run_only_shorten_the_warm_up_estimate():
    """A first run paying 1 s once: the warm-up grows the steps from the next run's time, and
    the rounds' step count comes from a run without the one-off cost."""
    order = []
    steps = warm_up(fake(lambda k: 0.002, [], "v", first_extra=1.0), 1.0, "v", order)
    assert order[0] == ("v", 1)
    # the first run (1.002 s) lasts a whole round by itself: one step a round
    assert steps == 1
    order.clear()
    steps = warm_up(fake(lambda k: 0.002, [], "v", first_extra=0.1), 1.0, "v", order)
    # 0.102 s < 0.25 s: grown to the half round at that (over-)estimate, 5 steps, then again
    assert [s for _, s in order] == [1, 5, 250] and steps == 500


def test_a_first_run_slowed_by_one_off_costs_does_not_set_the_rounds_steps():
    """A one-step run lasting 0.3 s of a 1 s round, 0.298 s of it once: it alone would give 3
    steps a round; the warm-up goes on until a later run lasts a quarter round."""
    order = []
    steps = warm_up(fake(lambda k: 0.002, [], "v", first_extra=0.298), 1.0, "v", order)
    assert [s for _, s in order] == [1, 2, 250] and steps == 500


def test_a_step_longer_than_a_round_runs_once_a_round():
    order = []
    runs = {"plain": fake(lambda k: 5.0, order, "plain"),
            "vectorized": fake(lambda k: 70.0, order, "vectorized")}
    got = interleave(runs, seconds=2.0, rounds=3)
    assert got.steps == {"plain": 1, "vectorized": 1}
    assert order == [("plain", 1), ("vectorized", 1)] + [("plain", 1), ("vectorized", 1)] * 3


def test_a_loop_too_fast_for_the_clock_grows_tenfold_and_stops_at_the_cap():
    order = []
    got = warm_up(fake(lambda k: 0.0, [], "p"), 1.0, "p", order)
    steps = [s for _, s in order]
    assert steps[:3] == [1, 10, 100] and steps[-1] == MAX_STEPS and got == MAX_STEPS


@pytest.mark.parametrize("seconds, rounds, message", [(1.0, 0, "rounds must be >= 1"),
                                                      (0.0, 3, "seconds must be > 0")])
def test_interleave_refuses_no_rounds_or_no_time(seconds, rounds, message):
    with pytest.raises(ValueError, match=message):
        interleave({"p": lambda s: 1.0}, seconds, rounds)


def test_median_index_is_a_measured_round():
    assert median_index([1.7, 1.1, 1.3]) == 2
    assert median_index([3.0]) == 0
    assert median_index([4.0, 1.0, 3.0, 2.0]) == 3   # the lower median of an even count
    with pytest.raises(ValueError):
        median_index([])


def test_rates_of_a_zero_time_loop_are_infinite():
    assert Rounds({"p": 4}, {"p": (2.0, 0.0)}).rates("p") == [2.0, math.inf]
