"""Real data parallelism: one trial on k worker processes with DistributedDataParallel.

The global mini-batch of step t is ``BatchOrder(trial_seed(run.seed, trial_index), n, B).batch(t)``,
exactly the batch :func:`training.train_reference` uses; rank r takes the contiguous shard
``[r B/k, (r+1) B/k)`` (``B`` must be divisible by ``k``). Each rank computes the mean loss of its
shard and DDP averages the gradients over ranks, so the update is the gradient of
(1/k) sum_r mean(shard_r) = mean(batch): the same SGD (or Adam) step as the single process
(Goyal et al., 2017), up to floating-point summation order. Learning-rate schedule, optimizer
(:func:`training.reference.make_optimizer`), gradient masking (:mod:`training.masks`) and goal
evaluation follow the reference trainer; rank 0 evaluates the goal on the validation split and
broadcasts the value so every rank stops at the same step.

Launchers:

- in-process (tests, laptops): :func:`train_distributed` spawns k processes with
  ``torch.multiprocessing`` and rendezvous through a TCP store on 127.0.0.1 (a free port).
- cluster: ``torchrun --nproc-per-node K -m experiments.cli ddp --dataset mnist1d --model mlp
  --batch-size 64 --lr 0.1 --steps 1000 --out result.pt`` (the ``sparsescale ddp`` command,
  :mod:`experiments.cli.ddp`) reads the ``env://`` rendezvous (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and calls :func:`train_env_rank`.

Backends: gloo on CPU, nccl on CUDA. The step-time benchmark and its cost model are
:mod:`training.distributed.bench`.
"""

from __future__ import annotations

import copy
import gc
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training.config import (
    RunConfig, Trial, check_batch_size, check_index, check_optimizer, check_run,
)
from training.data import Dataset
from training.delay import refuse
from training.models import check_output
from training.errors import ConfigError
from training.goal import as_goal, goal_metric, is_diverged, loss_fn
from training.masks import apply_mask, mask_
from training.schedules.order import BatchOrder, trial_seed
from training.processes.lifetime import children_die_with_this_thread, exit_with_parent
from training.reference import evaluate, make_optimizer
from training.results import Curve, ReferenceResult
from training import randomness
from training.schedules.lr_schedule import lr_factor
from training.randomness import randomness_seed

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class DistRun:
    """One distributed trial besides the model and the data: the :class:`training.Trial`, the
    :class:`training.RunConfig`, the trial's index in its group (its data seed), ``world_size``
    k and ``threads`` (torch threads per worker)."""

    trial: Trial
    run: RunConfig
    world_size: int
    trial_index: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.trial, Trial) or not isinstance(self.run, RunConfig):
            raise ConfigError(f"DistRun needs a training.Trial and a training.RunConfig, got "
                              f"{type(self.trial).__name__} and {type(self.run).__name__}")
        check_optimizer(self.run.optimizer, [self.trial.momentum], [self.trial.weight_decay])
        refuse([self.trial], "the DDP trainer", "its workers average their gradients at a "
               "barrier every step: synchronous data parallelism")
        check_world(self.world_size, self.run.batch_size)
        check_index(self.trial_index, "trial_index")
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ConfigError(f"threads (torch threads per worker) must be >= 1, "
                              f"got {self.threads!r}")
        if str(self.run.device).split(":")[0] not in ("cpu", "cuda"):
            raise ConfigError(f"device {self.run.device!r}; allowed: cpu, cuda")

    @property
    def shard(self) -> int:
        """Per-worker batch B / k."""
        return self.run.batch_size // self.world_size


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
    return "nccl" if str(device).startswith("cuda") else "gloo"


def rank_device(device: str, local_rank: int) -> torch.device:
    """CPU stays CPU; on CUDA each local rank gets its own GPU (round robin)."""
    if str(device).startswith("cuda"):
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
    mask_([params[name].grad for name in masks], list(masks.values()))
    opt.step()


def train_rank(model: nn.Module, dataset: Dataset, dist_run: DistRun, rank: int,
               device: torch.device, mask: Mapping[str, torch.Tensor] | None = None
               ) -> ReferenceResult:
    """The training loop of one rank (process group already initialised). Every rank returns the
    same result; the curve's ``train_loss`` is the global-batch loss.

    Modules with batch statistics or random draws: each rank normalizes its own shard with the
    shard's statistics (as DDP does without SyncBatchNorm; DDP gives every rank rank 0's
    buffers at each forward pass), and draws from its own generator
    (``randomness_seed(run.seed, trial_index, rank)``, rank 0's that of the single process), so
    on k > 1 workers such a run matches the single process in distribution, not to the bit.
    Evaluations and the divergence reference run in eval mode, as in the reference loop.

    The DistributedDataParallel wrapper is freed before this returns (:func:`release_ddp`), so
    the caller may destroy the process group and exit."""
    try:
        if not randomness.draws(model, dataset.x_train[:2]):
            return _train_rank(model, dataset, dist_run, rank, device, mask)
        with randomness.preserved(device):
            randomness.set_state(randomness.seeded_state(
                randomness_seed(dist_run.run.seed, dist_run.trial_index, rank), device), device)
            return _train_rank(model, dataset, dist_run, rank, device, mask)
    finally:
        release_ddp()


def release_ddp() -> None:
    """Free the DistributedDataParallel wrappers that only reference cycles keep alive.

    A DDP module outlives the loop that made it: its frames and closures form cycles that only
    the cyclic collector frees, at whatever later allocation triggers it. A rank that went
    straight from training to ``destroy_process_group`` and exit freed it during interpreter
    shutdown instead, when its reducer released gloo work whose callbacks need the GIL; a
    gloo thread asking for the GIL then is ended inside a ``noexcept`` frame, and the worker
    aborted ("terminate called without an active exception", SIGABRT), now and then, more
    often on a loaded machine (tests/training/distributed/test_trainer.py)."""
    gc.collect()


def _train_rank(model: nn.Module, dataset: Dataset, dist_run: DistRun, rank: int,
                device: torch.device, mask: Mapping[str, torch.Tensor] | None
                ) -> ReferenceResult:
    trial, run, k = dist_run.trial, dist_run.run, dist_run.world_size
    goal = as_goal(run.goal, dataset.task)
    metric = goal_metric(goal, dataset.task)
    data = dataset.to(device, run.dtype)
    net = copy.deepcopy(model).to(device=device, dtype=run.dtype).train()
    masks = apply_mask(net, mask)
    params = dict(net.named_parameters())
    ddp, slot = wrap_ddp(net, device, k)
    opt = make_optimizer(ddp.parameters(), run.optimizer, trial)
    order = BatchOrder(trial_seed(run.seed, dist_run.trial_index), data.n_train, run.batch_size)
    lo, hi = rank * dist_run.shard, (rank + 1) * dist_run.shard
    criterion = loss_fn(dataset.task, dataset.loss)
    evals = set(run.eval_schedule.steps(run.max_steps))
    stop_at_goal = run.stop != "never"

    def shard(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = order.batch(step)[lo:hi]
        return data.x_train[idx], data.y_train[idx]

    # The loop mirrors training.reference.train_reference line for line on purpose (see there):
    # a reader checks the data-parallel step against the single-process one side by side.
    with torch.no_grad():
        x, y = shard(0)
        net.eval()  # draws nothing, leaves the running statistics alone
        initial_loss = global_mean(criterion(net(x), y), k)
        net.train()
    rows: list[tuple[int, float, float]] = []
    losses: list[float] = [initial_loss]

    def record(step: int) -> bool:
        # rank 0 evaluates; broadcasting the value keeps every rank's stopping decision identical
        value = torch.zeros(1, dtype=torch.float64, device=device)
        if rank == 0:
            value += evaluate(net, data.x_val, data.y_val, metric, dataset.task,
                              loss=dataset.loss)
        dist.broadcast(value, src=0)
        rows.append((step, float(np.mean(losses)), float(value)))
        losses.clear()
        return bool(goal is not None and goal.met(float(value)))

    hit = diverged_step = None
    step = 0
    if 0 in evals and record(0):
        hit = 0
    while step < run.max_steps and not (hit is not None and stop_at_goal):
        for group in opt.param_groups:
            group["lr"] = trial.lr * lr_factor(step, trial.decay_steps, trial.end_factor)
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
        state={n: v.detach().cpu().clone() for n, v in net.named_parameters()},
        buffers={n: v.detach().cpu().clone() for n, v in net.named_buffers()})


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
    exit_with_parent()
    torch.set_num_threads(threads)
    _init_from_store(rank, world_size, port, backend, timeout)
    try:
        result = fn(rank, *args)
        release_ddp()   # whatever fn built (the benchmark's DDP too), while the group lives
        # no rank tears its process group down while another still has collectives in flight
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
        # this thread joins the ranks, so it outlives them: each is killed with this process
        with children_die_with_this_thread():
            mp.start_processes(_spawn_entry, nprocs=world_size, join=True,
                               start_method="spawn", args=(world_size, backend, threads,
                                                           store.port, timeout, out, fn, args))
        # our own file from our own worker: it holds numpy arrays, hence weights_only=False
        return torch.load(out, weights_only=False)


def _train_spawned(rank: int, model: nn.Module, dataset: Dataset, dist_run: DistRun,
                   mask: Mapping[str, torch.Tensor] | None) -> ReferenceResult:
    return train_rank(model, dataset, dist_run, rank, rank_device(dist_run.run.device, rank), mask)


def train_distributed(model: nn.Module, dataset: Dataset, trial: Trial | Mapping[str, Any],
                      run: RunConfig, *, world_size: int,
                      mask: Mapping[str, torch.Tensor] | None = None, trial_index: int = 0,
                      threads: int = 1, timeout: float = 300.0) -> ReferenceResult:
    """Train a copy of ``model`` like :func:`training.train_reference` (same arguments, same
    result) but on ``world_size`` worker processes with DistributedDataParallel, each taking
    ``run.batch_size / world_size`` examples of the global batch. ``threads``: torch threads per
    worker; ``timeout``: seconds before a stuck collective fails. Workers are spawned (see
    :func:`spawn`): call it under ``if __name__ == "__main__":`` in a script."""
    check_run(run, "train_distributed")
    check_output(model, dataset, "train_distributed")
    dist_run = DistRun(Trial.from_dict(trial), run, world_size, trial_index, threads)
    check_batch_size(run.batch_size, dataset.n_train)
    return spawn(_train_spawned, world_size, backend_for(run.device), threads, model, dataset,
                 dist_run, mask, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# command line: one trial under torchrun


def env_rendezvous() -> tuple[int, int]:
    """(rank, world size) of a process torchrun started, from its ``env://`` variables."""
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if v not in os.environ]
    if missing:
        raise ConfigError(f"environment variables {', '.join(missing)} are not set: launch with "
                          f"torchrun, or call training.distributed.train_distributed in-process")
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def train_env_rank(model: nn.Module, dataset: Dataset, dist_run: DistRun, device: str = "cpu"
                   ) -> tuple[int, ReferenceResult]:
    """This process's rank of a run whose workers torchrun started: joins the ``env://``
    rendezvous (:func:`env_rendezvous`; ``LOCAL_RANK`` picks the CUDA device), trains like
    :func:`train_distributed` and leaves the process group. Returns (rank, result);
    ``dist_run.world_size`` must equal ``WORLD_SIZE``."""
    check_output(model, dataset, "train_env_rank")
    rank, world = env_rendezvous()
    if world != dist_run.world_size:
        raise ConfigError(f"WORLD_SIZE is {world} but the run was planned for "
                          f"{dist_run.world_size} workers")
    torch.set_num_threads(dist_run.threads)
    dist.init_process_group(backend_for(device), init_method="env://")
    try:
        res = train_rank(model, dataset, dist_run, rank,
                         rank_device(device, int(os.environ.get("LOCAL_RANK", rank))))
    finally:
        dist.destroy_process_group()
    return rank, res
