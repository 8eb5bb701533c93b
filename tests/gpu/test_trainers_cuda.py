"""Every model through every program the strategy chooses on CUDA, with every optimizer, in
float64, against the plain torch.optim loop on the CPU (training.train_reference), trial by
trial with shared and per-trial masks, within the CPU tests' tolerances
(tests/training/test_trials_models.py); and each precision on CUDA against the float64 CPU loop
(tests/training/test_precision.py's measure)."""

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

import training
from training import EvalSchedule, RunConfig
from training.engine.strategy import candidate_strategies, ruled_strategy

# the CPU tests' trials, masks and tolerances (max |w - w_ref| / max |w_ref|): float64 on another
# device sums in another order, which these bounds already allow for the CPU's programs
from tests.training.test_trials_models import (  # noqa: E402
    F64, OPTIMIZERS, SGD_TRIALS, TOL, _Residual as Residual, masks_for, match_reference,
    trials_for,
)


def check_on_cuda(net, ds, steps, batch_size, program, optimizer, monkeypatch,
                  reference_device="cpu"):
    """train_trials on CUDA (float64) against train_reference on ``reference_device``, once
    with each program the measured choice may pick on CUDA (training.engine.choice's
    candidates; ``program``: the rules' plan, which is always one of them)."""
    trials = trials_for(optimizer)
    args = (net, ds.task, ds.input_shape, batch_size, len(trials), F64, "cuda")
    assert ruled_strategy(*args, optimizer=optimizer).name == program
    names = [c.name for c in candidate_strategies(*args, optimizer=optimizer)] or [program]
    masks = masks_for(net, len(trials))
    run = RunConfig(batch_size, optimizer, max_steps=steps, seed=3, dtype=F64,
                    eval_schedule=EvalSchedule(every=steps // 2))
    for name in names:
        monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", name)
        res = training.train_trials(net, ds, trials, replace(run, device="cuda"), masks=masks)
        assert res.program == name
        assert {p.device.type for p in res.params.values()} == {"cuda"}
        ref_run = replace(run, device=reference_device)
        for _ in match_reference(res, net, ds, trials, masks, ref_run, TOL[optimizer]):
            pass


@OPTIMIZERS
@pytest.mark.parametrize("name, options", [("mlp", {"hidden": [16, 16]}),
                                           ("cnn1d", {"channels": 4}), ("linear", {})])
def test_mnist1d_models_on_cuda_match_the_cpu_reference(mnist1d_small, name, options, optimizer,
                                                         monkeypatch):
    """On CUDA the compiled (CPU) kernel never runs: the hand-batched program does."""
    net = training.models.build(name, mnist1d_small, seed=1, **options)
    check_on_cuda(net, mnist1d_small, 100, 16, "batched", optimizer, monkeypatch)


@OPTIMIZERS
@pytest.mark.parametrize("name, options", [("simple_cnn", {"width": "narrow"}),
                                           ("resnet8", {"widths": [4, 4, 8]})])
def test_image_models_on_cuda_match_the_cpu_reference(tiny_images, name, options, optimizer,
                                                      monkeypatch):
    net = training.models.build(name, tiny_images, seed=1, **options)
    check_on_cuda(net, tiny_images, 20, 16, "per_trial", optimizer, monkeypatch)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_lee_cnn_on_cuda_matches_the_cpu_reference(lee_images, optimizer, monkeypatch):
    net = training.models.build("lee_cnn", lee_images, seed=1)
    check_on_cuda(net, lee_images, 10, 16, "per_trial", optimizer, monkeypatch)


@OPTIMIZERS
def test_other_modules_on_cuda_match_the_cpu_reference(mnist1d_small, optimizer, monkeypatch):
    torch.manual_seed(1)
    check_on_cuda(Residual(), mnist1d_small, 40, 16, "func", optimizer, monkeypatch)


def test_batch_norm_on_cuda_matches_the_cpu_reference(mnist1d_small, monkeypatch):
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(40, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
    check_on_cuda(net, mnist1d_small, 20, 16, "per_trial", "momentum", monkeypatch)


def test_dropout_on_cuda_matches_the_cuda_reference(mnist1d_small, monkeypatch):
    """Dropout draws from CUDA's generator, whose numbers are not the CPU's: the reference runs
    on CUDA too, from the same per-trial seeds."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(40, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 10))
    check_on_cuda(net, mnist1d_small, 20, 16, "per_trial", "momentum", monkeypatch,
                  reference_device="cuda")


# ---------------------------------------------------------------------------------------------
# precisions on CUDA against the float64 CPU loop (tests/training/test_precision.py's measure)

STEPS = 20
# fp32 with TF32 off: the CPU's bound; tf32 (10-bit significand) and bf16 (7-bit): the CPU's
# bf16 bound (measured there: weights up to 0.16 of their displacement, loss 7e-4)
PRECISION_TOL = {"fp32": (1e-4, 1e-5), "tf32": (0.5, 1e-2), "bf16": (0.5, 1e-2)}
# the CPU precision whose rounding each CUDA precision's may reach (TF32's 10-bit significand
# rounds less than bfloat16's 7 bits; the CPU has no TF32)
CPU_ANALOG = {"fp32": "fp32", "tf32": "bf16", "bf16": "bf16"}


def deviation(net, ds, precision, device):
    """(program, max weight deviation / displacement, max relative loss deviation) of the
    three SGD trials at ``precision`` on ``device`` against the float64 CPU loop."""
    every = EvalSchedule(every=STEPS)
    ref_run = RunConfig(16, max_steps=STEPS, seed=3, dtype=F64, eval_schedule=every)
    run = RunConfig(16, max_steps=STEPS, seed=3, precision=precision, eval_schedule=every,
                    device=device)
    res = training.train_trials(net, ds, SGD_TRIALS, run)
    start = {k: p.detach().double() for k, p in net.named_parameters()}
    weights, losses = [], []
    for i, t in enumerate(SGD_TRIALS):
        ref = training.train_reference(net, ds, t, ref_run, trial_index=i)
        moved = max(float((v - start[k]).abs().max()) for k, v in ref.state.items())
        weights.append(max(float((res.state(i)[k].double().cpu() - v).abs().max())
                           for k, v in ref.state.items()) / moved)
        losses += [abs(a - b) / abs(b) for a, b in zip(res.curves[i].train_loss,
                                                        ref.curve.train_loss)]
    return res.program, max(weights), max(losses)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("name", ["mlp", "simple_cnn", "lee_cnn"])
def test_each_precision_on_cuda_meets_its_tolerance(mnist1d_small, tiny_images, lee_images,
                                                    name, precision):
    """Within the bound measured on the CPU (PRECISION_TOL), or, for a trajectory that
    amplifies rounding more than the bound's models do, within twice the CPU's own deviation
    at the analogous precision: lee_cnn's second trial (lr 0.1) moves 2.6e-4 of its
    displacement away from float64 in float32 on the CPU itself, and 0.79 in bf16, whichever
    program runs (max pooling decides by comparisons that rounding can flip)."""
    ds = {"mlp": mnist1d_small, "simple_cnn": tiny_images, "lee_cnn": lee_images}[name]
    options = {"mlp": {"hidden": [16, 16]}, "simple_cnn": {"width": "narrow"}}.get(name, {})
    net = training.models.build(name, ds, seed=1, **options)
    program, weights, loss = deviation(net, ds, precision, "cuda")
    _, cpu_weights, cpu_loss = deviation(net, ds, CPU_ANALOG[precision], "cpu")
    tol_w, tol_l = PRECISION_TOL[precision]
    print(f"{name} {precision} {program}: weights {weights:.3g}, loss {loss:.3g} "
          f"(CPU {CPU_ANALOG[precision]}: {cpu_weights:.3g}, {cpu_loss:.3g})")
    assert math.isfinite(weights) and math.isfinite(loss)
    assert weights <= max(tol_w, 2 * cpu_weights), (weights, cpu_weights)
    assert loss <= max(tol_l, 2 * cpu_loss), (loss, cpu_loss)
