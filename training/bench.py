"""Benchmark: trial-steps per second of ``train_trials`` against the plain PyTorch loop.

``python -m training.bench [--models mlp,cnn1d,simple_cnn,resnet8] [--batch-sizes
8,64,512,4096] [--trials 32]`` (also ``sparsescale bench``). Both trainers run in the same
process, one after the other, so the ratio is meaningful on a shared machine even when absolute
numbers are noisy.

- plain loop: ``DataLoader(TensorDataset, shuffle=True)`` + ``nn.Module`` + ``torch.optim.SGD``
  (momentum 0.9), one trial at a time, as typical reference code trains;
- vectorized: ``train_trials`` with N trials (momentum 0.9, spread learning rates), evaluated only
  at the start and end, on the first VAL_EXAMPLES validation examples.

Rates are marginal (see ``_rate``): a run of 2s steps against one of s, so neither trainer's
once-per-run costs (setup, the two evaluations) count.

Data: MNIST-1D for ``mlp`` and ``cnn1d``; MNIST for ``simple_cnn`` and CIFAR-10 for ``resnet8``
when their files are present (``$SPARSESCALE_DATA``), else synthetic data of the same shape
(Gaussian images, uniform labels: the speed does not depend on the values).

Achieved GFLOP/s count the training FLOPs of the layers (forward 2 MAC, weight gradient 2 MAC,
input gradient 2 MAC except for the first layer) against a measured fp32 GEMM peak. The peak
resident memory of the process during the vectorized run (``VmHWM``, reset before it) is the
memory a worker needs for that group.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from . import data as data_mod
from . import models
from .cellplan import plan_cell
from .goal import loss_fn
from .schedules import EvalSchedule
from .trials import TrialsResult, train_trials, tune_allocator

MODELS = ("mlp", "cnn1d", "simple_cnn", "resnet8")
# Real data set and input shape of each model's workload (synthetic when the files are absent).
IMAGE_DATA = {"simple_cnn": ("mnist", (1, 28, 28)), "resnet8": ("cifar10", (3, 32, 32))}
VAL_EXAMPLES = 256


@dataclass(frozen=True)
class Row:
    """One benchmark cell: both trainers' rates, the vectorized trainer's GFLOP/s, its kernel
    (training.cellplan) and the peak resident memory of the process while it ran."""

    model: str
    batch_size: int
    trials: int
    plain_steps_per_s: float
    trial_steps_per_s: float
    gflops: float
    peak_gflops: float
    kernel: str = ""
    peak_rss_mib: float = math.nan

    @property
    def ratio(self) -> float:
        return self.trial_steps_per_s / self.plain_steps_per_s


def training_flops(model: nn.Module, input_shape: Sequence[int], batch_size: int) -> float:
    """FLOPs of one training step on one trial: 6 per multiply-accumulate and example in Linear /
    Conv layers, 4 in the first one (its input gradient is not needed)."""
    macs: list[float] = []

    def hook(module, inputs, output):
        if isinstance(module, nn.Linear):
            macs.append(module.in_features * module.out_features)
        elif isinstance(module, nn.modules.conv._ConvNd):
            k = math.prod(module.kernel_size) * module.in_channels // module.groups
            macs.append(k * output[0].numel())

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))]
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape))
    finally:
        for h in handles:
            h.remove()
    return batch_size * (6 * sum(macs) - (2 * macs[0] if macs else 0))


def matmul_peak(size: int = 1024, seconds: float = 0.5, clock: str = "wall") -> float:
    """Measured fp32 GEMM throughput (GFLOP/s) for size^3 products."""
    tick = CLOCKS[clock]
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    n, start = 0, tick()
    while tick() - start < seconds:
        a @ b
        n += 1
    return 2 * size ** 3 * n / (tick() - start) / 1e9


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def _rate(run: Callable[[int], object], seconds: float, clock: Callable[[], float]) -> float:
    """Marginal steps per second of ``run(steps)``: s / (t(2 s) - t(s)), with s grown until a
    run lasts ``seconds`` / 2, after an untimed one-step warm-up (one-off imports, builds and
    allocations). The difference cancels what a run pays once whatever its length: setup, and
    the vectorized trainer's evaluations at start and end, which for the image models at small
    batches would otherwise outweigh the steps."""
    run(1)
    steps = 1
    while True:
        start = clock()
        run(steps)
        took = clock() - start
        if took >= seconds / 2:
            break
        steps = max(steps + 1, int(steps * min(10.0, 0.6 * seconds / max(took, 1e-6))))
    start = clock()
    run(2 * steps)
    twice = clock() - start
    return steps / (twice - took) if twice > took else 2 * steps / twice


def reset_peak_rss() -> bool:
    """Return freed heap to the OS and reset the process's peak resident set (``VmHWM``) to the
    current one (Linux: ``/proc/self/clear_refs``); False where that is not possible."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except (OSError, AttributeError):
        return False


def peak_rss_mib() -> float:
    """Peak resident set of this process in MiB (``VmHWM``; NaN where unknown)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def bench_dataset(model: str, samples: int) -> data_mod.Dataset:
    """The model's workload data (see the module docstring), validation cut to VAL_EXAMPLES."""
    if model in IMAGE_DATA:
        name, shape = IMAGE_DATA[model]
        try:
            ds = data_mod.load(name)
        except data_mod.DataError:
            g = torch.Generator().manual_seed(0)
            x = torch.randn(samples, *shape, generator=g)
            y = torch.randint(0, 10, (samples,), generator=g)
            ds = data_mod.Dataset(f"synthetic {name}-shaped", "classification",
                                  x[VAL_EXAMPLES:], y[VAL_EXAMPLES:], x[:VAL_EXAMPLES],
                                  y[:VAL_EXAMPLES], 10, shape)
    else:
        ds = data_mod.load("mnist1d", num_samples=samples)
    return replace(ds, x_val=ds.x_val[:VAL_EXAMPLES], y_val=ds.y_val[:VAL_EXAMPLES])


def plain_loop(net: nn.Module, ds: data_mod.Dataset, batch_size: int, steps: int) -> float:
    """The plain loop: DataLoader(TensorDataset, shuffle) + nn.Module + torch.optim.SGD, for
    ``steps`` updates of a copy of ``net``; returns the last mini-batch loss."""
    model = copy.deepcopy(net)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ds.x_train, ds.y_train),
                                         batch_size=batch_size, shuffle=True, drop_last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = loss_fn(ds.task)
    done, loss = 0, torch.tensor(math.nan)
    while done < steps:
        for x, y in loader:
            opt.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
    return float(loss.detach())


def vectorized(net: nn.Module, ds: data_mod.Dataset, batch_size: int, n_trials: int,
               steps: int, trials_per_chunk: int | None = None) -> TrialsResult:
    """``train_trials`` on ``n_trials`` trials (momentum 0.9, learning rates 0.001 * 1.1^k)."""
    trials = [{"lr": 0.001 * 1.1 ** k, "momentum": 0.9} for k in range(n_trials)]
    return train_trials(net, ds, batch_size, trials, optimizer="momentum", max_steps=steps,
                        eval_schedule=EvalSchedule(every=max(steps, 1)),
                        trials_per_chunk=trials_per_chunk)


def bench(model: str, batch_size: int, n_trials: int, ds: data_mod.Dataset, peak: float,
          seconds: float = 1.0, clock: str = "wall") -> Row:
    """One table row: both trainers timed back to back on ``clock`` ("wall" or "cpu": process
    CPU time, which a single-threaded run on a shared machine should be measured with)."""
    net = models.build(model, ds, seed=0)
    tick = CLOCKS[clock]
    plain = _rate(lambda s: plain_loop(net, ds, batch_size, s), seconds, tick)
    reset_peak_rss()
    vec = _rate(lambda s: vectorized(net, ds, batch_size, n_trials, s), seconds, tick) * n_trials
    rss = peak_rss_mib()
    flops = training_flops(net, ds.input_shape, batch_size)
    kernel = plan_cell(net, ds.task, ds.input_shape, batch_size, n_trials).kernel
    return Row(model, batch_size, n_trials, plain, vec, vec * flops / 1e9, peak, kernel, rss)


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (ratio = vectorized / plain)."""
    head = ("| model | B | trials | kernel | plain loop steps/s | vectorized trial-steps/s | ratio "
            "| GFLOP/s | % of peak | peak RSS MiB |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"| {r.model} | {r.batch_size} | {r.trials} | {r.kernel} | "
             f"{r.plain_steps_per_s:.3g} | {r.trial_steps_per_s:.3g} | {r.ratio:.1f}x | "
             f"{r.gflops:.1f} | {100 * r.gflops / r.peak_gflops:.0f} % | {r.peak_rss_mib:.0f} |"
             for r in rows]
    return "\n".join([head, *lines])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sparsescale bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated (default {','.join(MODELS)})")
    p.add_argument("--batch-sizes", default="8,64,512,4096", help="comma-separated")
    p.add_argument("--trials", type=int, default=32, help="trials per group (default 32)")
    p.add_argument("--seconds", type=float, default=1.0, help="minimum timed run per cell")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--samples", type=int, default=10_000,
                   help="MNIST-1D samples, and synthetic images when MNIST / CIFAR-10 files are "
                        "absent (default 10000)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall time (default) or process CPU time (robust on a shared machine "
                        "with --threads 1)")
    args = p.parse_args(argv)
    names = [m.strip() for m in args.models.split(",")]
    unknown = sorted(set(names) - set(models.list_models()))
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; allowed: "
                f"{', '.join(models.list_models())}")
    if args.threads:
        torch.set_num_threads(args.threads)
    # train_trials tunes malloc on its first call; do it first so both trainers run with it
    tune_allocator()
    peak = matmul_peak(seconds=min(0.5, args.seconds), clock=args.clock)
    print(f"{torch.get_num_threads()} torch thread(s), {args.clock} clock, fp32 matmul peak "
          f"{peak:.0f} GFLOP/s (1024^3)")
    rows = []
    for model in names:
        ds = bench_dataset(model, args.samples)
        print(f"{model}: {ds.name}, {ds.n_train} training examples", flush=True)
        for b in (int(s) for s in args.batch_sizes.split(",")):
            rows.append(bench(model, b, args.trials, ds, peak, args.seconds, args.clock))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
