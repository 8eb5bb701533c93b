"""What the trainer benchmark measures on a GPU: the device's own matmul peak at a precision,
and its peak memory.

A GPU's peak depends on the arithmetic: on an H100, dense fp32 products run on the CUDA cores
(about 50-60 TFLOP/s), TF32 and bf16 on the tensor cores (several hundred). The achieved
fraction of a training step is only meaningful against the peak of the precision it ran in, so
:func:`matmul_peak` measures the product of two ``size`` x ``size`` matrices in that precision,
as :func:`training.bench.measure.matmul_peak` does for the CPU, timed with CUDA events after a
warm-up (the clock must wait for the queued work: a kernel launch returns at once).
"""

from __future__ import annotations

import math

import torch

from training.device import DeviceError, autocast, precision as arithmetic, resolve_device

# 8192^3: 1.1 TFLOP a product, long enough (ms) that launch overhead does not count, and the
# size the device notes of this workplace report (bf16 788-798 TFLOP/s on H100 / H200)
PEAK_SIZE = 8192


def matmul_peak(device: str = "cuda", precision: str = "fp32", size: int = PEAK_SIZE,
                seconds: float = 0.5) -> float:
    """Measured throughput (GFLOP/s, like the CPU's) of ``size``^3 products on ``device`` in
    ``precision`` (fp32 with TF32 off, tf32, or bf16 operands with float32 accumulation, as
    autocast gives them), from CUDA events over at least ``seconds``."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        raise DeviceError("training.bench.cuda.matmul_peak measures a CUDA device; use "
                         "training.bench.measure.matmul_peak on the CPU")
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(size, size, device=dev, generator=g)
    b = torch.randn(size, size, device=dev, generator=g)
    with arithmetic(precision, dev), autocast(precision, dev):
        if precision == "bf16":   # the operands autocast would make, made once
            a, b = a.bfloat16(), b.bfloat16()
        for _ in range(3):
            a @ b
        torch.cuda.synchronize(dev)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n, elapsed = 0, 0.0
        while elapsed < seconds * 1e3:
            start.record()
            for _ in range(10):
                a @ b
            stop.record()
            stop.synchronize()
            elapsed += start.elapsed_time(stop)
            n += 10
    return 2 * size ** 3 * n / (elapsed / 1e3) / 1e9


def reset_peak_memory(device: str) -> None:
    """Reset ``device``'s peak allocated memory (``torch.cuda.reset_peak_memory_stats``);
    nothing on the CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)


def peak_memory_mib(device: str) -> float:
    """Peak memory tensors held on ``device`` since the last reset
    (``torch.cuda.max_memory_allocated``), in MiB; NaN on the CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return math.nan
    torch.cuda.synchronize(dev)
    return torch.cuda.max_memory_allocated(dev) / 2 ** 20
