"""A map-style ``torch.utils.data.Dataset`` read once into two tensors, for
:meth:`training.Dataset.from_torch`.

The trainers index mini-batches from in-memory tensors, so a torch data set is read item by item
exactly once (``dataset[0]``, ..., ``dataset[len - 1]``) into an ``[n, *input_shape]`` float32
tensor of inputs and an ``[n, *label_shape]`` tensor of labels. A ``TensorDataset`` whose
``__getitem__`` is torch's own is not looped over: its two tensors are used as they are.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from training.errors import DataError

# a bar is drawn (progress=None) for data sets above this many items
PROGRESS_ITEMS = 10_000


def materialize(dataset: object, arg: str, progress: bool | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` of every item of the map-style data set ``dataset`` (named ``arg`` in errors).

    Each item must be an ``(x, y)`` pair (tuple or list of two): ``x`` a tensor, numpy array or
    number, ``y`` an integer, a float or a tensor / array; every item's ``x`` (and ``y``) has the
    shape of item 0's, and every label is of item 0's kind (integer, float or bool). Inputs are
    stored as float32 as they are read, labels as int64 (integer labels), float64 (float labels)
    or bool. ``progress``: a tqdm bar on stderr (None: only above :data:`PROGRESS_ITEMS` items).
    Every problem is one :class:`training.DataError` naming the index of the first bad item.
    """
    if isinstance(dataset, DataLoader):
        raise DataError(f"{arg} is a DataLoader: pass the data set it loads from, "
                        f"training.Dataset.from_torch(loader.dataset)")
    if isinstance(dataset, IterableDataset):
        raise DataError(f"{arg} is an IterableDataset ({type(dataset).__name__}): from_torch "
                        f"needs a map-style data set (__len__ and __getitem__); collect its items "
                        f"into tensors and use training.Dataset.from_tensors(x, y)")
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise DataError(f"{arg} must be a map-style torch Dataset (__len__ and __getitem__ "
                        f"returning (x, y) pairs), got {type(dataset).__name__}")
    if progress is not None and not isinstance(progress, bool):
        raise DataError(f"progress must be True, False or None (a bar above {PROGRESS_ITEMS} "
                        f"items), got {progress!r}")
    plain = type(dataset).__getitem__ is TensorDataset.__getitem__  # not a subclass's transform
    if isinstance(dataset, TensorDataset) and plain:
        if len(dataset.tensors) != 2:
            raise DataError(f"{arg} is a TensorDataset of {len(dataset.tensors)} tensors; "
                            f"from_torch needs two, (x, y)")
        return dataset.tensors[0], dataset.tensors[1]
    n = len(dataset)
    if n == 0:
        raise DataError(f"{arg} is empty (len 0)")
    x0, y0 = _item(dataset, 0, arg)
    # preallocated: the data are held once, as float32 inputs, while they are read
    xs = torch.empty((n, *x0.shape), dtype=torch.float32)
    ys = torch.empty((n, *y0.shape), dtype=_label_dtype(y0))
    xs[0], ys[0] = x0, y0
    from tqdm.auto import tqdm  # only here: reading a torch data set is the one long loop

    show = n > PROGRESS_ITEMS if progress is None else progress
    for i in tqdm(range(1, n), disable=not show, desc=f"reading {arg}", unit="item",
                  total=n, initial=1, dynamic_ncols=True):
        x, y = _item(dataset, i, arg)
        if x.shape != x0.shape:
            raise DataError(f"{arg}[{i}]: x has shape {tuple(x.shape)} but {arg}[0]'s has "
                            f"{tuple(x0.shape)}; every example must have the same shape")
        if y.shape != y0.shape:
            raise DataError(f"{arg}[{i}]: y has shape {tuple(y.shape)} but {arg}[0]'s has "
                            f"{tuple(y0.shape)}; every label must have the same shape")
        if _label_dtype(y) != ys.dtype:
            raise DataError(f"{arg}[{i}]: y is of dtype {y.dtype} but {arg}[0]'s is {y0.dtype}; "
                            f"labels must be all integers or all floats")
        xs[i], ys[i] = x, y
    return xs, ys


def _item(dataset: object, i: int, arg: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Item ``i`` as (x, y) tensors, or a DataError naming it."""
    item = dataset[i]  # type: ignore[index]
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        what = (f"a {type(item).__name__} of {len(item)}" if isinstance(item, (tuple, list))
                else f"a {type(item).__name__}")
        hint = (" (for tensors x, y use training.Dataset.from_tensors(x, y))"
                if i == 0 and isinstance(item, (torch.Tensor, np.ndarray)) else "")
        raise DataError(f"{arg}[{i}] is {what}, not an (x, y) pair; from_torch needs "
                        f"__getitem__ to return (input, label){hint}")
    return _number_tensor(item[0], f"{arg}[{i}]", "x"), _number_tensor(item[1], f"{arg}[{i}]", "y")


def _number_tensor(value: object, where: str, part: str) -> torch.Tensor:
    """``value`` (a tensor, numpy array or scalar, or a Python number) as a tensor of numbers."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
    elif isinstance(value, (np.ndarray, np.generic)) and np.asarray(value).dtype.kind in "biuf":
        t = torch.from_numpy(np.array(value))
    elif isinstance(value, (numbers.Integral, numbers.Real)):   # bool is Integral
        t = torch.tensor(value)
    else:
        hint = " (a torchvision data set needs transform=ToTensor())" if part == "x" else ""
        raise DataError(f"{where}: {part} is a {type(value).__name__}, not a tensor, array or "
                        f"number{hint}")
    if t.is_complex():
        raise DataError(f"{where}: {part} is complex ({t.dtype}); expected real numbers")
    return t


def _label_dtype(y: torch.Tensor) -> torch.dtype:
    """The dtype labels of ``y``'s kind are stored in: int64, float64 or bool."""
    if y.dtype == torch.bool:
        return torch.bool
    return torch.float64 if y.is_floating_point() else torch.int64
