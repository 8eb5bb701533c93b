"""A study's driver killed at chosen moments, and the processes it leaves: the helpers of
``test_driver_kills.py`` and, run as a script, the measurement in the benchmark log.

Each moment starts a driver in a session of its own (``start_new_session``), so that every
process it starts, at any depth (pool workers, multiprocessing's resource tracker, ninja, the
C++ compiler), carries the driver's pid as its session id, reparented to init or not; after the
signal the members of that session are counted at 1, 2 and 5 s.

Moments:

- ``startup``: a study's two pool workers have just been spawned (0.3 s), still importing;
- ``lockwait``: two pool workers wait for a kernel's build lock that another process holds;
- ``kernel`` / ``eager``: a study has stored its first group, its workers are inside the next
  ones, under the compiled kernel / the eager programs (``SPARSESCALE_KERNELS=0``);
- ``build-term`` / ``build-int`` / ``build-kill``: a study's driver compiles the kernel
  (``cc1plus`` runs) in a fresh ``TORCH_EXTENSIONS_DIR`` and gets SIGTERM / Ctrl-C (SIGINT to
  its process group, as a terminal sends it) / SIGKILL;
- ``ddp``: the DDP launcher (``training.distributed.trainer.spawn``) has just spawned its two
  ranks (0.3 s), still importing.

``python tests/reliability/driver_kills.py [--busy] [--repeats N] [--moments a,b]
[--pool-startup]`` prints one table row per moment (``--busy``: beside two ``yes`` loops, one
per core); ``--pool-startup`` times a pool of two workers, each loading the compiled kernel,
while another process holds it loaded. ``TORCH_EXTENSIONS_DIR`` names the kernel cache used by
``kernel`` and ``--pool-startup`` (built first if need be).
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from .conftest import edit
except ImportError:   # run as a script
    from conftest import edit

REPO = Path(__file__).resolve().parents[2]
CHECKS = (1.0, 2.0, 5.0)

# A study of six groups whose learning rate never reaches the goal: each group runs its whole
# budget (a second or more), so a kill after the first stored group lands inside the others.
STUDY = (edit("batch_sizes = [8, 32]", "batch_sizes = [4, 8, 16, 32, 64, 128]")
         .replace('lr = {scale = "log", min = 0.01, max = 1.0}', "lr = 1e-6")
         .replace("max_steps = 40", "max_steps = 3000").replace("every = 10", "every = 100"))

# A C extension that compiles in about a second (Python.h only), named as torch's loader names
# the module (TORCH_EXTENSION_NAME).
TINY_SOURCE = """#include <Python.h>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define STR2(a) #a
#define STR(a) STR2(a)
static struct PyModuleDef tiny = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1};
PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&tiny); }
"""

# Holds the build lock of the tiny kernel of sys.argv[1] until killed.
LOCK_HOLDER = """import fcntl, os, sys, time
from pathlib import Path
from training.engine import compiled_kernel, kernel_cache
folder = compiled_kernel.build_directory("tiny", Path(sys.argv[1]))
folder.mkdir(parents=True, exist_ok=True)
fd = os.open(folder / kernel_cache.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""

# A driver whose two pool workers each load the tiny kernel of sys.argv[1].
LOCK_WAITER = """import sys
from concurrent.futures import wait
from pathlib import Path
from experiments.run.executors import local_pool
from training.engine import compiled_kernel
if __name__ == "__main__":
    pool = local_pool(2)
    wait([pool.submit(compiled_kernel.load_kernel, "tiny", Path(sys.argv[1]), "test", "none")
          for _ in range(2)])
"""

# A driver that runs two DDP ranks on loopback (each would sleep ``rank`` seconds).
DDP_DRIVER = """import time
from training.distributed.trainer import spawn
spawn(time.sleep, 2, "gloo", 1)
"""


def environment(**extra: str) -> dict[str, str]:
    """This process's environment with the repository first on the path and ``extra``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    env.pop("SPARSESCALE_REQUIRE_KERNEL", None)
    return env


def session(sid: int) -> set[int]:
    """The live processes (zombies excluded) of session ``sid``, but ``sid`` itself."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        if fields[0] != "Z" and int(fields[3]) == sid and pid != sid:
            found.add(pid)
    return found


def commands(pids: set[int]) -> list[str]:
    """The command names of ``pids`` (those still there)."""
    names = []
    for pid in sorted(pids):
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            pass
    return names


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (0 once gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def done_groups(db: Path) -> int:
    """Groups a running study has stored as done (0 before its store exists)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return con.execute("SELECT count(*) FROM groups WHERE status = 'done'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def wait_until(condition, timeout: float, proc: subprocess.Popen) -> None:
    """Poll ``condition`` every 20 ms; AssertionError after ``timeout`` s or if ``proc`` ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the driver ended first (status {proc.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s")
        time.sleep(0.02)


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A driver in a session of its own, its stdout and stderr in ``log``."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # a shell's background job ignores SIGINT, and so would the driver (an ignored signal
        # stays ignored across exec, and Python then installs no KeyboardInterrupt): Ctrl-C
        # reaches a foreground command
        signal.signal(signal.SIGINT, signal.default_int_handler)
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, *argv], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


def spawned_workers(proc: subprocess.Popen) -> int:
    """How many of the driver's session are multiprocessing's spawned children."""
    n = 0
    for pid in session(proc.pid):
        try:
            n += b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    return n


def study_driver(tmp: Path, env: dict[str, str]) -> subprocess.Popen:
    """The study command on :data:`STUDY` with two workers."""
    spec = tmp / "kills.toml"
    spec.write_text(STUDY)
    return start(["-m", "experiments.cli.main", "study", str(spec), "--out", str(tmp / "run"),
                  "--workers", "2", "--quiet", "--no-report"], env, tmp / "driver.log")


def tiny_sources(tmp: Path) -> Path:
    """A folder holding the tiny kernel's source."""
    sources = tmp / "src"
    sources.mkdir(exist_ok=True)
    (sources / "tiny.cpp").write_text(TINY_SOURCE)
    return sources


def reach(moment: str, tmp: Path, helpers: list[subprocess.Popen]) -> subprocess.Popen:
    """A driver started and brought to ``moment`` (see the module docstring); processes that
    are not the driver's (a lock's holder) are appended to ``helpers``."""
    eager = environment(SPARSESCALE_KERNELS="0")
    if moment == "startup":
        proc = study_driver(tmp, eager)
        wait_until(lambda: spawned_workers(proc) >= 2, 120, proc)
        time.sleep(0.3)
        return proc
    if moment == "lockwait":
        sources = tiny_sources(tmp)
        env = environment(TORCH_EXTENSIONS_DIR=str(tmp / "ext"))
        with (tmp / "holder.log").open("w") as out:
            holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(sources)],
                                      env=env, stdout=out, stderr=subprocess.STDOUT)
        helpers.append(holder)
        wait_until(lambda: "held" in (tmp / "holder.log").read_text(), 120, holder)
        proc = start(["-c", LOCK_WAITER, str(sources)], env, tmp / "driver.log")
        wait_until(lambda: (tmp / "driver.log").read_text().count("waiting for the kernel") >= 2,
                   120, proc)
        return proc
    if moment in ("kernel", "eager"):
        proc = study_driver(tmp, environment() if moment == "kernel" else eager)
        wait_until(lambda: done_groups(tmp / "run" / "results.sqlite") >= 1, 300, proc)
        return proc
    if moment.startswith("build-"):
        proc = study_driver(tmp, environment(TORCH_EXTENSIONS_DIR=str(tmp / "ext")))
        wait_until(lambda: "cc1plus" in commands(session(proc.pid)), 120, proc)
        time.sleep(1.0)
        return proc
    if moment == "ddp":
        proc = start(["-c", DDP_DRIVER], eager, tmp / "driver.log")
        wait_until(lambda: spawned_workers(proc) >= 2, 120, proc)
        time.sleep(0.3)
        return proc
    raise ValueError(f"unknown moment {moment!r}; allowed: {', '.join(MOMENTS)}")


MOMENTS = ("startup", "lockwait", "kernel", "eager", "build-term", "build-int", "build-kill",
           "ddp")


def stop(proc: subprocess.Popen, moment: str) -> None:
    """The moment's signal: SIGTERM to the driver (``build-term``), SIGINT to its process group
    (``build-int``: Ctrl-C), else SIGKILL to the driver."""
    if moment == "build-int":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM if moment == "build-term" else signal.SIGKILL)


def signal_name(moment: str) -> str:
    return {"build-term": "SIGTERM", "build-int": "Ctrl-C"}.get(moment, "SIGKILL")


def kill_at(moment: str) -> dict[str, object]:
    """Bring a driver to ``moment``, signal it (:func:`stop`) and
    count its session's processes then and 1, 2 and 5 s after: ``{"at": n, 1.0: n, ...,
    "names": the command names left at 1 s}``. Whatever is left after 5 s is killed."""
    helpers: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="sparsescale-kills-") as tmp:
        proc = None
        try:
            proc = reach(moment, Path(tmp), helpers)
            counts: dict[object, object] = {"at": len(session(proc.pid))}
            sid = proc.pid
            sent = time.monotonic()
            stop(proc, moment)
            for check in CHECKS:
                time.sleep(max(0.0, sent + check - time.monotonic()))
                left = session(sid)
                counts[check] = len(left)
                if check == CHECKS[0]:
                    counts["names"] = commands(left)
            return counts
        finally:
            if proc is not None:
                for pid in session(proc.pid):
                    with_pid(pid, signal.SIGKILL)
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            for helper in helpers:
                helper.kill()
                helper.wait()


def with_pid(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` if it is still there."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kernel_ready(env: dict[str, str]) -> None:
    """Build (or find) the compiled kernel in ``env``'s cache before timing anything."""
    subprocess.run([sys.executable, "-c", "from training.engine import compiled_kernel as k; "
                    "assert k.fused_sequential() is not None"], env=env, check=True, cwd=REPO)


def _kernel_in_worker(meeting: str) -> tuple[int, float, float]:
    """A pool task: load the compiled kernel; this worker's pid, the wall time then and the
    seconds the load took. Each task then waits for the other in folder ``meeting``, so that
    the two run on two workers."""
    from training.engine import compiled_kernel

    start_load = time.time()
    assert compiled_kernel.fused_sequential() is not None
    ready = time.time()
    (Path(meeting) / str(os.getpid())).touch()
    while len(list(Path(meeting).iterdir())) < 2:
        time.sleep(0.01)
    return os.getpid(), ready, ready - start_load


HOLDER = """import time
from training.engine import compiled_kernel as k
assert k.fused_sequential() is not None
print("loaded", flush=True)
time.sleep(600)
"""


def pool_startup(repeats: int) -> list[tuple[float, float, float]]:
    """Seconds from creating a pool of two workers to both having loaded the kernel, while
    another process holds it loaded, and the seconds each worker's load took (the shorter
    first); one triple per repeat."""
    from experiments.run.executors import local_pool

    env = environment()
    kernel_ready(env)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE,
                              text=True, cwd=REPO)
    try:
        assert holder.stdout.readline() == "loaded\n"
        times = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as meeting:
                start_time = time.time()
                pool = local_pool(2)
                try:
                    results = [f.result() for f in
                               [pool.submit(_kernel_in_worker, meeting) for _ in range(2)]]
                finally:
                    pool.shutdown()
            assert len({pid for pid, _, _ in results}) == 2, results
            times.append((max(ready for _, ready, _ in results) - start_time,
                          *sorted(load for _, _, load in results)))
        return times
    finally:
        holder.kill()
        holder.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", action="store_true", help="beside one `yes` loop per core")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--moments", default=",".join(MOMENTS))
    parser.add_argument("--pool-startup", action="store_true")
    args = parser.parse_args()
    loops = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
             for _ in range(os.cpu_count() or 1)] if args.busy else []
    # this checkout's code, here and in the pool's workers (they inherit sys.path), whatever
    # an installed copy of the project says
    sys.path.insert(0, str(REPO))
    try:
        if args.pool_startup:
            times = pool_startup(args.repeats)
            print("pool of 2, kernel loaded elsewhere: start-up (the two loads) "
                  + ", ".join(f"{t:.2f} ({a:.2f}, {b:.2f})" for t, a, b in times) + " s")
            return
        if "kernel" in args.moments:
            kernel_ready(environment())
        print("| moment | signal | processes at the signal | alive 1 s | 2 s | 5 s | at 1 s |")
        print("|---|---|---|---|---|---|---|")
        for moment in args.moments.split(","):
            for _ in range(args.repeats):
                c = kill_at(moment)
                print(f"| {moment} | {signal_name(moment)} | {c['at']} | {c[1.0]} | {c[2.0]} | "
                      f"{c[5.0]} | {' '.join(c['names']) or '-'} |", flush=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


if __name__ == "__main__":
    main()
