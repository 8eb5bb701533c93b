"""Adam and AdamW in every single-process trainer against plain torch.optim.Adam / AdamW loops."""

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

import training
from training import ConfigError, EvalSchedule, RunConfig, Trial
from training.engine.adam import AdamState
from training.goal import loss_fn
from training.schedules.order import BatchOrder, trial_seed
from training.reference import train_schedule_reference

F64 = torch.float64
# trials 0 and 1 share (beta1, beta2, eps), trial 2 does not: the update runs one fused call per
# such class, over whole stacks or over rows
TRIALS = [
    {"lr": 3e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1},
    {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0,
     "decay_steps": 120, "end_factor": 0.01},
    {"lr": 1e-3, "beta1": 0.5, "beta2": 0.95, "eps": 1e-4, "weight_decay": 0.3,
     "decay_steps": 60, "end_factor": 0.1},
]


def random_mask(shape, seed, leading=()):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*leading, *shape, generator=g) > 0.4).double()


def torch_optim_loop(net, ds, trial, optimizer, index, batch_size, steps, seed, mask=None):
    """The plain loop: torch.optim.Adam / AdamW with LambdaLR for the linear decay, masked
    gradients, the data order of trial ``index`` (float64)."""
    t = Trial.from_dict(trial)
    model = copy.deepcopy(net).double()
    params = dict(model.named_parameters())
    mask = {k: m.double() for k, m in (mask or {}).items()}
    with torch.no_grad():
        for k, m in mask.items():
            params[k].mul_(m)
    cls = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    opt = cls(model.parameters(), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps,
              weight_decay=t.weight_decay)
    d = t.decay_steps

    def factor(k):
        return 1.0 if d is None else 1.0 - (1.0 - t.end_factor) * min(k, d) / d

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    order = BatchOrder(trial_seed(seed, index), ds.n_train, batch_size)
    x, y, criterion = ds.x_train.double(), ds.y_train, loss_fn(ds.task)
    for k in range(steps):
        idx = order.batch(k)
        opt.zero_grad()
        criterion(model(x[idx]), y[idx]).backward()
        for name, m in mask.items():
            params[name].grad.mul_(m)
        opt.step()
        sched.step()
    return {k: v.detach() for k, v in model.named_parameters()}


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("schedule", ["constant", "decay"])
def test_float64_matches_torch_optim_after_200_steps(mnist1d_small, optimizer, masked, schedule):
    net = training.models.build("mlp", mnist1d_small, hidden=[32, 32], seed=1)
    trials = TRIALS if schedule == "decay" else [
        {k: v for k, v in t.items() if k not in ("decay_steps", "end_factor")} for t in TRIALS]
    masks = {"1.weight": random_mask((32, 40), 0, leading=(3,)),
             "3.weight": random_mask((32, 32), 1)} if masked else None
    run = RunConfig(16, optimizer, max_steps=200, seed=7, dtype=F64,
                    eval_schedule=EvalSchedule(every=50))
    res = training.train_trials(net, mnist1d_small, trials, run, masks=masks)
    for i, t in enumerate(trials):
        mask = {k: m[i] if k == "1.weight" else m for k, m in masks.items()} if masked else None
        plain = torch_optim_loop(net, mnist1d_small, t, optimizer, i, batch_size=16, steps=200,
                                 seed=7, mask=mask)
        ref = training.train_reference(net, mnist1d_small, t, run, mask=mask, trial_index=i)
        for name, v in plain.items():
            assert rel_err(res.state(i)[name], v) <= 1e-9, (i, name)
            assert rel_err(ref.state[name], v) <= 1e-12, (i, name)
        # the weights moved far beyond the tolerance
        assert rel_err(net.state_dict()["1.weight"].double(), plain["1.weight"]) > 1e-3
        if masked:
            assert torch.all(res.state(i)["1.weight"][mask["1.weight"] == 0] == 0)
            assert torch.all(res.state(i)["3.weight"][mask["3.weight"] == 0] == 0)
    assert res.status == ["not_reached"] * 3 and res.steps_taken == [200] * 3


def test_adam_and_adamw_differ_only_with_weight_decay(teacher):
    net = training.models.build("mlp", teacher, hidden=[16], seed=0)
    kw = dict(max_steps=50, seed=1, dtype=F64)
    trials = [{"lr": 1e-2}, {"lr": 1e-2, "weight_decay": 0.5}]
    adam = training.train_trials(net, teacher, trials, RunConfig(16, "adam", **kw))
    adamw = training.train_trials(net, teacher, trials, RunConfig(16, "adamw", **kw))
    for name, v in adam.state(0).items():
        assert torch.equal(adamw.state(0)[name], v)
    assert rel_err(adamw.state(1)["1.weight"], adam.state(1)["1.weight"]) > 1e-3


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_float64_steps_to_result_identical(teacher, optimizer):
    """Exact hit steps (coarse schedule + replay from snapshots of the moments) equal the
    reference's with an evaluation after every step."""
    net = training.models.build("mlp", teacher, hidden=[16], seed=0)
    mask = {"1.weight": random_mask((16, 8), 3)}
    trials = [{"lr": 0.01}, {"lr": 0.03, "weight_decay": 0.1, "decay_steps": 100,
                             "end_factor": 0.1}, {"lr": 0.02, "beta1": 0.7, "beta2": 0.99}]
    run = RunConfig(32, optimizer, max_steps=300, goal=0.25, seed=3, dtype=F64,
                    eval_schedule=EvalSchedule(every=1), stop="all")
    coarse = replace(run, eval_schedule=EvalSchedule(every=40))
    every = training.train_trials(net, teacher, trials, run, masks=mask)
    coarse_all = training.train_trials(net, teacher, trials, coarse, masks=mask)
    first = training.train_trials(net, teacher, trials, replace(coarse, stop="first"), masks=mask)
    refs = [training.train_reference(net, teacher, t, run, mask=mask, trial_index=i)
            for i, t in enumerate(trials)]
    hits = [r.steps_to_result for r in refs]
    assert all(h is not None for h in hits) and len(set(hits)) > 1
    assert every.hit_step == coarse_all.hit_step == hits
    assert first.steps_to_result == min(hits) and first.best == hits.index(min(hits))
    for i, ref in enumerate(refs):
        for name, v in ref.state.items():
            assert rel_err(every.state(i)[name], v) <= 1e-9


# float32's unit roundoff: 2^-24
EPS32 = 2.0 ** -24
# A float32 run within this of the float64 run's weights (relative to the largest), where the
# loss is a smooth function of the weights: each of 100 steps rounds a weight's update (one
# ulp), its gradient's sums over 32 examples and 10 classes and Adam's square root and division
# (a few ulps each, pairwise), so about 16 ulps a step, and the errors add up at worst linearly:
# 100 x 16 x 2^-24 = 9.5e-5. Measured: 1.5e-6 with ATEN_CPU_CAPABILITY default and avx2.
SMOOTH_TOLERANCE = 100 * 16 * EPS32


def test_float32_stays_on_the_float64_trajectory_where_the_loss_is_smooth(mnist1d_small):
    """The compiled kernel's float32 Adam against the float64 plain loop, 100 steps of a
    softmax regression (no ReLU: the weights move smoothly with their gradients), masked."""
    net = training.models.build("linear", mnist1d_small, seed=2)
    weight = next(n for n, p in net.named_parameters() if p.dim() > 1)
    masks = {weight: random_mask(dict(net.named_parameters())[weight].shape, 6).float()}
    run = RunConfig(32, "adamw", max_steps=100, seed=1, eval_schedule=EvalSchedule(every=50))
    res = training.train_trials(net, mnist1d_small, TRIALS, run, masks=masks)
    assert res.params[weight].dtype == torch.float32
    for i, t in enumerate(TRIALS):
        ref = training.train_reference(net, mnist1d_small, t, replace(run, dtype=F64),
                                       mask=masks, trial_index=i)
        moved = rel_err(net.state_dict()[weight].double(), ref.state[weight])
        assert moved > 1e3 * SMOOTH_TOLERANCE   # the weights went far beyond the tolerance
        for name, v in ref.state.items():
            assert rel_err(res.state(i)[name].double(), v) <= SMOOTH_TOLERANCE, (i, name)


def test_float32_adam_through_relus_leaves_the_trajectory_only_in_steps(mnist1d_small,
                                                                        record_property):
    """Through ReLUs, float32 and float64 agree only until a pre-activation near zero falls on
    the two sides in the two precisions: the weights fed by that unit then see a gradient that
    is zero in one run and not in the other, and Adam, which divides by the root of the
    gradients' running square, turns it into a step of about lr. Which trial, if any, takes
    such a step depends on the machine's rounding (cnn1d here, 100 steps: trial 0 left the
    float64 weights by 8e-5 with ATEN_CPU_CAPABILITY=default, trial 1 by 7e-2 with avx2;
    torch.optim's float32 loop takes its own steps elsewhere). The deviations are measured and
    recorded (``record_property``); what holds on every machine is asserted: a jump of a few
    weights by an Adam step moves the loss by about lr x gradient x those weights' share, so the
    training loss stays within 1 % of float64's at every evaluation (measured at most 5.3e-4,
    avx2, trial 1), and the validation error within two of the 80 examples."""
    net = training.models.build("cnn1d", mnist1d_small, seed=2)
    masks = {"3.weight": random_mask(net[3].weight.shape, 6).float()}
    run = RunConfig(32, "adamw", max_steps=100, seed=1, eval_schedule=EvalSchedule(every=10))
    res = training.train_trials(net, mnist1d_small, TRIALS, run, masks=masks)
    assert res.params["1.weight"].dtype == torch.float32
    n_val = len(mnist1d_small.y_val)
    for i, t in enumerate(TRIALS):
        ref = training.train_reference(net, mnist1d_small, t, replace(run, dtype=F64),
                                       mask=masks, trial_index=i)
        plain = training.train_reference(net, mnist1d_small, t, run, mask=masks, trial_index=i)
        for label, state in (("trainer", res.state(i)), ("torch.optim", plain.state)):
            record_property(f"trial {i} {label} float32 deviation",
                            max(rel_err(state[n].double(), v) for n, v in ref.state.items()))
        mine, exact = res.curves[i], ref.curve
        assert mine.step.tolist() == exact.step.tolist()
        assert np.all(np.isfinite(mine.train_loss))
        np.testing.assert_allclose(mine.train_loss, exact.train_loss, rtol=1e-2)
        assert np.max(np.abs(mine.metric - exact.metric)) * n_val <= 2 + 1e-6


def manual_adam(w, grads, trial, decoupled, lrs):
    """Kingma & Ba's update written out for one trial (bias-corrected moments; AdamW decays the
    weights by lr * weight_decay first, Adam adds weight_decay * w to the gradient)."""
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        if decoupled:
            w = w * (1 - lr * trial.weight_decay)
        else:
            g = g + trial.weight_decay * w
        m = trial.beta1 * m + (1 - trial.beta1) * g
        v = trial.beta2 * v + (1 - trial.beta2) * g * g
        m_hat, v_hat = m / (1 - trial.beta1 ** t), v / (1 - trial.beta2 ** t)
        w = w - lr * m_hat / (v_hat.sqrt() + trial.eps)
    return w, m, v


@pytest.mark.parametrize("decoupled", [False, True])
def test_stacked_update_equals_the_written_out_rule(decoupled):
    g = torch.Generator().manual_seed(0)
    trials = [Trial.from_dict(t) for t in TRIALS] + [Trial(lr=0.1, beta1=0.0, beta2=0.5)]
    n, steps = len(trials), 6
    w0 = torch.randn(n, 5, 3, generator=g, dtype=F64)
    mask = (torch.rand(n, 5, 3, generator=g) > 0.3).double()
    w0 *= mask
    grads = [torch.randn(n, 5, 3, generator=g, dtype=F64) * mask for _ in range(steps)]
    lrs = [torch.tensor([t.lr * (1 - 0.1 * k) for t in trials], dtype=F64) for k in range(steps)]
    state = AdamState.zeros([w0], trials, decoupled)
    w = w0.clone()
    for k in range(steps):
        state.step([w], [grads[k].clone()], lrs[k], k)
    for i, trial in enumerate(trials):
        w_i, m_i, v_i = manual_adam(w0[i], [gr[i] for gr in grads], trial, decoupled,
                                    [float(lr[i]) for lr in lrs])
        torch.testing.assert_close(w[i], w_i, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(state.exp_avg[0][i], m_i, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(state.exp_avg_sq[0][i], v_i, rtol=1e-12, atol=1e-15)
    # masked entries: weights, first and second moments exactly zero
    for x in (w, state.exp_avg[0], state.exp_avg_sq[0]):
        assert torch.all(x[mask == 0] == 0)


def test_select_and_clone_keep_rows_independent():
    trials = [Trial(lr=0.1), Trial(lr=0.2, beta1=0.5), Trial(lr=0.3)]
    w = torch.ones(3, 4, dtype=F64)
    state = AdamState.zeros([w], trials, decoupled=False)
    state.step([w], [torch.full((3, 4), 2.0, dtype=F64)], torch.tensor([0.1, 0.2, 0.3], dtype=F64),
               0)
    copy_ = state.clone()
    sub = state.select(torch.tensor([2, 0]))
    assert sub.beta1.tolist() == [0.9, 0.9] and sub._classes == {(0.9, 0.999, 1e-8): [0, 1]}
    assert torch.equal(sub.exp_avg[0], state.exp_avg[0][[2, 0]])
    state.step([w], [torch.ones(3, 4, dtype=F64)], torch.tensor([0.1, 0.2, 0.3], dtype=F64), 1)
    assert not torch.equal(copy_.exp_avg[0], state.exp_avg[0])
    np.testing.assert_allclose(copy_.exp_avg[0][:, 0], [0.2, 1.0, 0.2])


@pytest.mark.parametrize("kwargs, match", [
    (dict(trials=[{"lr": 0.1, "weight_decay": 0.1}], optimizer="momentum"),
     "weight_decay is used by optimizers adam, adamw only"),
    (dict(trials=[{"lr": 0.1, "beta1": 1.0}], optimizer="adam"), r"beta1 must be in \[0, 1\)"),
    (dict(trials=[{"lr": 0.1, "beta2": -0.1}], optimizer="adam"), r"beta2 must be in \[0, 1\)"),
    (dict(trials=[{"lr": 0.1, "eps": 0.0}], optimizer="adam"), "eps must be a positive"),
    (dict(trials=[{"lr": 0.1, "weight_decay": -1.0}], optimizer="adamw"),
     "weight_decay must be a finite number >= 0"),
    (dict(trials=[{"lr": 0.1, "beta3": 0.5}], optimizer="adam"), "unknown trial keys"),
])
def test_bad_adam_keys(teacher, kwargs, match):
    net = training.models.build("mlp", teacher, hidden=[16], seed=0)
    run = RunConfig(8, kwargs["optimizer"], max_steps=5)
    with pytest.raises(ConfigError, match=match):
        training.train_trials(net, teacher, kwargs["trials"], run)
    with pytest.raises(ConfigError, match=match):
        training.train_reference(net, teacher, kwargs["trials"][0], run)


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_a_resumed_adam_run_equals_the_straight_run_bit_for_bit(teacher, optimizer):
    """The state holds Adam's m, v and step count: 30 + 30 steps are 60 steps (float64)."""
    net = training.models.build("mlp", teacher, hidden=[16], seed=0)
    mask = {"1.weight": random_mask((16, 8), 5)}
    trial = Trial(lr=1e-2, beta1=0.8, beta2=0.99, weight_decay=0.1, decay_steps=50,
                  end_factor=0.1)
    run = RunConfig(16, optimizer, max_steps=60, seed=2, dtype=F64, stop="never",
                    eval_schedule=EvalSchedule(every=10))
    straight = train_schedule_reference(net, teacher, trial, run, mask=mask, trial_index=1)
    half = train_schedule_reference(net, teacher, trial, replace(run, max_steps=30), mask=mask,
                                    trial_index=1)
    assert set(half.state.buffers) == set(half.state.moments) == set(half.state.params)
    resumed = train_schedule_reference(net, teacher, trial, run, mask=mask, trial_index=1,
                                       start=half.state)
    for name, v in straight.result.state.items():
        assert torch.equal(resumed.result.state[name], v), name
    for kind in ("buffers", "moments"):
        for name, v in getattr(straight.state, kind).items():
            assert torch.equal(getattr(resumed.state, kind)[name], v), (kind, name)
    assert torch.all(straight.state.moments["1.weight"][0][mask["1.weight"] == 0] == 0)
    assert resumed.result.curve.rows()[-3:] == straight.result.curve.rows()[-3:]


def test_a_state_resumes_only_its_own_optimizer_family(teacher):
    net = training.models.build("mlp", teacher, hidden=[16], seed=0)
    momentum = train_schedule_reference(net, teacher, Trial(lr=0.1, momentum=0.9),
                                        RunConfig(8, max_steps=4)).state
    adam = train_schedule_reference(net, teacher, Trial(lr=1e-2),
                                    RunConfig(8, "adam", max_steps=4)).state
    assert momentum.moments == {} and set(adam.moments) == set(adam.buffers)
    with pytest.raises(ConfigError, match="optimizer 'adamw' resumes from a TrainState with "
                                          "Adam's moments"):
        train_schedule_reference(net, teacher, Trial(lr=1e-2), RunConfig(8, "adamw", max_steps=8),
                                 start=momentum)
    with pytest.raises(ConfigError, match="start holds Adam's moments; optimizer 'momentum'"):
        train_schedule_reference(net, teacher, Trial(lr=0.1, momentum=0.9),
                                 RunConfig(8, max_steps=8), start=adam)
