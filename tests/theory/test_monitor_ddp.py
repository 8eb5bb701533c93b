"""The monitor's DDP communication hook under torchrun (2 processes, gloo on CPU, float64): each
step's |G|^2 and tr(Sigma) equal McCandlish et al.'s two-batch estimate computed in one process
from the same batches (each rank's batch the small one, their union the big one), to 1e-8."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from theory import two_batch_estimates
from theory.sampling import noise_scale

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("monitor_ddp_worker.py")
LOCAL, WORLD = 8, 2


def local_gradient(net, x, y):
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in net.parameters()])


def test_ddp_hook_equals_the_single_process_two_batch_estimate(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "readings.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(WORLD), "--master-addr", "127.0.0.1", "--master-port", str(port),
                           str(WORKER), str(out)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = torch.load(out, weights_only=False)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    g_steps, t_steps = [], []
    for record in saved:
        net.load_state_dict(record["state"])
        x, y = record["x"], record["y"]
        locals_ = [local_gradient(net, x[r * LOCAL:(r + 1) * LOCAL], y[r * LOCAL:(r + 1) * LOCAL])
                   for r in range(WORLD)]
        big = torch.stack(locals_).mean(0)
        ref = two_batch_estimates(float(np.mean([float(g.pow(2).sum()) for g in locals_])),
                                  float(big.pow(2).sum()), LOCAL, WORLD * LOCAL)
        r = record["reading"]
        assert r.method == "ddp" and r.batch_size == WORLD * LOCAL
        assert r.step_g_sq == pytest.approx(ref.g_sq, rel=1e-8)
        assert r.step_trace_sigma == pytest.approx(ref.trace_sigma, rel=1e-8)
        g_steps.append(ref.g_sq)
        t_steps.append(ref.trace_sigma)
    # the window averages numerator and denominator separately
    last = saved[-1]["reading"]
    assert last.g_sq == pytest.approx(np.mean(g_steps), rel=1e-8)
    assert last.trace_sigma == pytest.approx(np.mean(t_steps), rel=1e-8)
    assert last.b_simple == noise_scale(last.trace_sigma, last.g_sq)
