"""The in-memory data set every trainer, probe and pruning criterion takes, and how to make one.

A :class:`Dataset` holds a training and a validation split (and a test split when asked) as
tensors; the trainers index mini-batches from them directly (no DataLoader). Three ways in:

- a registered data set: ``training.data.load(name, **options)`` (:mod:`training.data`);
- your own tensors or numpy arrays: :meth:`Dataset.from_tensors` ``(x, y)``;
- your own map-style ``torch.utils.data.Dataset``: :meth:`Dataset.from_torch`, which reads it
  once into tensors (:mod:`training.data.torch_data`) and goes on as ``from_tensors``.

Without a given validation set, the validation split is carved from the data by one rule,
:func:`split_validation`, the same for the registered loaders and for your own data.
:func:`check_dataset` is the check each trainer, probe and ``pruning.prune`` makes of the data set
it is given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from training.errors import DataError
from training.data.torch_data import materialize

TASKS = ("classification", "regression")


@dataclass(frozen=True)
class Dataset:
    """An in-memory data set split into train / validation (/ test when asked).

    ``task`` is ``"classification"`` (integer labels, ``num_classes`` classes) or ``"regression"``
    (float targets of shape ``[n]``; ``num_classes`` is 0). ``input_shape`` excludes the batch
    dimension. ``provenance`` records how the data were made (generator, seed, files, sizes; for
    your own data, its source and a digest of its content).

    ``loss``: a per-example loss ``loss(outputs, targets) -> [B]`` (one value per example; any
    trailing dimensions are averaged) that replaces the task's own (cross-entropy, or half the
    squared error) in every trainer and probe: training minimizes its batch mean, and the goal
    metric ``loss`` is its mean on the validation split; ``error`` (the fraction of argmax
    misclassifications) still applies to classification. None: the task's loss.
    """

    name: str
    task: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    x_test: torch.Tensor | None = None
    y_test: torch.Tensor | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = field(
        default=None, compare=False, repr=False)

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_val(self) -> int:
        return int(self.x_val.shape[0])

    def to(self, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> "Dataset":
        """Copy onto ``device``; inputs (and regression targets) cast to ``dtype`` if given."""

        def move(t: torch.Tensor | None, is_target: bool = False) -> torch.Tensor | None:
            if t is None:
                return None
            cast = dtype if (dtype is not None and (not is_target or self.task == "regression")) else None
            return t.to(device=device, dtype=cast) if cast is not None else t.to(device)

        return Dataset(
            name=self.name, task=self.task,
            x_train=move(self.x_train), y_train=move(self.y_train, True),
            x_val=move(self.x_val), y_val=move(self.y_val, True),
            num_classes=self.num_classes, input_shape=self.input_shape,
            x_test=move(self.x_test), y_test=move(self.y_test, True),
            provenance=dict(self.provenance), loss=self.loss,
        )

    @classmethod
    def from_tensors(cls, x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, *,
                     x_val: torch.Tensor | np.ndarray | None = None,
                     y_val: torch.Tensor | np.ndarray | None = None, val_fraction: float = 0.1,
                     seed: int = 0, task: str | None = None, num_classes: int | None = None,
                     name: str | None = None,
                     loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                     ) -> "Dataset":
        """A data set from inputs ``x`` (``[n, *input_shape]``) and labels ``y`` (``[n]``),
        torch tensors or numpy arrays.

        Task: integer labels make a classification set (classes: ``num_classes`` if given, else
        the largest label + 1), floating-point labels a regression set; ``task="classification"`` or
        ``"regression"`` states it (float labels that are whole numbers can be class labels;
        integer labels can be regression targets). Classification labels must be 1-D integers in
        [0, num_classes), cast to int64; regression targets ``[n]`` (or ``[n, 1]``, flattened:
        the trainers' loss and goal metric take one target per example), cast to float32.
        Inputs are cast to float32 and held on the CPU, like the registered data sets; the
        trainers move them to ``run.device`` and ``run.dtype``.

        Validation: ``x_val`` and ``y_val`` as given (``val_fraction`` and ``seed`` are then
        unused), or else ``round(n * val_fraction)`` examples (at least one) carved from x, y
        by a permutation seeded with ``seed``, exactly as the registered loaders do
        (:func:`split_validation`), so the same tensors and seed give the same split.

        ``name`` (default ``"tensors"``) labels the set in results; ``provenance`` records
        ``source="tensors"``, the sizes, and ``digest``: the first 16 hex digits of a SHA-256 of
        the cast tensors' shapes and bytes, which tells data sets apart. The dataset owns its
        tensors (copies; the split's indexing copies). Each problem is one
        :class:`training.DataError` naming the argument: lengths of x and y differ, labels of the
        wrong shape, negative or out-of-range labels, non-finite values, x_val's examples shaped
        unlike x's, empty data, a type that is not a tensor or array. ``loss``: a per-example
        loss of your own (see :class:`Dataset`); it must be callable.
        """
        _check_loss(loss)
        made = _from_tensors(cls, x, y, x_val, y_val, val_fraction, seed, task, num_classes,
                             "tensors" if name is None else name, TENSOR_NAMES)
        return made if loss is None else replace(made, loss=loss)

    @classmethod
    def from_torch(cls, dataset: object, *, val_dataset: object | None = None,
                   val_fraction: float = 0.1, seed: int = 0, task: str | None = None,
                   num_classes: int | None = None, name: str | None = None,
                   progress: bool | None = None,
                   loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                   ) -> "Dataset":
        """A data set from a map-style ``torch.utils.data.Dataset`` (``__len__`` and
        ``__getitem__`` returning ``(x, y)`` pairs: ``x`` a tensor, numpy array or number, ``y``
        an integer, float or tensor), e.g. a torchvision data set with ``transform=ToTensor()``.

        It reads ``dataset`` (and ``val_dataset``) once, item by item, into tensors
        (:func:`training.data.torch_data.materialize`) and goes on as :meth:`from_tensors` with the
        same ``val_fraction``, ``seed``, ``task``, ``num_classes`` rules. Transforms therefore
        run once: a random augmentation is frozen into one draw per example. Memory: the inputs
        are held as float32, ``4 * n * prod(input_shape)`` bytes (about 190 MB for the 60,000
        MNIST images), and building the split needs up to twice that for a moment. A
        ``TensorDataset`` is not looped over: its two tensors are used directly. ``progress``:
        a tqdm bar while reading (None: only above 10,000 items; False: never). ``name``
        defaults to the class name of ``dataset``; ``provenance`` records ``source="torch"``
        and ``torch_class`` besides :meth:`from_tensors`' entries (the same content digest).

        An IterableDataset or DataLoader, an item that is not a pair, or an item shaped unlike
        item 0 is one :class:`training.DataError` naming the index of the first bad item.
        ``loss``: a per-example loss of your own, as in :meth:`from_tensors`.
        """
        x, y = materialize(dataset, "dataset", progress)
        x_val = y_val = None
        if val_dataset is not None:
            x_val, y_val = materialize(val_dataset, "val_dataset", progress)
        _check_loss(loss)
        made = _from_tensors(cls, x, y, x_val, y_val, val_fraction, seed, task, num_classes,
                             type(dataset).__name__ if name is None else name, TORCH_NAMES)
        return replace(made, loss=loss, provenance={**made.provenance, "source": "torch",
                                                    "torch_class": type(dataset).__qualname__})


def _check_loss(loss: object) -> None:
    if loss is not None and not callable(loss):
        raise DataError(f"loss must be a callable loss(outputs, targets) -> per-example losses, "
                        f"got {type(loss).__name__}")


def check_dataset(dataset: object, who: str) -> Dataset:
    """``dataset`` if it is a :class:`Dataset`, else one :class:`training.DataError` from
    ``who`` (the entry point) naming the constructor that builds one."""
    if isinstance(dataset, Dataset):
        return dataset
    got = type(dataset).__name__
    if isinstance(dataset, DataLoader):
        raise DataError(f"{who}: dataset must be a training.Dataset, got DataLoader; build one "
                        f"from the data set it loads: training.Dataset.from_torch(loader.dataset)")
    raise DataError(f"{who}: dataset must be a training.Dataset, got {got}; build one with "
                    f"training.Dataset.from_torch(...) or training.Dataset.from_tensors(x, y)")


# ---------------------------------------------------------------------------------------------
# the validation split, shared with the registered loaders


def split_validation(x: torch.Tensor, y: torch.Tensor, val_fraction: float, seed: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_val, y_val): the first ``max(1, round(n * val_fraction))`` entries of
    ``torch.randperm(n)`` drawn with ``seed`` are the validation split, the rest (in that
    permuted order) the training split."""
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) \
            or not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DataError(f"seed must be an integer, got {seed!r}")
    n = x.shape[0]
    n_val = max(1, int(round(n * val_fraction)))
    if n_val >= n:
        raise DataError(f"val_fraction={val_fraction} of {n} examples leaves no training "
                        f"example; give more examples or a smaller val_fraction")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    val, train = perm[:n_val], perm[n_val:]
    return x[train], y[train], x[val], y[val]


def split_dataset(name: str, task: str, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                  seed: int, val_fraction: float, test: bool, x_test: torch.Tensor | None,
                  y_test: torch.Tensor | None, provenance: dict[str, Any]) -> Dataset:
    """The :class:`Dataset` of pool (x, y) split by :func:`split_validation`; the split and its
    sizes are added to ``provenance``; the test split is kept only if ``test``."""
    x_tr, y_tr, x_va, y_va = split_validation(x, y, val_fraction, seed)
    provenance = dict(provenance, split_seed=seed, val_fraction=val_fraction,
                      n_train=int(x_tr.shape[0]), n_val=int(x_va.shape[0]))
    return Dataset(name=name, task=task, x_train=x_tr, y_train=y_tr, x_val=x_va, y_val=y_va,
                   num_classes=num_classes, input_shape=tuple(x.shape[1:]),
                   x_test=x_test if test else None, y_test=y_test if test else None,
                   provenance=provenance)


# ---------------------------------------------------------------------------------------------
# from_tensors


class _Names(NamedTuple):
    """How errors name the four arguments: the whole argument, and one example (``{i}``)."""

    x: tuple[str, str]
    y: tuple[str, str]
    x_val: tuple[str, str]
    y_val: tuple[str, str]


TENSOR_NAMES = _Names(("x", "x[{i}]"), ("y", "y[{i}]"), ("x_val", "x_val[{i}]"),
                      ("y_val", "y_val[{i}]"))
TORCH_NAMES = _Names(("dataset's x", "dataset[{i}]'s x"), ("dataset's y", "dataset[{i}]'s y"),
                     ("val_dataset's x", "val_dataset[{i}]'s x"),
                     ("val_dataset's y", "val_dataset[{i}]'s y"))


def _from_tensors(cls: type[Dataset], x: Any, y: Any, x_val: Any, y_val: Any, val_fraction: float,
                  seed: int, task: str | None, num_classes: int | None, name: str,
                  names: _Names) -> Dataset:
    if not isinstance(name, str) or not name:
        raise DataError(f"name must be a non-empty string, got {name!r}")
    given = x_val is not None or y_val is not None
    if given and (x_val is None or y_val is None):
        raise DataError(f"{'y_val' if y_val is None else 'x_val'} is missing: x_val and y_val "
                        f"come together (or neither, to carve the validation split from x, y)")
    x = _inputs(x, names.x, copy=given)
    y = _labels(y, names.y, x.shape[0], names.x[0])
    if given:
        x_val = _inputs(x_val, names.x_val, copy=True)
        if x_val.shape[1:] != x.shape[1:]:
            raise DataError(f"{names.x_val[0]}'s examples have shape {tuple(x_val.shape[1:])} but "
                            f"{names.x[0]}'s have {tuple(x.shape[1:])}; they must match")
        y_val = _labels(y_val, names.y_val, x_val.shape[0], names.x_val[0])
    task = _task(task, y, num_classes, names.y[0])
    if task == "classification":
        y = _class_labels(y, names.y)
        y_val = _class_labels(y_val, names.y_val) if given else None
        labelled = [(y, names.y)] + ([(y_val, names.y_val)] if given else [])
        num_classes = _num_classes(num_classes, labelled)
    else:
        y = _targets(y, names.y)
        y_val = _targets(y_val, names.y_val) if given else None
        num_classes = 0
    parts = [x, y] + ([x_val, y_val] if given else [])
    provenance: dict[str, Any] = {
        "source": "tensors", "examples": sum(int(t.shape[0]) for t in parts[::2]),
        "input_shape": list(x.shape[1:]), "inputs": "float32", "digest": content_digest(*parts)}
    if not given:
        return split_dataset(name, task, x, y, num_classes, seed, val_fraction, False, None, None,
                             provenance)
    provenance.update(validation="given", n_train=int(x.shape[0]), n_val=int(x_val.shape[0]))
    return cls(name=name, task=task, x_train=x, y_train=y, x_val=x_val, y_val=y_val,
               num_classes=num_classes, input_shape=tuple(x.shape[1:]), provenance=provenance)


def content_digest(*tensors: torch.Tensor) -> str:
    """First 16 hex digits of the SHA-256 of the tensors' shapes, dtypes and bytes (CPU)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(f"{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.contiguous().numpy())  # the buffer itself: no copy of a large data set
    return h.hexdigest()[:16]


def _as_tensor(value: Any, arg: str) -> torch.Tensor:
    """A tensor of real numbers (bool, integer or float) from a tensor or numpy array."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise DataError(f"{arg} has numpy dtype {value.dtype}; expected numbers (bool, "
                            f"integer or float)")
        value = torch.from_numpy(np.ascontiguousarray(value))
    elif not isinstance(value, torch.Tensor):
        raise DataError(f"{arg} must be a torch.Tensor or a numpy array, got "
                        f"{type(value).__name__}")
    if value.is_complex():
        raise DataError(f"{arg} is complex ({value.dtype}); expected real numbers")
    if value.dim() == 0:
        raise DataError(f"{arg} is a scalar; it must hold one entry per example (first dimension)")
    if value.shape[0] == 0:
        raise DataError(f"{arg} is empty (0 examples)")
    return value.detach()


def _first(bad: torch.Tensor) -> int:
    """Index of the first True of a 1-D mask."""
    return int(torch.nonzero(bad)[0, 0])


def _inputs(value: Any, name: tuple[str, str], copy: bool) -> torch.Tensor:
    x = _as_tensor(value, name[0])
    if x.numel() == 0:
        raise DataError(f"{name[0]}'s examples are empty: shape {tuple(x.shape)}")
    x = x.to(device="cpu", dtype=torch.float32, copy=copy)
    bad = ~torch.isfinite(x).reshape(x.shape[0], -1).all(1)
    if bool(bad.any()):
        raise DataError(f"{name[1].format(i=_first(bad))} has a non-finite value (NaN or inf, "
                        f"after the cast to float32); inputs must be finite")
    return x


def _labels(value: Any, name: tuple[str, str], n: int, x_name: str) -> torch.Tensor:
    y = _as_tensor(value, name[0]).to("cpu")
    if y.dtype == torch.bool:
        raise DataError(f"{name[0]} is bool; class labels must be integers (y.long()), regression "
                        f"targets floats")
    if y.shape[0] != n:
        raise DataError(f"{x_name} has {n} examples but {name[0]} has {y.shape[0]} labels; they "
                        f"must have one label per example")
    if y.is_floating_point():
        bad = ~torch.isfinite(y).reshape(n, -1).all(1)
        if bool(bad.any()):
            raise DataError(f"{name[1].format(i=_first(bad))} is not finite (NaN or inf); labels "
                            f"must be finite")
    return y


def _task(task: str | None, y: torch.Tensor, num_classes: int | None, y_name: str) -> str:
    """The stated task, or the one ``y``'s dtype implies (integer: classification)."""
    if task is None:
        task = "regression" if y.is_floating_point() else "classification"
        if task == "regression" and num_classes is not None:
            raise DataError(f"num_classes={num_classes!r} is given but {y_name} holds floats "
                            f"(regression targets); pass integer labels or task='classification'")
    elif task not in TASKS:
        raise DataError(f"task must be 'classification', 'regression' or None (inferred from the "
                        f"labels), got {task!r}")
    elif task == "regression" and num_classes is not None:
        raise DataError(f"num_classes applies to classification only, but task='regression'")
    return task


def _class_labels(y: torch.Tensor, name: tuple[str, str]) -> torch.Tensor:
    """``y`` as int64 class labels: 1-D, whole numbers, non-negative."""
    if y.dim() != 1:
        hint = " (one-hot labels? pass their argmax over dim 1)" if y.dim() == 2 else ""
        raise DataError(f"{name[0]} has shape {tuple(y.shape)}; classification needs one class "
                        f"label per example, shape [n]{hint}")
    if y.is_floating_point():
        bad = y != y.round()
        if bool(bad.any()):
            i = _first(bad)
            raise DataError(f"{name[1].format(i=i)} = {float(y[i])!r}: classification needs whole-"
                            f"number class labels; for real-valued targets use task='regression'")
    y = y.to(torch.int64, copy=True)
    bad = y < 0
    if bool(bad.any()):
        i = _first(bad)
        raise DataError(f"{name[1].format(i=i)} = {int(y[i])}: class labels must be >= 0 "
                        f"(in [0, num_classes))")
    return y


def _num_classes(stated: int | None, labels: list[tuple[torch.Tensor, tuple[str, str]]]) -> int:
    """The stated number of classes (every label below it), or the largest label + 1."""
    if stated is None:
        top = max(int(y.max()) for y, _ in labels)
        if top < 1:
            raise DataError(f"every label of {labels[0][1][0]} is 0: classification needs at "
                            f"least 2 classes (state num_classes=...)")
        return top + 1
    if isinstance(stated, bool) or not isinstance(stated, (int, np.integer)) or stated < 2:
        raise DataError(f"num_classes must be an integer >= 2, got {stated!r}")
    for y, name in labels:
        bad = y >= stated
        if bool(bad.any()):
            i = _first(bad)
            raise DataError(f"{name[1].format(i=i)} = {int(y[i])} but num_classes={int(stated)}: "
                            f"class labels must be in [0, {int(stated)})")
    return int(stated)


def _targets(y: torch.Tensor, name: tuple[str, str]) -> torch.Tensor:
    """``y`` as float32 regression targets of shape [n] (an [n, 1] column is flattened)."""
    if y.dim() == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.dim() != 1:
        raise DataError(f"{name[0]} has shape {tuple(y.shape)}; regression needs one target per "
                        f"example, shape [n] or [n, 1] (the trainers' loss and goal metric take "
                        f"one output per example)")
    return y.to(torch.float32, copy=True)
