"""Each precision of ``RunConfig.precision`` against the float64 plain loop: the tolerance it
meets, measured here on the CPU (bf16 autocast runs on the CPU too; tf32 is fp32 there).

The measure: after 20 steps of lr-spread momentum trials at B = 16, the largest weight error
against the float64 reference (``training.train_reference`` in float64), relative to how far
the reference moved the weights (max |w - w_ref| / max |w_ref - w_0|), and the relative error of
the mean training loss. Measured on this machine (mlp 16-16 and cnn1d on MNIST-1D, simple_cnn
narrow on 8x8 images, resnet8 4-4-8):

- fp32: weights 5.5e-7 to 1.6e-6, loss 6e-8 to 1.1e-7. Tolerance 1e-4 / 1e-5.
- bf16 (8-bit significand: a product's inputs are rounded by up to 2^-9 = 2e-3 relative):
  weights 4e-3 to 0.16, loss 3.6e-5 to 6.7e-4 (Adam: loss 1.6e-3, weights up to 0.86: it
  divides each gradient entry by its own root mean square, so rounding noise in an entry
  near zero moves its weight by about lr). Tolerance: weights 0.5, loss 1e-2 for the SGD
  family, loss 1e-2 for Adam; and bf16 must differ from fp32 by more than 1e-4 (autocast is
  really on).
- tf32 on the CPU: bit for bit fp32.
"""

import pytest
import torch

import training
from training import EvalSchedule, RunConfig
from training.engine.strategy import ruled_strategy

from .test_trials_models import _Residual as Residual   # only the torch.func program runs it

F64 = torch.float64
SGD_TRIALS = [{"lr": 0.05, "momentum": 0.9}, {"lr": 0.1, "momentum": 0.5},
              {"lr": 0.02, "momentum": 0.99}]
ADAM_TRIALS = [{"lr": 0.003}, {"lr": 0.001, "weight_decay": 0.01}]
STEPS = 20
# (weights relative to the displacement, mean training loss relative) per precision
TOL = {"fp32": (1e-4, 1e-5), "bf16": (0.5, 1e-2)}


def deviation(net, ds, precision, optimizer="momentum", trials=SGD_TRIALS):
    """(program, weight error / displacement, loss error) of train_trials in ``precision``
    against the float64 reference, the worst over the trials."""
    every = EvalSchedule(every=STEPS)
    ref_run = RunConfig(16, optimizer, max_steps=STEPS, seed=3, dtype=F64, eval_schedule=every)
    run = RunConfig(16, optimizer, max_steps=STEPS, seed=3, precision=precision,
                    eval_schedule=every)
    res = training.train_trials(net, ds, trials, run)
    start = {k: p.detach().double() for k, p in net.named_parameters()}
    weights, losses = [], []
    for i, t in enumerate(trials):
        ref = training.train_reference(net, ds, t, ref_run, trial_index=i)
        moved = max(float((v - start[k]).abs().max()) for k, v in ref.state.items())
        weights.append(max(float((res.state(i)[k].double() - v).abs().max())
                           for k, v in ref.state.items()) / moved)
        losses += [abs(a - b) / abs(b) for a, b in zip(res.curves[i].train_loss,
                                                        ref.curve.train_loss)]
    return res.program, max(weights), max(losses)


def workloads(mnist1d_small, tiny_images):
    return {"mlp": (training.models.build("mlp", mnist1d_small, seed=1, hidden=[16, 16]),
                    mnist1d_small),
            "simple_cnn": (training.models.build("simple_cnn", tiny_images, seed=1,
                                                 width="narrow"), tiny_images),
            "residual": (torch.manual_seed(1) and Residual(), mnist1d_small)}


@pytest.mark.parametrize("name, program", [("mlp", "batched"), ("simple_cnn", "per_trial"),
                                           ("residual", "func")])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_precision_meets_its_tolerance_against_float64(mnist1d_small, tiny_images, name,
                                                       program, precision, monkeypatch):
    if precision == "fp32" and name == "mlp":   # fused (tested below); here the eager program
        monkeypatch.setenv("SPARSESCALE_KERNELS", "0")
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "rules")   # the rules' program, not a measured one
    net, ds = workloads(mnist1d_small, tiny_images)[name]
    ran, weights, loss = deviation(net, ds, precision)
    assert ran == program
    tol_w, tol_l = TOL[precision]
    assert weights <= tol_w and loss <= tol_l, (weights, loss)
    if precision == "bf16":   # autocast really ran: far from fp32's 1e-6
        assert weights > 1e-4, weights


@pytest.mark.parametrize("name", ["mlp", "simple_cnn"])
def test_bf16_adam_loss_meets_its_tolerance(mnist1d_small, tiny_images, name):
    net, ds = workloads(mnist1d_small, tiny_images)[name]
    _, _, loss = deviation(net, ds, "bf16", "adam", ADAM_TRIALS)
    assert loss <= TOL["bf16"][1], loss


def test_tf32_is_fp32_on_the_cpu(mnist1d_small, tiny_images, kernel_or_skip, monkeypatch):
    kernel_or_skip()
    # one program for both: a measured choice may pick another program per precision, and
    # programs round float32 differently
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "rules")
    for net, ds in list(workloads(mnist1d_small, tiny_images).values())[:2]:
        runs = [training.train_trials(net, ds, SGD_TRIALS, RunConfig(
            16, max_steps=5, seed=3, precision=p, eval_schedule=EvalSchedule(every=5)))
            for p in ("fp32", "tf32")]
        assert runs[0].program == runs[1].program
        for k, v in runs[0].params.items():
            assert torch.equal(v, runs[1].params[k]), k


def test_bf16_keeps_float32_weights_and_optimizer_state(mnist1d_small):
    net = training.models.build("mlp", mnist1d_small, seed=1, hidden=[16])
    for optimizer, trials in (("momentum", SGD_TRIALS), ("adam", ADAM_TRIALS)):
        res = training.train_trials(net, mnist1d_small, trials, RunConfig(
            16, optimizer, max_steps=3, precision="bf16"), return_state=True)
        state = res.end_state
        assert {v.dtype for v in res.params.values()} == {torch.float32}
        assert {v.dtype for v in state.buffers.values()} == {torch.float32}
        assert {v.dtype for v in state.moments.values()} <= {torch.float32}
        ref = training.train_reference(net, mnist1d_small, trials[0], RunConfig(
            16, optimizer, max_steps=3, precision="bf16"))
        assert {v.dtype for v in ref.state.values()} == {torch.float32}


def test_the_strategy_never_gives_bf16_to_the_compiled_kernel(mnist1d_small, kernel_or_skip):
    """The compiled kernel is float32 C++: a bf16 cell of a model it runs goes to the eager
    hand-batched program, which autocasts; fp32 and tf32 (fp32 on the CPU) keep the kernel."""
    kernel_or_skip()
    for name in ("mlp", "cnn1d", "linear"):
        net = training.models.build(name, mnist1d_small, seed=0)
        plans = {p: ruled_strategy(net, "classification", mnist1d_small.input_shape, 64, 8,
                              precision=p) for p in ("fp32", "tf32", "bf16")}
        assert (plans["fp32"].name, plans["tf32"].name, plans["bf16"].name) == (
            "fused", "fused", "batched"), name
        assert plans["bf16"].program.precision == "bf16"


def test_programs_take_the_precision(mnist1d_small, tiny_images):
    cnn = training.models.build("simple_cnn", tiny_images, seed=0, width="narrow")
    assert ruled_strategy(cnn, "classification", (1, 8, 8), 8, 2,
                     precision="bf16").program.precision == "bf16"
    assert ruled_strategy(Residual(), "classification", (40,), 8, 2,
                     precision="bf16").program.precision == "bf16"


@pytest.mark.parametrize("kwargs, message", [
    (dict(precision="fp16"), "precision 'fp16'; allowed: fp32, tf32, bf16"),
    (dict(precision="bf16", dtype=F64), "precision 'bf16' needs dtype torch.float32"),
    (dict(precision="tf32", dtype=F64), "precision 'tf32' needs dtype torch.float32"),
])
def test_bad_precision_is_one_line(kwargs, message):
    with pytest.raises(training.ConfigError, match=message.replace("(", r"\(")):
        RunConfig(8, **kwargs)
