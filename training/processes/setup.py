"""Process-wide setup for a process that trains: called once by whoever owns the process (the
``sparsescale`` command, a worker pool's initializer, a benchmark), never by a library function,
because it changes the whole process. How the processes a driver starts end with it is
:mod:`training.processes.lifetime`'s job.
"""

from __future__ import annotations

import ctypes
import sys

import torch

# glibc mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_allocator_tuned = False


def setup_training_process() -> bool:
    """The process-wide settings of a training process: :func:`tune_allocator` and
    :func:`flush_subnormals` (idempotent; True if both applied)."""
    return tune_allocator() & flush_subnormals()


def tune_allocator() -> bool:
    """Make glibc's malloc keep freed memory for reuse (idempotent; True if applied).

    A stacked training step (:func:`training.train_trials`) allocates and frees activation
    tensors of megabytes; by default glibc returns such memory to the OS (heap trimming, mmap)
    and faults it back on the next step, which took 25 % of the CPU time at B = 512 (3000 page
    faults per step). Raising the trim threshold to 1 GiB and the mmap threshold to its 32 MiB
    maximum (``mallopt``) removed the faults: MLP, 16 trials, B = 512: 615 -> 907
    trial-steps/s. It changes speed only, never a result. No effect off glibc."""
    global _allocator_tuned
    if not _allocator_tuned and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6")
            _allocator_tuned = bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
                                    and libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20))
        except (OSError, AttributeError):
            _allocator_tuned = False
    return _allocator_tuned


def flush_subnormals() -> bool:
    """Compute with subnormal floats flushed to zero on this thread (x86 flush-to-zero and
    denormals-are-zero, ``torch.set_flush_denormal``); True if the CPU supports it.

    Why: a trial stuck at chance level (dead ReLUs, a saturated softmax) gets gradients near
    zero, and its momentum buffers decay into the subnormal range (below 1.2e-38 in float32)
    and stay there; every operation on a subnormal takes the CPU's slow path. In the
    quickstart's dense B = 8 group (16 trials, 2,664 steps) 36-55 % of the momentum buffers
    ended subnormal, and the compiled kernel's training steps took 2.5 s of CPU time against
    0.66 s flushed. TensorFlow and XLA run every CPU operation this way (their thread pools set
    the same flags), as GPUs do by default.

    What it changes: a value below 1.2e-38 reads and is written as 0, far below the rounding
    of any float32 sum it enters. The whole quickstart study came out bit for bit the same with
    and without it (20 groups' steps, 21,036 curve rows, 480 probe values, the branching table)
    in 57.8 s against 63.1 s, and so did ``lee_sparsity_mnist1d``'s dense groups at B = 8 and
    64 (B = 8: 16.4 -> 14.1 s of CPU). The flags belong to a thread: the compiled kernel copies
    its caller's into the threads it spreads trials over, so results do not depend on the
    thread count."""
    return bool(torch.set_flush_denormal(True))

