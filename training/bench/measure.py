"""What the trainer benchmark measures besides steps: clocks, the time of a step loop, the
training FLOPs of a model, the machine's matmul peak and the process's peak resident memory."""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

import torch
from torch import nn

from training.device import synchronize

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def training_flops(model: nn.Module, input_shape: Sequence[int], batch_size: int) -> float:
    """FLOPs of one training step on one trial: 6 per multiply-accumulate and example (forward,
    weight and input gradients), 4 in the first layer (its input gradient is not needed).
    Counted: Linear and Conv layers (once per position they are applied at, e.g. every token),
    recurrent layers (the gates' input and hidden products at every step) and multi-head
    attention (the projections, scores and weighted sums); element-wise work is not counted."""
    macs: list[float] = []

    def hook(module, inputs, output):
        out = output[0] if isinstance(output, tuple) else output
        if isinstance(module, nn.Linear):
            macs.append(module.in_features * out.numel())
        elif isinstance(module, nn.modules.conv._ConvNd):
            k = math.prod(module.kernel_size) * module.in_channels // module.groups
            macs.append(k * out[0].numel())
        elif isinstance(module, nn.RNNBase):
            gates = {"LSTM": 4, "GRU": 3}.get(module.mode, 1)
            steps = out.numel() // (module.hidden_size * (2 if module.bidirectional else 1))
            # layer 0 reads the input, later layers the previous one's hidden state
            inner = (module.input_size + module.hidden_size
                     + 2 * module.hidden_size * (module.num_layers - 1))
            macs.append(gates * module.hidden_size * inner * steps)
        elif isinstance(module, nn.MultiheadAttention):
            e = module.embed_dim
            tokens = out.numel() // e
            length = out.shape[-2] if out.dim() > 2 else out.shape[0]
            macs.append(4 * e * e * tokens + 2 * length * e * tokens)

    counted = (nn.Linear, nn.modules.conv._ConvNd, nn.RNNBase, nn.MultiheadAttention)
    # a layer inside multi-head attention (its output projection) is counted with it
    inside = {id(m) for a in model.modules() if isinstance(a, nn.MultiheadAttention)
              for m in a.modules() if m is not a}
    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, counted) and id(m) not in inside]
    p = next(model.parameters(), None)
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape, dtype=p.dtype if p is not None else None))
    finally:
        for h in handles:
            h.remove()
    return batch_size * (6 * sum(macs) - (2 * macs[0] if macs else 0))


def matmul_peak(size: int = 1024, seconds: float = 0.5, clock: str = "wall") -> float:
    """Measured fp32 GEMM throughput (GFLOP/s) for size^3 products."""
    tick = CLOCKS[clock]
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    n, start = 0, tick()
    while tick() - start < seconds:
        a @ b
        n += 1
    return 2 * size ** 3 * n / (tick() - start) / 1e9


class StepTimer:
    """Accumulated ``clock`` seconds of the step loops run inside ``with timer:`` blocks, each
    timed from just before its first update to just after its last with ``device``'s queue
    drained at both ends (:func:`training.device.synchronize`). The benchmark times both
    trainers' step loops with it, so neither rate includes what a run pays once (model copies,
    the trial stacks, evaluations) and no rate is a difference of two long runs."""

    def __init__(self, clock: Callable[[], float], device: str = "cpu"):
        self.clock, self.device = clock, device
        self.seconds, self.loops = 0.0, 0
        self._start: float | None = None

    def __enter__(self) -> Self:
        synchronize(self.device)
        self._start = self.clock()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.seconds += self.clock() - self._start
        self.loops += 1
        self._start = None


def reset_peak_rss() -> bool:
    """Return freed heap to the OS and reset the process's peak resident set (``VmHWM``) to the
    current one (Linux: ``/proc/self/clear_refs``); False where that is not possible."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except (OSError, AttributeError):
        return False


def peak_rss_mib() -> float:
    """Peak resident set of this process in MiB (``VmHWM``; NaN where unknown)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan
