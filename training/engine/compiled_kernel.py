"""Compiled kernels of the vectorized trainer, built from ``training/engine/csrc`` on first use.

``fused_sequential()`` returns the extension module of ``csrc/fused_sequential.cpp`` (see
:mod:`training.engine.programs.fused`), compiled with ``torch.utils.cpp_extension.load`` for the host CPU
(``-march=native``, OpenMP; ``-fno-math-errno``, without which the compiler cannot vectorize
Adam's square root: 3x slower): about 30-80 s of CPU once per machine and kernel version, then
an import. The build lives in torch's extension cache, a user cache folder
(``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``), never in the source tree,
under a name whose digest covers everything the built library depends on (:func:`build_name`):
the sources' content, the CPU, the compiler, the flags, and the Python and torch installations,
but no checkout's path. Two checkouts of one version, sharing an environment and the cache
(worktrees, a pip-installed copy beside a development checkout), share one build; two versions
never share a folder.

A folder whose build is complete (:mod:`training.engine.kernel_cache`: a record written
atomically after the build) is imported without a lock and without running torch's builder. A
process that finds no complete build takes the folder's build lock (an ``fcntl.flock``; a
process that waits says so once on stderr, "waiting for the kernel build by pid N in FOLDER"),
looks again, and if the folder is still incomplete empties it (what a killed or failed build
left) and builds from a copy of the sources inside it. Its compiler ends with it: SIGTERM or
Ctrl-C stop ninja and its compilers, and on Linux ninja receives SIGTERM when the process
dies, SIGKILL included.

The build needs a C++ compiler (``$CXX``, default ``c++``), ninja (the ``ninja`` package, a
dependency of sparsescale) and Python's headers. When any of them is missing or the build fails,
the trainer runs its eager ``batched`` program instead, which computes the same quantities
(tested to 1e-12 in float64) more slowly: the process warns once, naming why
(:class:`KernelWarning`), and :attr:`training.TrialsResult.program` (and a study's ``kernel``
column) records the program that ran. ``SPARSESCALE_KERNELS=0``, or :func:`disabled`, skips the
kernel without a warning.

``SPARSESCALE_REQUIRE_KERNEL=1`` (CI sets it) turns that fallback into an error: a kernel that
cannot be built raises :class:`KernelError` naming why, instead of warning, so that a machine
meant to run the kernel never passes its tests on the eager program alone. Unset (the default),
a machine without a compiler gets the fallback and its one warning.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from training.engine.kernel_cache import (
    build_lock, compiler_dies_with_this_thread, copy_sources, discard, load_complete, mark_complete,
)
from training.errors import SparsescaleError, SparsescaleWarning

SOURCES = Path(__file__).resolve().parent / "csrc"
DISABLE_ENV = "SPARSESCALE_KERNELS"
REQUIRE_ENV = "SPARSESCALE_REQUIRE_KERNEL"
# How builders and loaders of one folder share it, in its name: a version of sparsescale that
# waited on torch's lock file alone, or loaded through torch's builder under the flock, builds
# elsewhere, never beside one that loads a complete folder without a lock.
LOCKING = "flock+complete"
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno")
LDFLAGS = ("-fopenmp",)
_off = 0  # depth of disabled() contexts


class KernelWarning(SparsescaleWarning, RuntimeWarning):
    """A compiled kernel cannot be used; the eager program runs instead (same results)."""


class KernelError(SparsescaleError, OSError):
    """A compiled kernel cannot be built while ``SPARSESCALE_REQUIRE_KERNEL=1`` forbids the eager
    fallback: this machine lacks a tool (compiler, ninja, Python's headers) or the build failed.
    Names why and the build folder."""


def required() -> bool:
    """True when ``SPARSESCALE_REQUIRE_KERNEL`` is set (to anything but 0 or empty): a kernel
    that cannot be built is an error, not a warning and the eager program."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def enabled() -> bool:
    """False when ``SPARSESCALE_KERNELS=0`` or a :func:`disabled` context asks for the eager
    path only."""
    return _off == 0 and os.environ.get(DISABLE_ENV, "1") != "0"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within this context the trainer does not use (or build) compiled kernels."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


def _cpu_description() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    keys = ("model name", "flags")
    return "\n".join(next((ln for ln in lines if ln.startswith(k)), "") for k in keys)


def _installation() -> str:
    """What the built library depends on besides its sources: the CPU, the compiler (``$CXX``
    and the file it resolves to), the flags, Python's version and headers, torch's version and
    its installation (real paths: a symlinked environment is one installation), LOCKING."""
    import torch.utils.cpp_extension as cpp

    compiler = os.environ.get("CXX", "c++")
    found = shutil.which(compiler)
    parts = [_cpu_description(), compiler, os.path.realpath(found) if found else "-",
             " ".join(CFLAGS), " ".join(LDFLAGS), sys.version,
             os.path.realpath(sysconfig.get_paths()["include"]), torch.__version__,
             *map(os.path.realpath, cpp.include_paths()), LOCKING]
    return "\n".join(parts)


def build_name(name: str, sources: Path = SOURCES) -> str:
    """Extension name of kernel ``name``: a digest of every file in its source folder
    ``sources`` (names and contents: torch rebuilds on a change of the listed source only, not
    of its headers) and of :func:`_installation`, never of a path of the checkout."""
    digest = hashlib.sha256(_installation().encode())
    for path in sorted(sources.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return f"sparsescale_{name}_{digest.hexdigest()[:12]}"


def _ninja_dir() -> str | None:
    """Folder of a ninja executable, if ninja is not on PATH: the ``ninja`` package's (a venv's
    ``bin`` is not on PATH when its python is run directly)."""
    if shutil.which("ninja"):
        return None
    try:
        import ninja
    except ImportError:
        return None
    return str(ninja.BIN_DIR)


def missing_tool() -> str | None:
    """Why the build cannot start (no compiler, no ninja), or None."""
    compiler = os.environ.get("CXX", "c++")
    if not shutil.which(compiler):
        return (f"no C++ compiler ({compiler!r} not found; install one, e.g. g++, or set CXX)")
    if not shutil.which("ninja") and _ninja_dir() is None:
        return "ninja not found (pip install ninja)"
    return None


def failure_reason(exc: BaseException) -> str:
    """One line saying why a build failed: the compiler's first error line if the message holds
    one (e.g. a missing Python.h), else the message's first line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    line = next((ln for ln in lines if "error:" in ln.lower()), lines[0] if lines else "")
    return f"{type(exc).__name__}: {line[:300]}"


@contextlib.contextmanager
def _on_path(folder: str | None) -> Iterator[None]:
    """``folder`` first on PATH within the context (None: PATH unchanged)."""
    old = os.environ.get("PATH")
    if folder:
        os.environ["PATH"] = os.pathsep.join([folder, *([old] if old else [])])
    try:
        yield
    finally:
        if folder and old is None:
            os.environ.pop("PATH", None)
        elif folder:
            os.environ["PATH"] = old


def build_directory(name: str, sources: Path = SOURCES) -> Path:
    """Where kernel ``name`` is built: ``$TORCH_EXTENSIONS_DIR``, else torch's default extension
    root (``~/.cache/torch_extensions``, a user cache folder), ``/<build_name(name)>``."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / build_name(name, sources)


def _compile(name: str, sources: Path, folder: Path, user: str) -> ModuleType:
    """Kernel ``name`` built in ``folder`` under its build lock (module docstring), or loaded
    if the process it waited for completed it."""
    from torch.utils.cpp_extension import load

    with build_lock(folder):
        module = load_complete(folder)
        if module is not None:
            return module
        discard(folder)
        # a build takes 30-80 s in the middle of a user's run: say why it waits
        print(f"sparsescale: compiling the {user} kernel {name!r} (once per machine and kernel "
              f"version, about a minute) in {folder}", file=sys.stderr, flush=True)
        copy = copy_sources(sources, folder)
        with _on_path(_ninja_dir()), compiler_dies_with_this_thread():
            # OpenMP: at::parallel_for spreads trials over torch's intra-op threads
            module = load(name=folder.name, sources=[str(copy / f"{name}.cpp")],
                          extra_include_paths=[str(copy)], extra_cflags=list(CFLAGS),
                          extra_ldflags=list(LDFLAGS), build_directory=str(folder),
                          verbose=False)
        mark_complete(folder, module)
        return module


# what the trainer does without its kernel (the warning's second half)
TRAINER_FALLBACK = ("training uses the eager 'batched' program (and, for Conv2d models, torch's "
                    "update) instead: same results, slower")


@functools.cache
def _build(name: str, sources: Path = SOURCES, user: str = "training",
           fallback: str = TRAINER_FALLBACK) -> ModuleType | None:
    """Build (or load from the cache) kernel ``name`` from ``sources/<name>.cpp``; None, with one
    :class:`KernelWarning` saying why and what runs instead (``fallback``), where it cannot be.
    ``user`` names the kernel's user in the messages."""
    folder = build_directory(name, sources)
    reason = missing_tool()
    if reason is None:
        try:
            return load_complete(folder) or _compile(name, sources, folder, user)
        except Exception as exc:  # noqa: BLE001 - any build failure falls back to the eager path
            reason = failure_reason(exc)
    if required():
        raise KernelError(f"the compiled {user} kernel {name!r} cannot be built ({reason}; "
                          f"build folder {folder}) and {REQUIRE_ENV}=1 forbids "
                          f"the eager fallback: install what is missing, or unset {REQUIRE_ENV} "
                          f"to run the eager program (same results, slower)")
    warnings.warn(f"sparsescale: the compiled {user} kernel {name!r} is unavailable ({reason}); "
                  f"{fallback}. Set {DISABLE_ENV}=0 to skip the kernel without this warning.",
                  KernelWarning, stacklevel=2)
    return None


def load_kernel(name: str, sources: Path, user: str, fallback: str) -> ModuleType | None:
    """Kernel ``name`` built from ``sources/<name>.cpp`` by the same machinery as the trainer's
    (cache folder, build lock, flags, :func:`disabled` and the environment variables), or None
    where it is disabled or cannot be built (then one :class:`KernelWarning` naming why and
    ``fallback``, what runs instead; under ``SPARSESCALE_REQUIRE_KERNEL=1`` a
    :class:`KernelError`)."""
    return _build(name, sources, user, fallback) if enabled() else None


def fused_sequential() -> ModuleType | None:
    """The fused Sequential training-step kernel, or None (disabled, or it cannot be built;
    under ``SPARSESCALE_REQUIRE_KERNEL=1`` a kernel that cannot be built raises
    :class:`KernelError` instead)."""
    return _build("fused_sequential") if enabled() else None
