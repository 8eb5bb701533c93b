"""``sparsescale bench`` (the vectorized trainer against the plain loop,
:mod:`training.bench.speed`) and ``sparsescale bench ddp`` (DDP step times and the wall-clock
cost model, :mod:`training.distributed.bench`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training import data as data_mod
from training import models
from training.bench import delay as delay_bench
from training.bench import first_call
from training.bench.measure import CLOCKS, matmul_peak
from training.bench import cuda as cuda_bench
from training.bench import speed
from training.bench.models import BENCH_ONLY
from training.bench.speed import MODELS, VAL_EXAMPLES, bench_dataset, format_table
from training.data.dataset import Dataset
from training.config import OPTIMIZERS
from training.delay import DELAY_KINDS
from training.device import device_info
from training.distributed import costmodel
from training.distributed.bench import BenchProtocol, measure
from training.distributed.trainer import backend_for
from training.errors import ConfigError
from training.processes.setup import setup_training_process

from experiments.cli.ddp import add_workload_arguments, build_workload
from experiments.cli.options import add_device_argument, add_precision_argument, device_of
from experiments.spec import factories


def bench_workloads(model_names: str, dataset: str | None, samples: int
                    ) -> list[tuple[str, Callable[[Dataset], nn.Module], Dataset]]:
    """(label, model factory, data set) of each ``--models`` entry: a registered model (on its
    benchmark data, :func:`training.bench.speed.bench_dataset`), a bench-only one
    (``transformer``, ``gru``: :data:`training.bench.models.BENCH_ONLY`), or a factory by
    import path ``package.module:factory`` (as a study's ``[workload] model``,
    :mod:`experiments.spec.factories`), which needs ``--dataset``. ``dataset``: a registered
    data set or a factory by import path, for every model. Raises ConfigError / FactoryError
    (one line) for a name or path that does not resolve."""
    allowed = [*models.list_models(), *BENCH_ONLY]
    entries = [m.strip() for m in model_names.split(",") if m.strip()]
    if not entries:
        raise ConfigError(f"bench --models: empty; allowed: {', '.join(allowed)}, or "
                          f"package.module:factory")
    unknown = [m for m in entries if not factories.is_path(m) and m not in allowed]
    if unknown:
        raise ConfigError(f"bench --models: unknown model(s) {', '.join(unknown)}; allowed: "
                          f"{', '.join(allowed)}, or package.module:factory")
    try:
        shared = None if dataset is None else _bench_data(dataset)
    except factories.FactoryError as exc:
        raise ConfigError(f"bench --dataset: {exc.detail}") from None
    workloads = []
    for entry in entries:
        path, data_path = BENCH_ONLY.get(entry, (entry, None))
        if factories.is_path(path):
            try:
                factory = factories.resolve("model", path)
            except factories.FactoryError as exc:   # one line naming the option
                raise ConfigError(f"bench --models: {exc.detail}") from None
            if shared is None and data_path is None:
                raise ConfigError(f"bench --models {entry}: a model given by import path needs "
                                  f"--dataset NAME|package.module:factory")
            ds = shared if shared is not None else _bench_data(data_path)

            def build(ds: Dataset, path: str = path) -> nn.Module:
                try:
                    return factories.build_model(path, ds, 0, {})
                except factories.FactoryError as exc:
                    raise ConfigError(f"bench --models: {exc.detail}") from None

            label = entry if entry in BENCH_ONLY else factory.path.rpartition(":")[2]
            workloads.append((label, build, ds))
        else:
            ds = shared if shared is not None else bench_dataset(entry, samples)
            workloads.append((entry, lambda ds, name=entry: models.build(name, ds, seed=0), ds))
    return workloads


def _bench_data(name: str) -> Dataset:
    """A registered data set or a data-set factory by import path, validation cut to
    VAL_EXAMPLES."""
    if factories.is_path(name):
        ds = factories.load_dataset(name, {})
    elif name in data_mod.list_datasets():
        ds = data_mod.load(name)
    else:
        raise ConfigError(f"bench --dataset: unknown data set {name!r}; allowed: "
                          f"{', '.join(data_mod.list_datasets())}, or package.module:factory")
    return replace(ds, x_val=ds.x_val[:VAL_EXAMPLES], y_val=ds.y_val[:VAL_EXAMPLES])


def run_trainer_bench(args: argparse.Namespace) -> int:
    """``sparsescale bench``: print the table of :func:`bench` rows for the chosen models, batch
    sizes and optimizer, and each model's first-call cost in a fresh process. Returns 0."""
    device = device_of(args)   # before anything runs: no GPU is one line, exit 2
    if not args.seconds > 0:
        raise ConfigError(f"bench --seconds: must be > 0, got {args.seconds}")
    if args.rounds < 1:
        raise ConfigError(f"bench --rounds: must be >= 1, got {args.rounds}")
    # every model built before anything is timed: a bad factory fails at once
    workloads = [(label, build(ds), ds)
                 for label, build, ds in bench_workloads(args.models, args.dataset, args.samples)]
    if args.threads:
        torch.set_num_threads(args.threads)
    # both trainers run in a process set up for training, as a study's workers are
    setup_training_process()
    if device == "cpu":
        peak = matmul_peak(seconds=min(0.5, args.seconds), clock=args.clock)
        print(f"{torch.get_num_threads()} torch thread(s), {args.clock} clock, fp32 matmul peak "
              f"{peak:.0f} GFLOP/s (1024^3), optimizer {args.optimizer}"
              + (f", precision {args.precision}" if args.precision != "fp32" else "")
              + f", {args.rounds} interleaved round(s) of about {args.seconds / args.rounds:.2g} s "
                f"per trainer")
    else:
        peak = cuda_bench.matmul_peak(device, args.precision, seconds=min(0.5, args.seconds))
        info = device_info(device)
        print(f"{info.device} {info.name} (CUDA {info.cuda_version}, driver "
              f"{info.driver_version}), {args.precision} matmul peak {peak / 1e3:.1f} TFLOP/s "
              f"({cuda_bench.PEAK_SIZE}^3), optimizer {args.optimizer}, {args.rounds} "
              f"interleaved round(s) of about {args.seconds / args.rounds:.2g} s per trainer")
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    if args.delay:
        return _delay_bench(args, workloads, sizes)
    rows, first_calls = [], []
    for label, net, ds in workloads:
        print(f"{label}: {ds.name}, {ds.n_train} training examples", flush=True)
        for b in sizes:
            rows.append(speed.bench(label, b, args.trials, ds, peak, args.seconds, args.clock,
                                    args.optimizer, device, args.precision, net=net,
                                    rounds=args.rounds))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
        if args.first_call:
            first, second = first_call.measure(net, ds, sizes[0], args.trials, args.optimizer,
                                               torch.get_num_threads())
            first_calls.append(f"{label}: first call in a fresh process {first:.2f} s, the "
                               f"next {second:.2f} s (one step of {args.trials} trials at "
                               f"B = {sizes[0]}): one-time cost {first - second:.2f} s")
            print(first_calls[-1], flush=True)
    print(format_table(rows))
    print("\n".join(first_calls))
    return 0


def _delay_bench(args: argparse.Namespace, workloads: list[tuple[str, nn.Module, Dataset]],
                 sizes: list[int]) -> int:
    """``sparsescale bench --delay TAU``: the table of :func:`training.bench.delay.bench_delay`
    rows (delay TAU against delay 0) for every model, batch size and ``--programs`` entry.
    Returns 0."""
    if args.delay < 0:
        raise ConfigError(f"bench --delay: must be an integer >= 0, got {args.delay}")
    programs = [p.strip() or None for p in args.programs.split(",")]
    rows = []
    for label, net, ds in workloads:
        for b in sizes:
            for program in programs:
                rows.append(delay_bench.bench_delay(
                    label, net, ds, b, args.trials, args.delay, args.delay_kind,
                    None if program == "chosen" else program, args.seconds, args.rounds,
                    args.clock))
                print(delay_bench.format_delay_table(rows[-1:]).splitlines()[-1], flush=True)
    print(delay_bench.format_delay_table(rows))
    return 0


def add_trainer_bench_parser(subparsers: Any, name: str = "bench") -> Any:
    """Add the ``name`` subcommand (``sparsescale bench``); the handler
    :func:`run_trainer_bench` is set as the subcommand's ``fn`` default and returned."""
    p = subparsers.add_parser(name, help="the vectorized trainer against the plain torch.optim "
                                         "loop", description=speed.__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated registered or bench-only names, or factories by "
                        f"import path package.module:factory (default {','.join(MODELS)})")
    p.add_argument("--dataset", default=None,
                   help="data set of every model: a registered name or package.module:factory "
                        "(default: each model's benchmark data; required for models by path)")
    p.add_argument("--first-call", dest="first_call", action="store_true", default=True,
                   help="time each model's first call in a fresh process (the default)")
    p.add_argument("--no-first-call", dest="first_call", action="store_false",
                   help="skip timing each model's first call in a fresh process")
    p.add_argument("--batch-sizes", default="8,64,512,4096", help="comma-separated")
    p.add_argument("--trials", type=int, default=32, help="trials per group (default 32)")
    p.add_argument("--seconds", type=float, default=1.0,
                   help="timed step loops per trainer and cell, over all rounds (default 1.0)")
    p.add_argument("--rounds", type=int, default=speed.ROUNDS,
                   help=f"interleaved rounds per cell (plain loop, vectorized, ...); the table "
                        f"gives the median ratio and its range (default {speed.ROUNDS})")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--samples", type=int, default=10_000,
                   help="MNIST-1D samples, and synthetic images when MNIST / CIFAR-10 files are "
                        "absent (default 10000)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="momentum",
                   help="optimizer of both trainers (default momentum); any other is also "
                        "compared with the vectorized trainer under momentum")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall time (default) or process CPU time (robust on a shared machine "
                        "with --threads 1)")
    p.add_argument("--delay", type=int, default=0,
                   help="time delayed gradients instead: every trial with this delay against "
                        "delay 0, both train_trials (training.bench.delay; default 0: off)")
    p.add_argument("--delay-kind", dest="delay_kind", choices=DELAY_KINDS, default="fixed",
                   help="the delays' kind with --delay (default fixed)")
    p.add_argument("--programs", default="chosen",
                   help="with --delay: comma-separated programs to time (e.g. batched,fused; "
                        "default chosen: the program train_trials chooses)")
    add_device_argument(p, "cpu", "run both trainers")
    add_precision_argument(p)
    p.set_defaults(fn=run_trainer_bench)
    return run_trainer_bench


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def run_ddp_bench(args: argparse.Namespace) -> int:
    """``sparsescale bench ddp``: measure DDP step times on this machine, fit
    t(B, k) = t_fixed + t_example B / k + t_allreduce(P, k) (see :mod:`training.distributed.costmodel`),
    print the constants and the table, and save them as JSON with ``--out``. Returns 0."""
    if args.out:
        # fail on an unwritable destination now, not after minutes of measuring
        folder = args.out if args.out.suffix != ".json" else args.out.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise costmodel.CostModelIOError(f"--out {args.out}: cannot create folder "
                                             f"{folder} ({exc.strerror or exc})") from None
    model, ds = build_workload(args)
    protocol = BenchProtocol(args.per_worker_batch, args.allreduce_sizes, args.warmup,
                             args.repeats, args.rounds)
    meas = measure(model, ds, args.workers, protocol, device=args.device, threads=args.threads)
    fit = costmodel.fit(meas, backend=backend_for(args.device), device=args.device,
                        workload=f"{args.dataset}/{args.model}", threads=args.threads)
    print(costmodel.format_report(fit, meas))
    if args.out:
        print(f"saved {costmodel.save_cost_model(fit, args.out, meas)}")
    return 0


def add_ddp_bench_parser(subparsers: Any, name: str = "ddp") -> Any:
    """Add the ``name`` subcommand (``sparsescale bench ddp``); the handler
    :func:`run_ddp_bench` is set as the subcommand's ``fn`` default and returned."""
    p = subparsers.add_parser(
        name, help="DDP step times against workers k and per-worker batch; the cost model",
        description=run_ddp_bench.__doc__)
    add_workload_arguments(p)
    p.add_argument("--workers", type=_ints, default=(1, 2), help="worker counts k, e.g. 1,2,4")
    p.add_argument("--per-worker-batch", type=_ints, default=BenchProtocol.per_worker_batches,
                   help="per-worker batch sizes B / k")
    p.add_argument("--allreduce-sizes", type=_ints, default=BenchProtocol.allreduce_sizes,
                   help="all-reduce message sizes in float32 elements")
    p.add_argument("--repeats", type=int, default=BenchProtocol.repeats)
    p.add_argument("--warmup", type=int, default=BenchProtocol.warmup)
    p.add_argument("--rounds", type=int, default=BenchProtocol.rounds)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--out", type=Path, help="write the fitted cost model here (cost_model.json)")
    p.set_defaults(fn=run_ddp_bench)
    return run_ddp_bench
