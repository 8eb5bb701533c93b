"""A per-example loss of the user's (``Dataset.from_tensors(..., loss=)``) in every trainer, the
probes and pruning: against a plain loop with the same loss, and against the task's own loss
where the two are the same function."""

import copy

import pytest
import torch
import torch.nn.functional as F

import pruning
import training
from theory.estimators.noise import gradient_noise
from training import EvalSchedule, Goal, RunConfig, Trial
from training.schedules.order import BatchOrder, trial_seed

F64 = torch.float64
TRIALS = [Trial(lr=0.1, momentum=0.9), Trial(lr=0.3, momentum=0.5)]


def smoothed(out, y):
    return F.cross_entropy(out, y, reduction="none", label_smoothing=0.2)


def huber(out, y):
    return F.huber_loss(out, y, reduction="none", delta=0.5)


def plain_ce(out, y):
    return F.cross_entropy(out, y, reduction="none")


@pytest.fixture(scope="module")
def teacher():
    return training.data.load("teacher", n=400, dim=8, num_classes=3, seed=1)


def own(ds, loss):
    return training.Dataset.from_tensors(ds.x_train, ds.y_train, x_val=ds.x_val, y_val=ds.y_val,
                                         loss=loss)


def mlp(ds, seed=0):
    return training.models.build("mlp", ds, hidden=[16], seed=seed)


def plain_loop(net, ds, trial, loss, index, steps, batch):
    net = copy.deepcopy(net).double()
    opt = torch.optim.SGD(net.parameters(), lr=trial.lr, momentum=trial.momentum)
    order = BatchOrder(trial_seed(0, index), ds.n_train, batch)
    for t in range(steps):
        idx = order.batch(t)
        opt.zero_grad()
        loss(net(ds.x_train[idx].double()), ds.y_train[idx].to(net[1].weight.dtype)
             if ds.task == "regression" else ds.y_train[idx]).mean().backward()
        opt.step()
    return net


def test_trials_and_reference_train_on_the_own_loss_like_the_plain_loop(teacher):
    ds = own(teacher, smoothed)
    net = mlp(ds)
    run = RunConfig(16, max_steps=30, dtype=F64, goal=Goal("loss", 0.0, strict=True),
                    eval_schedule=EvalSchedule(every=10))
    res = training.train_trials(net, ds, TRIALS, run)
    assert res.program in ("func", "per_trial", "plain")  # the compiled kernel knows only the task's loss
    for i, trial in enumerate(TRIALS):
        ref = training.train_reference(net, ds, trial, run, trial_index=i)
        want = plain_loop(net, ds, trial, smoothed, i, 30, 16)
        for k, p in want.named_parameters():
            torch.testing.assert_close(res.state(i)[k], p.detach(), rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(ref.state[k], p.detach(), rtol=1e-12, atol=1e-14)
        # the goal metric "loss" is the own loss's mean on the validation split
        with torch.no_grad():
            val = float(smoothed(want(ds.x_val.double()), ds.y_val).mean())
        assert res.curves[i].metric[-1] == pytest.approx(val, rel=1e-12)
        assert ref.curve.metric[-1] == pytest.approx(val, rel=1e-12)
    # and it is not the task's cross-entropy
    base = training.train_trials(net, teacher, TRIALS, run)
    assert not torch.allclose(base.params["1.weight"].double(), res.params["1.weight"])


def test_error_metric_still_applies_to_classification(teacher):
    ds = own(teacher, smoothed)
    run = RunConfig(16, max_steps=20, dtype=F64, goal=0.5, eval_schedule=EvalSchedule(every=10))
    res = training.train_trials(mlp(ds), ds, TRIALS, run)
    assert all(0.0 <= v <= 1.0 for v in res.curves[0].metric)


def test_regression_with_an_own_loss():
    ds = training.data.load("linreg", n=300, dim=5, seed=2)
    mine = training.Dataset.from_tensors(ds.x_train, ds.y_train, x_val=ds.x_val, y_val=ds.y_val,
                                         loss=huber)
    net = training.models.build("linear", mine, seed=0)
    run = RunConfig(8, max_steps=25, dtype=F64, eval_schedule=EvalSchedule(every=25))
    res = training.train_trials(net, mine, TRIALS[:1], run)
    want = plain_loop(net, mine, TRIALS[0], huber, 0, 25, 8)
    for k, p in want.named_parameters():
        torch.testing.assert_close(res.state(0)[k], p.detach(), rtol=1e-12, atol=1e-14)


def test_probes_and_pruning_use_the_own_loss(teacher):
    """The same function as the task's loss gives the task's numbers exactly; another loss gives
    the per-example ground truth."""
    net = mlp(teacher).double()
    same = own(teacher, plain_ce)
    a = gradient_noise(net, teacher, dtype=F64)
    b = gradient_noise(net, same, dtype=F64)
    assert b.g_sq == pytest.approx(a.g_sq, rel=1e-10)
    assert b.trace_sigma == pytest.approx(a.trace_sigma, rel=1e-10)
    mine = own(teacher, smoothed)
    got = gradient_noise(net, mine, dtype=F64)
    grads = []
    for x, y in zip(mine.x_train.double(), mine.y_train):
        net.zero_grad()
        smoothed(net(x[None]), y[None]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    g = torch.stack(grads)
    n = g.shape[0]
    trace = float(((g - g.mean(0)) ** 2).sum() / n)   # the full split: its own variance
    assert got.trace_sigma == pytest.approx(trace, rel=1e-8)
    assert got.trace_sigma != pytest.approx(a.trace_sigma, rel=1e-3)
    masks = [pruning.prune(mlp(teacher), "snip", 0.5, dataset=d) for d in (teacher, same, mine)]
    assert all(torch.equal(masks[0][k], masks[1][k]) for k in masks[0])
    assert any(not torch.equal(masks[0][k], masks[2][k]) for k in masks[0])


def test_a_bad_own_loss_is_one_line(teacher):
    with pytest.raises(training.DataError, match="loss must be a callable"):
        own(teacher, "cross_entropy")
    scalar = own(teacher, lambda out, y: F.cross_entropy(out, y))
    with pytest.raises(training.ModelError, match=r"must return one loss per example \(shape "
                                                  r"\[B\]\); for one example it returned \[\]"):
        training.train_trials(mlp(teacher), scalar, TRIALS, RunConfig(16, max_steps=2))
    broken = own(teacher, lambda out, y: F.binary_cross_entropy_with_logits(out, y,
                                                                            reduction="none"))
    with pytest.raises(training.ModelError, match=r"the data set's loss cannot take the model's "
                                                  r"outputs \[1, 3\] and targets \[1\]: "):
        training.train_reference(mlp(teacher), broken, TRIALS[0], RunConfig(16, max_steps=2))


def test_from_torch_takes_an_own_loss_too(teacher):
    from torch.utils.data import TensorDataset

    made = training.Dataset.from_torch(TensorDataset(teacher.x_train, teacher.y_train),
                                       loss=smoothed)
    assert made.loss is smoothed
    with pytest.raises(training.DataError, match="loss must be a callable"):
        training.Dataset.from_torch(TensorDataset(teacher.x_train, teacher.y_train), loss=3)
