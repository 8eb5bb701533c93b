"""train_trials from a TrainState: equal to the reference loop from the same state (float64),
resuming its own end state continues a run bit for bit, and a branch with k = 1 and lr
multiplier 1 in a group of branches equals continuing the base run (1e-9)."""

from dataclasses import replace

import pytest
import torch

import training
from training import ConfigError, EvalSchedule, RunConfig, Trial
from training.schedules.order import trial_seed
from training.reference import train_schedule_reference
from training.engine.resume import DataOrigin
from training.state import DataPosition, DataStream, TrainState

F64 = torch.float64


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def stacked(states):
    """One N-trial TrainState from N one-trial states of the same step and position."""
    return TrainState({k: torch.cat([s.params[k] for s in states]) for k in states[0].params},
                      {k: torch.cat([s.buffers[k] for s in states]) for k in states[0].buffers},
                      states[0].step, states[0].position, tuple(s.initial_loss[0] for s in states),
                      {k: torch.cat([s.moments[k] for s in states]) for k in states[0].moments})


def test_data_origin_follows_the_stream():
    # 48 does not divide 320: 6 batches per epoch, 32 examples dropped; start mid-epoch at 100
    origin, stream, pos = DataOrigin(7, 2, 100), DataStream(3, 320), DataPosition(2, 100)
    for step in range(7, 30):
        idx, after = stream.batch(pos, 48)
        epoch, offset = origin.locate(step, 48, 320)
        assert torch.equal(stream._perm, training.schedules.order.epoch_permutation(3, epoch, 320))
        assert torch.equal(idx, stream._perm[offset:offset + 48])
        pos = after
        assert origin.position(step + 1, 48, 320) == pos
    # from the beginning: BatchOrder's divmod
    assert [DataOrigin().locate(s, 48, 320) for s in (0, 5, 6, 13)] == [(0, 0), (0, 240), (1, 0), (2, 48)]


@pytest.mark.parametrize(("optimizer", "decay"), [("momentum", 30), ("nesterov", None), ("adamw", 30), ("sgd", None)])
def test_from_a_state_equals_the_reference_from_the_same_state(teacher320, net16, optimizer, decay):
    trials = [Trial(lr=0.05 if "adam" not in optimizer else 0.01, momentum=0.9, decay_steps=decay,
                    end_factor=0.1, weight_decay=0.01 if optimizer == "adamw" else 0.0),
              Trial(lr=0.1 if "adam" not in optimizer else 0.003, momentum=0.5)]
    mask = {"1.weight": (torch.rand(16, 8, generator=torch.Generator().manual_seed(0)) > 0.5).double()}
    run = RunConfig(48, optimizer, max_steps=11, stop="never", seed=4, dtype=F64,
                    eval_schedule=EvalSchedule(every=4))
    # base states: 11 steps at B = 48 (mid-epoch, 2nd epoch), one per trial
    bases = [train_schedule_reference(net16, teacher320, t, run, mask=mask, trial_index=i).state
             for i, t in enumerate(trials)]
    start = stacked(bases)
    later = replace(run, max_steps=40, goal=0.45)
    got = training.train_trials(net16, teacher320, trials, later, masks=mask, start=start, return_state=True)
    assert got.end_trials == (0, 1) and got.end_state.step == 40
    for i, t in enumerate(trials):
        ref = train_schedule_reference(net16, teacher320, t, later, mask=mask, start=start.trial(i), trial_index=i)
        assert got.curves[i].step.tolist() == ref.result.curve.step.tolist() == [12, 16, 20, 24, 28, 32, 36, 40]
        # the reference sees the goal at an evaluation, the replay pins the exact step before it
        assert ref.result.steps_to_result - 4 < got.hit_step[i] <= ref.result.steps_to_result
        for name, v in ref.result.state.items():
            assert rel_err(got.state(i)[name], v) <= 1e-9, (i, name)
            if ref.state.buffers:
                assert rel_err(got.end_state.buffers[name][i], ref.state.buffers[name][0]) <= 1e-9
            if ref.state.moments:
                assert rel_err(got.end_state.moments[name][i], ref.state.moments[name][0]) <= 1e-9
        assert got.end_state.position == ref.state.position
        assert torch.allclose(torch.tensor(got.curves[i].metric), torch.tensor(ref.result.curve.metric),
                              rtol=1e-9, atol=1e-12)
    assert got.end_state.initial_loss == start.initial_loss


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_resuming_the_end_state_continues_bit_for_bit(teacher320, net16, optimizer):
    trials = [Trial(lr=0.05 if optimizer == "momentum" else 0.01, momentum=0.9, decay_steps=25, end_factor=0.2),
              Trial(lr=0.02 if optimizer == "momentum" else 0.003, momentum=0.8)]
    run = RunConfig(48, optimizer, max_steps=30, stop="never", seed=1, dtype=F64,
                    eval_schedule=EvalSchedule(every=5))
    straight = training.train_trials(net16, teacher320, trials, run, return_state=True)
    first = training.train_trials(net16, teacher320, trials, replace(run, max_steps=13), return_state=True)
    rest = training.train_trials(net16, teacher320, trials, run, start=first.end_state, return_state=True)
    for i in range(2):
        # the first run's last evaluation (step 13) splits the straight run's train-loss window
        # (10, 15]; everything else is the same
        joined = first.curves[i].rows()[:-1] + rest.curves[i].rows()
        assert [r[::2] for r in joined] == [r[::2] for r in straight.curves[i].rows()]
        assert joined[4:] == straight.curves[i].rows()[4:]
        for name, v in straight.state(i).items():
            assert torch.equal(rest.state(i)[name], v)
    for table in ("buffers", "moments"):
        for name, v in getattr(straight.end_state, table).items():
            assert torch.equal(getattr(rest.end_state, table)[name], v)
    assert rest.end_state.position == straight.end_state.position
    assert rest.steps_taken == straight.steps_taken == [30, 30]


def test_branch_with_k_1_and_multiplier_1_continues_the_base_run(teacher320, net16):
    # the base run: trial 3 of a group of seed 5, 17 steps, then continued to 29
    base_trial = Trial(lr=0.05, momentum=0.9)
    run = RunConfig(32, "momentum", max_steps=29, stop="never", seed=5, dtype=F64,
                    eval_schedule=EvalSchedule(every=4))
    base = training.train_trials(net16, teacher320, [base_trial], run, first_index=3)
    ckpt = training.train_trials(net16, teacher320, [base_trial], replace(run, max_steps=17), first_index=3,
                                 return_state=True).end_state
    # the branches of that checkpoint at k = 1: lr multipliers (0.5, 1, 2) x branch seeds; seed 0
    # reads the base run's data order
    seeds = [trial_seed(5, 3), 11, 12]
    trials = [Trial(lr=0.05 * m, momentum=0.9) for _ in seeds for m in (0.5, 1.0, 2.0)]
    branches = training.train_trials(net16, teacher320, trials, run, start=ckpt,
                                     data_seeds=[s for s in seeds for _ in range(3)])
    for name, v in base.state(0).items():
        assert rel_err(branches.state(1)[name], v) <= 1e-9, name
        assert rel_err(branches.state(4)[name], v) > 1e-3, name   # another data order
    assert branches.curves[1].metric.tolist() == pytest.approx(base.curves[0].metric[-4:].tolist(), rel=1e-9)


def test_start_is_checked(teacher320, net16):
    run = RunConfig(32, "momentum", max_steps=5, stop="never")
    state = train_schedule_reference(net16, teacher320, Trial(lr=0.1, momentum=0.9), run).state
    trials = [Trial(lr=0.1, momentum=0.9)] * 3
    two = stacked([state, state])
    with pytest.raises(ConfigError, match=r"start holds 2 trials; allowed: 1 \(shared by every trial\) or 3"):
        training.train_trials(net16, teacher320, trials, run, start=two)
    with pytest.raises(ConfigError, match=r"max_steps \(4\) must be >= the start state's step \(5\)"):
        training.train_trials(net16, teacher320, trials, replace(run, max_steps=4), start=state)
    with pytest.raises(ConfigError, match="optimizer 'adam' resumes from a TrainState with Adam's moments"):
        training.train_trials(net16, teacher320, trials, replace(run, optimizer="adam"), start=state)
    with pytest.raises(ConfigError, match="start must be a training.state.TrainState"):
        training.train_trials(net16, teacher320, trials, run, start=state.params)
    with pytest.raises(ConfigError, match=r"data_seeds must be 3 integers >= 0 \(one per trial\)"):
        training.train_trials(net16, teacher320, trials, run, data_seeds=[1, 2])
    other = training.models.build("mlp", teacher320, hidden=[8], seed=0)
    with pytest.raises(ConfigError, match=r"params\['1.weight'\] has shape"):
        training.train_trials(other, teacher320, trials, run, start=state)
    # a shared one-trial state at its own step: nothing to run, the state comes back
    same = training.train_trials(net16, teacher320, trials, run, start=state, return_state=True)
    assert same.steps_run == 5 and same.end_trials == (0, 1, 2) and all(len(c) == 0 for c in same.curves)
    assert torch.equal(same.end_state.params["1.weight"][2], state.params["1.weight"][0])
