"""Data sets as in-memory tensors.

- :mod:`~training.data.dataset`: the :class:`Dataset` type, your own data in
  (``Dataset.from_tensors``, ``Dataset.from_torch``) and ``check_dataset``.
- :mod:`~training.data.registry`: the registry (``register``, ``load``, ``list_datasets``) and the
  bundled data sets; ``cache_dir``.
- :mod:`~training.data.text`: the ``python_source`` corpus.
- :mod:`~training.data.torch_data`: a map-style ``torch.utils.data.Dataset`` read into tensors.

Every name is importable from ``training.data``.
"""

from training.data.dataset import Dataset, check_dataset, split_dataset, split_validation
from training.data.registry import (
    CIFAR_FILES, DATA_FOLDERS, DATASETS, SYSTEM_FOLDERS, cache_dir, list_datasets, load, load_cifar10,
    load_fashion_mnist, load_linreg, load_mnist, load_mnist1d, load_python_source, load_teacher,
    read_cifar_batch, read_idx, register,
)
from training.errors import DataError, DataIOError

__all__ = ["Dataset", "check_dataset", "split_dataset", "split_validation", "CIFAR_FILES",
           "DATA_FOLDERS", "DATASETS", "SYSTEM_FOLDERS", "cache_dir", "list_datasets", "load", "load_cifar10",
           "load_fashion_mnist", "load_linreg", "load_mnist", "load_mnist1d",
           "load_python_source", "load_teacher", "read_cifar_batch", "read_idx", "register",
           "DataError", "DataIOError"]
