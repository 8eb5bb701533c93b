"""Trials spread over torch's threads: each of ``torch.get_num_threads()`` Python threads runs
whole trials with one intra-op thread of its own, instead of every operation of one trial
being split over all the threads.

Why: a trial-step of a small model is a chain of small operations (``lee_cnn`` at B = 8: two
convolutions of 0.2-0.7 ms, pooling, a 1024 x 10 product), which two OpenMP threads split
with a synchronization at each one's end: on the 2-core machine a two-thread step of the plain
loop took about as long as a one-thread step. Two trials side by side, one a thread, use both
cores all the time. The compiled kernel spreads its trials the same way
(:mod:`training.engine.programs.fused`); this module gives the ``per_trial`` program
(:mod:`training.engine.programs.per_trial`) the same, through threads that release the GIL inside torch's
operations and inside the compiled kernel's update (``update_trial``, which held the GIL until
2026-11-27: a memory-bound update of ``simple_cnn``'s 3.3 M weights, a third of its trial-step at
B = 8, then stalled the other worker's Python).

What it keeps: each trial runs on one intra-op thread, whichever worker takes it, so a trial's
result does not depend on the thread count or on which trials share the pool (it equals the
one-thread run, bit for bit). The workers copy their caller's subnormal flushing
(:func:`training.processes.setup.flush_subnormals`: the flags belong to a thread). Models that draw
random numbers do not spread (their draws go through the process-wide generator, one trial at a
time: :mod:`training.randomness`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
_POOLS: dict[int, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()
_LOCAL = threading.local()


def flushing() -> bool:
    """Whether this thread flushes subnormal floats to zero (a float32 subnormal reads as 0)."""
    return torch.tensor([1e-39], dtype=torch.float64).float().mul(1.0).item() == 0.0


def _one_thread(barrier: threading.Barrier) -> None:
    """Pin this worker to one intra-op thread. ``torch.set_num_threads`` also sets the value new
    threads start with, so every worker sets it while the caller waits at ``barrier``, and the
    caller restores it afterwards (:func:`pool`)."""
    torch.get_num_threads()   # torch's per-thread lazy initialization first, then our setting
    torch.set_num_threads(1)
    _LOCAL.worker = True
    barrier.wait()


def pool(workers: int) -> ThreadPoolExecutor:
    """The process's pool of ``workers`` one-thread workers (made on first use)."""
    with _LOCK:
        found = _POOLS.get(workers)
        if found is None:
            threads = torch.get_num_threads()
            found = ThreadPoolExecutor(workers, thread_name_prefix="sparsescale-trial")
            barrier = threading.Barrier(workers + 1)
            started = [found.submit(_one_thread, barrier) for _ in range(workers)]
            barrier.wait()   # every worker is its own thread: none returned before all arrived
            for f in started:
                f.result()
            torch.set_num_threads(threads)
            _POOLS[workers] = found
        return found


def in_worker() -> bool:
    """Whether the calling thread is one of the pools' workers."""
    return getattr(_LOCAL, "worker", False)


def spread(fn: Callable[[int], T], items: Iterable[int], workers: int) -> list[T]:
    """``[fn(i) for i in items]``, computed by ``workers`` one-thread workers when
    ``workers`` > 1 (in order; the first exception is raised), with this thread's subnormal
    flushing."""
    items = list(items)
    if workers <= 1 or len(items) <= 1 or in_worker():
        return [fn(i) for i in items]
    flush = flushing()

    def run(i: int) -> T:
        torch.set_flush_denormal(flush)
        return fn(i)

    return list(pool(workers).map(run, items))
