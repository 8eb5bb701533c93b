"""Benchmark: trial-steps per second of ``train_trials`` against the plain PyTorch loop.

``sparsescale bench [--models mlp,cnn1d,simple_cnn,resnet8] [--batch-sizes 8,64,512,4096]
[--trials 32] [--optimizer momentum]`` (:mod:`experiments.cli.bench`). Both trainers run in the same
process, in interleaved rounds, so the ratio is meaningful on a shared machine even when absolute
numbers are noisy.

- plain loop: ``DataLoader(TensorDataset, shuffle=True)`` + ``nn.Module`` + the ``torch.optim``
  optimizer (``--optimizer``: SGD with momentum 0.9 by default, or Adam / AdamW), one trial at a
  time, as typical reference code trains;
- vectorized: ``train_trials`` with N trials (spread learning rates; momentum 0.9 for the SGD
  family), evaluated only at the start and end, on the first VAL_EXAMPLES validation examples,
  against a goal no trial meets (validation error < 0): as in a study, the trainer keeps the
  copy of a stack it would replay a hit from, so the peak memory is a study group's.

Protocol (:mod:`training.bench.rounds`): after a warm-up of each trainer (a one-step run, which
pays one-off costs and the program choice, then runs grown until a step loop lasts a quarter of
a round), the trainers run in ``rounds`` interleaved rounds (default 3): plain loop, vectorized,
plain loop, vectorized, ... A *round* is one timed run of each trainer, each run's step loop
lasting about ``seconds / rounds`` (at least one step), so each trainer is timed for about
``seconds`` a cell. Each run's rate is its steps over the time of its step loop alone
(:class:`training.bench.measure.StepTimer`, the same for both trainers: from just before the
first update to just after the last), so neither trainer's once-per-run costs count (the model
copy, ``DataLoader`` and optimizer of the plain loop; the trial stacks, the program choice, the
evaluations at start and end and the result of the vectorized trainer: for simple_cnn at B = 8
about 5 s a run against 12 ms per trial-step), and no rate is a small difference of two long
runs. Each round gives a ratio (vectorized trial-steps/s over plain steps/s, measured seconds
apart); the table reports the median ratio over the rounds (the lower median: one round's, with
that round's rates in the rate columns) and the range of the rounds' ratios. With an optimizer
other than ``momentum``, the vectorized trainer is also timed with momentum in every round
(plain, the optimizer, momentum), and the table adds the median over rounds of the slowdown of
the chosen optimizer against momentum.

Data: MNIST-1D for ``mlp`` and ``cnn1d``; MNIST for ``simple_cnn``, Fashion-MNIST for
``lee_cnn`` and CIFAR-10 for ``resnet8``
when their files are present (``$SPARSESCALE_DATA``), else synthetic data of the same shape
(Gaussian images, uniform labels: the speed does not depend on the values).

Achieved GFLOP/s count the training FLOPs of the layers (forward 2 MAC, weight gradient 2 MAC,
input gradient 2 MAC except for the first layer) against a measured fp32 GEMM peak. Each row
names the program that ran (:mod:`training.engine.strategy`) and how it was chosen, and the
peak resident memory of the process during the vectorized runs (``VmHWM``, reset before each,
the largest kept): the memory a worker needs for that group.

On a GPU (``device="cuda"``, ``sparsescale bench --device cuda``): both trainers run there, in
the chosen ``precision`` (:mod:`training.device`). The plain loop is the usual GPU reference
code: the ``DataLoader`` on the CPU, each batch copied to the GPU, ``torch.autocast`` around the
forward pass and loss for bf16; the vectorized trainer holds the data set on the GPU. The peak
is the GPU's own matmul peak in that precision (:func:`training.bench.cuda.matmul_peak`), and
the memory column is the peak GPU memory of the vectorized runs
(``torch.cuda.max_memory_allocated``, reset before each, the largest kept).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from training import data as data_mod
from training import models
from training.bench.cuda import peak_memory_mib, reset_peak_memory
from training.bench.measure import (
    CLOCKS, StepTimer, peak_rss_mib, reset_peak_rss, training_flops,
)
from training.bench.rounds import interleave, median_index
from training.config import ADAM_OPTIMIZERS, EvalSchedule, RunConfig, Trial
from training.device import autocast, precision as arithmetic
from training.goal import Goal, loss_fn
from training.reference import make_optimizer
from training.trials import TrialsResult, train_trials

# the bundled models, Lee et al. (2021)'s Simple-CNN and two models written only for the
# benchmark (training.bench.models.BENCH_ONLY)
MODELS = ("mlp", "cnn1d", "simple_cnn", "resnet8", "lee_cnn", "transformer", "gru")
# Real data set and input shape of each model's workload (synthetic when the files are absent).
IMAGE_DATA = {"simple_cnn": ("mnist", (1, 28, 28)), "resnet8": ("cifar10", (3, 32, 32)),
              "lee_cnn": ("fashion_mnist", (1, 28, 28))}
VAL_EXAMPLES = 256
NEVER = Goal("error", 0.0, strict=True)
# Interleaved rounds of the trainers in a cell (training.bench.rounds).
ROUNDS = 3


@dataclass(frozen=True)
class Row:
    """One benchmark cell: both trainers' rates in the median round, the vectorized trainer's
    GFLOP/s, the program that ran (training.engine.strategy), the peak resident memory of the
    process while it ran and, for an optimizer other than momentum, the vectorized momentum rate
    beside it. ``ratio_rounds``: each round's ratio (vectorized over plain), in round order;
    ``slowdown_rounds``: each round's momentum rate over this optimizer's."""

    model: str
    batch_size: int
    trials: int
    plain_steps_per_s: float
    trial_steps_per_s: float
    gflops: float
    peak_gflops: float
    program: str = ""
    peak_rss_mib: float = math.nan
    optimizer: str = "momentum"
    momentum_trial_steps_per_s: float | None = None
    device: str = "cpu"
    precision: str = "fp32"
    peak_gpu_mib: float = math.nan   # torch.cuda.max_memory_allocated (a GPU row's)
    choice: str = ""   # how the program was chosen: "ruled" or "measured" (strategy.CHOICES)
    ratio_rounds: tuple[float, ...] = ()
    slowdown_rounds: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        """Vectorized trial-steps/s over plain steps/s of the median round (the lower median
        of ``ratio_rounds``, whose rates the row holds)."""
        return self.trial_steps_per_s / self.plain_steps_per_s

    @property
    def ratio_range(self) -> tuple[float, float]:
        """Smallest and largest ratio over the rounds (the median's alone without rounds)."""
        return ((min(self.ratio_rounds), max(self.ratio_rounds)) if self.ratio_rounds
                else (self.ratio, self.ratio))

    @property
    def slowdown(self) -> float | None:
        """Vectorized momentum rate over this optimizer's (1.0: as fast as momentum): the
        median over the rounds where they were timed, else of the two rates held."""
        if self.momentum_trial_steps_per_s is None:
            return None
        if self.slowdown_rounds:
            return self.slowdown_rounds[median_index(self.slowdown_rounds)]
        return self.momentum_trial_steps_per_s / self.trial_steps_per_s


def bench_dataset(model: str, samples: int) -> data_mod.Dataset:
    """The model's workload data (see the module docstring), validation cut to VAL_EXAMPLES."""
    if model in IMAGE_DATA:
        name, shape = IMAGE_DATA[model]
        try:
            ds = data_mod.load(name)
        except (data_mod.DataError, data_mod.DataIOError):   # absent or unreadable: synthetic
            g = torch.Generator().manual_seed(0)
            x = torch.randn(samples, *shape, generator=g)
            y = torch.randint(0, 10, (samples,), generator=g)
            ds = data_mod.Dataset(f"synthetic {name}-shaped", "classification",
                                  x[VAL_EXAMPLES:], y[VAL_EXAMPLES:], x[:VAL_EXAMPLES],
                                  y[:VAL_EXAMPLES], 10, shape)
    else:
        ds = data_mod.load("mnist1d", num_samples=samples)
    return replace(ds, x_val=ds.x_val[:VAL_EXAMPLES], y_val=ds.y_val[:VAL_EXAMPLES])


def bench_trials(optimizer: str, n_trials: int) -> list[Trial]:
    """The benchmark's trials: learning rates 0.001 * 1.1^k with momentum 0.9 (SGD family) or
    0.0001 * 1.1^k (Adam family, torch's default betas and eps)."""
    if optimizer in ADAM_OPTIMIZERS:
        return [Trial(lr=1e-4 * 1.1 ** k) for k in range(n_trials)]
    return [Trial(lr=0.001 * 1.1 ** k, momentum=0.9) for k in range(n_trials)]


def plain_loop(net: nn.Module, ds: data_mod.Dataset, batch_size: int, steps: int,
               optimizer: str = "momentum", device: str = "cpu", precision: str = "fp32",
               timer: StepTimer | None = None) -> float:
    """The plain loop: DataLoader(TensorDataset, shuffle) + nn.Module + the torch.optim optimizer
    of ``optimizer`` (SGD lr 0.01, momentum 0.9; Adam / AdamW lr 0.001), for ``steps`` updates of
    a copy of ``net``; returns the last mini-batch loss. On a GPU, each batch is copied there
    and the forward pass and loss run under ``precision``'s autocast, as GPU reference code
    trains. ``timer``: times the loop over the batches (not the copy of ``net``, the
    ``DataLoader`` or the optimizer made before it)."""
    with arithmetic(precision, device):
        return _plain_loop(net, ds, batch_size, steps, optimizer, device, precision, timer)


def _plain_loop(net: nn.Module, ds: data_mod.Dataset, batch_size: int, steps: int,
                optimizer: str, device: str, precision: str, timer: StepTimer | None) -> float:
    model = copy.deepcopy(net).to(device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ds.x_train, ds.y_train),
                                         batch_size=batch_size, shuffle=True, drop_last=True)
    lr = 1e-3 if optimizer in ADAM_OPTIMIZERS else 0.01
    opt = make_optimizer(model.parameters(), optimizer, Trial(lr=lr, momentum=0.9))
    criterion = loss_fn(ds.task)
    done, loss = 0, torch.tensor(math.nan)
    with timer if timer is not None else contextlib.nullcontext():
        while done < steps:
            for x, y in loader:
                if device != "cpu":
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                opt.zero_grad()
                with autocast(precision, device):
                    loss = criterion(model(x), y)
                loss.backward()
                opt.step()
                done += 1
                if done == steps:
                    break
    return float(loss.detach())


def vectorized(net: nn.Module, ds: data_mod.Dataset, batch_size: int, n_trials: int,
               steps: int, trials_per_stack: int | None = None, optimizer: str = "momentum",
               device: str = "cpu", precision: str = "fp32", timer: StepTimer | None = None,
               delay: int = 0, delay_kind: str = "fixed", program: str | None = None
               ) -> TrialsResult:
    """``train_trials`` on the ``n_trials`` trials of :func:`bench_trials` (``ds`` on
    ``device`` already, so no run copies it), each with ``delay`` of ``delay_kind``
    (:mod:`training.delay`), on ``program`` (None: as chosen). ``timer``: times the
    trainer's step loops between its evaluations (``train_trials``'s ``step_timer``)."""
    run = RunConfig(batch_size, optimizer=optimizer, max_steps=steps, goal=NEVER,
                    eval_schedule=EvalSchedule(every=max(steps, 1)), device=device,
                    precision=precision)
    # round_robin is given by its workers, W = delay + 1
    late = (dict(delay_kind=delay_kind, workers=delay + 1) if delay_kind == "round_robin" else
            dict(delay=delay, delay_kind=delay_kind))
    trials = [replace(t, **late) for t in bench_trials(optimizer, n_trials)]
    return train_trials(net, ds, trials, run, trials_per_stack=trials_per_stack,
                        step_timer=timer, program=program)


def bench(model: str, batch_size: int, n_trials: int, ds: data_mod.Dataset, peak: float,
          seconds: float = 1.0, clock: str = "wall", optimizer: str = "momentum",
          device: str = "cpu", precision: str = "fp32", net: nn.Module | None = None,
          rounds: int = ROUNDS) -> Row:
    """One table row: both trainers timed on ``clock`` ("wall" or "cpu": process CPU time,
    which a single-threaded run on a shared machine should be measured with) in ``rounds``
    interleaved rounds of about ``seconds / rounds`` per trainer (module docstring,
    :func:`training.bench.rounds.interleave`); the rates are the median round's. For an
    optimizer other than momentum, the vectorized trainer also runs with momentum in every
    round. ``device``, ``precision``: where and how both trainers compute (module docstring).
    ``net``: the module to time (default the registered ``model`` built for ``ds``); ``model``
    labels the row. The memory columns are the peaks over the vectorized runs (each measured
    from its own start)."""
    net = models.build(model, ds, seed=0) if net is None else net
    tick = CLOCKS[clock]
    on_device = ds.to(device)
    program: dict[str, tuple[str, str]] = {}
    rss, gpu = [math.nan], [math.nan]

    def plain_run(steps: int) -> float:
        timer = StepTimer(tick, device)
        plain_loop(net, ds, batch_size, steps, optimizer, device, precision, timer)
        return timer.seconds

    def vectorized_run(opt: str) -> Callable[[int], float]:
        def run(steps: int) -> float:
            timer = StepTimer(tick, device)
            reset_peak_rss()
            reset_peak_memory(device)
            res = vectorized(net, on_device, batch_size, n_trials, steps, optimizer=opt,
                             device=device, precision=precision, timer=timer)
            rss.append(peak_rss_mib())
            gpu.append(peak_memory_mib(device))
            program[opt] = (res.program, res.program_choice)
            return timer.seconds
        return run

    runs = {"plain": plain_run, "vectorized": vectorized_run(optimizer)}
    if optimizer != "momentum":
        runs["momentum"] = vectorized_run("momentum")
    measured = interleave(runs, seconds, rounds)
    plain = measured.rates("plain")
    vec = [r * n_trials for r in measured.rates("vectorized")]
    ratios = tuple(v / p for v, p in zip(vec, plain))
    m = median_index(ratios)
    momentum, slowdowns = None, ()
    if optimizer != "momentum":
        mom = [r * n_trials for r in measured.rates("momentum")]
        slowdowns = tuple(a / b for a, b in zip(mom, vec))
        momentum = mom[median_index(slowdowns)]
    flops = training_flops(net, ds.input_shape, batch_size)
    return Row(model, batch_size, n_trials, plain[m], vec[m], vec[m] * flops / 1e9, peak,
               program[optimizer][0], _peak(rss), optimizer, momentum, device, precision,
               _peak(gpu), program[optimizer][1], ratios, slowdowns)


def _peak(values: list[float]) -> float:
    """The largest of the known (not NaN) values; NaN if none is known."""
    known = [v for v in values if not math.isnan(v)]
    return max(known) if known else math.nan


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table: the median round's rates, the median ratio (vectorized /
    plain) over the rounds and the range of the rounds' ratios; rows compared with momentum add
    its rate and the median slowdown (momentum rate / this optimizer's)."""
    if any(r.device != "cpu" for r in rows):
        return format_device_table(rows)
    compared = any(r.slowdown is not None for r in rows)
    head = ("| model | B | trials | program | chosen | plain loop steps/s | vectorized "
            "trial-steps/s | median ratio | ratio range | GFLOP/s | % of peak | peak RSS MiB |")
    rule = "|---|---|---|---|---|---|---|---|---|---|---|---|"
    if compared:
        head += " vectorized momentum trial-steps/s | slowdown vs momentum |"
        rule += "---|---|"
    lines = []
    for r in rows:
        line = (f"| {r.model} | {r.batch_size} | {r.trials} | {r.program} | {r.choice} | "
                f"{r.plain_steps_per_s:.3g} | {r.trial_steps_per_s:.3g} | {_ratios(r)} | "
                f"{r.gflops:.1f} | {100 * r.gflops / r.peak_gflops:.0f} % | "
                f"{r.peak_rss_mib:.0f} |")
        if compared:
            line += (" – | – |" if r.slowdown is None else
                     f" {r.momentum_trial_steps_per_s:.3g} | {r.slowdown:.2f}x |")
        lines.append(line)
    return "\n".join([head, rule, *lines])


def format_device_table(rows: Sequence[Row]) -> str:
    """GPU rows as a Markdown table: the ratio against the plain loop on the same GPU, achieved
    TFLOP/s against the GPU's measured matmul peak in the row's precision, and peak GPU memory
    (the optimizer comparison columns of :func:`format_table` are left out)."""
    head = ("| model | B | trials | device | precision | program | plain loop steps/s "
            "| vectorized trial-steps/s | median ratio | ratio range | TFLOP/s | % of peak "
            "| peak GPU MiB |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.batch_size} | {r.trials} | {r.device} | {r.precision} | "
                     f"{r.program} | {r.plain_steps_per_s:.3g} | {r.trial_steps_per_s:.3g} | "
                     f"{_ratios(r)} | {r.gflops / 1e3:.2f} | "
                     f"{100 * r.gflops / r.peak_gflops:.1f} % | {r.peak_gpu_mib:.0f} |")
    return "\n".join(lines)


def _ratio(x: float) -> str:
    """A ratio with two decimals below 10 (0.96x is below the loop; one decimal showed it as
    1.0x), one above."""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _ratios(row: Row) -> str:
    """The median ratio and the rounds' range, as two table cells."""
    low, high = row.ratio_range
    return f"{_ratio(row.ratio)}x | {_ratio(low)}-{_ratio(high)}x"
