"""The batch-size-schedule reference loop: train_reference is its constant-batch case (whose
float64 equivalence with independent update rules is tests/training/test_reference.py), it is
resumable from a TrainState bit for bit, and equal to an independent loop across a batch change."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import training
from training import ConfigError, EvalSchedule, RunConfig, Trial
from training.schedules.batch_schedule import BatchSchedule, BatchSegment
from training.schedules.order import BatchOrder, epoch_permutation, trial_seed
from training.reference import train_schedule_reference
from training.state import DataPosition, DataStream, TrainState

F64 = torch.float64


def assert_same_run(a, b):
    assert a.curve.rows() == b.curve.rows()
    assert (a.steps_to_result, a.steps_run, a.diverged) == (b.steps_to_result, b.steps_run, b.diverged)
    for k, v in a.state.items():
        assert torch.equal(v, b.state[k]), k


@pytest.mark.parametrize(("optimizer", "batch", "decay"), [("sgd", 32, None), ("momentum", 48, 20), ("nesterov", 32, 20)])
def test_one_constant_batch_equals_train_reference_bit_for_bit(teacher320, net16, optimizer, batch, decay):
    # 48 does not divide 320: every epoch drops 32 examples, as BatchOrder does
    mask = {"1.weight": (torch.rand(16, 8, generator=torch.Generator().manual_seed(0)) > 0.5).float()}
    trial = Trial(lr=0.3, momentum=0.9, decay_steps=decay, end_factor=0.1)
    run = RunConfig(batch, optimizer, max_steps=40, goal=0.3, eval_schedule=EvalSchedule(every=7),
                    stop="never", seed=5, dtype=F64)
    ref = training.train_reference(net16, teacher320, trial, run, mask=mask, trial_index=2)
    # the schedule's batch size replaces run.batch_size
    other = RunConfig(batch // 2, optimizer, max_steps=40, goal=0.3, eval_schedule=EvalSchedule(every=7),
                      stop="never", seed=5, dtype=F64)
    got = train_schedule_reference(net16, teacher320, trial, other, schedule=BatchSchedule.constant(batch),
                                   mask=mask, trial_index=2)
    assert_same_run(got.result, ref)
    assert got.examples == 40 * batch and got.state.step == 40


def run_config(steps, **kw):
    return RunConfig(16, "momentum", max_steps=steps, stop="never", dtype=F64, **kw)


def test_resuming_from_a_state_continues_the_run_bit_for_bit(teacher320, net16):
    sched = BatchSchedule((BatchSegment(0, 16), BatchSegment(20, 64, 4.0)))
    trial, every = Trial(lr=0.05, momentum=0.9), EvalSchedule(every=5)
    straight = train_schedule_reference(net16, teacher320, trial, run_config(50, seed=1, eval_schedule=every),
                                        schedule=sched)
    first = train_schedule_reference(net16, teacher320, trial, run_config(15, seed=1, eval_schedule=every),
                                     schedule=sched)
    resumed = train_schedule_reference(net16, teacher320, trial, run_config(50, seed=1, eval_schedule=every),
                                       schedule=sched, start=first.state)
    assert first.result.curve.rows() + resumed.result.curve.rows() == straight.result.curve.rows()
    for k, v in straight.result.state.items():
        assert torch.equal(v, resumed.result.state[k]), k
        assert torch.equal(straight.state.buffers[k], resumed.state.buffers[k]), k
    assert resumed.state.position == straight.state.position
    assert first.examples + resumed.examples == straight.examples == 20 * 16 + 30 * 64


def test_a_batch_change_matches_an_independent_loop(teacher320, net16):
    # 3 steps of 8 examples at lr 0.1, then 32 examples at lr 0.4, heavy ball, float64
    sched = BatchSchedule((BatchSegment(0, 8), BatchSegment(3, 32, 4.0)))
    got = train_schedule_reference(net16, teacher320, Trial(lr=0.1, momentum=0.9), run_config(14, seed=2),
                                   schedule=sched).result
    perms = [epoch_permutation(trial_seed(2, 0), e, 320) for e in range(2)]
    # epoch 0: 24 examples at B = 8, then 9 batches of 32 (up to offset 312); the 8 left are dropped
    batches = [perms[0][8 * i:8 * i + 8] for i in range(3)] + [perms[0][24 + 32 * i:56 + 32 * i] for i in range(9)] \
        + [perms[1][32 * i:32 * i + 32] for i in range(2)]
    params = {k: v.detach().clone().double() for k, v in net16.named_parameters()}
    bufs = {k: torch.zeros_like(v) for k, v in params.items()}
    model = training.models.build("mlp", teacher320, hidden=[16], seed=0).double()
    for t, idx in enumerate(batches):
        p = {k: v.requires_grad_() for k, v in params.items()}
        loss = F.cross_entropy(torch.func.functional_call(model, p, (teacher320.x_train.double()[idx],)), teacher320.y_train[idx])
        grads = dict(zip(p, torch.autograd.grad(loss, list(p.values()))))
        with torch.no_grad():
            for k in params:
                bufs[k] = 0.9 * bufs[k] + grads[k]
                params[k] = params[k] - (0.1 if t < 3 else 0.4) * bufs[k]
    for k, v in got.state.items():
        assert torch.allclose(v, params[k], rtol=1e-10, atol=1e-12), k


def test_stream_reproduces_batch_order_and_tracks_positions():
    order, stream, pos = BatchOrder(7, 100, 30), DataStream(7, 100), DataPosition()
    for step in range(10):                        # 3 batches per epoch, 10 examples dropped
        idx, pos = stream.batch(pos, 30)
        assert torch.equal(idx, order.batch(step))
    assert pos == DataPosition(3, 30)
    _, pos = stream.batch(DataPosition(0, 60), 50)   # 40 left: next epoch
    assert pos == DataPosition(1, 50)
    assert stream.batch(DataPosition(0, 70), 30)[1] == DataPosition(0, 100)   # exactly fits
    assert len(stream.batch(DataPosition(0, 71), 30)[0]) == 30


def test_state_checks_and_slicing(teacher320, net16):
    trial = Trial(lr=0.1)
    state = train_schedule_reference(net16, teacher320, trial, RunConfig(16, "sgd", max_steps=3)).state
    two = TrainState({k: v.repeat(2, *[1] * (v.dim() - 1)) for k, v in state.params.items()},
                     {k: v.repeat(2, *[1] * (v.dim() - 1)) for k, v in state.buffers.items()},
                     3, state.position, state.initial_loss * 2)
    assert two.n_trials == 2 and torch.equal(two.trial(1).params["1.weight"], state.params["1.weight"])
    run5 = RunConfig(16, "sgd", max_steps=5)
    with pytest.raises(ConfigError, match="resumes one trial"):
        train_schedule_reference(net16, teacher320, trial, run5, start=two)
    with pytest.raises(ConfigError, match=r"max_steps \(2\) must be >= the start state's step \(3\)"):
        train_schedule_reference(net16, teacher320, trial, RunConfig(16, "sgd", max_steps=2), start=state)
    other = training.models.build("mlp", teacher320, hidden=[8], seed=0)
    with pytest.raises(ConfigError, match=r"params\['1.weight'\] has shape"):
        train_schedule_reference(other, teacher320, trial, run5, start=state)
    with pytest.raises(ConfigError, match="one per trial"):
        TrainState(state.params, state.buffers, 3, state.position, (1.0, 2.0))
    with pytest.raises(ConfigError, match="schedule must be a training.schedules.batch_schedule.BatchSchedule"):
        train_schedule_reference(net16, teacher320, trial, run5, schedule=16)
    with pytest.raises(ConfigError, match="start must be a training.state.TrainState"):
        train_schedule_reference(net16, teacher320, trial, run5, start=state.params)
    with pytest.raises(ConfigError, match=r"batch_size must be an integer in \[1, 320\]"):
        train_schedule_reference(net16, teacher320, trial, run5, schedule=BatchSchedule.constant(321))


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_snapshots_are_the_states_of_runs_stopped_there(teacher320, optimizer):
    """One run's snapshots, from a start state too, equal bit for bit the weights and buffers of
    separate runs to each step, on a network with batch normalization and dropout (running
    statistics and the dropout generator carried through the steps)."""
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3),
                        nn.Linear(16, 3))
    trial = Trial(lr=0.05 if optimizer == "momentum" else 0.01, momentum=0.9, decay_steps=9,
                  end_factor=0.3)
    run = RunConfig(48, optimizer, max_steps=11, stop="never", seed=3,
                    eval_schedule=EvalSchedule(every=4))
    wanted = (0, 1, 6, 7, 11)
    once = train_schedule_reference(net, teacher320, trial, run, trial_index=2, snapshots=wanted)
    assert sorted(once.snapshots) == list(wanted)
    for t in wanted:
        alone = train_schedule_reference(net, teacher320, trial, RunConfig(
            48, optimizer, max_steps=t, stop="never", seed=3), trial_index=2).result
        expected = {**alone.state, **alone.buffers}
        assert once.snapshots[t].keys() == expected.keys()
        for name, v in expected.items():
            assert torch.equal(once.snapshots[t][name], v), (t, name)
    assert not torch.equal(once.snapshots[6]["1.running_mean"], once.snapshots[7]["1.running_mean"])
    # from a start state: the steps count from the run's beginning
    start = train_schedule_reference(net, teacher320, trial, RunConfig(
        48, optimizer, max_steps=6, stop="never", seed=3), trial_index=2).state
    later = train_schedule_reference(net, teacher320, trial, run, start=start, trial_index=2,
                                     snapshots=(6, 11))
    for t in (6, 11):
        for name, v in once.snapshots[t].items():
            assert torch.equal(later.snapshots[t][name], v), (t, name)
    with pytest.raises(ConfigError, match=r"snapshots must be update counts in \[6, 11\]"):
        train_schedule_reference(net, teacher320, trial, run, start=start, snapshots=(5, 11))
    with pytest.raises(ConfigError, match=r"snapshots must be update counts in \[0, 11\]"):
        train_schedule_reference(net, teacher320, trial, run, snapshots=(12,))


def check_divergence_like_the_reference(net, data, trial, run, mask):
    """A replay at a diverging learning rate stops where the reference loop does."""
    from training.replay import replay_snapshots

    blown = replace(trial, lr=1e4)
    states, diverged = replay_snapshots(net, data, blown, run, (0, 1, 40), mask)
    ref = train_schedule_reference(net, data, blown, replace(run, max_steps=40, stop="never"),
                                   mask=mask)
    assert diverged == ref.result.diverged_step is not None and 40 not in states


@pytest.mark.parametrize(("optimizer", "momentum", "decay"),
                         [("sgd", 0.0, None), ("momentum", 0.9, 7), ("nesterov", 0.8, 5)])
def test_plain_mlp_replay_with_the_backward_written_out_is_bit_for_bit(teacher320, monkeypatch,
                                                                       optimizer, momentum, decay):
    """A plain ReLU MLP's replay (training.replay._mlp_replay: the aten operations autograd runs,
    written out, and foreach updates) against the reference loop stopped at each step, float32,
    with a mask on a weight and a bias, over more than two epochs; and the same divergence step."""
    from torch import nn
    from training import replay
    from training.replay import replay_snapshots

    taken = []
    original = replay._mlp_replay
    monkeypatch.setattr(replay, "_mlp_replay", lambda *a: taken.append(1) or original(*a))
    torch.manual_seed(1)
    net = nn.Sequential(nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(),
                        nn.Linear(12, 3))
    gen = torch.Generator().manual_seed(0)
    mask = {"1.weight": (torch.rand(16, 8, generator=gen) > 0.5).float(),
            "3.bias": (torch.rand(12, generator=gen) > 0.3).float()}
    trial = Trial(lr=0.1, momentum=momentum, decay_steps=decay, end_factor=0.2)
    run = RunConfig(48, optimizer, seed=3)
    wanted = (0, 1, 6, 13, 20)
    states, diverged = replay_snapshots(net, teacher320, trial, run, wanted, mask, trial_index=2)
    assert taken and diverged is None and list(states) == list(wanted)
    for t in wanted:
        alone = train_schedule_reference(net, teacher320, trial, RunConfig(
            48, optimizer, max_steps=t, stop="never", seed=3), mask=mask, trial_index=2).result
        assert states[t].keys() == alone.state.keys()
        for name, v in alone.state.items():
            assert torch.equal(states[t][name], v), (t, name)
    check_divergence_like_the_reference(net, teacher320, trial, run, mask)


@pytest.mark.parametrize(("optimizer", "momentum", "decay"),
                         [("sgd", 0.0, None), ("momentum", 0.9, 7), ("nesterov", 0.8, None),
                          ("momentum", 0.0, None), ("adamw", 0.9, 7)])
def test_replay_snapshots_equal_the_reference_loop_bit_for_bit(teacher320, optimizer, momentum, decay):
    """The lean replay (SGD family: torch.optim.SGD's arithmetic written out; Adam-type: the
    reference loop's snapshots) against the reference loop stopped at each step, float32, with a
    mask, batch normalization and dropout; a diverging run returns what it reached."""
    from torch import nn
    from training.replay import replay_snapshots

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3),
                        nn.Linear(16, 3))
    mask = {"0.weight": (torch.rand(16, 8, generator=torch.Generator().manual_seed(0)) > 0.5).float()}
    trial = Trial(lr=0.01 if "adam" in optimizer else 0.1, momentum=momentum, decay_steps=decay,
                  end_factor=0.2, weight_decay=0.01 if optimizer == "adamw" else 0.0)
    run = RunConfig(48, optimizer, seed=3)
    wanted = (0, 1, 5, 6, 13)   # 6 batches of 48 per epoch: step 13 is in the third
    states, diverged = replay_snapshots(net, teacher320, trial, run, wanted, mask, trial_index=2)
    assert diverged is None and list(states) == list(wanted)
    for t in wanted:
        alone = train_schedule_reference(net, teacher320, trial, RunConfig(
            48, optimizer, max_steps=t, stop="never", seed=3), mask=mask, trial_index=2).result
        expected = {**alone.state, **alone.buffers}
        assert states[t].keys() == expected.keys()
        for name, v in expected.items():
            assert torch.equal(states[t][name], v), (t, name)
    check_divergence_like_the_reference(net, teacher320, trial, run, mask)
    with pytest.raises(ConfigError, match="steps must be a non-empty collection"):
        replay_snapshots(net, teacher320, trial, run, (), mask)
