"""Compiled kernels of the vectorized trainer, built from ``training/engine/csrc`` on first use.

``fused_sequential()`` returns the extension module of ``csrc/fused_sequential.cpp`` (see
:mod:`training.engine.programs.fused`), compiled with ``torch.utils.cpp_extension.load`` for the host CPU
(``-march=native``, OpenMP; ``-fno-math-errno``, without which the compiler cannot vectorize
Adam's square root: 3x slower): about 30 s once per machine and source version, then a cached
import. The build lives in torch's extension cache, a user cache folder
(``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``), never in the source tree,
under a name that carries a digest of the sources, the CPU model and flags, and the Python and
torch versions: a cache shared by machines or environments holds one build for each.

Concurrent processes wait for one build under :func:`build_lock`, an ``fcntl.flock`` on
``FOLDER/build.lock`` that the operating system drops when its holder dies, however it dies; a
process that waits says so once on stderr ("waiting for the kernel build by pid N in FOLDER").
Torch's own lock file (``FOLDER/lock``, which a process killed while building leaves behind and
on which torch's loader would wait for ever) is removed by whoever holds the flock: every
process that builds here holds it, so a ``lock`` file seen then is a dead builder's.

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
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from training.errors import SparsescaleError, SparsescaleWarning

SOURCES = Path(__file__).resolve().parent / "csrc"
DISABLE_ENV = "SPARSESCALE_KERNELS"
REQUIRE_ENV = "SPARSESCALE_REQUIRE_KERNEL"
LOCK_NAME = "build.lock"
# How builders of one folder exclude each other, in its name: a version of sparsescale that
# waited on torch's lock file alone builds elsewhere, never beside one that clears that file.
LOCKING = "flock"
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


def build_name(name: str, sources: Path = SOURCES) -> str:
    """Extension name of kernel ``name``: a digest of every file in its source folder
    ``sources`` (torch rebuilds on a change of the listed source only, not of its headers), of
    the host CPU, of the Python and torch versions (the extension's ABI) and of LOCKING."""
    digest = hashlib.sha256(f"{_cpu_description()}\n{sys.version}\n{torch.__version__}\n"
                            f"{LOCKING}".encode())
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


def _holder(fd: int) -> str:
    """The pid the lock file's holder wrote into it ("unknown" before it wrote it)."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold the build lock of ``folder`` (see the module docstring) for the body: wait for
    another process's build, saying so once on stderr, then clear torch's ``lock`` file, which
    only a dead builder can have left."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"sparsescale: waiting for the kernel build by pid {_holder(fd)} in {folder}",
                  file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        with contextlib.suppress(FileNotFoundError):
            (folder / "lock").unlink()
        yield
    finally:
        os.close(fd)   # drops the flock


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
            from torch.utils.cpp_extension import load

            with build_lock(folder), _on_path(_ninja_dir()):
                if not (folder / f"{folder.name}.so").exists():   # the folder is the build's
                    # a first build takes 20-60 s in the middle of a user's run: say why it waits
                    print(f"sparsescale: compiling the {user} kernel {name!r} (once per machine "
                          f"and torch version, under a minute) in {folder}", file=sys.stderr,
                          flush=True)
                # OpenMP: at::parallel_for spreads trials over torch's intra-op threads
                return load(name=folder.name, sources=[str(sources / f"{name}.cpp")],
                            extra_include_paths=[str(sources)],
                            extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno"],
                            extra_ldflags=["-fopenmp"], build_directory=str(folder),
                            verbose=False)
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
