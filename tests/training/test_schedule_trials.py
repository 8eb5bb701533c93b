"""The vectorized batch-size-schedule trainer: one constant batch size is train_trials bit for bit;
two segments equal the reference loop (train_schedule_reference) trial by trial in float64."""

from dataclasses import replace

import pytest
import torch

import training
from training import ConfigError, EvalSchedule, RunConfig, Trial
from training.schedules.batch_schedule import BatchSchedule, BatchSegment
from training.reference import train_schedule_reference
from training.schedule_trials import train_schedule_trials

F64 = torch.float64
TRIALS = [Trial(lr=0.05, momentum=0.9, decay_steps=30, end_factor=0.1), Trial(lr=0.1, momentum=0.5),
          Trial(lr=0.02, momentum=0.9)]


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_one_constant_batch_equals_train_trials_bit_for_bit(teacher320, net16, optimizer):
    mask = {"1.weight": (torch.rand(3, 16, 8, generator=torch.Generator().manual_seed(0)) > 0.5).float()}
    run = RunConfig(48, optimizer, max_steps=45, goal=0.3, eval_schedule=EvalSchedule(every=7), seed=3)
    for stop in ("first", "never"):
        r = replace(run, stop=stop)
        want = training.train_trials(net16, teacher320, TRIALS, r, masks=mask, first_index=2)
        got = train_schedule_trials(net16, teacher320, TRIALS, replace(r, batch_size=16), masks=mask,
                                    first_index=2, schedule=BatchSchedule.constant(48))
        assert [c.rows() for c in got.curves] == [c.rows() for c in want.curves]
        assert (got.hit_step, got.status, got.steps_taken, got.steps_run, got.best, got.program) == \
            (want.hit_step, want.status, want.steps_taken, want.steps_run, want.best, want.program)
        for name, v in want.params.items():
            assert torch.equal(got.params[name], v), name


@pytest.mark.parametrize("optimizer", ["nesterov", "adamw"])
def test_two_segments_equal_the_reference_loop(teacher320, net16, optimizer):
    # 16 steps at B = 16, then B = 48 at lr x 3 (2 steps drop 32 examples per epoch); the
    # segment boundary (16) is not an evaluation step
    sched = BatchSchedule((BatchSegment(0, 16), BatchSegment(16, 48, 3.0)))
    trials = TRIALS if optimizer != "adamw" else [replace(t, lr=t.lr / 10, weight_decay=0.01) for t in TRIALS]
    mask = {"3.weight": (torch.rand(3, 16, generator=torch.Generator().manual_seed(1)) > 0.3).double()}
    run = RunConfig(64, optimizer, max_steps=37, stop="never", eval_schedule=EvalSchedule(every=5), seed=9,
                    dtype=F64)
    got = train_schedule_trials(net16, teacher320, trials, run, schedule=sched, masks=mask)
    assert got.end_trials == (0, 1, 2) and got.end_state.step == 37
    assert got.program in ("fused", "batched")   # both segments' program, named once
    for i, t in enumerate(trials):
        ref = train_schedule_reference(net16, teacher320, t, run, schedule=sched, mask=mask, trial_index=i)
        assert got.curves[i].step.tolist() == ref.result.curve.step.tolist() == [0, 5, 10, 15, 20, 25, 30, 35, 37]
        for a, b in zip(got.curves[i].rows(), ref.result.curve.rows()):
            assert a[1] == pytest.approx(b[1], rel=1e-9) and a[2] == pytest.approx(b[2], rel=1e-9)
        for name, v in ref.result.state.items():
            assert rel_err(got.state(i)[name], v) <= 1e-9, (i, name)
        assert got.end_state.position == ref.state.position
        for name, v in ref.state.buffers.items():
            assert rel_err(got.end_state.buffers[name][i], v[0]) <= 1e-9, (i, name)


def test_stops_and_divergence_carry_across_segments(teacher320, net16):
    sched = BatchSchedule((BatchSegment(0, 16), BatchSegment(10, 32, 2.0)))
    trials = [Trial(lr=0.05, momentum=0.9), Trial(lr=50.0, momentum=0.9), Trial(lr=0.2, momentum=0.9)]
    run = RunConfig(16, "momentum", max_steps=60, goal=0.4, eval_schedule=EvalSchedule(every=4), seed=2,
                    dtype=F64, stop="all")
    got = train_schedule_trials(net16, teacher320, trials, run, schedule=sched)
    assert got.status[1] == "diverged" and got.diverged_step[1] < 10
    for i in (0, 2):
        ref = train_schedule_reference(net16, teacher320, trials[i], replace(run, eval_schedule=EvalSchedule(every=1)),
                                       schedule=sched, trial_index=i)
        # exact hit step (the replay); the trial stopped at the evaluation that saw it
        assert got.hit_step[i] == ref.result.steps_to_result
        assert got.curves[i].step[-1] == got.steps_taken[i] == 4 * -(-got.hit_step[i] // 4)
    assert got.end_trials == () and got.steps_run == max(got.steps_taken)
    with pytest.raises(ConfigError, match=r"batch_size must be an integer in \[1, 320\]"):
        train_schedule_trials(net16, teacher320, trials, run, schedule=BatchSchedule.constant(400))
    with pytest.raises(ConfigError, match="schedule must be a training.schedules.batch_schedule.BatchSchedule"):
        train_schedule_trials(net16, teacher320, trials, run, schedule=[16])
