"""The noise monitor's kernel (compiled C++, ``theory/monitor/csrc/example_norms.cpp``): every
layer's per-example squared-norm sum and the gradients' squared norm in one call.

:func:`load` builds it on first use with the trainer's machinery
(:func:`training.extensions.load_kernel`: torch's extension cache, ``-O3
-march=native``, about 20 s once per machine and source version), or returns None where it is
switched off (``SPARSESCALE_KERNELS=0``) or cannot be built (one warning naming why); the
monitor then takes the same sums with torch operators (:mod:`theory.monitor.layer_norms`' terms), and
always does for tensors that are not on the CPU. :func:`sums` runs it on jobs made by
:func:`theory.monitor.layer_norms.job_function`.

Why a kernel: a measured step of a small model is made of operator calls that cost
10-25 us each in Python and dispatch (docs/benchmarks/log.md, "noise-monitor"); the torch path
issues two to four per layer, this one call issues none for Linear layers on one position,
Embedding and LayerNorm / RMSNorm (plain loops, double accumulators) and batched products over
cache-sized chunks of examples for sequence and convolution layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch

from theory.monitor.layer_norms import GRAM_ADVANTAGE
from training import extensions

SOURCES = Path(__file__).resolve().parent / "csrc"
NAME = "example_norms"
FALLBACK = ("the noise monitor computes its per-example norms with torch operators instead: "
            "same results, slower on small steps")


def load() -> ModuleType | None:
    """The kernel's module, or None (switched off, or it cannot be built)."""
    return extensions.load_kernel(NAME, SOURCES, "noise-monitor", FALLBACK)


def sums(module: ModuleType, passes: int, jobs: Sequence[tuple], grads: Sequence[torch.Tensor]
         ) -> list[float]:
    """[sum over pass j's examples of their squared gradient norms, for each of ``passes``
    passes..., sum of the squared norms of ``grads``], in double precision. ``jobs``: one
    ``(pass, *job)`` per layer and pass, ``job`` from :func:`theory.monitor.layer_norms.job_function`;
    CPU tensors only, dense (the kernel refuses others)."""
    return module.sums(passes, jobs, grads, GRAM_ADVANTAGE)
