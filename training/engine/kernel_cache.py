"""One compiled kernel's build folder in torch's extension cache: who builds it, when it is
complete, how it is loaded, and how its compiler ends with the process that runs it.

A folder is **complete** when it holds :data:`COMPLETE`, a JSON record that names the folder
(its key), the extension's library and the library's size, written atomically
(``os.replace``) after the library was built and imported. A process that finds a complete
folder imports the library and takes no lock (:func:`load_complete`); a record that does not
match (another folder's, a library missing or of another size) makes the folder incomplete.

Builders of one folder exclude each other under :func:`build_lock`, an ``fcntl.flock`` on
``FOLDER/build.lock`` that the operating system drops when its holder dies, however it dies.
The holder of the lock that finds the folder incomplete holds what a killed or failed build
left (objects, torch's ``lock`` file, a half-written library): it empties the folder
(:func:`discard`) and builds from scratch, from a copy of the sources inside the folder
(:func:`copy_sources`), so that the build command names no checkout's path.

Torch's builder runs ``ninja``, which runs the compiler; :func:`compiler_dies_with_this_thread`
makes ninja receive SIGTERM when the building thread ends (the process's death included, on
Linux) and sends it SIGTERM when the build is interrupted (Ctrl-C, the study command's
SIGTERM): on SIGTERM ninja ends its compilers (each of which it runs in a process group of its
own) and exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from training.processes.lifetime import LINUX, death_prelude

LOCK_NAME = "build.lock"
COMPLETE = "complete.json"
SOURCE_DIR = "src"
# seconds ninja gets to end its compilers after SIGTERM, before SIGKILL
NINJA_GRACE = 5.0


def _holder(fd: int) -> str:
    """The pid the lock file's holder wrote into it ("unknown" before it wrote it)."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold the build lock of ``folder`` for the body: wait for another process's build,
    saying so once on stderr ("waiting for the kernel build by pid N in FOLDER")."""
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
        yield
    finally:
        os.close(fd)   # drops the flock


def _import(name: str, library: Path) -> ModuleType:
    """Extension module ``name`` from ``library``, as torch's loader imports it."""
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_complete(folder: Path) -> ModuleType | None:
    """The extension of a complete ``folder`` (module docstring), imported without a lock; None
    when the folder is not complete."""
    try:
        record = json.loads((folder / COMPLETE).read_text())
        library = folder / str(record["library"])
        complete = record["key"] == folder.name and library.stat().st_size == record["bytes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return _import(folder.name, library) if complete else None


def mark_complete(folder: Path, module: ModuleType) -> None:
    """Record that ``folder`` holds the built and imported ``module`` (atomically)."""
    library = Path(module.__file__)
    record = {"key": folder.name, "library": library.name, "bytes": library.stat().st_size}
    partial = folder / f"{COMPLETE}.{os.getpid()}"
    partial.write_text(json.dumps(record))
    os.replace(partial, folder / COMPLETE)


def discard(folder: Path) -> None:
    """Empty ``folder`` but its lock file: what an incomplete build left (its holder calls
    it, under :func:`build_lock`, before it builds)."""
    for entry in folder.iterdir():
        if entry.name == LOCK_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def copy_sources(sources: Path, folder: Path) -> Path:
    """Copy the files of ``sources`` into ``folder/src`` and return that folder."""
    target = folder / SOURCE_DIR
    target.mkdir()
    for path in sorted(sources.iterdir()):
        if path.is_file():
            shutil.copyfile(path, target / path.name)
    return target


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to ninja, which ends its compilers and exits; SIGKILL after NINJA_GRACE s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=NINJA_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _GuardedSubprocess:
    """``subprocess`` as torch's extension builder sees it during a guarded build: ``run``
    starts the command (ninja) with :func:`training.processes.lifetime.death_prelude` (SIGTERM when this
    thread ends) and stops it with SIGTERM, not SIGKILL, when the wait is interrupted; every
    other name is ``subprocess``'s."""

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    @staticmethod
    def run(command, *, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
        argv = list(command)
        if LINUX:   # the prelude, then exec: ninja keeps the request and this process's pid
            argv = [sys.executable, "-S", "-c", death_prelude(os.getpid(), signal.SIGTERM)
                    + "import sys;os.execvp(sys.argv[1],sys.argv[1:])", *argv]
        with subprocess.Popen(argv, **kwargs) as proc:
            try:
                out, err = proc.communicate()
            except BaseException:
                _stop(proc)
                raise
        if check and proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, command, out, err)
        return subprocess.CompletedProcess(command, proc.returncode, out, err)


@contextlib.contextmanager
def compiler_dies_with_this_thread() -> Iterator[None]:
    """Within the block, torch's extension builder runs ninja through
    :class:`_GuardedSubprocess` (module docstring). One build at a time per process: the
    caller holds :func:`build_lock`."""
    from torch.utils import cpp_extension

    plain = cpp_extension.subprocess
    cpp_extension.subprocess = _GuardedSubprocess()
    try:
        yield
    finally:
        cpp_extension.subprocess = plain
