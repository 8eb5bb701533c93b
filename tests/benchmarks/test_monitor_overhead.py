"""Overhead of theory.NoiseScaleMonitor on a plain training loop (pytest-benchmark).

The loop: SGD with momentum on pre-drawn batches of 64, ``zero_grad``, forward, mean
cross-entropy, ``backward``, ``monitor.step()``, ``optimizer.step()``; on the MNIST-1D MLP, a
tiny transformer classifier (one block, width 16, 8 tokens) and a small one (two blocks, width
128, 64 tokens) (tests/theory/monitor/monitor_models.py), one thread. With the default
``--benchmark-disable`` each test runs once as a quick check of the readings.

``python tests/benchmarks/test_monitor_overhead.py`` prints the overhead table: the loop with and
without the monitor, alternated in rounds in one process (so the ratio holds on a shared
machine), per-step CPU time of the thread (``time.thread_time``): the plain loop's fastest
round, and the median over rounds of each loop's time over the plain loop's in the same round
(a ratio of neighbours, which load that comes and goes disturbs less than the fastest rounds
do), for ``every`` = 1, 2, 4, 8 and 16, and with empty hooks in the monitor's places (a
forward pre-hook on the model and a forward hook on each supported layer that do nothing: the
floor of any capture by module hooks); then where a measured step's time goes (the monitor's
``step()`` alone, and the operator calls it adds, counted by ``torch.profiler``); and the DDP
hook's: two gloo processes on loopback, a DDP loop with DDP's built-in all-reduce against the
same loop with that all-reduce as a Python communication hook and with the monitor's hook, by
wall clock and by process CPU time (the same statistics), on the MLP, the MLP 2048 wide and the
two-block transformer (``DDP_WORKLOADS``). ``python tests/benchmarks/test_monitor_overhead.py
ddp`` prints the DDP table alone, ``... per-example`` all but the DDP table.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
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
from tests.theory.monitor.monitor_models import TinyTransformer, token_dataset
from theory import NoiseScaleMonitor

BATCH = 64


# name: (steps, rounds) of the overhead table (the small transformer's step is ~100x longer)
WORKLOADS = {"mlp": (40, 20), "transformer": (40, 20), "transformer-2x128": (8, 6)}


# name: (steps, rounds) of the DDP table: the MNIST-1D MLP (one bucket), the same MLP 2048 wide
# (4.3 M weights; after DDP's first step, a 4.2 M-weight bucket and a last one of 84 k) and the
# two-block transformer (0.3 M weights, two buckets)
DDP_WORKLOADS = {"mlp": (50, 20), "mlp-2048": (10, 8), "transformer-2x128": (6, 6)}


def workload(name: str) -> tuple[torch.nn.Module, training.Dataset]:
    if name in ("mlp", "mlp-2048"):
        ds = training.data.load("mnist1d")
        hidden = {"hidden": (2048, 2048)} if name == "mlp-2048" else {}
        return training.models.build("mlp", ds, seed=0, **hidden), ds
    torch.manual_seed(0)
    if name == "transformer-2x128":
        return (TinyTransformer(dim=128, heads=4, blocks=2, length=64, vocab=256),
                token_dataset(length=64, vocab=256))
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


class EmptyHooks:
    """The monitor's module hooks, doing nothing: a forward pre-hook on the model and a forward
    hook on each layer the monitor reads (``step()`` does nothing either)."""

    def __init__(self, net: torch.nn.Module) -> None:
        with NoiseScaleMonitor(net) as probe:
            layers = list(probe.layers.values())
        self.handles = [net.register_forward_pre_hook(lambda m, args, kwargs: None,
                                                      with_kwargs=True)]
        self.handles += [m.register_forward_hook(lambda m, args, out: None) for m in layers]

    def step(self) -> None:
        return None

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def overhead(name: str, everies: tuple[int, ...] = EVERIES, steps: int = 40, rounds: int = 20
             ) -> dict[int | str | None, float]:
    """The loop's per-step thread CPU seconds without the monitor (key None; its fastest round)
    and the overhead, as a fraction of that, with empty hooks (key "hooks") and with the
    monitor at each ``every``: the loops alternate within every round, and each overhead is the
    median over rounds of the loop's time over the plain loop's in the same round."""
    torch.set_num_threads(1)
    net, ds = workload(name)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)
    return alternate(("hooks", *everies),
                     lambda every: EmptyHooks(net) if every == "hooks"
                     else NoiseScaleMonitor(net, every=every),
                     lambda data, monitor: loop(net, opt, data, monitor), batches(ds, steps),
                     rounds)


def alternate(keys: tuple, make, run, data: list, rounds: int, warm: int = 5
              ) -> dict[int | str | None, float]:
    """Per-step thread CPU seconds of ``run(data, None)`` (key None; its fastest round) and, for
    each key, the overhead of ``run(data, make(key))`` as a fraction of that: the loops
    alternate within every round (after ``warm`` steps each), and each overhead is the median
    over rounds of the loop's time over the plain loop's in the same round."""
    times: dict[int | str | None, list[float]] = {key: [] for key in (None, *keys)}
    for _ in range(rounds):
        for key, runs in times.items():
            monitor = None if key is None else make(key)
            run(data[:warm], monitor)                     # warm up
            start = time.thread_time()
            run(data, monitor)
            runs.append((time.thread_time() - start) / len(data))
            if monitor is not None:
                monitor.close()
    plain = times.pop(None)
    return {None: min(plain), **{key: statistics.median(t / p - 1 for t, p in zip(runs, plain))
                                 for key, runs in times.items()}}


def _top_level_calls(prof) -> int:
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def breakdown(name: str, steps: int = 20, rounds: int = 5) -> tuple[float, int, int]:
    """Where a measured step's time goes: thread CPU seconds of the monitor's ``step()`` alone
    inside the loop (fastest round), and the top-level operator calls of a plain step and of
    the monitor's ``step()`` (``torch.profiler``; deterministic; the hooks add none)."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    net, ds = workload(name)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)
    data = batches(ds, steps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop(net, opt, data[:1])
    plain_calls = _top_level_calls(prof)
    monitor = NoiseScaleMonitor(net)
    loop(net, opt, data[:3], monitor)
    best = math.inf
    for _ in range(rounds):
        spent = 0.0
        for x, y in data:
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            start = time.thread_time()
            monitor.step()
            spent += time.thread_time() - start
            opt.step()
        best = min(best, spent / steps)
    opt.zero_grad()
    F.cross_entropy(net(data[0][0]), data[0][1]).backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        monitor.step()
    monitor.close()
    return best, plain_calls, _top_level_calls(prof)


# -- DDP --------------------------------------------------------------------------------------

def _ddp_rank(rank: int, world: int, init: str, steps: int, rounds: int, out: str,
              name: str) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    net, ds = workload(name)
    data = batches(ds, steps, seed=rank)
    plain = DistributedDataParallel(net)
    # DDP's own all-reduce as a Python communication hook (what the monitor's hook wraps)
    python_hook = DistributedDataParallel(copy.deepcopy(net))
    python_hook.register_comm_hook(None, default_hooks.allreduce_hook)
    hooked = DistributedDataParallel(copy.deepcopy(net))
    monitor = NoiseScaleMonitor(hooked)
    runs = {"plain": (plain, None), "python hook": (python_hook, None),
            "monitor": (hooked, monitor)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9) for k, (m, _) in runs.items()}
    times = {(k, clock): [] for k in runs for clock in ("wall", "cpu")}
    for _ in range(rounds):
        for key, (model, mon) in runs.items():
            loop(model, opts[key], data[:5], mon)
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            loop(model, opts[key], data, mon)
            times[key, "wall"].append((time.perf_counter() - start) / steps)
            times[key, "cpu"].append((time.process_time() - cpu) / steps)
    if rank == 0:
        torch.save(times, out)
    dist.destroy_process_group()


def ddp_overhead(name: str = "mlp", steps: int = 50, rounds: int = 20
                 ) -> dict[str, tuple[float, float, float]]:
    """Seconds per step of a 2-process DDP loop (workload ``name``, 64 per rank) with DDP's
    built-in all-reduce (fastest round), and the overheads, as fractions of it (the median over
    rounds, as :func:`overhead`), of DDP's own all-reduce as a Python communication hook and of
    the monitor's communication hook (which wraps that one), by rank 0's wall clock
    ("wall": what a step takes, waits on the other rank included) and its process CPU time
    ("cpu": the work the rank does, its communication threads included, without the waits that
    a shared machine's scheduling adds)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.pt")
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(_ddp_rank, args=(2, init, steps, rounds, out, name), nprocs=2, join=True)
        times = torch.load(out)
    def extra(key: str, clock: str) -> float:
        return statistics.median(t / p - 1 for t, p in zip(times[key, clock],
                                                           times["plain", clock]))

    return {clock: (min(times["plain", clock]), extra("python hook", clock),
                    extra("monitor", clock)) for clock in ("wall", "cpu")}


def main(only_ddp: bool = False, without_ddp: bool = False) -> None:
    if only_ddp:
        return ddp_table()
    print(f"{'workload':<18} {'every':>5} {'plain ms/step':>14} {'monitor ms/step':>16} "
          f"{'overhead':>9}")
    for name, (steps, rounds) in WORKLOADS.items():
        times = overhead(name, steps=steps, rounds=rounds)
        plain = times[None]
        for every in ("hooks", *EVERIES):
            print(f"{name:<18} {every:>5} {plain * 1e3:>14.3f} "
                  f"{plain * (1 + times[every]) * 1e3:>16.3f} {100 * times[every]:>8.1f}%")
    print(f"\n{'workload':<18} {'step() ms':>10} {'ops per plain step':>19} "
          f"{'ops in step()':>14}")
    for name, (steps, rounds) in WORKLOADS.items():
        spent, plain_ops, step_ops = breakdown(name, steps=min(steps, 20), rounds=min(rounds, 5))
        print(f"{name:<18} {spent * 1e3:>10.3f} {plain_ops:>19} {step_ops:>14}")
    if not without_ddp:
        ddp_table()


def ddp_table() -> None:
    print(f"\n{'DDP x2':<18} {'clock':<5} {'plain ms/step':>14} {'Python hook':>12} "
          f"{'monitor':>9}")
    for name, (steps, rounds) in DDP_WORKLOADS.items():
        for clock, (plain, python_hook, monitored) in ddp_overhead(name, steps, rounds).items():
            print(f"{name:<18} {clock:<5} {plain * 1e3:>14.3f} {100 * python_hook:>11.1f}% "
                  f"{100 * monitored:>8.1f}%")


if __name__ == "__main__":
    main(only_ddp=sys.argv[1:] == ["ddp"], without_ddp=sys.argv[1:] == ["per-example"])
