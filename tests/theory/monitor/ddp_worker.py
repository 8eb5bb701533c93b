"""One rank of the monitor's DDP tests (run by tests/theory/monitor/test_ddp.py under torchrun,
gloo on CPU, float64): for each configuration in CONFIGS trains a few steps of an MLP with the
monitor's communication hook and saves, on rank 0, each step's weights, global batch and reading
(and how the hook reduced the per-rank scalars) to the path in argv[1]. One step accumulates two
micro-batches per rank under no_sync.

Configurations: ``fold`` (DDP's own averaging, several small buckets: the scalars ride in the
last bucket's all-reduce), ``separate`` (the same with folding turned off: a separate
all-reduce), ``user_hook`` (a communication hook of the user's, wrapped: a separate all-reduce),
``unused`` (a parameter the forward never uses, ``find_unused_parameters=True``),
``bucket_view`` (the fold with ``gradient_as_bucket_view=True``: the parameters' ``.grad`` are
views of DDP's bucket buffers, which must receive the folded copy's averaged part); and
``two_synced``, two synchronized backward passes in one step, which ``step()`` must refuse.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

import theory.monitor.ddp
from theory import NoiseScaleMonitor, TheoryError

LOCAL, STEPS = 8, 4
CONFIGS = ("fold", "bucket_view", "separate", "user_hook", "unused")


class Net(nn.Module):
    """The tests' MLP; ``unused`` adds a layer that the forward never calls."""

    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.spare = nn.Linear(3, 3) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class CountingHook:
    """A user's communication hook: DDP's averaging, recording the indices of the buckets it
    is given, one list per synchronized backward."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.backwards: list[list[int]] = []

    def hook(self, state, bucket):
        self.seen.append(bucket.index())
        if bucket.is_last():
            self.backwards.append(self.seen)
            self.seen = []
        return default_hooks.allreduce_hook(state, bucket)


def run(config: str, rank: int, world: int) -> dict:
    torch.manual_seed(0)
    net = Net(unused=config == "unused").double()
    # small buckets: several buckets per backward, the norms summed across them
    ddp = DistributedDataParallel(net, bucket_cap_mb=0.0005,
                                  find_unused_parameters=config == "unused",
                                  gradient_as_bucket_view=config == "bucket_view")
    user = CountingHook()
    kwargs = {"comm_hook": user.hook} if config == "user_hook" else {}
    fold_max = theory.monitor.ddp.FOLD_MAX_NUMEL
    if config == "separate":
        theory.monitor.ddp.FOLD_MAX_NUMEL = 0
    monitor = NoiseScaleMonitor(ddp, window=STEPS, **kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)          # the same global batches on every rank
    saved = []
    try:
        for step in range(STEPS):
            x = torch.randn(world * LOCAL, 6, generator=gen, dtype=torch.float64)
            y = torch.randint(3, (world * LOCAL,), generator=gen)
            state = {k: v.clone() for k, v in net.state_dict().items()}
            mine = slice(rank * LOCAL, (rank + 1) * LOCAL)
            xs, ys = x[mine], y[mine]
            opt.zero_grad()
            if step == 2:                            # two micro-batches of LOCAL / 2
                half = LOCAL // 2
                with ddp.no_sync():
                    (F.cross_entropy(ddp(xs[:half]), ys[:half]) / 2).backward()
                (F.cross_entropy(ddp(xs[half:]), ys[half:]) / 2).backward()
                reading = monitor.step(loss_scale=0.5)
            else:
                F.cross_entropy(ddp(xs), ys).backward()
                reading = monitor.step()
            opt.step()
            saved.append({"state": state, "x": x, "y": y, "reading": reading})
    finally:
        theory.monitor.ddp.FOLD_MAX_NUMEL = fold_max
    hook = monitor._ddp_hook
    return {"steps": saved, "folded": hook._flat is not None, "separate": hook._pair is not None,
            "buckets": len(hook._slots), "user_buckets": user.backwards}


def two_synced(rank: int, world: int) -> str:
    """The error of a step with two synchronized backward passes."""
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Net().double())
    monitor = NoiseScaleMonitor(ddp)
    x = torch.randn(LOCAL, 6, dtype=torch.float64)
    y = torch.randint(3, (LOCAL,))
    for _ in range(2):
        F.cross_entropy(ddp(x), y).backward()
    try:
        monitor.step()
    except TheoryError as exc:
        return str(exc)
    return "no error"


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {config: run(config, rank, world) for config in CONFIGS}
    results["two_synced"] = two_synced(rank, world)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
