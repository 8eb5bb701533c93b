"""Real data parallelism: :func:`train_distributed` (one trial on k processes with
DistributedDataParallel, :mod:`training.distributed.trainer`), the wall-clock cost model t(B, k)
of a data-parallel step (:mod:`training.distributed.costmodel`), its asynchronous mode with
stragglers (:mod:`training.distributed.asynctime`) and the benchmark that fits it
(:mod:`training.distributed.bench`)."""

from training.distributed import asynctime, costmodel
from training.distributed.trainer import DistRun, train_distributed, train_env_rank

__all__ = ["asynctime", "costmodel", "DistRun", "train_distributed", "train_env_rank"]
