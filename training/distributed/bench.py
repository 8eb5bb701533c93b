"""The DDP cost-model benchmark: step time against workers k and per-worker batch, all-reduce time
against message size, fitted to t(B, k) = t_fixed + t_example B / k + t_allreduce(P, k)
(:mod:`training.distributed.costmodel`).

Each measurement runs a real DDP training step (forward, backward with the gradient all-reduce,
SGD update: the primitives of :mod:`training.distributed.trainer`) on k spawned workers. The command is
``sparsescale bench ddp`` (:mod:`experiments.cli.bench`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from training.distributed import costmodel
from training.data import Dataset
from training.distributed.trainer import (
    apply_update, backend_for, forward_backward, rank_device, spawn, wrap_ddp,
)
from training.errors import ConfigError
from training.goal import loss_fn
from training.models import count_parameters
from training.reference import make_sgd


# ---------------------------------------------------------------------------------------------
# measurement


@dataclass(frozen=True)
class BenchProtocol:
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
                protocol: BenchProtocol, device: str) -> dict[str, list]:
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

    configs = [("steps", b, train_step(b)) for b in protocol.per_worker_batches]
    if world_size > 1:
        configs += [("allreduce", n * 4, allreduce(n)) for n in protocol.allreduce_sizes]
    for _, _, fn in configs:
        for _ in range(protocol.warmup):
            fn()
    best = [float("inf")] * len(configs)
    for _ in range(protocol.rounds):
        for i, (_, _, fn) in enumerate(configs):
            best[i] = min(best[i], _median_time(fn, protocol.repeats, sync))
    out: dict[str, list] = {"steps": [], "allreduce": []}
    for (kind, size, _), t in zip(configs, best):
        out[kind].append((size, t))
    return out


def measure(model: nn.Module, dataset: Dataset, workers: Sequence[int],
            protocol: BenchProtocol = BenchProtocol(), device: str = "cpu", threads: int = 1,
            timeout: float = 300.0) -> costmodel.Measurements:
    """Time a DDP training step (forward, backward with gradient all-reduce, SGD update) for every
    k in ``workers`` and per-worker batch in ``protocol``, and a bare all-reduce of each message size.
    """
    steps, reduces = [], []
    for k in workers:
        if k < 1:
            raise ConfigError(f"workers must be >= 1, got {k}")
        out = spawn(_bench_rank, k, backend_for(device), threads, k, model, dataset, protocol, device,
                    timeout=timeout)
        steps += [costmodel.StepTime(k, b, t) for b, t in out["steps"]]
        reduces += [costmodel.AllReduceTime(k, n, t) for n, t in out["allreduce"]]
    n_params = count_parameters(model)
    return costmodel.Measurements(steps=tuple(steps), allreduce=tuple(reduces),
                                  n_params=n_params, bytes_per_param=4)
