"""Delayed gradients (training.delay) in every program of ``train_trials``, against a plain
``torch.optim`` loop written here that keeps a ``collections.deque`` of its past weights and
takes each update's gradient at the weights of step max(t - tau_t, 0) (float64, 1e-12); the
delay draws; delay 0 bit for bit the undelayed step; exact steps to result (the replay); the
refusals and errors."""

import collections
import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

import training
from training import ConfigError, EvalSchedule, RunConfig, Trial
from training.delay import BLOCK, DelayQueue, uniform_delays
from training.distributed.trainer import DistRun
from training.replay import replay_snapshots
from training.schedule_trials import train_schedule_trials

from .test_trials_user_models import masks_for
from training.schedules.order import BatchOrder, trial_seed

F64 = torch.float64
STEPS, BATCH = 12, 8
TOL = 1e-12
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")


def trials_for(optimizer, kinds=("fixed", "uniform", "round_robin")):
    """One trial per delay kind, each with other metaparameters (one group, per-trial tau)."""
    delays = {"fixed": dict(delay=2), "uniform": dict(delay=3, delay_kind="uniform"),
              "round_robin": dict(delay_kind="round_robin", workers=4)}
    adam = optimizer in ("adam", "adamw")
    out = []
    for j, kind in enumerate(kinds):
        meta = (dict(lr=3e-3 * (j + 1), beta1=0.9 - 0.05 * j, weight_decay=0.01 * j)
                if adam else dict(lr=0.05 * (j + 1), momentum=0.0 if optimizer == "sgd"
                                  else 0.9 - 0.2 * j))
        out.append(Trial(**meta, **delays[kind]))
    return out


def delays_of(trial, seed, steps):
    if trial.delay_kind == "uniform":
        return uniform_delays(seed, trial.delay, 0, steps).tolist()
    return [trial.delay] * steps


def delayed_loop(model, ds, trial, optimizer, i, mask, seed=0, steps=STEPS):
    """The loop a user writes for an asynchronous worker: torch.optim on the current weights, the
    gradient taken on a copy of the model holding the weights of step max(t - tau_t, 0), kept
    in a deque. Returns the trained weights and the worker copy (its buffers: BatchNorm's
    running statistics, updated at every gradient)."""
    net = copy.deepcopy(model).double().train()
    with torch.no_grad():
        for k, m in mask.items():
            net.get_parameter(k).mul_(m)
    worker = copy.deepcopy(net)
    if optimizer in ("adam", "adamw"):
        make = torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW
        opt = make(net.parameters(), lr=trial.lr, betas=(trial.beta1, trial.beta2),
                   eps=trial.eps, weight_decay=trial.weight_decay)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=trial.lr, momentum=trial.momentum,
                              nesterov=optimizer == "nesterov")
    data_seed = trial_seed(seed, i)
    order = BatchOrder(data_seed, ds.n_train, BATCH)
    past = collections.deque([copy.deepcopy(dict(net.named_parameters()))],
                             maxlen=trial.delay + 1)
    x, y = ds.x_train.double(), ds.y_train
    for t, tau in enumerate(delays_of(trial, data_seed, steps)):
        behind = t - max(t - tau, 0)   # how many steps old the worker's weights are
        with torch.no_grad():
            for k, p in worker.named_parameters():
                p.copy_(past[-1 - behind][k])
        idx = order.batch(t)
        worker.zero_grad()
        nn.functional.cross_entropy(worker(x[idx]), y[idx]).backward()
        for k, p in net.named_parameters():
            p.grad = worker.get_parameter(k).grad.clone()
            if k in mask:
                p.grad.mul_(mask[k])
        opt.step()
        past.append({k: p.detach().clone() for k, p in net.named_parameters()})
    return net, worker


def close(got, want, tol=TOL):
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30)) <= tol


def check_against_loop(net, ds, trials, optimizer, program, masks=True, buffers=False):
    masks = masks_for(net, len(trials)) if masks else {}
    run = RunConfig(BATCH, optimizer, max_steps=STEPS, dtype=F64,
                    eval_schedule=EvalSchedule(every=STEPS // 2))
    res = training.train_trials(net, ds, trials, run, masks=masks, program=program)
    assert res.program == program
    for i, trial in enumerate(trials):
        mask = {k: m[i] if m.dim() > net.get_parameter(k).dim() else m for k, m in masks.items()}
        want, worker = delayed_loop(net, ds, trial, optimizer, i, mask)
        for k, p in want.named_parameters():
            assert close(res.state(i)[k], p.detach()), (k, i, trial)
            if k in mask:
                assert torch.all(res.state(i)[k][mask[k] == 0] == 0)
        if buffers:
            for k, b in worker.named_buffers():
                if b.is_floating_point():
                    assert close(res.buffers[k][i], b), (k, i)
        moved = max(float((p.detach() - q.detach().double()).abs().max())
                    for p, q in zip(want.parameters(), net.parameters()))
        assert moved > 1e-4   # training moved the weights far beyond the tolerance
    return res


@pytest.fixture(scope="module")
def mlp(teacher320):
    return training.models.build("mlp", teacher320, hidden=[16], seed=0), teacher320


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_with_every_delay_kind_in_one_group(mlp, optimizer):
    """Our MLP, masks, the three delay kinds side by side in one stack (per-trial tau)."""
    net, ds = mlp
    check_against_loop(net, ds, trials_for(optimizer), optimizer, "batched")


PROGRAMS = ["batched", "func", "per_trial", "plain", "fused"]


def model_for(program, ds, request):
    """Our MLP for every program but ``func``, which the rules give a model the hand-batched
    program does not take (a Tanh MLP); ``fused`` needs the compiled kernel (skipped without)."""
    if program == "fused":
        request.getfixturevalue("compiled_kernel")
    if program == "func":
        with training.models.seeded(0):
            return nn.Sequential(nn.Linear(ds.input_shape[0], 16), nn.Tanh(), nn.Linear(16, 3))
    return training.models.build("mlp", ds, hidden=[16], seed=0)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("optimizer", ["nesterov", "adamw"])
def test_every_program(teacher320, program, optimizer, request):
    net = model_for(program, teacher320, request)
    check_against_loop(net, teacher320, trials_for(optimizer), optimizer, program)


class Conv1dNet(nn.Module):
    """A 1-D CNN as a user writes it (a module of its own, not an ``nn.Sequential``)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv1d(1, 4, 3, padding=1), nn.Conv1d(4, 4, 3, stride=2)
        self.out = nn.Linear(4 * 3, 3)

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x.unsqueeze(1)))))
        return self.out(x.flatten(1))


class GRUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru, self.out = nn.GRU(2, 6, batch_first=True), nn.Linear(6, 3)

    def forward(self, x):
        h, _ = self.gru(x.view(x.shape[0], 4, 2))
        return self.out(h[:, -1])


def batchnorm_mlp():
    """No bias before BatchNorm, as usually written: its gradient is zero in exact arithmetic,
    and Adam would turn the rounding noise there into steps of size lr."""
    return nn.Sequential(nn.Linear(8, 12, bias=False), nn.BatchNorm1d(12), nn.ReLU(),
                         nn.Linear(12, 3))


USER_MODELS = {"conv1d": Conv1dNet, "batchnorm_mlp": batchnorm_mlp, "gru": GRUNet}


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("name", list(USER_MODELS))
def test_models_the_library_did_not_write(teacher320, name, optimizer):
    """Through the own-model path, in the program the rules choose (per_trial for BatchNorm and
    the GRU), BatchNorm's running statistics updated at every (stale) gradient's forward pass."""
    torch.manual_seed(2)
    net = USER_MODELS[name]()
    res = check_against_loop(net, teacher320, trials_for(optimizer), optimizer,
                             _rules_program(net, teacher320, optimizer),
                             buffers=name == "batchnorm_mlp")
    assert res.program_choice == "given"


def _rules_program(net, ds, optimizer):
    run = RunConfig(BATCH, optimizer, max_steps=STEPS, dtype=F64)
    return training.choose_program(net, ds, trials_for(optimizer), run,
                                   program_choice="rules")[0]


def test_a_delay_beyond_the_run_takes_every_gradient_at_the_start(mlp):
    """tau >= the step budget: every update's gradient is at w_0, so plain SGD ends at
    w_0 - lr * (sum of the steps' gradients at w_0), computed here directly."""
    net, ds = mlp
    trial = Trial(lr=0.1, delay=STEPS)
    run = RunConfig(BATCH, "sgd", max_steps=STEPS, dtype=F64, eval_schedule=EvalSchedule(every=STEPS))
    res = training.train_trials(net, ds, [trial], run)
    start = copy.deepcopy(net).double()
    order = BatchOrder(trial_seed(0, 0), ds.n_train, BATCH)
    total = [torch.zeros_like(p) for p in start.parameters()]
    for t in range(STEPS):
        idx = order.batch(t)
        start.zero_grad()
        nn.functional.cross_entropy(start(ds.x_train.double()[idx]), ds.y_train[idx]).backward()
        total = [a + p.grad for a, p in zip(total, start.parameters())]
    for (k, p), g in zip(start.named_parameters(), total):
        assert close(res.state(0)[k], p.detach() - 0.1 * g), k


@pytest.mark.parametrize("program", PROGRAMS)
def test_delay_zero_is_the_undelayed_step_bit_for_bit(teacher320, program, request):
    """Float32: trials of delay 0 beside delayed ones train exactly as in a group without them
    (they stack apart), and an explicit delay 0 (any kind) is the default."""
    ds = teacher320
    net = model_for(program, ds, request)
    run = RunConfig(BATCH, "momentum", max_steps=STEPS, eval_schedule=EvalSchedule(every=5))
    plain = [Trial(lr=0.05, momentum=0.9), Trial(lr=0.1, momentum=0.5)]
    explicit = [Trial(lr=0.05, momentum=0.9, delay=0, delay_kind="uniform"),
                Trial(lr=0.1, momentum=0.5, delay_kind="round_robin", workers=1)]
    base = training.train_trials(net, ds, plain, run, program=program)
    same = training.train_trials(net, ds, explicit, run, program=program)
    seeds = [trial_seed(0, 0), 99, trial_seed(0, 1)]   # the undelayed trials' data orders
    mixed = training.train_trials(net, ds, [plain[0], Trial(lr=0.05, delay=3), plain[1]], run,
                                  program=program, trials_per_stack=3, data_seeds=seeds)
    for k in base.params:
        assert torch.equal(base.params[k], same.params[k]), k
        assert torch.equal(base.params[k][0], mixed.params[k][0]), k
        assert torch.equal(base.params[k][1], mixed.params[k][2]), k
    assert [c.metric.tolist() for c in base.curves] == [mixed.curves[0].metric.tolist(),
                                                        mixed.curves[2].metric.tolist()]


def test_a_delayed_trial_does_not_depend_on_its_neighbours(mlp):
    """Per-trial tau in one stack: each trial as when trained alone (its seed, its draws)."""
    net, ds = mlp
    run = RunConfig(BATCH, "momentum", max_steps=STEPS, dtype=F64,
                    eval_schedule=EvalSchedule(every=STEPS))
    trials = trials_for("momentum")
    together = training.train_trials(net, ds, trials, run, program="batched")
    for i, trial in enumerate(trials):
        alone = training.train_trials(net, ds, [trial], run, first_index=i, program="batched")
        for k in alone.params:
            assert close(together.params[k][i], alone.params[k][0], 1e-14), (k, i)


@pytest.mark.parametrize("program", PROGRAMS)
def test_steps_to_result_are_exact_with_delays(teacher, program, request):
    """The replay copies the queue: each hit step found between evaluations every 7 steps is
    the first step after the previous evaluation where a run evaluated after every step meets
    the goal."""
    net = model_for(program, teacher, request)
    trials = [Trial(lr=0.1, momentum=0.9, delay=2), Trial(lr=0.05, momentum=0.9, delay=4,
                                                          delay_kind="uniform")]
    run = RunConfig(16, "momentum", max_steps=80, goal=0.2, dtype=F64)
    every = replace(run, stop="never", eval_schedule=EvalSchedule(every=1))
    dense = training.train_trials(net, teacher, trials, every, program=program)
    sparse = training.train_trials(net, teacher, trials, replace(
        run, stop="all", eval_schedule=EvalSchedule(every=7)), program=program)
    goal = training.goal.as_goal(run.goal, teacher.task)
    between = 0
    for i, hit in enumerate(sparse.hit_step):
        met = [goal.met(v) for v in dense.curves[i].metric]
        prev = (hit - 1) // 7 * 7
        assert met[hit] and not any(met[prev + 1:hit]), (i, hit)
        between += hit % 7 != 0
    assert between   # a replay found a hit between two evaluations


def test_uniform_delays_are_the_trials_own_draws():
    """Uniform on {0, ..., tau_max}, any span of steps cut from the same stream, other seeds
    other draws, frequencies within 5 sigma of uniform over 20k steps."""
    whole = uniform_delays(11, 4, 0, 20 * BLOCK)
    assert whole.min() == 0 and whole.max() == 4
    assert np.array_equal(uniform_delays(11, 4, BLOCK - 7, BLOCK + 9), whole[BLOCK - 7:BLOCK + 9])
    assert not np.array_equal(uniform_delays(12, 4, 0, BLOCK), whole[:BLOCK])
    counts = np.bincount(whole, minlength=5)
    n, p = len(whole), 1 / 5
    assert np.all(np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p)))


def test_queue_reads_a_slot_without_a_copy_when_the_trials_agree():
    params = [torch.arange(6.0).view(2, 3)]
    q = DelayQueue.start(params, [Trial(lr=1, delay=2), Trial(lr=1, delay=2)], [0, 1])
    assert q.stale(params, 0)[0] is params[0]         # step 0: the weights themselves
    q.slot(1)[0].copy_(params[0] + 1)                 # what updates 0 and 1 write
    q.slot(2)[0].copy_(params[0] + 2)
    at = q.stale(params, 3)[0]                        # weights of step 1, a view of the ring
    assert at.data_ptr() == q.ring[0][1].data_ptr() and torch.equal(at, params[0] + 1)
    assert q.slot(4)[0].data_ptr() == at.data_ptr()   # S = 3 slots: step 4 overwrites step 1
    mixed = DelayQueue.start(params, [Trial(lr=1, delay=1), Trial(lr=1, delay=2)], [0, 1])
    mixed.slot(1)[0].copy_(params[0] + 1)
    mixed.slot(2)[0].copy_(params[0] + 2)
    # step 2: trial 0 reads step 1, trial 1 step 0
    assert torch.equal(mixed.stale(params, 2)[0], torch.stack([params[0][0] + 1, params[0][1]]))
    assert DelayQueue.start(params, [Trial(lr=1), Trial(lr=1)], [0, 1]) is None


def test_the_queue_reads_each_trials_own_past_step_across_a_block():
    """The reads worked out a block of steps at a time: every trial's gradient weights at
    update t are those of step max(t - tau_t, 0), with tau_t its own draw (uniform_delays) or
    its fixed delay, from the first steps to past the edge of the first block."""
    trials = [Trial(lr=1, delay=3, delay_kind="uniform"), Trial(lr=1, delay=2),
              Trial(lr=1, delay=5, delay_kind="uniform"), Trial(lr=1, delay=1)]
    seeds = [5, 6, 7, 8]
    params = [torch.zeros(4, 2)]                      # every weight: the step it belongs to
    q = DelayQueue.start(params, trials, seeds)
    for t in range(BLOCK + 6):
        tau = [int(uniform_delays(s, tr.delay, t, t + 1)[0]) if tr.delay_kind == "uniform"
               else tr.delay for s, tr in zip(seeds, trials)]
        want = torch.tensor([float(max(t - d, 0)) for d in tau]).unsqueeze(1).expand(4, 2)
        assert torch.equal(q.stale(params, t)[0], want), t
        params = q.slot(t + 1)                        # what the update writes, as the loop
        params[0].fill_(t + 1)


@pytest.mark.parametrize("fields, message", [
    (dict(delay=-1), "delay must be an integer >= 0"),
    (dict(delay=1.5), "delay must be an integer >= 0"),
    (dict(delay_kind="unifrom"), "allowed: fixed, uniform, round_robin"),
    (dict(delay_kind="round-robin"), "did you mean 'round_robin'"),
    (dict(workers=4), "for delay_kind 'round_robin' only"),
    (dict(delay_kind="round_robin", workers=0), "workers must be an integer >= 1"),
    (dict(delay_kind="round_robin", workers=3, delay=1), "W - 1 = 2"),
    (dict(delay_kind="round_robin", delay=3), "did you mean workers=4"),
])
def test_bad_delays_raise_one_clear_error(fields, message):
    with pytest.raises(ConfigError, match=message):
        Trial(lr=0.1, **fields)


def test_round_robin_sets_the_delay_from_the_workers():
    assert Trial(lr=0.1, delay_kind="round_robin", workers=5).delay == 4
    assert Trial(lr=0.1, delay_kind="round_robin", workers=5, delay=4).delay == 4
    assert Trial.from_dict({"lr": 0.1, "delay": 2, "delay_kind": "uniform"}).delay == 2


def test_trainers_without_delays_refuse_them(mlp):
    net, ds = mlp
    trial = Trial(lr=0.1, delay=2)
    run = RunConfig(BATCH, "sgd", max_steps=4)
    with pytest.raises(ConfigError, match="plain reference loop does not train delayed"):
        training.train_reference(net, ds, trial, run)
    with pytest.raises(ConfigError, match="replay_snapshots .* does not train delayed"):
        replay_snapshots(net, ds, trial, run, [2])
    with pytest.raises(ConfigError, match="the DDP trainer does not train delayed"):
        DistRun(trial, run, world_size=2)
    with pytest.raises(ConfigError, match="train_schedule_trials does not train delayed"):
        train_schedule_trials(net, ds, [trial], run)
    with pytest.raises(ConfigError, match="start or return_state does not train delayed"):
        training.train_trials(net, ds, [Trial(lr=0.1), trial], run, return_state=True)


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_diverging_delayed_trial_leaves_its_stack_alone(teacher320, program, request):
    """A huge learning rate diverges (its loss at its past weights above the limit) at the
    same step on every program; the trial beside it trains as the plain loop does."""
    net = model_for(program, teacher320, request)
    trials = [Trial(lr=1e3, momentum=0.9, delay=2),
              Trial(lr=0.05, momentum=0.9, delay=3, delay_kind="uniform")]
    run = RunConfig(BATCH, "momentum", max_steps=STEPS, dtype=F64,
                    eval_schedule=EvalSchedule(every=STEPS))
    res = training.train_trials(net, teacher320, trials, run, program=program)
    ref = training.train_trials(net, teacher320, trials, run,
                                program="func" if program == "func" else "batched")
    assert res.status[0] == "diverged" and res.diverged_step == ref.diverged_step
    assert res.diverged_step[0] > 0
    want, _ = delayed_loop(net, teacher320, trials[1], "momentum", 1, {})
    for k, p in want.named_parameters():
        assert close(res.state(1)[k], p.detach()), k
