"""The probes on CUDA give the CPU's values to float64 tolerance: gradient noise (|G|^2,
tr Sigma, B_simple, B_noise), the Hessian's top eigenvalue (Lanczos and ARPACK), Lee et al.'s
local Lipschitz constant, a whole probed trajectory, and the critical batch by branching.
(The noise-scale monitor is tested here once it lands.)"""

import math

import numpy as np
import pytest
import torch

import theory
import training
from experiments.run.branching import branch_critical_batch
from theory.estimators.functional import flat_loss
from training import EvalSchedule, RunConfig, Trial

F64 = torch.float64
RTOL = 1e-9   # float64 sums in another order on another device; the probes' values are O(1)


@pytest.fixture(scope="module")
def teacher():
    return training.data.load("teacher", n=600, dim=8, num_classes=3, seed=1)


@pytest.fixture(scope="module")
def nets(teacher):
    cpu = training.models.build("mlp", teacher, hidden=[16], seed=0).double()
    return cpu, training.models.build("mlp", teacher, hidden=[16], seed=0).double().to("cuda")


def close(a, b, rtol=RTOL):
    return math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=1e-12)


def test_gradient_noise_on_cuda_equals_the_cpu(teacher, nets):
    cpu, gpu = (theory.gradient_noise(n, teacher, examples=256, hessian_examples=16, seed=1)
                for n in nets)
    for key in ("g_sq", "trace_sigma", "b_simple", "b_noise", "loss", "g_h_g"):
        assert close(getattr(cpu, key), getattr(gpu, key)), key


def test_curvature_on_cuda_equals_the_cpu(teacher, nets):
    lanczos = [theory.lanczos_top(flat_loss(n, teacher), 30, seed=0) for n in nets]
    assert close(*lanczos)
    arpack = [theory.hessian_top_eigenvalues(n, teacher, k=2) for n in nets]
    np.testing.assert_allclose(np.asarray(arpack[0]), np.asarray(arpack[1]), rtol=1e-7)


def test_lee_local_lipschitz_on_cuda_equals_the_cpu(teacher, nets):
    w_prev = {k: v.detach().cpu() for k, v in nets[0].state_dict().items()}
    g = torch.Generator().manual_seed(0)
    w_next = {k: v + 0.01 * torch.randn(v.shape, generator=g, dtype=v.dtype)
              for k, v in w_prev.items()}
    values = [theory.local_lipschitz(n, teacher, w_prev, w_next).value for n in nets]
    assert close(*values)


def test_a_probed_trajectory_on_cuda_equals_the_cpu(teacher, nets):
    """The replay (the plain loop) and every probe along it, on each device."""
    rows = []
    for net, device in zip(nets, ("cpu", "cuda")):
        run = RunConfig(16, "momentum", seed=2, dtype=F64, device=device)
        rows.append(theory.probe_trajectory(net, teacher, Trial(lr=0.05, momentum=0.9), run,
                                            [0, 10, 20], 20, examples=128,
                                            curvature_examples=128, dtype=F64))
    a, b = (r.sort_values(["step", "quantity"]).reset_index(drop=True) for r in rows)
    assert a[["step", "quantity"]].equals(b[["step", "quantity"]])
    np.testing.assert_allclose(a.value.to_numpy(), b.value.to_numpy(), rtol=1e-7, atol=1e-10)


def test_branching_on_cuda_equals_the_cpu(teacher):
    net = training.models.build("mlp", teacher, hidden=[16], seed=0)
    results = []
    for device in ("cpu", "cuda"):
        run = RunConfig(8, "momentum", max_steps=400, goal=0.3, seed=3, dtype=F64,
                        eval_schedule=EvalSchedule(every=10), device=device)
        results.append(branch_critical_batch(net, teacher, Trial(lr=0.05, momentum=0.9), run,
                                             goal_step=40, k_max=4, window=64, seeds=3))
    cpu, gpu = results
    np.testing.assert_allclose(gpu.branch_loss, cpu.branch_loss, rtol=1e-9)
    np.testing.assert_array_equal(gpu.critical.critical_batch, cpu.critical.critical_batch)
    assert gpu.branch_trial_steps == cpu.branch_trial_steps
