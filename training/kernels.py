"""Compiled kernels of the vectorized trainer, built from ``training/csrc`` on first use.

``fused_sequential()`` returns the extension module of ``csrc/fused_sequential.cpp`` (see
:mod:`training.stacked_fused`), compiled with ``torch.utils.cpp_extension.load`` into torch's
extension cache (``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``): about 30 s
once per machine and source version, then a cached import; concurrent worker processes wait for
one build (torch's file lock). It is compiled for the host CPU (``-march=native``), so its name
carries a digest of the sources and of the CPU model and flags: a cache shared by different
machines holds one build per CPU. It needs a C++ compiler and ninja. When the build fails, or
``SPARSESCALE_KERNELS=0`` is set, it returns None and the trainer uses its eager path, which
computes the same quantities (tested to 1e-12 in float64) more slowly.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import warnings
from pathlib import Path
from types import ModuleType

SOURCES = Path(__file__).resolve().parent / "csrc"
DISABLE_ENV = "SPARSESCALE_KERNELS"


def enabled() -> bool:
    """False when ``SPARSESCALE_KERNELS=0`` asks for the eager path only."""
    return os.environ.get(DISABLE_ENV, "1") != "0"


def _cpu_description() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    keys = ("model name", "flags")
    return "\n".join(next((ln for ln in lines if ln.startswith(k)), "") for k in keys)


def build_name(name: str) -> str:
    """Extension name of kernel ``name``: a digest of every file in ``csrc`` (torch rebuilds
    on a change of the listed source only, not of its headers) and of the host CPU."""
    digest = hashlib.sha256(_cpu_description().encode())
    for path in sorted(SOURCES.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return f"sparsescale_{name}_{digest.hexdigest()[:12]}"


@functools.cache
def _build(name: str) -> ModuleType | None:
    try:
        from torch.utils.cpp_extension import load

        # OpenMP: at::parallel_for spreads trials over torch's intra-op threads
        return load(name=build_name(name), sources=[str(SOURCES / f"{name}.cpp")],
                    extra_include_paths=[str(SOURCES)],
                    extra_cflags=["-O3", "-march=native", "-fopenmp"],
                    extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure falls back to the eager path
        first = str(exc).splitlines()[0] if str(exc) else ""
        warnings.warn(f"sparsescale: compiled kernel {name!r} unavailable, using the eager "
                      f"path ({type(exc).__name__}: {first})", RuntimeWarning, stacklevel=3)
        return None


def fused_sequential() -> ModuleType | None:
    """The fused Sequential training-step kernel, or None (disabled, or it cannot be built)."""
    return _build("fused_sequential") if enabled() else None
