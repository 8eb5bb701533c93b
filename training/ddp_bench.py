"""The DDP cost-model benchmark: step time against workers k and per-worker batch, all-reduce time
against message size, fitted to t(B, k) = t_fixed + t_example B / k + t_allreduce(P, k)
(:mod:`training.costmodel`).

Each measurement runs a real DDP training step (forward, backward with the gradient all-reduce,
SGD update: the primitives of :mod:`training.distributed`) on k spawned workers. The command is
``sparsescale bench ddp`` (:func:`add_bench_parser`).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from . import costmodel
from .data import Dataset
from .distributed import (add_workload_arguments, apply_update, backend_for, build_workload,
                          forward_backward, rank_device, spawn, wrap_ddp)
from .errors import ConfigError
from .goal import loss_fn
from .models import count_parameters
from .reference import make_sgd


# ---------------------------------------------------------------------------------------------
# measurement


@dataclass(frozen=True)
class BenchPlan:
    """What :func:`measure` times on k workers. Each configuration gets ``warmup`` untimed calls,
    then ``rounds`` rounds of ``repeats`` timed calls; its time is the smallest per-round median.
    Rounds interleave the configurations in time, and the minimum over rounds discards rounds
    slowed by other processes on a shared machine."""

    per_worker_batches: tuple[int, ...] = (8, 32, 128, 512)
    allreduce_sizes: tuple[int, ...] = (1_000, 30_000, 300_000, 3_000_000)
    warmup: int = 5
    repeats: int = 20
    rounds: int = 5


def _median_time(fn, repeats: int, sync) -> float:
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _bench_rank(rank: int, world_size: int, model: nn.Module, dataset: Dataset,
                plan: BenchPlan, device: str) -> dict[str, list]:
    dev = rank_device(device, rank)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    data = dataset.to(dev, torch.float32)
    net = copy.deepcopy(model).to(dev).train()
    ddp, slot = wrap_ddp(net, dev, world_size)
    opt = make_sgd(ddp.parameters(), "momentum", 1e-3, 0.9)
    criterion = loss_fn(dataset.task)
    params = dict(net.named_parameters())
    gen = torch.Generator().manual_seed(rank)

    def train_step(b: int):
        idx = torch.randint(0, data.n_train, (b,), generator=gen).to(dev)
        x, y = data.x_train[idx], data.y_train[idx]

        def step() -> None:
            opt.zero_grad(set_to_none=False)
            forward_backward(ddp, slot, criterion, x, y)
            apply_update(opt, params, {})

        return step

    def allreduce(n: int):
        buf = torch.ones(n, device=dev)
        return lambda: dist.all_reduce(buf)

    configs = [("steps", b, train_step(b)) for b in plan.per_worker_batches]
    if world_size > 1:
        configs += [("allreduce", n * 4, allreduce(n)) for n in plan.allreduce_sizes]
    for _, _, fn in configs:
        for _ in range(plan.warmup):
            fn()
    best = [float("inf")] * len(configs)
    for _ in range(plan.rounds):
        for i, (_, _, fn) in enumerate(configs):
            best[i] = min(best[i], _median_time(fn, plan.repeats, sync))
    out: dict[str, list] = {"steps": [], "allreduce": []}
    for (kind, size, _), t in zip(configs, best):
        out[kind].append((size, t))
    return out


def measure(model: nn.Module, dataset: Dataset, workers: Sequence[int],
            plan: BenchPlan = BenchPlan(), device: str = "cpu", threads: int = 1,
            timeout: float = 300.0) -> costmodel.Measurements:
    """Time a DDP training step (forward, backward with gradient all-reduce, SGD update) for every
    k in ``workers`` and per-worker batch in ``plan``, and a bare all-reduce of each message size.
    """
    steps, reduces = [], []
    for k in workers:
        if k < 1:
            raise ConfigError(f"workers must be >= 1, got {k}")
        out = spawn(_bench_rank, k, backend_for(device), threads, k, model, dataset, plan, device,
                    timeout=timeout)
        steps += [costmodel.StepTime(k, b, t) for b, t in out["steps"]]
        reduces += [costmodel.AllReduceTime(k, n, t) for n, t in out["allreduce"]]
    n_params = count_parameters(model)
    return costmodel.Measurements(steps=tuple(steps), allreduce=tuple(reduces),
                                  n_params=n_params, bytes_per_param=4)


# ---------------------------------------------------------------------------------------------
# command line: `sparsescale bench ddp`


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def run_bench_command(args: argparse.Namespace) -> int:
    """``sparsescale bench ddp``: measure DDP step times on this machine, fit
    t(B, k) = t_fixed + t_example B / k + t_allreduce(P, k) (see :mod:`training.costmodel`),
    print the constants and the table, and save them as JSON with ``--out``. Returns 0."""
    if args.out:
        # fail on an unwritable destination now, not after minutes of measuring
        folder = args.out if args.out.suffix != ".json" else args.out.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--out {args.out}: cannot create folder {folder} "
                              f"({exc.strerror})") from None
    model, ds = build_workload(args)
    plan = BenchPlan(args.per_worker_batch, args.allreduce_sizes, args.warmup, args.repeats,
                     args.rounds)
    meas = measure(model, ds, args.workers, plan, device=args.device, threads=args.threads)
    fit = costmodel.fit(meas, backend=backend_for(args.device), device=args.device,
                        workload=f"{args.dataset}/{args.model}", threads=args.threads)
    print(costmodel.format_report(fit, meas))
    if args.out:
        print(f"saved {costmodel.save_cost_model(fit, args.out, meas)}")
    return 0


def add_bench_parser(subparsers: Any, name: str = "ddp") -> Any:
    """Add the ``name`` subcommand (``sparsescale bench ddp``); the handler
    :func:`run_bench_command` is set as the subcommand's ``fn`` default and returned."""
    p = subparsers.add_parser(
        name, help="DDP step times against workers k and per-worker batch; the cost model",
        description=run_bench_command.__doc__)
    add_workload_arguments(p)
    p.add_argument("--workers", type=_ints, default=(1, 2), help="worker counts k, e.g. 1,2,4")
    p.add_argument("--per-worker-batch", type=_ints, default=BenchPlan.per_worker_batches,
                   help="per-worker batch sizes B / k")
    p.add_argument("--allreduce-sizes", type=_ints, default=BenchPlan.allreduce_sizes,
                   help="all-reduce message sizes in float32 elements")
    p.add_argument("--repeats", type=int, default=BenchPlan.repeats)
    p.add_argument("--warmup", type=int, default=BenchPlan.warmup)
    p.add_argument("--rounds", type=int, default=BenchPlan.rounds)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--out", type=Path, help="write the fitted cost model here (cost_model.json)")
    p.set_defaults(fn=run_bench_command)
    return run_bench_command
