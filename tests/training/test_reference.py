import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import training
from training import ConfigError, EvalSchedule, MaskError, RunConfig, Trial
from training.schedules.order import BatchOrder, trial_seed
from training.schedules.lr_schedule import lr_factor


@pytest.fixture(scope="module")
def teacher():
    return training.data.load("teacher", n=400, dim=8, num_classes=3, seed=1)


def manual_sgd(net, ds, batch_size, lr, momentum, optimizer, steps, seed, trial_index,
               decay_steps=None, end_factor=1.0, mask=None):
    """Independent re-implementation of the update rules (Shallue et al.'s TF form), float64."""
    params = {k: v.detach().clone().double() for k, v in net.named_parameters()}
    if mask:
        for k, m in mask.items():
            params[k] *= m.double()
    bufs = {k: torch.zeros_like(v) for k, v in params.items()}
    order = BatchOrder(trial_seed(seed, trial_index), ds.n_train, batch_size)
    x, y = ds.x_train.double(), ds.y_train
    for t in range(steps):
        idx = order.batch(t)
        p = {k: v.requires_grad_() for k, v in params.items()}
        loss = F.cross_entropy(torch.func.functional_call(net.double(), p, (x[idx],)), y[idx])
        grads = dict(zip(p, torch.autograd.grad(loss, list(p.values()))))
        rate = lr * lr_factor(t, decay_steps, end_factor)
        with torch.no_grad():
            for k in params:
                g = grads[k] * (mask[k].double() if mask and k in mask else 1.0)
                if optimizer == "sgd":
                    step = g
                else:
                    bufs[k] = momentum * bufs[k] + g
                    step = g + momentum * bufs[k] if optimizer == "nesterov" else bufs[k]
                params[k] = params[k] - rate * step
    net.float()
    return params


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov"])
@pytest.mark.parametrize("decay", [None, 15])
def test_matches_independent_update_rules(teacher, optimizer, decay):
    net = training.models.build("mlp", teacher, hidden=[16], seed=0)
    mask = {"1.weight": (torch.rand(16, 8, generator=torch.Generator().manual_seed(0)) > 0.5).float()}
    kw = dict(batch_size=32, lr=0.3, momentum=0.9, optimizer=optimizer, steps=25, seed=5,
              trial_index=2, decay_steps=decay, end_factor=0.1)
    res = training.train_reference(
        net, teacher, Trial(lr=0.3, momentum=0.9, decay_steps=decay, end_factor=0.1),
        RunConfig(32, optimizer, max_steps=25, seed=5, dtype=torch.float64), mask=mask,
        trial_index=2)
    ref = manual_sgd(net, teacher, **kw, mask=mask)
    for k, v in res.state.items():
        assert torch.allclose(v, ref[k], rtol=1e-10, atol=1e-12), k
    assert torch.all(res.state["1.weight"][mask["1.weight"] == 0] == 0)
    assert res.steps_run == 25 and not res.diverged


def test_deterministic_and_seeded_by_trial(teacher):
    net = training.models.build("mlp", teacher, hidden=[16])
    trial = Trial(lr=0.1, momentum=0.9)
    run = RunConfig(16, max_steps=60, eval_schedule=EvalSchedule(every=10), seed=3)
    a = training.train_reference(net, teacher, trial, run)
    b = training.train_reference(net, teacher, trial, run)
    c = training.train_reference(net, teacher, trial, run, trial_index=1)
    assert a.curve.rows() == b.curve.rows()
    assert a.curve.rows() != c.curve.rows()
    assert list(a.curve.step) == [0, 10, 20, 30, 40, 50, 60]
    # the caller's model is not modified
    assert torch.equal(net.state_dict()["1.weight"], training.models.build("mlp", teacher, hidden=[16]).state_dict()["1.weight"])


def test_curve_train_loss_is_the_mean_since_the_last_evaluation(teacher):
    net = training.models.build("linear", teacher)
    res = training.train_reference(net, teacher, Trial(lr=0.5),
                                   RunConfig(400 - 80, "sgd", max_steps=4,
                                             eval_schedule=EvalSchedule(every=2)))
    # full batch (one batch per epoch, permuted): the losses are those of gradient descent
    w = {k: v.detach().clone() for k, v in net.named_parameters()}
    losses = []
    for _ in range(4):
        p = {k: v.requires_grad_() for k, v in w.items()}
        loss = F.cross_entropy(torch.func.functional_call(net, p, (teacher.x_train,)), teacher.y_train)
        grads = torch.autograd.grad(loss, list(p.values()))
        losses.append(float(loss.detach()))
        w = {k: (v - 0.5 * g).detach() for (k, v), g in zip(p.items(), grads)}
    assert np.allclose(res.curve.train_loss, [losses[0], np.mean(losses[:2]), np.mean(losses[2:])], rtol=1e-5)


def test_steps_to_result_is_the_first_evaluation_meeting_the_goal(teacher):
    net = training.models.build("mlp", teacher, hidden=[32])
    trial = Trial(lr=0.2, momentum=0.9)
    run = RunConfig(32, max_steps=300, eval_schedule=EvalSchedule(every=20))
    full = training.train_reference(net, teacher, trial, replace(run, goal=0.0, stop="never"))
    target = float(np.median(full.curve.metric))
    first = int(full.curve.step[np.argmax(full.curve.metric < target)])
    stopped = training.train_reference(net, teacher, trial, replace(run, goal=target))
    assert stopped.steps_to_result == first and stopped.steps_run == first
    assert stopped.curve.rows() == full.curve.rows()[: len(stopped.curve)]
    # one trial: stop="all" (each trial to its own hit) is stop="first"
    alone = training.train_reference(net, teacher, trial, replace(run, goal=target, stop="all"))
    assert alone.curve.rows() == stopped.curve.rows()
    # stop="never" trains the budget and still records the first hit
    never = training.train_reference(net, teacher, trial, replace(run, goal=target, stop="never"))
    assert never.steps_to_result == first and never.steps_run == 300
    lee = training.train_reference(
        net, teacher, trial, replace(run, goal=training.Goal("error", target, strict=False)))
    assert lee.steps_to_result <= first


def test_divergence_ends_the_run_cleanly(teacher):
    net = training.models.build("mlp", teacher, hidden=[16])
    res = training.train_reference(net, teacher, Trial(lr=1e4, momentum=0.9),
                                   RunConfig(32, max_steps=200, goal=0.01))
    assert res.diverged and res.diverged_step is not None and res.steps_run < 200
    assert res.steps_to_result is None and res.steps_run == res.diverged_step


def test_reaches_ten_percent_error_on_mnist1d_with_cnn1d():
    ds = training.data.load("mnist1d")
    net = training.models.build("cnn1d", ds, seed=0)
    res = training.train_reference(net, ds, Trial(lr=0.05, momentum=0.9),
                                   RunConfig(64, max_steps=3000, goal=0.10))
    assert not res.diverged
    assert res.steps_to_result is not None and res.steps_to_result <= 3000
    assert res.curve.metric[-1] < 0.10


def test_regression_task_uses_half_mse():
    ds = training.data.load("linreg", n=200, dim=4, noise=0.1)
    net = training.models.build("linear", ds)
    res = training.train_reference(net, ds, Trial(lr=0.1), RunConfig(40, "sgd", max_steps=300,
                                                                     goal=0.02))
    assert res.steps_to_result is not None
    w = torch.tensor(ds.provenance["w_star"])
    assert torch.allclose(res.state["1.weight"].flatten(), w, atol=0.05)


def test_batch_order_covers_each_epoch():
    order = BatchOrder(7, 10, 3)
    epoch0 = torch.cat([order.batch(s) for s in range(3)])
    assert len(set(epoch0.tolist())) == 9
    assert not torch.equal(order.batch(3), order.batch(0))
    assert torch.equal(BatchOrder(7, 10, 3).batch(4), order.batch(4))
    with pytest.raises(ConfigError, match=r"batch size must be in \[1, 10\]"):
        BatchOrder(0, 10, 11)


def test_schedules():
    assert lr_factor(0, 10, 0.1) == 1.0 and math.isclose(lr_factor(5, 10, 0.1), 0.55)
    assert math.isclose(lr_factor(50, 10, 0.1), 0.1) and lr_factor(50, None, 0.1) == 1.0
    t = lr_factor(5, torch.tensor([10.0, 20.0]), torch.tensor([0.1, 0.0]))
    assert torch.allclose(t, torch.tensor([0.55, 0.75]))
    assert EvalSchedule(every=3).steps(10) == [0, 3, 6, 9, 10]
    geo = EvalSchedule(kind="geometric", first=1, ratio=2.0, max_gap=16).steps(100)
    assert geo[:7] == [0, 1, 2, 4, 8, 16, 32] and geo[-1] == 100
    assert all(b - a <= 16 for a, b in zip(geo, geo[1:]))


@pytest.mark.parametrize("trial, run, mask, message", [
    (dict(lr=-1.0), {}, None, "lr must be a positive finite number"),
    (dict(lr=float("nan")), {}, None, "lr must be a positive finite number"),
    (dict(lr=0.1, momentum=1.0), {}, None, r"momentum must be in \[0, 1\)"),
    (dict(lr=0.1), dict(optimizer="adagrad"), None,
     "unknown optimizer 'adagrad'; allowed: sgd, momentum, nesterov, adam, adamw"),
    (dict(lr=0.1), dict(optimizer="nesterov"), None, "'nesterov' needs momentum > 0"),
    (dict(lr=0.1), dict(batch_size=400), None, r"batch_size must be an integer in \[1, 320\]"),
])
def test_bad_arguments(teacher, trial, run, mask, message):
    net = training.models.build("linear", teacher)
    with pytest.raises(ConfigError, match=message):
        training.train_reference(net, teacher, Trial.from_dict(trial),
                                 RunConfig(**{"batch_size": 8, "max_steps": 1, **run}))


def test_bad_mask_raises_mask_error(teacher):
    net = training.models.build("linear", teacher)
    with pytest.raises(MaskError, match="mask entry 'nope' is not a parameter"):
        training.train_reference(net, teacher, Trial(lr=0.1), RunConfig(8, max_steps=1),
                                 mask={"nope": torch.ones(1)})


def test_run_must_be_a_run_config(teacher):
    net = training.models.build("linear", teacher)
    with pytest.raises(ConfigError, match="run must be a training.RunConfig, got dict"):
        training.train_reference(net, teacher, Trial(lr=0.1), {"batch_size": 8})


def test_trial_from_dict():
    assert Trial.from_dict({"lr": 0.1, "momentum": 0.5}).effective_lr == pytest.approx(0.2)
    with pytest.raises(ConfigError, match=r"unknown trial keys \['lrr'\]"):
        Trial.from_dict({"lrr": 0.1})
