"""Piecewise-constant batch-size schedules: lookup, examples consumed, bad input."""

import pytest

from training import ConfigError
from training.schedules.batch_schedule import BatchSchedule, BatchSegment


def test_segments_are_looked_up_by_step_and_count_examples():
    sched = BatchSchedule((BatchSegment(0, 8), BatchSegment(5, 32, 4.0), BatchSegment(7, 64, 8.0)))
    assert [sched.at(s).batch_size for s in (0, 4, 5, 6, 7, 1000)] == [8, 8, 32, 32, 64, 64]
    assert sched.at(6).lr_scale == 4.0
    assert [sched.examples(s) for s in (0, 3, 5, 6, 7, 9)] == [0, 24, 40, 72, 104, 232]


def test_constant_schedule():
    sched = BatchSchedule.constant(16)
    assert sched.segments == (BatchSegment(0, 16, 1.0),) and sched.examples(10) == 160


@pytest.mark.parametrize(("call", "match"), [
    (lambda: BatchSchedule(()), "non-empty"),
    (lambda: BatchSchedule((BatchSegment(1, 8),)), "must start at step 0"),
    (lambda: BatchSchedule((BatchSegment(0, 8), BatchSegment(4, 16), BatchSegment(4, 32))), "increase strictly"),
    (lambda: BatchSegment(0, 0), "batch_size must be an integer >= 1"),
    (lambda: BatchSegment(-1, 8), "start_step must be an integer >= 0"),
    (lambda: BatchSegment(0, 8.0), "batch_size must be an integer"),
    (lambda: BatchSegment(0, 8, 0.0), "lr_scale must be a positive"),
    (lambda: BatchSchedule.constant(8).at(-1), "step must be >= 0"),
])
def test_bad_input_raises_a_clear_error(call, match):
    with pytest.raises(ConfigError, match=match):
        call()
