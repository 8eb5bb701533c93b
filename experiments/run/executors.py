"""Executors for the runner: any ``concurrent.futures.Executor`` works.

- :func:`local_pool`: a ``ProcessPoolExecutor`` whose workers run one torch thread each (spawned,
  not forked: forking a process that already ran torch's OpenMP pool can hang the child) and
  end with the driver however it dies (:mod:`training.processes.lifetime`).
- :func:`dask_executor`: a Dask distributed executor, ``address`` = ``tcp://host:port`` of a running
  scheduler or ``"local"`` for a ``LocalCluster`` on loopback. Dask is an optional extra
  (``pip install 'sparsescale[dask]'``).

A worker computes with ONE torch thread (``torch_threads(1)``) wherever it runs, so a group's
floating-point results do not depend on which executor ran it.

On CUDA (a study's ``[workload] device = "cuda"``) the local pool runs one worker per visible GPU
(:func:`default_workers`), and worker k makes GPU k modulo their count its current device as it
starts (:func:`_init_worker`), so ``"cuda"`` in a group's run means that worker's own GPU and
the workers never share one. ``"cuda:N"`` pins every worker to GPU N.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor

from training.errors import SparsescaleError, SparsescaleIOError
from training.processes.lifetime import on_launcher_thread


class ExecutorError(SparsescaleError, ValueError):
    """An executor cannot be created as asked (e.g. dask is not installed)."""


class ExecutorIOError(SparsescaleIOError):
    """The executor's cluster cannot be reached (a Dask scheduler's address): names the address."""


def _init_worker(counter=None) -> None:
    """A pool worker's setup. ``counter``: a shared integer (``multiprocessing.Value``) when
    the workers train on ``"cuda"``: each takes the next value k and makes GPU k modulo the
    visible count its current device."""
    import signal

    import torch

    from training.processes.lifetime import exit_with_parent
    from training.processes.setup import setup_training_process

    torch.set_num_threads(1)
    setup_training_process()
    exit_with_parent()   # the portable fallback of the launcher's PR_SET_PDEATHSIG
    if counter is not None:
        torch.cuda.set_device(worker_gpu(counter))
    # Ctrl-C is the driver's business: it stops submitting and ends the pool (LocalPool.terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call_unpickled(fn, payload: bytes):
    """Worker side of :meth:`LocalPool.submit`: ``fn`` of the arguments in ``payload``."""
    args, kwargs = pickle.loads(payload)
    return fn(*args, **kwargs)


class LocalPool(ProcessPoolExecutor):
    """A process pool that can be ended at once on Ctrl-C (:meth:`terminate`), whose tasks
    travel as plain pickles (:meth:`submit`), and whose workers die with the process that made
    it, at any moment (:meth:`_spawn_process`)."""

    def _spawn_process(self) -> None:
        """Start one worker (``ProcessPoolExecutor`` calls it from the thread that submits)
        from :func:`training.processes.lifetime.on_launcher_thread`: on Linux the worker then receives
        SIGKILL when the driver dies, from its first statement, while it still imports the
        driver's modules, rather than from its initializer on; and never because the
        submitting thread (a short-lived one, say) ended."""
        on_launcher_thread(super()._spawn_process)

    def submit(self, fn, /, *args, **kwargs) -> Future:
        """Submit ``fn(*args, **kwargs)``, its arguments pickled by :mod:`pickle`, which copies
        a tensor's data into the message. The pool's own pickler (torch's multiprocessing
        reductions) would instead pass each tensor (a task's mask) as a file descriptor, served
        by a helper thread of the driver; a worker killed while fetching one (Ctrl-C, SIGTERM)
        made that thread print a ``ConnectionResetError`` traceback after the driver's last
        line."""
        payload = pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        return super().submit(_call_unpickled, fn, payload)

    def terminate(self) -> None:
        """Kill the workers now (a running group is lost; it was never written, so a rerun
        redoes it) and shut the pool down without waiting."""
        # ProcessPoolExecutor has no public way to stop running work; _processes is stable
        # since Python 3.2 and this is best effort
        for proc in list(getattr(self, "_processes", {}).values()):
            proc.terminate()
        self.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the body with ``n`` torch intra-op threads, restoring the previous count after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def default_workers(device: str = "cpu") -> int:
    """On the CPU: CPUs this process may run on (its affinity set where the OS has one); on
    ``"cuda"``: the visible GPUs (one worker each); on ``"cuda:N"``: one. At least 1."""
    if device == "cuda":
        import torch

        return max(1, torch.cuda.device_count())
    if device.startswith("cuda:"):
        return 1
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else
               (os.cpu_count() or 1))


def worker_gpu(counter) -> int:
    """The GPU of the next worker to start: the shared ``counter``'s value (then incremented)
    modulo the visible GPUs."""
    import torch

    with counter.get_lock():
        k = counter.value
        counter.value += 1
    return k % max(1, torch.cuda.device_count())


def local_pool(workers: int | None = None, device: str = "cpu") -> LocalPool:
    """A process pool of ``workers`` (default: :func:`default_workers` of ``device``)
    single-threaded workers; on ``"cuda"`` each on its own GPU (module docstring)."""
    n = default_workers(device) if workers is None else int(workers)
    if n < 1:
        raise ExecutorError(f"workers must be >= 1, got {workers}")
    context = multiprocessing.get_context("spawn")
    # a plain "cuda" spreads the workers over the GPUs; "cuda:N" names one for all of them
    counter = context.Value("i", 0) if device == "cuda" else None
    return LocalPool(max_workers=n, mp_context=context, initializer=_init_worker,
                     initargs=(counter,))


class DaskExecutor(Executor):
    """A Dask ``ClientExecutor`` plus the client (and local cluster) it owns; ``shutdown`` closes
    all of them."""

    def __init__(self, address: str, workers: int | None = None):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ExecutorError(
                "--dask needs the optional dask extra: pip install 'sparsescale[dask]' "
                "(dask[distributed])") from None
        self.cluster = None
        if address == "local":
            self.cluster = LocalCluster(n_workers=workers or default_workers(),
                                        threads_per_worker=1, host="127.0.0.1",
                                        dashboard_address=None, processes=True)
            self.client = Client(self.cluster)
        else:
            try:
                self.client = Client(address, timeout="20s")
            except (OSError, TimeoutError) as exc:
                raise ExecutorIOError(f"--dask {address}: cannot reach the scheduler "
                                      f"({exc})") from None
        self.executor: Executor = self.client.get_executor(pure=False)

    def submit(self, fn, *args, **kwargs):
        return self.executor.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self.executor.shutdown(wait=wait)
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __exit__(self, *exc) -> None:
        self.shutdown()


def dask_executor(address: str, workers: int | None = None) -> DaskExecutor:
    """Executor on a Dask cluster at ``address`` (``"local"``: a LocalCluster on 127.0.0.1 with
    ``workers`` single-threaded worker processes)."""
    return DaskExecutor(address, workers)
