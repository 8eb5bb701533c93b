"""Every model through every program the strategy can choose, with every optimizer, float64,
against the plain torch.optim loop (training.train_reference), trial by trial, with shared and
per-trial masks."""

import pytest
import torch
from torch import nn

import training
from training import EvalSchedule, RunConfig
from training.engine import compiled_kernel as kernels
from training.engine.programs.per_trial import PerTrialProgram
from training.engine.strategy import ruled_strategy

F64 = torch.float64
SGD_TRIALS = [
    {"lr": 0.05, "momentum": 0.9},
    {"lr": 0.1, "momentum": 0.5, "decay_steps": 40, "end_factor": 0.1},
    {"lr": 0.02, "momentum": 0.99},
]
ADAM_TRIALS = [
    {"lr": 0.003},
    {"lr": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1,
     "decay_steps": 40, "end_factor": 0.1},
    {"lr": 0.001, "weight_decay": 0.01},
]
OPTIMIZERS = pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov", "adam",
                                                   "adamw"])
# on max |w - w_ref| / max |w_ref| per parameter after the steps (measured: 4e-16 to 1.4e-15
# for the SGD rules; float64 rounding can grow along a trajectory, most with momentum 0.99).
# Adam divides by sqrt(v), so a gradient entry that is rounding noise still moves its weight by
# about lr: up to 3.4e-13 measured (simple_cnn), 5e-16 to 2e-15 for the other models.
TOL = {"sgd": 1e-12, "momentum": 1e-12, "nesterov": 1e-12, "adam": 1e-10, "adamw": 1e-10}


def trials_for(optimizer):
    return ADAM_TRIALS if optimizer in ("adam", "adamw") else SGD_TRIALS


def masks_for(net, n, seed=0):
    """A per-trial mask on the first weight, a shared mask on the second (if any)."""
    g = torch.Generator().manual_seed(seed)
    weights = [(name, p) for name, p in net.named_parameters() if p.dim() > 1][:2]
    return {name: (torch.rand(*((n,) if k == 0 else ()), *p.shape, generator=g) > 0.3).double()
            for k, (name, p) in enumerate(weights)}


def match_reference(res, net, ds, trials, masks, run, tol):
    """Each trial of ``res`` against the plain loop (``train_reference`` under ``run``, on the
    CPU or another device) with the trial's mask: the same evaluation steps, the metric and
    every weight within ``tol`` (relative), pruned weights exactly zero. Yields each trial's
    reference result."""
    for i, t in enumerate(trials):
        mask = {k: m[i] if m.dim() > net.get_parameter(k).dim() else m for k, m in masks.items()}
        ref = training.train_reference(net, ds, t, run, mask=mask, trial_index=i)
        assert res.curves[i].step.tolist() == ref.curve.step.tolist()
        torch.testing.assert_close(torch.as_tensor(res.curves[i].metric),
                                   torch.as_tensor(ref.curve.metric), rtol=tol, atol=0)
        for name, v in ref.state.items():
            got, v = res.state(i)[name].cpu(), v.cpu()
            assert float((got - v).abs().max() / v.abs().max()) <= tol, (i, name)
            if name in mask:
                assert torch.all(got[mask[name] == 0] == 0)
        yield ref


def check_against_reference(net, ds, steps, batch_size, kernel, optimizer, monkeypatch,
                            program=None):
    """``kernel``: the rules' program (ruled_strategy); ``program``: the candidate the trainer is
    made to run (training.engine.choice; default the rules')."""
    if kernel == "batched":
        monkeypatch.setenv(kernels.DISABLE_ENV, "0")
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", program or "rules")
    trials = trials_for(optimizer)
    plan = ruled_strategy(net, ds.task, ds.input_shape, batch_size, len(trials), F64,
                     optimizer=optimizer)
    assert plan.name == kernel
    masks = masks_for(net, len(trials))
    run = RunConfig(batch_size, optimizer, max_steps=steps, seed=3, dtype=F64,
                    eval_schedule=EvalSchedule(every=steps // 2))
    res = training.train_trials(net, ds, trials, run, masks=masks)
    assert res.program == (program or kernel)
    for ref in match_reference(res, net, ds, trials, masks, run, TOL[optimizer]):
        # the weights moved far beyond the tolerance
        start = {k: p.detach() for k, p in net.named_parameters()}
        assert max(float((v - start[k].double()).abs().max() / v.abs().max())
                   for k, v in ref.state.items()) > 1e-4


@OPTIMIZERS
@pytest.mark.parametrize("name, options, kernel", [
    ("mlp", {"hidden": [16, 16]}, "fused"),
    ("cnn1d", {"channels": 4}, "fused"),
    ("linear", {}, "fused"),
    ("mlp", {"hidden": [16, 16]}, "batched"),
    ("cnn1d", {"channels": 4}, "batched"),
])
def test_mnist1d_models_match_reference(mnist1d_small, monkeypatch, name, options, kernel,
                                        optimizer, kernel_or_skip):
    if kernel == "fused":
        kernel_or_skip()
    net = training.models.build(name, mnist1d_small, seed=1, **options)
    check_against_reference(net, mnist1d_small, 100, 16, kernel, optimizer, monkeypatch)


@OPTIMIZERS
@pytest.mark.parametrize("name, options", [("simple_cnn", {"width": "narrow"}),
                                           ("resnet8", {"widths": [4, 4, 8]})])
@pytest.mark.parametrize("update", ["kernel", "torch", "stacked"])
@pytest.mark.parametrize("candidate", ["per_trial", "plain", "func"])
def test_image_models_match_reference(tiny_images, monkeypatch, name, options, optimizer,
                                      update, candidate, kernel_or_skip):
    """The per-trial program with the compiled kernel's one-pass update, without it, and
    ("stacked") as it runs on CUDA: every trial's gradients first, then one stacked update
    (PerTrialProgram.updates_in_step)."""
    if update == "stacked" and candidate == "func":
        pytest.skip("func updates the stack in one call anyway")
    if update == "stacked":
        monkeypatch.setattr(PerTrialProgram, "updates_in_step", lambda *args: False)
    if update != "kernel":
        monkeypatch.setenv(kernels.DISABLE_ENV, "0")
    else:
        kernel_or_skip()
    net = training.models.build(name, tiny_images, seed=1, **options)
    program = ruled_strategy(net, "classification", tiny_images.input_shape, 16, 3, F64).program
    assert (program.kernel is None) == (update != "kernel")
    check_against_reference(net, tiny_images, 20, 16, "per_trial", optimizer, monkeypatch,
                            candidate)


class _Residual(nn.Module):
    """A module none of the specialised programs takes: torch.func runs it."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(40, 12), nn.Linear(12, 10)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return self.out(h + h.square())


@OPTIMIZERS
@pytest.mark.parametrize("candidate", ["func", "per_trial", "plain"])
def test_other_modules_match_reference(mnist1d_small, monkeypatch, optimizer, candidate):
    torch.manual_seed(1)
    check_against_reference(_Residual(), mnist1d_small, 40, 16, "func", optimizer, monkeypatch,
                            candidate)
