"""The DDP communication hook of :class:`theory.NoiseScaleMonitor` (``method="ddp"``).

McCandlish, Kaplan, Amodei et al. 2018 ("An Empirical Model of Large-Batch Training", appendix
A.1) estimate |G|^2 and tr(Sigma) from two batch sizes; under data parallelism each rank's local
gradient (b examples) is the small batch and the all-reduced mean (W b examples) the big one, so
the estimate needs, beyond the averaged gradient in ``.grad``, the sum over ranks of the local
squared norms |g_r|^2 and of each rank's batch-size term x_r (theory.monitor's docstring).

Each bucket's local norm is taken from the bucket's flat buffer before it is averaged (one
``torch.linalg.vector_norm`` into a preallocated slot: no host synchronization, no allocation).
The two per-rank scalars then ride along with the gradients: when DDP's own averaging is the
hook and the last bucket is small (at most :data:`FOLD_MAX_NUMEL` elements), they are appended
to a persistent copy of that bucket, which is averaged in the same all-reduce and handed back
to DDP without the two extra elements; otherwise (a hook of the user's, which the monitor wraps
and must not alter, or a large last bucket, whose copy would cost more than a collective) one
all-reduce of a 2-element float64 tensor is started beside the last bucket's. Either way the
sums are read at ``step()``, after DDP has waited for every bucket.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from theory.errors import TheoryError

# The largest last bucket (elements) into whose all-reduce the per-rank scalars are folded: its
# copy costs about as much as a separate 2-element all-reduce near 10^6 float32 elements on a
# CPU core (docs/benchmarks/log.md, #bench-noise-monitor-ddp).
FOLD_MAX_NUMEL = 1 << 20


class LocalNormHook:
    """The communication hook and its per-step state. ``batch_term()`` gives the rank's x =
    sum_j 1/(k^2 b_j) over the step's k micro-batches (nan if a batch size is unknown), asked at
    the last bucket. Register ``ddp.register_comm_hook(None, this.hook)``; ``active`` False
    passes every bucket straight to the wrapped hook."""

    def __init__(self, ddp: DistributedDataParallel, hook: Callable | None, state: Any,
                 batch_term: Callable[[], float]) -> None:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self._dist = dist
        self.group = ddp.process_group
        self.world = dist.get_world_size(self.group)
        if self.world < 2:
            raise TheoryError("method='ddp' needs at least 2 processes (the world size is 1): "
                              "build the monitor on the wrapped model (ddp.module) instead")
        # DDP's default averaging, over DDP's own process group, when the user gives no hook
        self.default = hook is None
        self.inner = (default_hooks.allreduce_hook, self.group) if hook is None else (hook, state)
        self.batch_term = batch_term
        self.active = True
        self._norms: torch.Tensor | None = None     # |local bucket i| at index i
        self._slots: list[torch.Tensor] = []        # its 0-d views, written with out=
        self._used: torch.Tensor | None = None      # its first (bucket count) entries
        self._flat: torch.Tensor | None = None      # last bucket + 2 scalars, kept across steps
        self._head: torch.Tensor | None = None
        self._tail: torch.Tensor | None = None
        self._tail_sq: torch.Tensor | None = None
        self._tail_x: torch.Tensor | None = None
        self._pair: torch.Tensor | None = None      # the separate all-reduce's float64 pair
        self._pair_sq: torch.Tensor | None = None
        self._pair_x: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        """Forget the step's reduction (after ``step()`` has read it)."""
        self.sums: torch.Tensor | None = None   # (sum_r |g_r|^2, sum_r x_r) once reduced
        self.work: Any = None
        self.synced = 0                         # synchronized backward passes this step

    def hook(self, state, bucket):   # DDP checks a hook's annotations: none given
        hook, inner_state = self.inner
        if not self.active:
            return hook(inner_state, bucket)
        buf = bucket.buffer()
        index = bucket.index()
        norms = self._norms
        if norms is None or index >= len(self._slots) or norms.device != buf.device \
                or torch.promote_types(norms.dtype, buf.dtype) != norms.dtype:
            norms = self._grow(index, buf)
        # the local gradient, before the buffer is averaged in place
        if norms.dtype == buf.dtype:
            torch.linalg.vector_norm(buf, out=self._slots[index])
        else:
            torch.linalg.vector_norm(buf, dtype=norms.dtype, out=self._slots[index])
        if not bucket.is_last():
            return hook(inner_state, bucket)
        # buckets are reduced in order: every local norm of this backward is in
        if self.work is not None:       # a second synchronized backward: its buffers are reused
            self.work.wait()
        self.synced += 1
        count = index + 1
        if self._used is None or self._used.numel() != count:
            self._used = norms[:count] if count < norms.numel() else norms
        x = self.batch_term()
        if self.default and buf.dtype == norms.dtype and buf.numel() <= FOLD_MAX_NUMEL:
            return self._folded(buf, x)
        pair = self._pair
        if pair is None or pair.device != buf.device:
            pair = self._pair = torch.zeros(2, dtype=torch.float64, device=buf.device)
            self._pair_sq, self._pair_x = pair.unbind()
        torch.linalg.vector_norm(self._used, dtype=torch.float64, out=self._pair_sq)
        self._pair_sq.square_()
        self._pair_x.fill_(x)
        self.sums = pair
        self.work = self._dist.all_reduce(pair, group=self.group, async_op=True)
        return hook(inner_state, bucket)

    def _folded(self, buf: torch.Tensor, x: float) -> torch.futures.Future:
        """DDP's averaging of the last bucket with the two scalars appended: the copy divided
        by the world size (as DDP's own hook divides the buffer), the scalars as they are (so
        the all-reduce sums them over ranks); DDP gets the bucket's part back, a view at offset
        0 of the persistent copy, from which it writes the parameters' ``.grad``."""
        n = buf.numel()
        flat = self._flat
        if flat is None or flat.numel() != n + 2 or flat.dtype != buf.dtype \
                or flat.device != buf.device:
            flat = self._flat = torch.empty(n + 2, dtype=buf.dtype, device=buf.device)
            self._head, self._tail = flat[:n], flat[n:]
            self._tail_sq, self._tail_x = self._tail[0], self._tail[1]
        torch.div(buf, self.world, out=self._head)
        torch.dot(self._used, self._used, out=self._tail_sq)
        self._tail_x.fill_(x)
        self.sums = self._tail
        future = self._dist.all_reduce(flat, group=self.group, async_op=True).get_future()
        self.work = future
        return future.then(self._head_of)

    def _head_of(self, future: torch.futures.Future) -> torch.Tensor:
        future.value()          # (raises the all-reduce's error, if any)
        return self._head

    def _grow(self, index: int, buf: torch.Tensor) -> torch.Tensor:
        """Room for bucket ``index``'s norm (at the first steps and after DDP rebuilds its
        buckets; a wider dtype than before, from a bucket of mixed precision, widens them
        all)."""
        dtype, old = _norm_dtype(buf), self._norms
        if old is not None and old.device == buf.device:
            dtype = torch.promote_types(dtype, old.dtype)
        norms = torch.zeros(max(index + 1, len(self._slots)), dtype=dtype, device=buf.device)
        if old is not None and old.device == buf.device:
            norms[:old.numel()] = old
        self._norms, self._slots, self._used = norms, list(norms.unbind()), None
        return norms

    def reduced(self) -> tuple[torch.Tensor, int]:
        """The step's (sum_r |g_r|^2, sum_r x_r) as a 2-element tensor once the all-reduce is
        done, and the number of synchronized backward passes it saw (1 when used right)."""
        if self.work is not None:
            self.work.wait()
        return self.sums, self.synced


def _norm_dtype(buf: torch.Tensor) -> torch.dtype:
    """The norms' dtype for a bucket: at least float32 (a half-precision bucket's norm would
    round its square)."""
    return torch.promote_types(buf.dtype, torch.float32)


def batch_term(forwards: list[int | None]) -> float:
    """x = sum_j 1/(k^2 b_j) over k micro-batches of b_j examples (nan if one is unknown)."""
    k = len(forwards)
    if not k or not all(forwards):
        return math.nan
    return sum(1.0 / (k * k * b) for b in forwards)
