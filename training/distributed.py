"""Real data parallelism: one trial on k worker processes with DistributedDataParallel.

The global mini-batch of step t is ``BatchOrder(trial_seed(seed, trial_index), n, B).batch(t)``,
exactly the batch :func:`training.train_reference` uses; rank r takes the contiguous shard
``[r B/k, (r+1) B/k)`` (``B`` must be divisible by ``k``). Each rank computes the mean loss of its
shard and DDP averages the gradients over ranks, so the update is the gradient of
(1/k) sum_r mean(shard_r) = mean(batch): the same SGD (or Adam) step as the single process (Goyal
et al., 2017), up to floating-point summation order. Learning-rate schedule, optimizer
(:func:`training.reference.make_optimizer`), gradient masking and goal evaluation follow the reference
trainer; rank 0 evaluates the goal on the validation split and broadcasts the value so every rank
stops at the same step.

Launchers:

- in-process (tests, laptops): :func:`train_distributed` spawns k processes with
  ``torch.multiprocessing`` and rendezvous through a TCP store on 127.0.0.1 (a free port).
- cluster: ``torchrun --nproc-per-node K -m training.distributed train --dataset mnist1d
  --model mlp --batch-size 64 --lr 0.1 --steps 1000 --out result.pt`` reads the ``env://``
  rendezvous (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``).

Backends: gloo on CPU, nccl on CUDA. ``python -m training.distributed bench ...`` (or
:func:`bench_main`) measures step times and fits :class:`training.costmodel.CostModel`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import costmodel
from .data import Dataset
from .goal import Goal, as_goal, goal_metric, is_diverged, loss_fn
from .models import count_parameters
from .order import BatchOrder, trial_seed
from .reference import evaluate, make_optimizer, make_sgd, zero_masked
from .results import Curve, ReferenceResult
from .schedules import ConfigError, EvalSchedule, Trial, check_optimizer, lr_factor

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class DistRun:
    """Everything one distributed trial needs besides the model and the data (the arguments of
    :func:`training.train_reference`, plus ``world_size`` k and ``threads`` per worker)."""

    world_size: int
    batch_size: int
    lr: float
    momentum: float = 0.0
    optimizer: str = "momentum"
    steps: int = 500
    seed: int = 0
    trial_index: int = 0
    decay_steps: int | None = None
    end_factor: float = 1.0
    target: Goal | float | None = None
    eval_schedule: EvalSchedule = field(default_factory=EvalSchedule)
    stop_at_goal: bool = True
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    threads: int = 1
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        check_optimizer(self.optimizer, [self.trial.momentum], [self.trial.weight_decay])
        check_world(self.world_size, self.batch_size)
        if self.steps < 0:
            raise ConfigError(f"steps must be >= 0, got {self.steps}")
        if self.threads < 1:
            raise ConfigError(f"threads (torch threads per worker) must be >= 1, "
                              f"got {self.threads}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ConfigError(f"device {self.device!r}; allowed: cpu, cuda")

    @property
    def trial(self) -> Trial:
        """The run's metaparameters (validated)."""
        return Trial(lr=self.lr, momentum=self.momentum, decay_steps=self.decay_steps,
                     end_factor=self.end_factor, beta1=self.beta1, beta2=self.beta2,
                     eps=self.eps, weight_decay=self.weight_decay)

    @property
    def shard(self) -> int:
        """Per-worker batch B / k."""
        return self.batch_size // self.world_size


def check_world(world_size: int, batch_size: int) -> None:
    """``world_size`` k >= 1 and ``batch_size`` B divisible by k (equal shards keep the average of
    shard means equal to the global mean)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size (number of workers) must be an integer >= 1, "
                          f"got {world_size!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size % world_size:
        raise ConfigError(f"batch_size {batch_size} is not divisible by world_size {world_size}: "
                          f"every worker needs an equal shard of B / k examples")


def backend_for(device: str) -> str:
    """gloo on CPU, nccl on CUDA."""
    return "nccl" if device.startswith("cuda") else "gloo"


def rank_device(device: str, local_rank: int) -> torch.device:
    """CPU stays CPU; on CUDA each local rank gets its own GPU (round robin)."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("device 'cuda' asked for but torch.cuda is not available")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# one step, shared by the trainer and the benchmark


def global_mean(value: torch.Tensor, world_size: int) -> float:
    """Mean over ranks of a scalar (the global-batch loss from the shard means)."""
    total = value.detach().reshape(1).to(torch.float64)
    dist.all_reduce(total)
    return float(total) / world_size


class LossSlot:
    """State of :func:`loss_in_gradients_hook`: the shard loss going in, the global mean out."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.loss: torch.Tensor | None = None
        self.mean: torch.Tensor | None = None


# no annotations on the hook: DDP inspects them and this module's are strings (postponed evaluation)
def loss_in_gradients_hook(slot, bucket):
    """DDP communication hook that averages the last gradient bucket together with the loss.

    Appending the shard's loss to the last bucket gives every rank the global-batch loss
    (1/k) sum_r loss_r from the same all-reduce as the gradients, so a step costs one round trip,
    not two. The gradients are averaged as DDP's default hook does (divide by k, then sum).
    """
    last = bucket.is_last()
    buf = bucket.buffer()
    msg = torch.cat([buf, slot.loss.reshape(1).to(buf.dtype)]) if last else buf
    msg.div_(slot.world_size)

    def done(fut: torch.futures.Future) -> torch.Tensor:
        out = fut.value()[0]
        if last:
            slot.mean = out[-1:]
            return out[:-1]
        return out

    return dist.all_reduce(msg, async_op=True).get_future().then(done)


def wrap_ddp(net: nn.Module, device: torch.device, world_size: int, bucket_cap_mb: float = 25.0
             ) -> tuple[DistributedDataParallel, LossSlot]:
    """``net`` under DistributedDataParallel (gradient buckets of ``bucket_cap_mb``, DDP's
    default) with :func:`loss_in_gradients_hook`."""
    ddp = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None,
                                  bucket_cap_mb=bucket_cap_mb)
    slot = LossSlot(world_size)
    ddp.register_comm_hook(slot, loss_in_gradients_hook)
    return ddp, slot


def forward_backward(ddp: DistributedDataParallel, slot: LossSlot, criterion,
                     x: torch.Tensor, y: torch.Tensor) -> float:
    """Averaged gradients of the global mean loss in every rank's ``.grad``; returns that loss.
    DDP's backward returns only after every bucket's all-reduce has completed."""
    loss = criterion(ddp(x), y)
    slot.loss = loss.detach()
    loss.backward()
    return float(slot.mean)


def apply_update(opt: torch.optim.Optimizer, params: Mapping[str, nn.Parameter],
                 masks: Mapping[str, torch.Tensor]) -> None:
    """Mask the (already averaged) gradients, then step: masked weights stay exactly zero."""
    for name, m in masks.items():
        params[name].grad.mul_(m)
    opt.step()


def train_rank(model: nn.Module, dataset: Dataset, run: DistRun, rank: int,
               device: torch.device, mask: Mapping[str, torch.Tensor] | None = None
               ) -> ReferenceResult:
    """The training loop of one rank (process group already initialised). Every rank returns the
    same result; the curve's ``train_loss`` is the global-batch loss."""
    k = run.world_size
    goal = as_goal(run.target, dataset.task)
    metric = goal_metric(goal, dataset.task)
    data = dataset.to(device, run.dtype)
    net = copy.deepcopy(model).to(device=device, dtype=run.dtype).train()
    masks, params = zero_masked(net, mask, device, run.dtype)
    ddp, slot = wrap_ddp(net, device, k)
    opt = make_optimizer(ddp.parameters(), run.optimizer, run.trial)
    order = BatchOrder(trial_seed(run.seed, run.trial_index), data.n_train, run.batch_size)
    lo, hi = rank * run.shard, (rank + 1) * run.shard
    criterion = loss_fn(dataset.task)
    evals = set(run.eval_schedule.steps(run.steps))

    def shard(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = order.batch(step)[lo:hi]
        return data.x_train[idx], data.y_train[idx]

    with torch.no_grad():
        x, y = shard(0)
        initial_loss = global_mean(criterion(net(x), y), k)
    rows: list[tuple[int, float, float]] = []
    losses: list[float] = [initial_loss]

    def record(step: int) -> bool:
        # rank 0 evaluates; broadcasting the value keeps every rank's stopping decision identical
        value = torch.zeros(1, dtype=torch.float64, device=device)
        if rank == 0:
            value += evaluate(net, data.x_val, data.y_val, metric, dataset.task)
        dist.broadcast(value, src=0)
        rows.append((step, float(np.mean(losses)), float(value)))
        losses.clear()
        return bool(goal is not None and goal.met(float(value)))

    hit = diverged_step = None
    step = 0
    if 0 in evals and record(0):
        hit = 0
    while step < run.steps and not (hit is not None and run.stop_at_goal):
        for group in opt.param_groups:
            group["lr"] = run.lr * lr_factor(step, run.decay_steps, run.end_factor)
        opt.zero_grad(set_to_none=False)
        value = forward_backward(ddp, slot, criterion, *shard(step))
        # the reference stops before its update on a diverged loss: skip the step likewise
        if is_diverged(value, initial_loss):
            diverged_step = step
            break
        apply_update(opt, params, masks)
        step += 1
        losses.append(value)
        if step in evals and record(step) and hit is None:
            hit = step

    return ReferenceResult(
        steps_to_result=hit, diverged=diverged_step is not None, diverged_step=diverged_step,
        steps_run=step, curve=Curve.from_rows(rows),
        state={n: v.detach().cpu().clone() for n, v in net.named_parameters()})


# ---------------------------------------------------------------------------------------------
# in-process launcher (spawn on loopback)


def _init_from_store(rank: int, world_size: int, port: int, backend: str, timeout: float) -> None:
    store = dist.TCPStore(LOOPBACK, port, world_size, is_master=False,
                          timeout=timedelta(seconds=timeout))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))


def _spawn_entry(rank: int, world_size: int, backend: str, threads: int, port: int,
                 timeout: float, out: str, fn, args: tuple) -> None:
    """Body of one spawned worker: join the group, run ``fn(rank, *args)``, rank 0 saves."""
    torch.set_num_threads(threads)
    _init_from_store(rank, world_size, port, backend, timeout)
    try:
        result = fn(rank, *args)
        # no rank tears its process group down while another still has collectives in flight
        # (gloo aborts the process: "terminate called without an active exception")
        dist.barrier()
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def spawn(fn, world_size: int, backend: str, threads: int, *args: Any, timeout: float = 300.0):
    """Run ``fn(rank, *args)`` on ``world_size`` spawned processes joined in a process group on
    127.0.0.1; returns rank 0's return value. The parent holds the rendezvous store on a port
    the OS picks, so concurrent runs never collide. If a worker fails, the others are stopped
    and its traceback is raised here. Scripts calling this need the
    ``if __name__ == "__main__":`` guard (spawned workers re-import the main module)."""
    store = dist.TCPStore(LOOPBACK, 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout))
    with tempfile.TemporaryDirectory(prefix="sparsescale-ddp-") as tmp:
        out = os.path.join(tmp, "rank0.pt")
        mp.start_processes(_spawn_entry, nprocs=world_size, join=True, start_method="spawn",
                           args=(world_size, backend, threads, store.port, timeout, out, fn, args))
        # our own file from our own worker: it holds numpy arrays, hence weights_only=False
        return torch.load(out, weights_only=False)


def _train_spawned(rank: int, model: nn.Module, dataset: Dataset, run: DistRun,
                   mask: Mapping[str, torch.Tensor] | None) -> ReferenceResult:
    return train_rank(model, dataset, run, rank, rank_device(run.device, rank), mask)


def train_distributed(model: nn.Module, dataset: Dataset, world_size: int, batch_size: int,
                      lr: float, momentum: float = 0.0, optimizer: str = "momentum",
                      steps: int = 500, seed: int = 0, trial_index: int = 0,
                      decay_steps: int | None = None, end_factor: float = 1.0,
                      target: Goal | float | None = None,
                      eval_schedule: EvalSchedule | None = None, stop_at_goal: bool = True,
                      mask: Mapping[str, torch.Tensor] | None = None,
                      dtype: torch.dtype = torch.float32, device: str = "cpu", threads: int = 1,
                      timeout: float = 300.0, beta1: float = 0.9, beta2: float = 0.999,
                      eps: float = 1e-8, weight_decay: float = 0.0) -> ReferenceResult:
    """Train a copy of ``model`` like :func:`training.train_reference` (same arguments, same
    result) but on ``world_size`` worker processes with DistributedDataParallel, each taking
    ``batch_size / world_size`` examples of the global batch. ``threads``: torch threads per
    worker; ``timeout``: seconds before a stuck collective fails. Workers are spawned (see
    :func:`spawn`): call it under ``if __name__ == "__main__":`` in a script."""
    run = DistRun(world_size=world_size, batch_size=batch_size, lr=lr, momentum=momentum,
                  optimizer=optimizer, steps=steps, seed=seed, trial_index=trial_index,
                  decay_steps=decay_steps, end_factor=end_factor, target=target,
                  eval_schedule=eval_schedule or EvalSchedule(), stop_at_goal=stop_at_goal,
                  dtype=dtype, device=device, threads=threads, beta1=beta1, beta2=beta2,
                  eps=eps, weight_decay=weight_decay)
    if batch_size > dataset.n_train:
        raise ConfigError(f"batch_size {batch_size} exceeds the training set size "
                          f"{dataset.n_train}")
    return spawn(_train_spawned, world_size, backend_for(device), threads, model, dataset, run,
                 mask, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# benchmark: step time against k and per-worker batch, all-reduce time against message size


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
# command line: `train` (torchrun) and `bench`


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def _options(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"option {item!r} must look like key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="mnist1d", help="data set name (training.data)")
    p.add_argument("--data-option", action="append", default=[], metavar="KEY=VALUE",
                   help="data set option, e.g. num_samples=1000 (repeatable)")
    p.add_argument("--model", default="mlp", help="model name (training.models)")
    p.add_argument("--model-seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))


def _workload(args: argparse.Namespace) -> tuple[nn.Module, Dataset]:
    from . import data, models

    ds = data.load(args.dataset, **_options(args.data_option))
    return models.build(args.model, ds, seed=args.model_seed), ds


def bench_main(argv: Sequence[str] | None = None) -> int:
    """``sparsescale bench ddp``: measure DDP step times on this machine, fit
    t(B, k) = t_fixed + t_example B / k + t_allreduce(P, k) (see :mod:`training.costmodel`),
    print the constants and the table, and save them as JSON with ``--out``. Returns 0."""
    p = argparse.ArgumentParser(prog="sparsescale bench ddp", description=bench_main.__doc__)
    _workload_args(p)
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
    args = p.parse_args(argv)
    if args.out:
        # fail on an unwritable destination now, not after minutes of measuring
        folder = args.out if args.out.suffix != ".json" else args.out.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--out {args.out}: cannot create folder {folder} ({exc.strerror})") from None
    model, ds = _workload(args)
    plan = BenchPlan(args.per_worker_batch, args.allreduce_sizes, args.warmup, args.repeats,
                     args.rounds)
    meas = measure(model, ds, args.workers, plan, device=args.device, threads=args.threads)
    fit = costmodel.fit(meas, backend=backend_for(args.device), device=args.device,
                        workload=f"{args.dataset}/{args.model}", threads=args.threads)
    print(costmodel.format_report(fit, meas))
    if args.out:
        print(f"saved {costmodel.save_cost_model(fit, args.out, meas)}")
    return 0


def train_main(argv: Sequence[str] | None = None) -> int:
    """One trial under ``torchrun`` (env:// rendezvous). Rank 0 prints a summary and saves the
    :class:`ReferenceResult` with ``torch.save`` to ``--out``."""
    p = argparse.ArgumentParser(prog="python -m training.distributed train")
    _workload_args(p)
    p.add_argument("--batch-size", type=int, required=True, help="global batch B")
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--optimizer", default="momentum")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trial-index", type=int, default=0)
    p.add_argument("--decay-steps", type=int)
    p.add_argument("--end-factor", type=float, default=1.0)
    p.add_argument("--beta1", type=float, default=0.9, help="adam / adamw")
    p.add_argument("--beta2", type=float, default=0.999, help="adam / adamw")
    p.add_argument("--eps", type=float, default=1e-8, help="adam / adamw")
    p.add_argument("--weight-decay", type=float, default=0.0, help="adam / adamw")
    p.add_argument("--target", type=float)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if v not in os.environ]
    if missing:
        raise ConfigError(f"environment variables {', '.join(missing)} are not set: launch with "
                          f"torchrun, or call training.distributed.train_distributed in-process")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    run = DistRun(world_size=world, batch_size=args.batch_size, lr=args.lr,
                  momentum=args.momentum, optimizer=args.optimizer, steps=args.steps,
                  seed=args.seed, trial_index=args.trial_index, decay_steps=args.decay_steps,
                  end_factor=args.end_factor, target=args.target,
                  eval_schedule=EvalSchedule(every=args.eval_every), device=args.device,
                  threads=args.threads, beta1=args.beta1, beta2=args.beta2, eps=args.eps,
                  weight_decay=args.weight_decay)
    torch.set_num_threads(run.threads)
    model, ds = _workload(args)
    dist.init_process_group(backend_for(run.device), init_method="env://")
    try:
        res = train_rank(model, ds, run, rank,
                         rank_device(run.device, int(os.environ.get("LOCAL_RANK", rank))))
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(f"world_size={world} batch_size={run.batch_size} steps_run={res.steps_run} "
              f"steps_to_result={res.steps_to_result} diverged={res.diverged} "
              f"final_metric={res.curve.metric[-1] if len(res.curve) else float('nan'):.4f}")
        if args.out:
            torch.save(res, args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": train_main, "bench": bench_main}
    if not argv or argv[0] not in commands:
        print("usage: python -m training.distributed {train,bench} [options] (see --help)",
              file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
