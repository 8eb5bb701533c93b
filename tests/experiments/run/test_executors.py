"""The local pool: tasks with tensors travel as plain pickles."""

from multiprocessing import resource_sharer

import torch

from experiments.run.executors import local_pool


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
