"""Per-token classification (labels [n, T], outputs [n, T, classes], next-byte prediction): the
loss and goal metrics against a float64 loop over positions, and every trainer and program the
strategy picks for a language model against the plain torch.optim loop."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import training
from training import EvalSchedule, Goal, RunConfig, Trial
from training.engine.programs.common import stacked_loss_and_grad
from training.goal import loss_fn, metric_value
from training.schedules.order import BatchOrder, trial_seed
from training.randomness import randomness_seed

F64 = torch.float64
T, V = 6, 256
STEPS, BATCH = 10, 8


def token_data(n=48, seed=0):
    """Random token windows whose targets are the inputs shifted by one, as python_source."""
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, 40, (n * (T + 1),), generator=g)
    w = stream.view(n, T + 1)
    x, y = w[:, :-1].float(), w[:, 1:].clone()
    return training.Dataset("tokens", "classification", x[:40], y[:40], x[40:], y[40:], V, (T,))


def mean_token_ce(out, y):
    """The loss written out: mean over examples and positions of -log softmax(out)[y]."""
    total, count = 0.0, 0
    for i in range(out.shape[0]):
        for t in range(out.shape[1]):
            total = total - torch.log_softmax(out[i, t], -1)[y[i, t]]
            count += 1
    return total / count


def test_loss_and_metrics_are_means_over_examples_and_positions():
    g = torch.Generator().manual_seed(1)
    out = torch.randn(5, T, V, generator=g, dtype=F64)
    y = torch.randint(0, V, (5, T), generator=g)
    want = mean_token_ce(out, y)
    assert float(loss_fn("classification")(out, y)) == pytest.approx(float(want), rel=1e-12)
    assert float(metric_value("loss", out, y, "classification")) == pytest.approx(float(want),
                                                                                  rel=1e-12)
    err = sum(int(out[i, t].argmax() != y[i, t]) for i in range(5) for t in range(T)) / (5 * T)
    assert float(metric_value("error", out, y, "classification")) == pytest.approx(err)
    # stacked over trials [N, n, T, V]: one value per trial
    stacked = torch.stack([out, out.flip(0)])
    got = metric_value("loss", stacked, y, "classification")
    assert got.shape == (2,) and float(got[0]) == pytest.approx(float(want), rel=1e-12)
    # the stacked loss and its gradient with respect to the outputs, against autograd
    loss, dout = stacked_loss_and_grad(stacked, y, "classification")
    leaf = stacked.clone().requires_grad_(True)
    ref = torch.stack([mean_token_ce(leaf[k], y) for k in range(2)])
    ref.sum().backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(dout, leaf.grad, rtol=1e-10, atol=1e-15)


def lm(seed=1, dropout=False):
    ds = token_data()
    net = training.models.build("transformer_lm", ds, seed=seed, layers=1, width=16, heads=2)
    return (nn.Sequential(net, nn.Dropout(0.1)) if dropout else net), ds


def plain_loop(model, ds, trial, optimizer, i):
    net = copy.deepcopy(model).double().train()
    if optimizer == "adamw":
        opt = torch.optim.AdamW(net.parameters(), lr=trial.lr, betas=(trial.beta1, trial.beta2),
                                eps=trial.eps, weight_decay=trial.weight_decay)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=trial.lr, momentum=trial.momentum)
    order = BatchOrder(trial_seed(0, i), ds.n_train, BATCH)
    torch.manual_seed(randomness_seed(0, i))
    for t in range(STEPS):
        idx = order.batch(t)
        logits = net(ds.x_train[idx].double())
        loss = -torch.log_softmax(logits, -1).gather(-1, ds.y_train[idx].unsqueeze(-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net


def key_bias(name, p):
    """The attention key bias: its gradient is zero in exact arithmetic (softmax over the keys
    ignores a shift shared by all of them), so it moves only by rounding noise, which Adam
    normalizes into steps of its own (see test_trials_user_models.noise_only)."""
    if not name.endswith("attn.qkv.bias"):
        return torch.zeros_like(p, dtype=torch.bool)
    d = p.shape[0] // 3
    return (torch.arange(p.shape[0]) >= d) & (torch.arange(p.shape[0]) < 2 * d)


TRIALS = {"momentum": [Trial(lr=0.1, momentum=0.9), Trial(lr=0.3, momentum=0.5)],
          "adamw": [Trial(lr=3e-3, weight_decay=0.1), Trial(lr=1e-2, beta2=0.99,
                                                          weight_decay=0.01)]}


@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
@pytest.mark.parametrize("dropout, program", [(False, "func"), (True, "per_trial")])
def test_trainers_train_a_language_model_as_the_plain_loop(optimizer, dropout, program,
                                                         monkeypatch):
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", program)   # this candidate, not the measured one
    net, ds = lm(dropout=dropout)
    trials = TRIALS[optimizer]
    run = RunConfig(BATCH, optimizer, max_steps=STEPS, dtype=F64, goal=Goal("loss", 0.0),
                    eval_schedule=EvalSchedule(every=5), stop="never")
    res = training.train_trials(net, ds, trials, run)
    assert res.program == program
    for i, trial in enumerate(trials):
        ref = training.train_reference(net, ds, trial, run, trial_index=i)
        want = plain_loop(net, ds, trial, optimizer, i)
        for k, p in want.named_parameters():
            keep = ~key_bias(k, p)
            for got in (res.state(i)[k], ref.state[k]):
                torch.testing.assert_close(got[keep], p.detach()[keep], rtol=1e-9, atol=1e-12)
        # the goal metric: mean per-token cross-entropy on the validation split
        with torch.no_grad():
            want.eval()
            val = float(mean_token_ce(want(ds.x_val.double()), ds.y_val))
        assert res.curves[i].metric[-1] == pytest.approx(val, rel=1e-8)
        assert ref.curve.metric[-1] == pytest.approx(val, rel=1e-8)
