"""Compiled kernels of the vectorized trainer, built from ``training/csrc`` on first use.

``fused_sequential()`` returns the extension module of ``csrc/fused_sequential.cpp`` (see
:mod:`training.stacked_fused`), compiled with ``torch.utils.cpp_extension.load`` into torch's
extension cache (``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``): about 30 s
once per machine and source version, then a cached import; concurrent worker processes wait for
one build (torch's file lock). It needs a C++ compiler and ninja. When the build fails, or
``SPARSESCALE_KERNELS=0`` is set, it returns None and the trainer uses its eager path, which
computes the same quantities (tested to 1e-12 in float64) more slowly.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from types import ModuleType

SOURCES = Path(__file__).resolve().parent / "csrc"
DISABLE_ENV = "SPARSESCALE_KERNELS"


def enabled() -> bool:
    """False when ``SPARSESCALE_KERNELS=0`` asks for the eager path only."""
    return os.environ.get(DISABLE_ENV, "1") != "0"


@functools.cache
def _build(name: str) -> ModuleType | None:
    try:
        from torch.utils.cpp_extension import load

        # OpenMP: at::parallel_for spreads trials over torch's intra-op threads
        return load(name=f"sparsescale_{name}", sources=[str(SOURCES / f"{name}.cpp")],
                    extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure falls back to the eager path
        warnings.warn(f"sparsescale: compiled kernel {name!r} unavailable, using the eager "
                      f"path ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
                      RuntimeWarning, stacklevel=3)
        return None


def fused_sequential() -> ModuleType | None:
    """The fused Sequential training-step kernel, or None (disabled, or it cannot be built)."""
    return _build("fused_sequential") if enabled() else None
