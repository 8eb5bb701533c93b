"""Each trial its own initialization (``train_trials(init_params=...)``) and its own mask on weights
AND biases, in every program: trial i equals the plain reference loop started from its own
weights under its own mask (float64), and its pruned biases stay exactly zero."""

import copy

import pytest
import torch
from torch import nn

import training
from training import ConfigError, EvalSchedule, RunConfig, Trial
from training.engine import compiled_kernel as kernels

F64 = torch.float64
TRIALS = [Trial(lr=0.05, momentum=0.9), Trial(lr=0.2, momentum=0.5, decay_steps=20,
                                             end_factor=0.1), Trial(lr=0.1, momentum=0.0)]


def images(n=48):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 1, 16, 16, generator=g), torch.randint(0, 3, (n,), generator=g)
    return training.Dataset("img16", "classification", x[:32], y[:32], x[32:], y[32:], 3,
                            (1, 16, 16))


def tanh_mlp(ds):
    return nn.Sequential(nn.Flatten(), nn.Linear(40, 12), nn.Tanh(), nn.Linear(12, 10))


def per_trial(net, n, seed):
    """Every parameter perturbed per trial ([n, *shape]) and a random 0/1 mask per trial on
    every parameter, biases included (about 40 % pruned)."""
    g = torch.Generator().manual_seed(seed)
    named = dict(net.named_parameters())
    inits = {k: p.detach().double() + 0.1 * torch.randn(n, *p.shape, generator=g, dtype=F64)
             for k, p in named.items()}
    masks = {k: (torch.rand(n, *p.shape, generator=g) > 0.4).double() for k, p in named.items()}
    return inits, masks


def started_from(net, params):
    """A copy of ``net`` holding ``params`` (one trial's row)."""
    out = copy.deepcopy(net)
    with torch.no_grad():
        for k, p in out.named_parameters():
            p.copy_(params[k])
    return out


@pytest.mark.parametrize("program", ["fused", "batched", "per_trial", "plain", "func"])
def test_every_program_starts_each_trial_from_its_own_weights_and_masks_its_biases(
        program, mnist1d_small, monkeypatch, request):
    if program == "fused":
        request.getfixturevalue("compiled_kernel")   # skipped without it (failed in CI)
    if program == "batched":
        monkeypatch.setenv(kernels.DISABLE_ENV, "0")   # the compiled kernel's eager fallback
    if program in ("per_trial", "plain"):
        ds = images()
        net = training.models.build("lee_cnn", ds, seed=1).double()
    elif program == "func":
        ds = mnist1d_small
        with training.models.seeded(1):
            net = tanh_mlp(ds).double()
    else:
        ds = mnist1d_small
        net = training.models.build("mlp", ds, hidden=[16, 16], seed=1).double()
    inits, masks = per_trial(net, len(TRIALS), seed=2)
    run = RunConfig(8, "momentum", max_steps=30, seed=5, dtype=F64,
                    eval_schedule=EvalSchedule(every=10))
    # the program named, not the rules' or the measured one
    res = training.train_trials(net, ds, TRIALS, run, masks=masks, init_params=inits,
                                program=program)
    assert res.program == program
    for i, trial in enumerate(TRIALS):
        mask = {k: m[i] for k, m in masks.items()}
        ref = training.train_reference(started_from(net, {k: v[i] for k, v in inits.items()}),
                                       ds, trial, run, mask=mask, trial_index=i)
        for k, v in ref.state.items():
            torch.testing.assert_close(res.state(i)[k], v, rtol=1e-9, atol=1e-12)
            assert torch.all(res.state(i)[k][mask[k] == 0] == 0), k
        assert res.curves[i].train_loss[0] == pytest.approx(ref.curve.train_loss[0], rel=1e-12)
    biases = [k for k in inits if k.endswith("bias")]
    assert biases and all(torch.count_nonzero(masks[k] == 0) for k in biases)


def test_without_init_params_every_trial_starts_from_the_model(mnist1d_small):
    net = training.models.build("mlp", mnist1d_small, hidden=[8], seed=0).double()
    same = {k: p.detach().unsqueeze(0).expand(2, *p.shape).clone()
            for k, p in net.named_parameters()}
    run = RunConfig(8, "momentum", max_steps=10, seed=1, dtype=F64)
    a = training.train_trials(net, mnist1d_small, TRIALS[:2], run)
    b = training.train_trials(net, mnist1d_small, TRIALS[:2], run, init_params=same)
    for i in range(2):
        for k, v in a.state(i).items():
            assert torch.equal(v, b.state(i)[k])


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("1.bias"), r"missing \['1.bias'\]"),
    (lambda d: d.update(extra=torch.zeros(2)), r"not parameters \['extra'\]"),
    (lambda d: d.update({"1.bias": torch.zeros(8)}), r"init_params\['1.bias'\] .* shape \(2, 8\)"),
    (lambda d: d.update({"1.bias": torch.zeros(2, 8, dtype=torch.long)}), "floating-point"),
])
def test_bad_init_params_name_what_is_allowed(mnist1d_small, change, message):
    net = training.models.build("mlp", mnist1d_small, hidden=[8], seed=0)
    inits = {k: p.detach().unsqueeze(0).expand(2, *p.shape).clone()
             for k, p in net.named_parameters()}
    change(inits)
    run = RunConfig(8, "momentum", max_steps=10, seed=1)
    with pytest.raises(ConfigError, match=message):
        training.train_trials(net, mnist1d_small, TRIALS[:2], run, init_params=inits)


def test_init_params_and_a_start_state_exclude_each_other(mnist1d_small):
    net = training.models.build("mlp", mnist1d_small, hidden=[8], seed=0)
    inits = {k: p.detach().unsqueeze(0).expand(2, *p.shape).clone()
             for k, p in net.named_parameters()}
    run = RunConfig(8, "momentum", max_steps=10, seed=1)
    state = training.train_trials(net, mnist1d_small, TRIALS[:2], run, return_state=True).end_state
    with pytest.raises(ConfigError, match="init_params and start exclude each other"):
        training.train_trials(net, mnist1d_small, TRIALS[:2], RunConfig(8, "momentum",
                                                                       max_steps=20, seed=1),
                              init_params=inits, start=state)
