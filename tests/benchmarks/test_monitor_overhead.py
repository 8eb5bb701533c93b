"""Overhead of theory.NoiseScaleMonitor on a plain training loop (pytest-benchmark).

The loop: SGD with momentum on pre-drawn batches of 64, ``zero_grad``, forward, mean
cross-entropy, ``backward``, ``monitor.step()``, ``optimizer.step()``; on the MNIST-1D MLP and a
small transformer classifier (tests/theory/monitor_models.py), one thread. With the default
``--benchmark-disable`` each test runs once as a quick check of the readings.

``python tests/benchmarks/test_monitor_overhead.py`` prints the overhead table: the loop with and
without the monitor, alternated in rounds in one process (so the ratio holds on a shared
machine), per-step CPU time of the thread (``time.thread_time``; each loop's fastest round), for
``every`` = 1, 2, 4, 8 and 16; and the DDP hook's: two gloo processes on loopback, wall-clock per
step of a DDP loop with the monitor's communication hook against the same loop with DDP's
built-in all-reduce (each loop's fastest round).
"""

from __future__ import annotations

import copy
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # run as a script
    sys.path.insert(0, str(ROOT))

import training
from tests.theory.monitor_models import TinyTransformer, token_dataset
from theory import NoiseScaleMonitor

BATCH = 64


def workload(name: str) -> tuple[torch.nn.Module, training.Dataset]:
    if name == "mlp":
        ds = training.data.load("mnist1d")
        return training.models.build("mlp", ds, seed=0), ds
    torch.manual_seed(0)
    return TinyTransformer(), token_dataset()


def batches(ds: training.Dataset, steps: int, batch: int = BATCH, seed: int = 0):
    idx = torch.randint(ds.n_train, (steps, batch), generator=torch.Generator().manual_seed(seed))
    return list(zip(ds.x_train[idx], ds.y_train[idx]))


def loop(net, opt, data, monitor=None):
    reading = None
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        if monitor is not None:
            reading = monitor.step()
        opt.step()
    return reading


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_plain_loop(benchmark, name):
    net, ds = workload(name)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    benchmark(loop, net, opt, batches(ds, 20))


@pytest.mark.parametrize("every", [1, 4])
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_monitored_loop(benchmark, name, every):
    net, ds = workload(name)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    monitor = NoiseScaleMonitor(net, every=every)
    reading = benchmark(loop, net, opt, batches(ds, 20), monitor)
    assert reading.method == "per_example" and reading.batch_size == BATCH
    assert math.isfinite(reading.trace_sigma) and reading.trace_sigma > 0


EVERIES = (1, 2, 4, 8, 16)


def overhead(name: str, everies: tuple[int, ...] = EVERIES, steps: int = 40, rounds: int = 20
             ) -> dict[int | None, float]:
    """Per-step thread CPU seconds of the loop without the monitor (key None) and with it at each
    ``every``: the loops alternate within every round, and each keeps its fastest round (the
    least disturbed by other processes on a shared machine)."""
    torch.set_num_threads(1)
    net, ds = workload(name)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)
    data = batches(ds, steps)
    times: dict[int | None, list[float]] = {key: [] for key in (None, *everies)}
    for _ in range(rounds):
        for every, runs in times.items():
            monitor = NoiseScaleMonitor(net, every=every) if every else None
            loop(net, opt, data[:5], monitor)                     # warm up
            start = time.thread_time()
            loop(net, opt, data, monitor)
            runs.append((time.thread_time() - start) / steps)
            if monitor is not None:
                monitor.close()
    return {key: min(runs) for key, runs in times.items()}


# -- DDP --------------------------------------------------------------------------------------

def _ddp_rank(rank: int, world: int, init: str, steps: int, rounds: int, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    net, ds = workload("mlp")
    data = batches(ds, steps, seed=rank)
    plain = DistributedDataParallel(net)
    hooked = DistributedDataParallel(copy.deepcopy(net))
    monitor = NoiseScaleMonitor(hooked)
    runs = {"plain": (plain, None), "monitor": (hooked, monitor)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9) for k, (m, _) in runs.items()}
    times = {k: [] for k in runs}
    for _ in range(rounds):
        for key, (model, mon) in runs.items():
            loop(model, opts[key], data[:5], mon)
            dist.barrier()
            start = time.perf_counter()
            loop(model, opts[key], data, mon)
            times[key].append((time.perf_counter() - start) / steps)
    if rank == 0:
        torch.save({k: min(v) for k, v in times.items()}, out)
    dist.destroy_process_group()


def ddp_overhead(steps: int = 50, rounds: int = 20) -> tuple[float, float]:
    """Wall-clock seconds per step (fastest round) of a 2-process DDP loop (MNIST-1D MLP, 64 per rank)
    with DDP's built-in all-reduce and with the monitor's communication hook."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.pt")
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(_ddp_rank, args=(2, init, steps, rounds, out), nprocs=2, join=True)
        times = torch.load(out)
    return times["plain"], times["monitor"]


def main() -> None:
    print(f"{'workload':<12} {'every':>5} {'plain ms/step':>14} {'monitor ms/step':>16} "
          f"{'overhead':>9}")
    for name in ("mlp", "transformer"):
        times = overhead(name)
        for every in EVERIES:
            plain, monitored = times[None], times[every]
            print(f"{name:<12} {every:>5} {plain * 1e3:>14.3f} {monitored * 1e3:>16.3f} "
                  f"{100 * (monitored / plain - 1):>8.1f}%")
    plain, monitored = ddp_overhead()
    print(f"{'mlp DDP x2':<12} {1:>5} {plain * 1e3:>14.3f} {monitored * 1e3:>16.3f} "
          f"{100 * (monitored / plain - 1):>8.1f}%")


if __name__ == "__main__":
    main()
