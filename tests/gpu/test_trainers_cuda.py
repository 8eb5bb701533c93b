"""Every model through every program the cell plan chooses on CUDA, with every optimizer, in
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
from training.engine.cell_plan import plan_cell

# the CPU tests' trials, masks and tolerances (max |w - w_ref| / max |w_ref|): float64 on another
# device sums in another order, which these bounds already allow for the CPU's programs
from tests.training.test_trials_models import (  # noqa: E402
    F64, OPTIMIZERS, SGD_TRIALS, TOL, _Residual as Residual, masks_for, match_reference,
    trials_for,
)


def check_on_cuda(net, ds, steps, batch_size, program, optimizer, reference_device="cpu"):
    """train_trials on CUDA (float64) against train_reference on ``reference_device``."""
    trials = trials_for(optimizer)
    plan = plan_cell(net, ds.task, ds.input_shape, batch_size, len(trials), F64, "cuda",
                     optimizer=optimizer)
    assert plan.name == program
    masks = masks_for(net, len(trials))
    run = RunConfig(batch_size, optimizer, max_steps=steps, seed=3, dtype=F64,
                    eval_schedule=EvalSchedule(every=steps // 2))
    res = training.train_trials(net, ds, trials, replace(run, device="cuda"), masks=masks)
    assert res.program == program
    assert {p.device.type for p in res.params.values()} == {"cuda"}
    ref_run = replace(run, device=reference_device)
    for _ in match_reference(res, net, ds, trials, masks, ref_run, TOL[optimizer]):
        pass


@OPTIMIZERS
@pytest.mark.parametrize("name, options", [("mlp", {"hidden": [16, 16]}),
                                           ("cnn1d", {"channels": 4}), ("linear", {})])
def test_mnist1d_models_on_cuda_match_the_cpu_reference(mnist1d_small, name, options, optimizer):
    """On CUDA the compiled (CPU) kernel never runs: the hand-batched program does."""
    net = training.models.build(name, mnist1d_small, seed=1, **options)
    check_on_cuda(net, mnist1d_small, 100, 16, "batched", optimizer)


@OPTIMIZERS
@pytest.mark.parametrize("name, options", [("simple_cnn", {"width": "narrow"}),
                                           ("resnet8", {"widths": [4, 4, 8]})])
def test_image_models_on_cuda_match_the_cpu_reference(tiny_images, name, options, optimizer):
    net = training.models.build(name, tiny_images, seed=1, **options)
    check_on_cuda(net, tiny_images, 20, 16, "per_trial", optimizer)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_lee_cnn_on_cuda_matches_the_cpu_reference(lee_images, optimizer):
    net = training.models.build("lee_cnn", lee_images, seed=1)
    check_on_cuda(net, lee_images, 10, 16, "per_trial", optimizer)


@OPTIMIZERS
def test_other_modules_on_cuda_match_the_cpu_reference(mnist1d_small, optimizer):
    torch.manual_seed(1)
    check_on_cuda(Residual(), mnist1d_small, 40, 16, "func", optimizer)


def test_batch_norm_on_cuda_matches_the_cpu_reference(mnist1d_small):
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(40, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
    check_on_cuda(net, mnist1d_small, 20, 16, "per_trial", "momentum")


def test_dropout_on_cuda_matches_the_cuda_reference(mnist1d_small):
    """Dropout draws from CUDA's generator, whose numbers are not the CPU's: the reference runs
    on CUDA too, from the same per-trial seeds."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(40, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 10))
    check_on_cuda(net, mnist1d_small, 20, 16, "per_trial", "momentum", reference_device="cuda")


# ---------------------------------------------------------------------------------------------
# precisions on CUDA against the float64 CPU loop (tests/training/test_precision.py's measure)

STEPS = 20
# fp32 with TF32 off: the CPU's bound; tf32 (10-bit significand) and bf16 (7-bit): the CPU's
# bf16 bound (measured there: weights up to 0.16 of their displacement, loss 7e-4)
PRECISION_TOL = {"fp32": (1e-4, 1e-5), "tf32": (0.5, 1e-2), "bf16": (0.5, 1e-2)}


def deviation(net, ds, precision):
    every = EvalSchedule(every=STEPS)
    ref_run = RunConfig(16, max_steps=STEPS, seed=3, dtype=F64, eval_schedule=every)
    run = RunConfig(16, max_steps=STEPS, seed=3, precision=precision, eval_schedule=every,
                    device="cuda")
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
    ds = {"mlp": mnist1d_small, "simple_cnn": tiny_images, "lee_cnn": lee_images}[name]
    options = {"mlp": {"hidden": [16, 16]}, "simple_cnn": {"width": "narrow"}}.get(name, {})
    net = training.models.build(name, ds, seed=1, **options)
    program, weights, loss = deviation(net, ds, precision)
    tol_w, tol_l = PRECISION_TOL[precision]
    print(f"{name} {precision} {program}: weights {weights:.3g}, loss {loss:.3g}")
    assert weights <= tol_w and loss <= tol_l and math.isfinite(weights), (weights, loss)
