"""One rank of the monitor's DDP test (run by tests/theory/test_monitor_ddp.py under torchrun,
gloo on CPU, float64): trains a few steps of an MLP with the monitor's communication hook and
saves, on rank 0, each step's weights, global batch and reading to the path in argv[1]. One step
accumulates two micro-batches per rank under no_sync."""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from theory import NoiseScaleMonitor

LOCAL, STEPS = 8, 4


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    # small buckets: several buckets per backward, the norms summed across them
    ddp = DistributedDataParallel(net, bucket_cap_mb=0.0005)
    monitor = NoiseScaleMonitor(ddp, window=STEPS)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)          # the same global batches on every rank
    saved = []
    for step in range(STEPS):
        x = torch.randn(world * LOCAL, 6, generator=gen, dtype=torch.float64)
        y = torch.randint(3, (world * LOCAL,), generator=gen)
        state = {k: v.clone() for k, v in net.state_dict().items()}
        mine = slice(rank * LOCAL, (rank + 1) * LOCAL)
        xs, ys = x[mine], y[mine]
        opt.zero_grad()
        if step == 2:                                # two micro-batches of LOCAL / 2
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
    if rank == 0:
        torch.save(saved, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
