"""Training under a policy: each trial's run equals the plain reference loop
(``train_schedule_reference``) under the schedule it followed, in float64, also when a decision
splits the trials into cohorts; the reading between segments against the exact noise of the
split; the modelled wall time."""

import copy
from dataclasses import replace

import pytest
import torch

import training
from training import EvalSchedule, RunConfig, Trial
from training.reference import train_schedule_reference
from training.schedules.batch_schedule import BatchSchedule, BatchSegment
from training.state import DataPosition, TrainState
from theory import TheoryError, gradient_noise
from theory.policies import (
    Goodput, LinearTime, PolicyTrial, Seesaw, Setting, read_noise, train_under_policy,
)

F64 = torch.float64
TRIALS = [Trial(lr=0.1, momentum=0.9), Trial(lr=0.02, momentum=0.5), Trial(lr=0.08, momentum=0.9)]


@pytest.fixture(scope="module")
def data():
    return training.data.load("teacher", n=400, dim=8, num_classes=3, seed=1)


@pytest.fixture(scope="module")
def net(data):
    return training.models.build("mlp", data, hidden=[16], seed=0)


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def check_against_reference(net, data, trials, run, got):
    for i, (t, pt) in enumerate(zip(trials, got)):
        ref = train_schedule_reference(net, data, t, run, schedule=pt.schedule, trial_index=i)
        assert pt.hit_step == ref.result.steps_to_result, i
        for name, v in ref.result.state.items():
            assert rel_err(pt.params[name], v) <= 1e-9, (i, name)


def test_seesaw_run_equals_the_reference_loop(data, net):
    # evaluations after every step: the reference's first hit is then exact to the step too
    run = RunConfig(16, "momentum", max_steps=40, goal=0.45, stop="never",
                    eval_schedule=EvalSchedule(every=1), seed=4, dtype=F64)
    got = train_under_policy(net, data, TRIALS, run, Seesaw(milestones=(160, 480)), every=5)
    # 10 steps at 16 (160 examples), 10 at 32 (480), then 64 at lr / 2
    want = (BatchSegment(0, 16), BatchSegment(10, 32, 2**-0.5), BatchSegment(20, 64, 0.5))
    for pt in got:
        assert [(s.start_step, s.batch_size) for s in pt.schedule.segments] == \
            [(s.start_step, s.batch_size) for s in want]
        assert [s.lr_scale for s in pt.schedule.segments] == pytest.approx([s.lr_scale for s in want])
        assert pt.measured_examples == 0 and pt.steps_taken == 40
    check_against_reference(net, data, TRIALS, run, got)
    assert any(pt.hit_step is not None for pt in got)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_cohorts_split_by_decision_and_each_equals_the_reference(data, net, optimizer):
    trials = TRIALS if optimizer == "momentum" else [replace(t, lr=t.lr / 10) for t in TRIALS]
    top = max(t.lr for t in trials)

    def by_lr(signal, current):   # the fastest trial to 48, the others to 32 then 64
        if current.lr >= top * 0.99:
            return Setting(48, current.lr)
        return Setting(32 if signal.step < 12 else 64, current.lr * 1.5)

    run = RunConfig(16, optimizer, max_steps=24, goal=0.4, stop="all",
                    eval_schedule=EvalSchedule(every=1), seed=2, dtype=F64)
    got = train_under_policy(net, data, trials, run, by_lr, every=6)
    assert got[0].schedule.segments[1].batch_size == 48
    assert got[1].schedule.segments[1].batch_size == 32
    check_against_reference(net, data, trials, replace(run, stop="all"), got)


def test_reading_of_the_whole_split_is_the_exact_noise(data, net):
    # one batch of all N examples, drawn without replacement from N: the reading is exact
    d = data.to("cpu", F64)
    params = {k: v.detach().double().unsqueeze(0) for k, v in net.named_parameters()}
    state = TrainState(params, {}, 0, DataPosition(), (1.0,))
    run = RunConfig(16, "momentum", dtype=F64)
    reading = read_noise(net, d, state, d.n_train, run, steps=1)
    exact = gradient_noise(copy.deepcopy(net).double(), d, hessian_examples=0)
    assert reading.g_sq == pytest.approx(exact.g_sq, rel=1e-9)
    assert reading.trace_sigma == pytest.approx(exact.trace_sigma, rel=1e-9)


def test_goodput_reads_the_noise_between_segments(data, net):
    run = RunConfig(8, "momentum", max_steps=30, goal=0.3, stop="all",
                    eval_schedule=EvalSchedule(every=10), seed=0, dtype=F64)
    pol = Goodput(min_batch=8, max_batch=128, step_time=LinearTime(1.0, 1 / 32), min_gain=0.0)
    got = train_under_policy(net, data, TRIALS[:2], run, pol, every=10, measure_steps=2)
    for pt in got:
        assert pt.decisions and all(d.b_simple == d.b_simple for d in pt.decisions)   # not nan
        assert pt.decisions[0].batch_size == pol.best(pt.decisions[0].b_simple)
        assert pt.measured_examples == sum(2 * b for b in
                                           [8] + [d.batch_size for d in pt.decisions[:-1]])


def test_modelled_seconds_sum_the_segments():
    pt = PolicyTrial(BatchSchedule((BatchSegment(0, 16), BatchSegment(10, 32, 2.0))), (), 15,
                     None, 15, 0, {})
    assert pt.seconds(LinearTime(1.0, 0.1)) == pytest.approx(10 * 2.6 + 5 * 4.2)
    assert pt.seconds(None) == 15 and pt.examples_to_result == 10 * 16 + 5 * 32


def test_refusals(data, net):
    with pytest.raises(TheoryError, match="allowed: 'all'"):
        train_under_policy(net, data, TRIALS, RunConfig(16, max_steps=5), "fixed", every=2)
    with pytest.raises(TheoryError, match="unknown policy"):
        train_under_policy(net, data, TRIALS, RunConfig(16, max_steps=5, stop="all"), "fxed", every=2)


def test_preconditioned_reading_is_adams_closed_form(data, net):
    # tr(P Sigma P) and |P G|^2 of the whole split with P = 1 / (sqrt(v / (1 - beta2^t)) + eps)
    d = data.to("cpu", F64)
    g = torch.Generator().manual_seed(3)
    named = dict(net.named_parameters())
    params = {k: v.detach().double().unsqueeze(0) for k, v in named.items()}
    m = {k: 0.01 * torch.randn(v.shape, generator=g, dtype=F64) for k, v in params.items()}
    v2 = {k: 1e-4 * torch.rand(v.shape, generator=g, dtype=F64) + 1e-6 for k, v in params.items()}
    trial = Trial(lr=1e-3, beta2=0.99, eps=1e-6)
    state = TrainState(params, m, 5, DataPosition(), (1.0,), v2)
    run = RunConfig(16, "adam", dtype=F64)
    reading = read_noise(net, d, state, d.n_train, run, steps=1, adam=trial)
    [part] = [p for p in reading.parts if p.name == "<preconditioned>"]
    ref = copy.deepcopy(net).double()
    scale = {k: 1 / ((v2[k][0] / (1 - 0.99**5)).sqrt() + 1e-6) for k in params}
    rows = []
    for i in range(d.n_train):
        loss = torch.nn.functional.cross_entropy(ref(d.x_train[i:i + 1]), d.y_train[i:i + 1])
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        rows.append(torch.cat([(gr * scale[k]).reshape(-1) for (k, _), gr in
                               zip(ref.named_parameters(), grads)]))
    pg = torch.stack(rows)
    mean = pg.mean(0)
    assert part.g_sq == pytest.approx(float(mean @ mean), rel=1e-9)
    assert part.trace_sigma == pytest.approx(float((pg - mean).pow(2).sum(1).mean()), rel=1e-9)


def test_a_policys_part_sets_what_the_monitor_reads(data, net):
    run = RunConfig(8, "adam", max_steps=12, stop="never", eval_schedule=EvalSchedule(every=6),
                    dtype=F64)
    pol = Goodput(min_batch=8, max_batch=64, part="<preconditioned>", min_gain=0.0)
    got = train_under_policy(net, data, [Trial(lr=1e-3)], run, pol, every=6, measure_steps=1)
    assert got[0].decisions and got[0].measured_examples > 0
    with pytest.raises(TheoryError, match="needs an Adam-type run"):
        train_under_policy(net, data, [Trial(lr=0.1)], replace(run, optimizer="momentum"), pol, every=6)


class OutsideUse(torch.nn.Module):
    """A layer whose weight is also read outside its own call: per-example norms cannot see it."""

    def __init__(self):
        super().__init__()
        self.body, self.shift = torch.nn.Linear(8, 3), torch.nn.Linear(1, 3)

    def forward(self, x):
        return self.body(x) + self.shift.weight[:, 0]


def test_a_layer_the_per_example_norms_cannot_read_falls_back_to_micro_batches(data):
    net = OutsideUse()
    params = {k: v.detach().unsqueeze(0) for k, v in net.named_parameters()}
    state = TrainState(params, {}, 0, DataPosition(), (1.0,))
    reading = read_noise(net, data, state, 64, RunConfig(16), steps=2)
    assert reading.method == "micro_batch" and reading.b_simple == reading.b_simple
