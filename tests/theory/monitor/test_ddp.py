"""The monitor's DDP communication hook under torchrun (2 processes, gloo on CPU, float64): each
step's |G|^2 and tr(Sigma) equal McCandlish et al.'s two-batch estimate computed in one process
from the same batches (each rank's batch the small one, their union the big one), to 1e-8, on
every path the per-rank scalars can take (folded into the last bucket's all-reduce, a separate
all-reduce, a user's communication hook wrapped, a parameter the forward does not use)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from tests.theory.monitor.ddp_worker import CONFIGS, LOCAL, STEPS, Net
from theory import NoiseScaleMonitor, TheoryError, two_batch_estimates
from theory.estimators.sampling import noise_scale

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("ddp_worker.py")
WORLD = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One torchrun launch of the worker, every configuration's records."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path_factory.mktemp("ddp") / "readings.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(WORLD), "--master-addr", "127.0.0.1", "--master-port", str(port),
                           str(WORKER), str(out)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def local_gradient(net, x, y):
    """The flat gradient of the mean loss on (x, y); a parameter without a gradient counts as
    zeros."""
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in net.parameters()])


@pytest.mark.parametrize("config", CONFIGS)
def test_ddp_hook_equals_the_single_process_two_batch_estimate(results, config):
    run = results[config]
    net = Net(unused=config == "unused").double()
    g_steps, t_steps = [], []
    for record in run["steps"]:
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
    last = run["steps"][-1]["reading"]
    assert last.g_sq == pytest.approx(np.mean(g_steps), rel=1e-8)
    assert last.trace_sigma == pytest.approx(np.mean(t_steps), rel=1e-8)
    assert last.b_simple == noise_scale(last.trace_sigma, last.g_sq)


def test_each_path_reduces_the_scalars_as_designed(results):
    # the tiny buckets give several buckets: the norms of all of them are summed
    assert all(results[c]["buckets"] >= 2 for c in CONFIGS)
    # DDP's own averaging with a small last bucket folds; the others run a separate all-reduce
    for config in ("fold", "bucket_view"):
        assert results[config]["folded"] and not results[config]["separate"]
    for config in ("separate", "user_hook"):
        assert results[config]["separate"] and not results[config]["folded"]
    # the user's hook still averages every bucket of every synchronized backward, in order
    backwards = results["user_hook"]["user_buckets"]
    assert len(backwards) == STEPS
    assert all(seen == list(range(len(seen))) for seen in backwards)
    assert len(backwards[-1]) == results["user_hook"]["buckets"]


def test_two_synchronized_backwards_in_one_step_are_refused(results):
    assert results["two_synced"].startswith("NoiseScaleMonitor: 2 synchronized backward passes "
                                            "in one step")
    assert "no_sync()" in results["two_synced"]


def test_one_process_is_refused_with_a_clear_error(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                            world_size=1)
    try:
        ddp = DistributedDataParallel(Net().double())
        with pytest.raises(TheoryError, match=r"^method='ddp' needs at least 2 processes \(the "
                                              r"world size is 1\): build the monitor on the "
                                              r"wrapped model \(ddp.module\) instead$"):
            NoiseScaleMonitor(ddp)
    finally:
        dist.destroy_process_group()
