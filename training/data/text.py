"""Text data: ``python_source``, the bytes of the running Python's standard library, as
next-byte prediction windows for a byte-level language model.

The corpus is every ``.py`` file under ``sysconfig.get_paths()["stdlib"]``, in sorted order of
their paths relative to that folder, except tests (any path component that starts with
``test``: ``test/``, ``tests/``, ``idlelib/idle_test``, ``lib2to3/tests``, ``test_*.py``),
``site-packages``, ``dist-packages`` and ``__pycache__`` (:func:`stdlib_files`). It needs
nothing but the interpreter, so it is offline everywhere; it differs between Python versions,
so the data set's provenance records the version and a SHA-256 digest of the corpus (each
file's relative path and bytes, in order), which a study's store keeps with its results.

**Split by file.** A seeded permutation of the files (``torch.randperm`` with ``seed``) puts the
first ``max(1, round(n_files * val_fraction))`` in the validation split, the rest in training:
no file contributes to both. Each split's files are concatenated, in sorted path order, into one
byte stream.

**Windows.** An example is a window of ``context`` bytes of a stream: input
``x = s[i : i + context]`` and target ``y = s[i + 1 : i + context + 1]`` (the next byte at every
position), for starts ``i = 0, stride, 2 stride, ...`` while the target fits. The task is
classification over 256 byte values at every position: ``y`` has shape ``[n, context]`` and a
model outputs ``[n, context, 256]`` logits; the loss is the mean over positions of the
cross-entropy (so an example's loss is its mean per-byte cross-entropy, in nats) and the goal
metric ``loss`` is its mean over the validation windows. ``loss / ln 2`` is bits per byte.
Inputs are held as float32 byte values 0..255 (exact), like every data set's inputs; a model
casts them to indices (``training.models.transformer_lm`` does).
``max_train_windows`` / ``max_val_windows`` keep that many windows evenly spaced over the stream
(every window when None), so the data fit in memory at any context.
"""

from __future__ import annotations

import hashlib
import math
import platform
import sysconfig
from pathlib import Path

import torch

from training.data.dataset import Dataset
from training.errors import DataError

# path components that mark a file as not part of the corpus (besides any starting with "test")
EXCLUDED_PARTS = ("site-packages", "dist-packages", "__pycache__", "idle_test")
BYTE_VALUES = 256
# registered data sets whose examples are bytes: their loss is nats per byte
BYTE_LEVEL = ("python_source",)


def stdlib_root() -> Path:
    """The running interpreter's standard-library folder (``sysconfig``'s ``stdlib`` path)."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_corpus_file(relative: Path) -> bool:
    """True for a ``.py`` file that is not a test and not an installed package: no path
    component starts with ``test`` or is one of ``EXCLUDED_PARTS``."""
    return relative.suffix == ".py" and not any(
        part.startswith("test") or part in EXCLUDED_PARTS for part in relative.parts)


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The corpus' files, relative to ``root`` (default :func:`stdlib_root`), sorted by their
    POSIX path (the same order on every machine with the same files)."""
    root = stdlib_root() if root is None else Path(root)
    if not root.is_dir():
        raise DataError(f"python_source: the standard-library folder {root} does not exist")
    found = [p.relative_to(root) for p in root.rglob("*.py") if p.is_file()]
    return sorted((p for p in found if is_corpus_file(p)), key=lambda p: p.as_posix())


def corpus_digest(root: Path, files: list[Path], contents: list[bytes]) -> str:
    """SHA-256 (first 16 hex digits) of the corpus: each file's relative POSIX path and length,
    then its bytes, in order."""
    h = hashlib.sha256()
    for rel, data in zip(files, contents):
        h.update(f"{rel.as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def windows(stream: torch.Tensor, context: int, stride: int, limit: int | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the windows of a uint8 ``stream``: starts ``0, stride, ...`` with
    ``start + context + 1 <= len(stream)``; inputs ``stream[i:i+context]`` as float32, targets
    ``stream[i+1:i+context+1]`` as int64. ``limit``: that many starts, evenly spaced over all."""
    count = (stream.numel() - context - 1) // stride + 1 if stream.numel() > context else 0
    if count < 1:
        raise DataError(f"python_source: a split of {stream.numel()} bytes holds no window of "
                        f"context {context} (it needs context + 1 bytes)")
    starts = torch.arange(count) * stride
    if limit is not None and limit < count:
        starts = starts[torch.linspace(0, count - 1, limit).round().long()]
    index = starts[:, None] + torch.arange(context + 1)
    both = stream[index]
    return both[:, :-1].to(torch.float32), both[:, 1:].to(torch.int64)


def _positive(value: object, name: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataError(f"python_source: {name} must be an integer >= 1"
                        f"{' or None' if allow_none else ''}, got {value!r}")


def load_python_source(context: int = 64, stride: int | None = None, seed: int = 0,
                       val_fraction: float = 0.1, max_train_windows: int | None = None,
                       max_val_windows: int | None = None, root: str | None = None,
                       test: bool = False) -> Dataset:
    """The ``python_source`` data set (module docstring): windows of ``context`` bytes every
    ``stride`` bytes (default ``context``: windows that do not overlap), validation files a
    ``val_fraction`` of the files drawn with ``seed``. ``root``: another folder of ``.py`` files
    instead of the standard library (tests). There is no test split (``test=True`` is refused).

    Provenance: ``python_version``, ``corpus_digest``, ``files``, ``bytes``, the train and
    validation files' counts and bytes, ``context``, ``stride`` and the window counts.
    """
    _positive(context, "context")
    stride = context if stride is None else stride
    _positive(stride, "stride")
    _positive(max_train_windows, "max_train_windows", allow_none=True)
    _positive(max_val_windows, "max_val_windows", allow_none=True)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) \
            or not 0.0 < val_fraction < 1.0:
        raise DataError(f"python_source: val_fraction must be in (0, 1), got {val_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"python_source: seed must be an integer, got {seed!r}")
    if test:
        raise DataError("python_source has no test split: its held-out data is the validation "
                        "split (whole files)")
    base = stdlib_root() if root is None else Path(root)
    files = stdlib_files(base)
    if len(files) < 2:
        raise DataError(f"python_source: {base} holds {len(files)} corpus file(s); the split "
                        f"by file needs at least 2")
    contents = [(base / f).read_bytes() for f in files]
    n_val = max(1, int(round(len(files) * val_fraction)))
    if n_val >= len(files):
        raise DataError(f"python_source: val_fraction={val_fraction} of {len(files)} files "
                        f"leaves no training file")
    perm = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    val_files = sorted(perm[:n_val])
    train_files = sorted(perm[n_val:])

    def stream(indices: list[int]) -> torch.Tensor:
        data = b"".join(contents[i] for i in indices)
        return (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
                else torch.zeros(0, dtype=torch.uint8))   # only empty files (__init__.py)

    train, val = stream(train_files), stream(val_files)
    x_tr, y_tr = windows(train, context, stride, max_train_windows)
    x_va, y_va = windows(val, context, stride, max_val_windows)
    provenance = {
        "source": "python standard library" if root is None else str(base),
        "python_version": platform.python_version(),
        "corpus_digest": corpus_digest(base, files, contents),
        "files": len(files), "bytes": sum(len(c) for c in contents),
        "train_files": len(train_files), "train_bytes": int(train.numel()),
        "val_files": len(val_files), "val_bytes": int(val.numel()),
        "split": "by file", "split_seed": seed, "val_fraction": val_fraction,
        "context": context, "stride": stride,
        "n_train": int(x_tr.shape[0]), "n_val": int(x_va.shape[0]),
        "bits_per_byte": f"loss / ln 2 = loss / {math.log(2):.6f}",
    }
    return Dataset(name="python_source", task="classification", x_train=x_tr, y_train=y_tr,
                   x_val=x_va, y_val=y_va, num_classes=BYTE_VALUES, input_shape=(context,),
                   provenance=provenance)


def bits_per_byte(loss: float) -> float:
    """A mean per-byte cross-entropy in nats as bits per byte: ``loss / ln 2``."""
    return loss / math.log(2)
