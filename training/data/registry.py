"""Data sets as in-memory tensors: a small registry, and your own data.

``load(name, **options) -> Dataset``. Every data set is held as tensors (no DataLoader): the
trainers index mini-batches directly. A validation split is carved deterministically (by ``seed``)
from the training data; the test split is only returned when asked (``test=True``).

Your own data (:mod:`training.data.dataset`), with the same split rule:

- ``Dataset.from_tensors(x, y, x_val=None, y_val=None, val_fraction=0.1, seed=0, task=None)``:
  tensors or numpy arrays; the task is inferred from the labels (integers: classification, floats:
  regression) unless stated; inputs cast to float32, labels to int64 (classification).
- ``Dataset.from_torch(torch_dataset, val_dataset=None, ...)``: any map-style
  ``torch.utils.data.Dataset`` of ``(x, y)`` pairs, read once into tensors (a progress bar above
  10,000 items), then as ``from_tensors``.

``check_dataset(dataset, who)`` is the one check of a data set argument the trainers, the probes
and ``pruning.prune`` make: anything else (a ``TensorDataset``, a DataLoader, an ``(x, y)``
tuple) is one ``DataError`` naming these constructors.

Registered data sets (``list_datasets()``):

- ``mnist1d``: generated offline with the ``mnist1d`` package (Greydanus 2020), cached as ``.npz``
  under ``$SPARSESCALE_CACHE`` (else ``$XDG_CACHE_HOME/sparsescale`` or ``~/.cache/sparsescale``).
- ``mnist``, ``fashion_mnist``: IDX files (gzipped or raw). Looked for in ``root=`` or
  ``$SPARSESCALE_DATA``, in a sub-folder named after the data set first (``fashion_mnist`` or
  ``fashion-mnist`` for Fashion-MNIST), then the folder itself; without ``root=``,
  Fashion-MNIST is also found where Debian's package ``dataset-fashion-mnist`` installs it
  (``/usr/share/datasets/fashion-mnist``), with no configuration.
- ``cifar10``: the python pickle batches (``data_batch_1..5``, ``test_batch``), same lookup
  (sub-folders ``cifar10`` or ``cifar-10-batches-py``).

A data set found nowhere is one ``DataError`` naming every folder looked in and the files to put
there (and, for Fashion-MNIST, the one-line install). ``DATA_FOLDERS`` and ``SYSTEM_FOLDERS``
hold the search order.
- ``python_source``: the running Python's standard-library ``.py`` files as next-byte windows
  for a language model (:mod:`training.data.text`): labels ``[n, context]``, 256 classes.
- ``teacher``: labels from a random teacher MLP (synthetic classification).
- ``linreg``: Gaussian linear regression y = x . w* + noise with known noise (theory ground truth).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import random
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
# Dataset, DataError and check_dataset are also this module's names (``training.data.Dataset``)
from training.data.dataset import Dataset, check_dataset, split_dataset
from training.errors import DataError, DataIOError
from training.registry import Registry


Loader = Callable[..., Dataset]
DATASETS: Registry[Loader] = Registry("data set", DataError, sort=True)


def register(name: str) -> Callable[[Loader], Loader]:
    """Decorator adding a data set loader to the registry as ``name``: the way to add a named
    data set to this process.

    The loader is called as ``fn(**options)`` with a study's ``[workload] dataset_options``
    (JSON values; the registered loaders take a ``seed`` option, default 0, for their
    validation split and generation). It must return a :class:`Dataset` (tensors on the CPU,
    ``task`` "classification" with integer labels or "regression" with float targets of shape
    ``[n]``), the same one every time it is called with the same options: each worker process
    loads it for itself, so draw random numbers from a generator seeded by the options. A study
    names it as ``[workload] dataset = "<name>"``.

    A registration lives in the process that made it: the worker processes of a study (the
    local pool, Dask) do not see one made in a notebook or a script. For a data set of your
    own, name its factory by import path instead (``dataset = "mymodels:blobs"``, same
    signature; see :mod:`experiments.spec.factories`).

    A name already registered by another function is refused with a :class:`DataError`
    (:class:`training.registry.Registry`); ``DATASETS.remove(name)`` frees it.
    """
    return DATASETS.register(name)


def list_datasets() -> list[str]:
    """Names accepted by :func:`load`."""
    return DATASETS.names()


def load(name: str, **options: Any) -> Dataset:
    """Load data set ``name`` (see the module docstring for the registry and options).

    Common options: ``seed`` (validation split and synthetic generation), ``val_fraction``
    (default 0.1, as Lee et al.), ``test`` (also return the test split).
    """
    loader = DATASETS.get(name)
    try:
        return loader(**options)
    except TypeError as exc:
        raise DataError(f"bad options for data set {name!r}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# helpers


def cache_dir() -> Path:
    """Folder for generated data: ``$SPARSESCALE_CACHE`` or the user cache dir."""
    if os.environ.get("SPARSESCALE_CACHE"):
        return Path(os.environ["SPARSESCALE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sparsescale"


# Where each local-file data set is looked for, in order, when no ``root=`` is given:
# ``$SPARSESCALE_DATA/<folder>`` for each folder name, ``$SPARSESCALE_DATA`` itself, then the
# system folders an operating-system package installs (Debian's ``dataset-fashion-mnist`` puts
# the four gzipped IDX files in /usr/share/datasets/fashion-mnist).
DATA_FOLDERS: dict[str, tuple[str, ...]] = {
    "mnist": ("mnist",),
    "fashion_mnist": ("fashion_mnist", "fashion-mnist"),
    "cifar10": ("cifar10", "cifar10/cifar-10-batches-py", "cifar-10-batches-py"),
}
SYSTEM_FOLDERS: dict[str, tuple[Path, ...]] = {
    "fashion_mnist": (Path("/usr/share/datasets/fashion-mnist"),),
}
INSTALL_HINTS: dict[str, str] = {
    "fashion_mnist": "install it with `apt-get install dataset-fashion-mnist` (Debian, Ubuntu)",
}
FORMAT_NOTES: dict[str, str] = {
    "mnist": " (the IDX files, gzipped or raw)",
    "fashion_mnist": " (the IDX files, gzipped or raw)",
    "cifar10": " (the python version: cifar-10-python.tar.gz extracted)",
}


def _candidates(name: str, root: str | os.PathLike | None) -> list[Path]:
    """The folders :func:`_data_root` looks in for data set ``name``, in order."""
    subs = DATA_FOLDERS.get(name, (name,))
    bases = [Path(root)] if root is not None else (
        [Path(os.environ["SPARSESCALE_DATA"])] if os.environ.get("SPARSESCALE_DATA") else [])
    found = [b / s for b in bases for s in subs] + bases
    if root is None:
        found += list(SYSTEM_FOLDERS.get(name, ()))
    return found


def _data_root(name: str, root: str | os.PathLike | None, files: tuple[str, ...],
               has: Callable[[Path], bool]) -> Path:
    """The first folder of :func:`_candidates` that holds any of data set ``name``'s files
    (``has(folder)``; a missing one is then named by the reader),
    else one DataError naming every folder looked in, the files expected (``files``) and where
    to put them."""
    looked = _candidates(name, root)
    for folder in looked:
        if folder.is_dir() and has(folder):
            return folder
    subs = DATA_FOLDERS.get(name, (name,))
    where = (", ".join(str(p) for p in looked) if looked else
             "no folder (SPARSESCALE_DATA is not set and no root= was given)")
    hint = INSTALL_HINTS.get(name)
    put = (f"put {', '.join(files)}{FORMAT_NOTES.get(name, '')} in $SPARSESCALE_DATA/{subs[0]} "
           f"(or in a folder given as "
           f"root=FOLDER); nothing is downloaded")
    raise DataError(f"data set {name!r} not found; looked in {where}; "
                    f"{hint + ', or ' if hint else ''}{put}")


# ---------------------------------------------------------------------------------------------
# MNIST-1D


@register("mnist1d")
def load_mnist1d(num_samples: int = 10_000, seed: int = 0, data_seed: int = 42,
                 val_fraction: float = 0.1, test: bool = False, cache: bool = True) -> Dataset:
    """MNIST-1D (Greydanus 2020) generated offline with ``mnist1d.data.make_dataset``.

    ``num_samples`` examples (80 % train pool / 20 % test, as the package), generated with
    ``data_seed`` (the package's default 42); ``seed`` carves the validation split. The caller's
    numpy and ``random`` RNG states are restored after generation.
    """
    if num_samples < 20:
        raise DataError(f"mnist1d num_samples must be >= 20, got {num_samples}")
    path = cache_dir() / f"mnist1d_n{num_samples}_s{data_seed}.npz"
    arrays = None
    if cache and path.exists():
        try:
            with np.load(path) as f:
                arrays = {k: f[k] for k in ("x", "y", "x_test", "y_test")}
        except (OSError, ValueError, KeyError):
            arrays = None  # a corrupt cache file is regenerated, not trusted
    if arrays is None:
        arrays = _generate_mnist1d(num_samples, data_seed)
        if cache:
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                np.savez(tmp, **arrays)
                os.replace(tmp, path)
            except OSError as exc:
                raise DataIOError(f"cannot write the data cache {path} ({exc.strerror or exc}); "
                                  f"set SPARSESCALE_CACHE to a writable folder") from None
    x = torch.tensor(arrays["x"], dtype=torch.float32)
    y = torch.tensor(arrays["y"], dtype=torch.long)
    xt = torch.tensor(arrays["x_test"], dtype=torch.float32)
    yt = torch.tensor(arrays["y_test"], dtype=torch.long)
    return split_dataset("mnist1d", "classification", x, y, 10, seed, val_fraction, test, xt, yt,
                   {"generator": "mnist1d.data.make_dataset", "num_samples": num_samples,
                    "data_seed": data_seed})


def _generate_mnist1d(num_samples: int, data_seed: int) -> dict[str, np.ndarray]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = data_seed
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return {"x": d["x"].astype(np.float32), "y": d["y"].astype(np.int64),
            "x_test": d["x_test"].astype(np.float32), "y_test": d["y_test"].astype(np.int64)}


# ---------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)

_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: Path, expected_magic: int) -> np.ndarray:
    """Read one IDX file (gzipped or raw): big-endian header, magic 2051 images / 2049 labels,
    type byte 0x08 (uint8)."""
    fmt = "IDX images (magic 2051)" if expected_magic == 2051 else "IDX labels (magic 2049)"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataIOError(f"{path}: cannot read ({exc.strerror or exc}); expected {fmt}, gzipped "
                          f"or raw") from None
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:   # gzip.BadGzipFile is an OSError
            raise DataError(f"{path}: cannot read ({exc}); expected {fmt}, gzipped or "
                            f"raw") from None
    if len(raw) < 8:
        raise DataError(f"{path}: truncated header; expected {fmt}")
    magic = int.from_bytes(raw[0:4], "big")
    if magic != expected_magic:
        raise DataError(f"{path}: wrong magic number {magic}; expected {fmt}")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated header; expected {fmt}")
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    count = int(np.prod(dims))
    if len(raw) - header != count:
        raise DataError(f"{path}: expected {count} bytes of data for shape {tuple(dims)}, "
                        f"found {len(raw) - header} (truncated or wrong format: {fmt})")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _find(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / (stem + ".gz")):
        if candidate.exists():
            return candidate
    raise DataError(f"missing file {folder / stem}[.gz]: expected the IDX file {stem} "
                    f"(gzipped or raw) in {folder}")


def _has_file(folder: Path, stem: str) -> bool:
    return (folder / stem).exists() or (folder / (stem + ".gz")).exists()


def _load_idx_dataset(name: str, root, seed: int, val_fraction: float, test: bool,
                      train_examples: int | None = None, standardize: bool = False) -> Dataset:
    stems = [stem for pair in _IDX_FILES.values() for stem in pair]
    folder = _data_root(name, root, tuple(f"{stem}[.gz]" for stem in stems),
                        lambda f: any(_has_file(f, stem) for stem in stems))
    arrays = {}
    for split, (img, lab) in _IDX_FILES.items():
        if split == "test" and not test:
            continue
        x = read_idx(_find(folder, img), 2051)
        y = read_idx(_find(folder, lab), 2049)
        if x.shape[0] != y.shape[0]:
            raise DataError(f"{folder / img}: {x.shape[0]} images but {y.shape[0]} labels")
        arrays[split] = (torch.tensor(x, dtype=torch.float32).div_(255.0).unsqueeze(1),
                         torch.tensor(y, dtype=torch.long))
    x, y = arrays["train"]
    xt, yt = arrays.get("test", (None, None))
    scaling = "pixels / 255"
    if standardize:
        # one mean and std over every pixel of the training pool, as Lee et al.'s released code
        mean, std = x.mean(), x.std()
        x = (x - mean) / std
        xt = (xt - mean) / std if xt is not None else None
        scaling += f", standardized with the pool's mean {float(mean):.6f} and std {float(std):.6f}"
    ds = split_dataset(name, "classification", x, y, 10, seed, val_fraction, test, xt, yt,
                       {"folder": str(folder), "format": "idx", "scaling": scaling})
    return _first_examples(ds, train_examples)


def _first_examples(ds: Dataset, train_examples: int | None) -> Dataset:
    """``ds`` with its training split cut to its first ``train_examples`` (the split's order is
    the seeded permutation, so these are a random sample); the validation and test splits are
    unchanged. None: the whole split."""
    if train_examples is None:
        return ds
    if isinstance(train_examples, bool) or not isinstance(train_examples, int) \
            or not 1 <= train_examples <= ds.n_train:
        raise DataError(f"{ds.name}: train_examples must be an integer in [1, {ds.n_train}] "
                        f"(the training split), got {train_examples!r}")
    return replace(ds, x_train=ds.x_train[:train_examples].clone(),
                   y_train=ds.y_train[:train_examples].clone(),
                   provenance={**ds.provenance, "n_train": train_examples,
                               "train_examples": train_examples})


@register("mnist")
def load_mnist(root: str | os.PathLike | None = None, seed: int = 0, val_fraction: float = 0.1,
               test: bool = False, train_examples: int | None = None,
               standardize: bool = False) -> Dataset:
    """MNIST from local IDX files (``train-images-idx3-ubyte[.gz]`` and friends), pixels / 255.

    ``standardize``: then minus the training pool's mean pixel and divided by its standard
    deviation (one number each, as Lee et al. 2021's released code). ``train_examples``: keep
    only the first that many of the training split (a seeded random sample; validation and
    test unchanged), for studies sized to a small machine."""
    return _load_idx_dataset("mnist", root, seed, val_fraction, test, train_examples, standardize)


@register("fashion_mnist")
def load_fashion_mnist(root: str | os.PathLike | None = None, seed: int = 0,
                       val_fraction: float = 0.1, test: bool = False,
                       train_examples: int | None = None, standardize: bool = False) -> Dataset:
    """Fashion-MNIST (Xiao et al. 2017) from local IDX files (same names as MNIST), pixels /
    255; ``standardize`` and ``train_examples`` as :func:`load_mnist`."""
    return _load_idx_dataset("fashion_mnist", root, seed, val_fraction, test, train_examples,
                             standardize)


# ---------------------------------------------------------------------------------------------
# CIFAR-10


CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch: pickle (encoding="bytes") with b"data" (n x 3072 uint8,
    R, G, B planes) and b"labels"."""
    fmt = 'a CIFAR-10 python batch (pickle with b"data" n x 3072 uint8 and b"labels")'
    if not path.exists():
        raise DataError(f"missing file {path}: expected {fmt}")
    try:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="bytes")
        data = np.asarray(d[b"data"], dtype=np.uint8)
        labels = np.asarray(d[b"labels"], dtype=np.int64)
    except OSError as exc:   # the file cannot be opened or read
        raise DataIOError(f"{path}: cannot read ({exc.strerror or exc}); expected {fmt}") from None
    except Exception as exc:  # pickle raises many types on bad input
        raise DataError(f"{path}: not {fmt} ({type(exc).__name__}: {exc})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or data.shape[0] != labels.shape[0]:
        raise DataError(f"{path}: data shape {data.shape} with {labels.shape[0]} labels; expected {fmt}")
    return data.reshape(-1, 3, 32, 32), labels


@register("cifar10")
def load_cifar10(root: str | os.PathLike | None = None, seed: int = 0, val_fraction: float = 0.1,
                 test: bool = False) -> Dataset:
    """CIFAR-10 from local python batches (``data_batch_1..5``, ``test_batch``; a
    ``cifar-10-batches-py`` sub-folder is searched too, see ``DATA_FOLDERS``). Pixels / 255, then standardized per
    channel with the training-pool mean and std."""
    folder = _data_root("cifar10", root, CIFAR_FILES,
                        lambda f: any((f / stem).exists() for stem in CIFAR_FILES))
    parts = [read_cifar_batch(folder / f"data_batch_{i}") for i in range(1, 6)]
    x = torch.tensor(np.concatenate([p[0] for p in parts]), dtype=torch.float32).div_(255.0)
    y = torch.tensor(np.concatenate([p[1] for p in parts]), dtype=torch.long)
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    std = x.std(dim=(0, 2, 3), keepdim=True)
    x = (x - mean) / std
    xt = yt = None
    if test:
        xt_np, yt_np = read_cifar_batch(folder / "test_batch")
        xt = (torch.tensor(xt_np, dtype=torch.float32).div_(255.0) - mean) / std
        yt = torch.tensor(yt_np, dtype=torch.long)
    return split_dataset("cifar10", "classification", x, y, 10, seed, val_fraction, test, xt, yt,
                   {"folder": str(folder), "format": "cifar10-python",
                    "scaling": "pixels / 255, per-channel standardization"})


# ---------------------------------------------------------------------------------------------
# synthetic


def _generator(seed: int, name: str) -> torch.Generator:
    # distinct streams per data set for the same seed
    digest = hashlib.sha256(f"{name}:{seed}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


@register("teacher")
def load_teacher(n: int = 2000, dim: int = 20, num_classes: int = 4, hidden: int = 32,
                 seed: int = 0, val_fraction: float = 0.2, test: bool = False) -> Dataset:
    """Classification with labels from a random teacher MLP (dim -> hidden -> num_classes, tanh):
    x ~ N(0, I), y = argmax teacher(x). A test set of ``n // 4`` fresh points when asked."""
    g = _generator(seed, "teacher")
    w1 = torch.randn(dim, hidden, generator=g) / dim ** 0.5
    w2 = torch.randn(hidden, num_classes, generator=g) / hidden ** 0.5
    x = torch.randn(n + n // 4, dim, generator=g)
    y = torch.argmax(torch.tanh(x @ w1) @ w2, dim=1)
    return split_dataset("teacher", "classification", x[:n], y[:n], num_classes, seed, val_fraction,
                   test, x[n:], y[n:], {"generator": "teacher-mlp", "n": n, "dim": dim,
                                        "hidden": hidden, "seed": seed})


@register("linreg")
def load_linreg(n: int = 1000, dim: int = 10, noise: float = 0.5, seed: int = 0,
                val_fraction: float = 0.2, test: bool = False) -> Dataset:
    """Gaussian linear regression: x ~ N(0, I_dim), y = x . w* + noise * N(0, 1), w* ~ N(0, I).
    ``provenance["w_star"]`` and ``provenance["noise"]`` hold the ground truth."""
    g = _generator(seed, "linreg")
    w = torch.randn(dim, generator=g)
    x = torch.randn(n + n // 4, dim, generator=g)
    y = x @ w + noise * torch.randn(n + n // 4, generator=g)
    return split_dataset("linreg", "regression", x[:n], y[:n], 0, seed, val_fraction, test, x[n:], y[n:],
                   {"generator": "linreg", "n": n, "dim": dim, "noise": noise, "seed": seed,
                    "w_star": w.tolist()})


# ---------------------------------------------------------------------------------------------
# text


@register("python_source")
def load_python_source(context: int = 64, stride: int | None = None, seed: int = 0,
                       val_fraction: float = 0.1, max_train_windows: int | None = None,
                       max_val_windows: int | None = None, root: str | None = None,
                       test: bool = False) -> Dataset:
    """The running Python's standard-library source as next-byte windows
    (:func:`training.data.text.load_python_source`)."""
    from training.data.text import load_python_source as load

    return load(context=context, stride=stride, seed=seed, val_fraction=val_fraction,
                max_train_windows=max_train_windows, max_val_windows=max_val_windows,
                root=root, test=test)
