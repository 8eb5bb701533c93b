"""Where a cell's training step spends its time on the GPU: the plain loop and the vectorized
trainer timed (marginal seconds per step, the queue drained), then ``torch.profiler`` over a
short vectorized run, the host-side operations with the most self time first and the host
waits counted. A tool for the GPU check (tests/gpu/check.sh), not a test:

    python tests/gpu/profile_step.py lee_cnn 64 [--trials 32] [--steps 20]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from training import models
from training.device import synchronize
from training.bench import speed

# host calls that wait for the GPU's queue
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")


def per_step(run, steps: int, device: str) -> float:
    """Marginal seconds per step of ``run(steps)`` (its fixed costs cancel)."""
    times = []
    for s in (steps, 3 * steps):
        synchronize(device)
        start = time.perf_counter()
        run(s)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / (2 * steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("batch_size", type=int)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = args.device
    ds = speed.bench_dataset(args.model, 10_000)
    net = models.build(args.model, ds, seed=0)
    on_gpu = ds.to(device)

    def plain(s: int) -> None:
        speed.plain_loop(net, ds, args.batch_size, s, device=device)

    def vectorized(s: int):
        return speed.vectorized(net, on_gpu, args.batch_size, args.trials, s, device=device)

    program = vectorized(2).program   # first calls and the measured choice
    plain(2)
    loop, vec = per_step(plain, args.steps, device), per_step(vectorized, args.steps, device)
    print(f"{args.model} B = {args.batch_size}, {args.trials} trials, program {program}: plain "
          f"loop {loop * 1e3:.2f} ms a step, vectorized {vec * 1e3:.2f} ms a step of all trials "
          f"= {vec / args.trials * 1e3:.3f} ms a trial-step: ratio {loop * args.trials / vec:.2f}x")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    with profile(activities=activities) as prof:
        vectorized(args.steps)
        synchronize(device)
    events = prof.key_averages()
    waits = {e.key: e.count for e in events if e.key in WAITS}
    print(f"host waits in {args.steps} steps: {waits}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=48))


if __name__ == "__main__":
    main()
