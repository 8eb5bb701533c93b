"""Benchmark: trial-steps per second of ``train_trials`` against the plain PyTorch loop.

``sparsescale bench [--models mlp,cnn1d] [--batch-sizes 8,64,512,4096] [--trials 32]
[--optimizer momentum]`` (:func:`add_bench_parser`). Both trainers run in the same process, one
after the other, so the ratio is meaningful on a shared machine even when absolute numbers are
noisy.

- plain loop: ``DataLoader(TensorDataset, shuffle=True)`` + ``nn.Module`` + the ``torch.optim``
  optimizer (``--optimizer``: SGD with momentum 0.9 by default, or Adam / AdamW), one trial at a
  time, as typical reference code trains;
- vectorized: ``train_trials`` with N trials (spread learning rates; momentum 0.9 for the SGD
  family), evaluated only at the start and end.

With an optimizer other than ``momentum``, the vectorized trainer is also timed with momentum at
the same batch size, alternating the two (best of ``ROUNDS`` each), and the table adds the
slowdown of the chosen optimizer against momentum.

Achieved GFLOP/s count the training FLOPs of the layers (forward 2 MAC, weight gradient 2 MAC,
input gradient 2 MAC except for the first layer) against a measured fp32 GEMM peak.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import data as data_mod
from . import models
from .config import ADAM_OPTIMIZERS, OPTIMIZERS, EvalSchedule, RunConfig, Trial
from .goal import loss_fn
from .process import setup_training_process
from .reference import make_optimizer
from .trials import TrialsResult, train_trials


@dataclass(frozen=True)
class Row:
    """One benchmark cell: both trainers' rates and the vectorized trainer's GFLOP/s."""

    model: str
    batch_size: int
    trials: int
    plain_steps_per_s: float
    trial_steps_per_s: float
    gflops: float
    peak_gflops: float
    optimizer: str = "momentum"
    momentum_trial_steps_per_s: float | None = None

    @property
    def ratio(self) -> float:
        return self.trial_steps_per_s / self.plain_steps_per_s

    @property
    def slowdown(self) -> float | None:
        """Vectorized momentum rate over this optimizer's (1.0: as fast as momentum)."""
        if self.momentum_trial_steps_per_s is None:
            return None
        return self.momentum_trial_steps_per_s / self.trial_steps_per_s


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


def _rate(run: Callable[[int], object], seconds: float, clock: Callable[[], float],
          first: int = 4) -> float:
    """Steps per second of ``run(steps)``: grow the step count until a run lasts ``seconds``
    (after one untimed warm-up run, which pays one-off imports and allocations)."""
    steps = first
    run(steps)
    while True:
        start = clock()
        run(steps)
        took = clock() - start
        if took >= seconds:
            return steps / took
        steps = max(steps + 1, int(steps * min(10.0, 1.2 * seconds / max(took, 1e-6))))


def bench_trials(optimizer: str, n_trials: int) -> list[Trial]:
    """The benchmark's trials: learning rates 0.001 * 1.1^k with momentum 0.9 (SGD family) or
    0.0001 * 1.1^k (Adam family, torch's default betas and eps)."""
    if optimizer in ADAM_OPTIMIZERS:
        return [Trial(lr=1e-4 * 1.1 ** k) for k in range(n_trials)]
    return [Trial(lr=0.001 * 1.1 ** k, momentum=0.9) for k in range(n_trials)]


def plain_loop(net: nn.Module, ds: data_mod.Dataset, batch_size: int, steps: int,
               optimizer: str = "momentum") -> float:
    """The plain loop: DataLoader(TensorDataset, shuffle) + nn.Module + the torch.optim optimizer
    of ``optimizer`` (SGD lr 0.01, momentum 0.9; Adam / AdamW lr 0.001), for ``steps`` updates of
    a copy of ``net``; returns the last mini-batch loss."""
    model = copy.deepcopy(net)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ds.x_train, ds.y_train),
                                         batch_size=batch_size, shuffle=True, drop_last=True)
    lr = 1e-3 if optimizer in ADAM_OPTIMIZERS else 0.01
    opt = make_optimizer(model.parameters(), optimizer, Trial(lr=lr, momentum=0.9))
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
               steps: int, trials_per_chunk: int | None = None, optimizer: str = "momentum"
               ) -> TrialsResult:
    """``train_trials`` on the ``n_trials`` trials of :func:`bench_trials`."""
    run = RunConfig(batch_size, optimizer=optimizer, max_steps=steps,
                    eval_schedule=EvalSchedule(every=max(steps, 1)))
    return train_trials(net, ds, bench_trials(optimizer, n_trials), run,
                        trials_per_chunk=trials_per_chunk)


# Alternating rounds when the vectorized trainer is compared with itself under momentum.
ROUNDS = 3


def bench(model: str, batch_size: int, n_trials: int, ds: data_mod.Dataset, peak: float,
          seconds: float = 1.0, clock: str = "wall", optimizer: str = "momentum") -> Row:
    """One table row: both trainers timed back to back on ``clock`` ("wall" or "cpu": process
    CPU time, which a single-threaded run on a shared machine should be measured with). For an
    optimizer other than momentum, the vectorized trainer's rates with it and with momentum are
    the best of ``ROUNDS`` alternating measurements."""
    net = models.build(model, ds, seed=0)
    tick = CLOCKS[clock]
    plain = _rate(lambda s: plain_loop(net, ds, batch_size, s, optimizer), seconds, tick)
    compared = [optimizer] if optimizer == "momentum" else [optimizer, "momentum"]
    rates = dict.fromkeys(compared, 0.0)
    for _ in range(1 if optimizer == "momentum" else ROUNDS):
        for opt in compared:
            rate = _rate(lambda s: vectorized(net, ds, batch_size, n_trials, s, optimizer=opt),
                         seconds, tick)
            rates[opt] = max(rates[opt], rate * n_trials)
    vec = rates[optimizer]
    flops = training_flops(net, ds.input_shape, batch_size)
    return Row(model, batch_size, n_trials, plain, vec, vec * flops / 1e9, peak, optimizer,
               rates.get("momentum") if optimizer != "momentum" else None)


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (ratio = vectorized / plain); rows compared with momentum
    add its rate and the slowdown (momentum rate / this optimizer's)."""
    compared = any(r.slowdown is not None for r in rows)
    head = ("| model | B | trials | plain loop steps/s | vectorized trial-steps/s | ratio "
            "| GFLOP/s | % of peak |")
    rule = "|---|---|---|---|---|---|---|---|"
    if compared:
        head += " vectorized momentum trial-steps/s | slowdown vs momentum |"
        rule += "---|---|"
    lines = []
    for r in rows:
        line = (f"| {r.model} | {r.batch_size} | {r.trials} | {r.plain_steps_per_s:.0f} | "
                f"{r.trial_steps_per_s:.0f} | {r.ratio:.1f}x | {r.gflops:.1f} | "
                f"{100 * r.gflops / r.peak_gflops:.0f} % |")
        if compared:
            line += (" – | – |" if r.slowdown is None else
                     f" {r.momentum_trial_steps_per_s:.0f} | {r.slowdown:.2f}x |")
        lines.append(line)
    return "\n".join([head, rule, *lines])


def run_bench_command(args: argparse.Namespace) -> int:
    """``sparsescale bench``: print the table of :func:`bench` rows for the chosen models, batch
    sizes and optimizer. Returns 0."""
    if args.threads:
        torch.set_num_threads(args.threads)
    # both trainers run in a process set up for training, as a study's workers are
    setup_training_process()
    ds = data_mod.load("mnist1d", num_samples=args.samples)
    peak = matmul_peak(seconds=min(0.5, args.seconds), clock=args.clock)
    print(f"MNIST-1D {ds.n_train} train examples, {torch.get_num_threads()} torch thread(s), "
          f"{args.clock} clock, fp32 matmul peak {peak:.0f} GFLOP/s (1024^3), optimizer "
          f"{args.optimizer}")
    rows = []
    for model in args.models.split(","):
        for b in (int(s) for s in args.batch_sizes.split(",")):
            rows.append(bench(model.strip(), b, args.trials, ds, peak, args.seconds, args.clock,
                              args.optimizer))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print(format_table(rows))
    return 0


def add_bench_parser(subparsers: Any, name: str = "bench") -> Any:
    """Add the ``name`` subcommand (``sparsescale bench``); the handler
    :func:`run_bench_command` is set as the subcommand's ``fn`` default and returned."""
    p = subparsers.add_parser(name, help="the vectorized trainer against the plain torch.optim "
                                         "loop", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,cnn1d", help="comma-separated (default mlp,cnn1d)")
    p.add_argument("--batch-sizes", default="8,64,512,4096", help="comma-separated")
    p.add_argument("--trials", type=int, default=32, help="trials per group (default 32)")
    p.add_argument("--seconds", type=float, default=1.0, help="minimum timed run per cell")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--samples", type=int, default=10_000, help="MNIST-1D samples (default 10000)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="momentum",
                   help="optimizer of both trainers (default momentum); any other is also "
                        "compared with the vectorized trainer under momentum")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall time (default) or process CPU time (robust on a shared machine "
                        "with --threads 1)")
    p.set_defaults(fn=run_bench_command)
    return run_bench_command
