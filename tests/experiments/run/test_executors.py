"""The local pool: tasks with tensors travel as plain pickles; workers outlive the thread that
first submitted to the pool."""

import os
import signal
import sys
import threading
import time
from multiprocessing import resource_sharer
from pathlib import Path

import pytest
import torch

from experiments.run.executors import local_pool
from training.processes.lifetime import death_prelude


def _total(mask: dict[str, torch.Tensor], scale: float = 1.0) -> float:
    return float(sum(t.sum() for t in mask.values())) * scale


def test_a_task_s_tensors_reach_the_worker_without_the_driver_serving_descriptors():
    """A mask shipped to a worker arrives whole, and the driver starts no descriptor-serving
    thread (torch's pickler would pass the tensor as a file descriptor through
    ``multiprocessing.resource_sharer``, whose thread printed a traceback when a worker was
    killed while fetching one)."""
    resource_sharer.stop()   # started by an earlier test in this process, if any
    mask = {"0.weight": torch.arange(12.0).reshape(3, 4), "0.bias": torch.ones(3)}
    pool = local_pool(1)
    try:
        assert pool.submit(_total, mask, scale=2.0).result(timeout=120) == 2 * (66 + 3)
    finally:
        pool.shutdown()
    assert resource_sharer._resource_sharer._listener is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_pool_first_used_from_a_short_lived_thread_keeps_its_workers():
    """Linux sends a child's death signal when the *thread* that started it ends: the pool
    starts its workers from the process's launcher thread, so a worker spawned for a thread
    that then ends lives on and serves the next task, and it asked for SIGKILL on the driver's
    death in the first statement of its command line."""
    pool = local_pool(1)
    try:
        first = []
        thread = threading.Thread(target=lambda: first.append(pool.submit(os.getpid).result()))
        thread.start()
        thread.join()
        time.sleep(0.5)   # a signal on the thread's end would have killed the worker by now
        assert pool.submit(os.getpid).result(timeout=120) == first[0]
        prelude = death_prelude(os.getpid(), signal.SIGKILL)
        assert prelude.encode() in Path(f"/proc/{first[0]}/cmdline").read_bytes()
    finally:
        pool.shutdown()
