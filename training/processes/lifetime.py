"""Child processes that end with the process that started them, at any moment.

A study's driver starts processes (pool workers, DDP ranks, the kernel's compiler) that must not
outlive it: a driver killed by SIGKILL (the OOM killer, a scheduler's hard limit) runs no
cleanup, and what it started would run on, reparented to init. Two means, the first where the
platform has it:

- **Linux**: :func:`children_die_with_this_thread` makes a process that multiprocessing's
  ``spawn`` starts ask for ``PR_SET_PDEATHSIG`` in the first statement it runs, before it
  imports anything (:func:`death_prelude`), so that the kernel signals it the moment its
  creator dies, even while it imports torch. The signal comes when the *thread* that started
  the process ends, so a pool starts its workers from :func:`on_launcher_thread`, a thread that
  lives as long as the process.
- **Everywhere**: :func:`exit_with_parent`, a thread that polls the parent's pid every
  ``PARENT_POLL`` seconds, started once the child runs the project's code.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

# seconds between two checks of a child's parent (exit_with_parent)
PARENT_POLL = 0.5
# prctl(2): ask for a signal when the parent thread ends
PR_SET_PDEATHSIG = 1
LINUX = sys.platform.startswith("linux")

_spawning = threading.local()   # .signal: what children spawned from this thread ask for
_install_lock = threading.Lock()
_launcher: tuple[int, queue.SimpleQueue, threading.Thread] | None = None
_launcher_lock = threading.Lock()


def death_prelude(parent: int, sig: int) -> str:
    """Python statements (one line) that make the process running them receive ``sig`` when
    the thread that started it ends (Linux's ``prctl(PR_SET_PDEATHSIG)``), then end it at once
    if ``parent`` is no longer its parent: a parent that died before the request sends no
    signal. Standard library only (``ctypes``, ``os``): a few milliseconds."""
    return (f"import ctypes,os;ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG},{int(sig)});"
            f"os.getppid()=={int(parent)} or os._exit(1);")


def _install_prelude() -> None:
    """Wrap ``multiprocessing.spawn.get_command_line`` (once per process) so that a child
    spawned from a thread inside :func:`children_die_with_this_thread` runs
    :func:`death_prelude` before ``spawn_main``. Why a wrapper: the command line is the only
    code of ours the child runs before it imports the driver's main module (torch, seconds),
    and the function is the one place that writes it (``popen_spawn_posix`` calls it by module
    attribute); outside such a thread the wrapper returns the command unchanged."""
    from multiprocessing import spawn

    with _install_lock:
        plain = spawn.get_command_line
        if getattr(plain, "dies_with_parent", False):
            return

        def get_command_line(**kwds):
            cmd = plain(**kwds)
            sig = getattr(_spawning, "signal", None)
            # [python, *flags, "-c", prog, "--multiprocessing-fork"] (not a frozen program's)
            if sig is None or len(cmd) < 3 or cmd[-3] != "-c":
                return cmd
            return [*cmd[:-2], death_prelude(os.getpid(), sig) + cmd[-2], cmd[-1]]

        get_command_line.dies_with_parent = True
        spawn.get_command_line = get_command_line


@contextlib.contextmanager
def children_die_with_this_thread(sig: int = signal.SIGKILL) -> Iterator[None]:
    """Within the block, each process that multiprocessing's ``spawn`` starts from this thread
    receives ``sig`` as soon as this thread ends, the process's death included, from its first
    statement on (:func:`death_prelude`). The caller keeps the thread alive as long as the
    children: a thread that joins them (the DDP launcher) or :func:`on_launcher_thread`. Off
    Linux it does nothing (:func:`exit_with_parent` remains)."""
    if not LINUX:
        yield
        return
    _install_prelude()
    previous = getattr(_spawning, "signal", None)
    _spawning.signal = sig
    try:
        yield
    finally:
        _spawning.signal = previous


def _serve(jobs: queue.SimpleQueue) -> None:
    with children_die_with_this_thread():
        while True:
            fn, done = jobs.get()
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)


def on_launcher_thread(start: Callable[[], T]) -> T:
    """``start()`` (which starts processes with multiprocessing's ``spawn``) run on this
    process's launcher thread, a daemon thread that never ends, inside
    :func:`children_die_with_this_thread`: its children receive SIGKILL when this process dies,
    and never because the thread that asked for them (a short-lived thread that first submitted
    to a pool) ended. Returns what ``start`` returns, or raises what it raised."""
    global _launcher
    with _launcher_lock:
        if _launcher is None or _launcher[0] != os.getpid():   # none yet, or a fork's copy
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            thread = threading.Thread(target=_serve, args=(jobs,), daemon=True,
                                      name="sparsescale-launcher")
            thread.start()
            _launcher = (os.getpid(), jobs, thread)
        _, jobs, thread = _launcher
    if threading.current_thread() is thread:
        return start()
    done: Future = Future()
    jobs.put((start, done))
    return done.result()


def exit_with_parent(poll: float = PARENT_POLL) -> bool:
    """End this process (``os._exit``) within ``poll`` seconds of its parent's death; True
    when the watch started (False: the parent was already gone, and this process ends now).

    The portable fallback of :func:`children_die_with_this_thread`, for the processes a driver
    starts (a study's pool workers, the DDP trainer's ranks): a daemon thread compares
    ``os.getppid()`` with the parent's pid every ``poll`` seconds, which sees every kind of
    death on every POSIX system, but only from the moment the child calls it (a pool worker:
    in its initializer, after it imported the driver's modules)."""
    import multiprocessing

    # a process multiprocessing started knows its parent's pid: one that died before this
    # line is seen too (the pid is then another's, the reaper's)
    started_by = multiprocessing.parent_process()
    parent = started_by.pid if started_by is not None else os.getppid()
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(1)

    threading.Thread(target=watch, name="sparsescale-parent-watch", daemon=True).start()
    return True
