"""Overhead of theory.NoiseScaleMonitor's parts (theory.monitor.parts): the normalization-layer,
per-layer and preconditioned noise scales, against the plain loop and the monitor alone.

The loop of tests/benchmarks/test_monitor_overhead.py, with Adam and each step's batch of 64 as
two accumulated micro-batches of 32 (a loop with accumulation, the case every part covers), one
thread; the loops alternate within every round, and each overhead is the median over rounds of
the loop's per-step thread CPU time over the plain loop's in the same round. With the default
``--benchmark-disable`` the test runs once as a quick check of the readings.
``python tests/benchmarks/test_monitor_parts_overhead.py`` prints the table.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # run as a script
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.test_monitor_overhead import alternate, batches, workload
from theory import NoiseScaleMonitor

# label: the monitor's keyword arguments (None: no monitor); the optimizer is filled in
VARIANTS = {"monitor": {}, "norm_layers": {"norm_layers": True},
            "per_layer": {"per_layer": True}, "preconditioned": {"optimizer": True}}


def loop(net, opt, data, monitor=None):
    reading = None
    for x, y in data:
        opt.zero_grad()
        for part in (slice(0, 32), slice(32, None)):
            (F.cross_entropy(net(x[part]), y[part]) / 2).backward()
        if monitor is not None:
            reading = monitor.step(loss_scale=0.5)
        opt.step()
    return reading


def make(net, opt, label):
    kwargs = dict(VARIANTS[label])
    if kwargs.pop("optimizer", False):
        kwargs["optimizer"] = opt
    return NoiseScaleMonitor(net, **kwargs)


def test_parts_loop_reads_every_part(benchmark):
    net, ds = workload("transformer")
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    monitor = NoiseScaleMonitor(net, norm_layers=True, per_layer=True, optimizer=opt)
    reading = benchmark(loop, net, opt, batches(ds, 5), monitor)
    names = [p.name for p in reading.parts]
    assert names[-2:] == ["<norm layers>", "<preconditioned>"]
    assert all(math.isfinite(p.trace_sigma) for p in reading.parts)


def overhead(name: str, steps: int = 20, rounds: int = 10) -> dict[str | None, float]:
    """Plain per-step thread CPU seconds (key None, the fastest round) and each variant's
    overhead as a fraction of the plain step (the MLP has no normalization layer)."""
    torch.set_num_threads(1)
    net, ds = workload(name)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    data = batches(ds, steps)
    loop(net, opt, data[:2])                  # the optimizer's state exists from here on
    labels = tuple(k for k in VARIANTS if name != "mlp" or k != "norm_layers")  # (MLP: none)
    return alternate(labels, lambda label: make(net, opt, label),
                     lambda part, monitor: loop(net, opt, part, monitor), data, rounds, warm=3)


def main() -> None:
    print(f"{'workload':<12} {'plain ms/step':>14} " + " ".join(f"{k:>15}" for k in VARIANTS))
    for name in ("mlp", "transformer"):
        times = overhead(name)
        print(f"{name:<12} {times[None] * 1e3:>14.3f} "
              + " ".join(f"{100 * times[k]:>14.1f}%" if k in times else f"{'-':>15}"
                         for k in VARIANTS))


if __name__ == "__main__":
    main()
