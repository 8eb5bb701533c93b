"""Sparsity masks: parameter name -> 0/1 tensor, and what is prunable.

A :class:`Mask` is a read-only ``Mapping[str, Tensor]`` so every trainer accepts it directly
(``training.train_reference(mask=...)``, ``training.train_trials(masks=...)``); checking and
applying it is :mod:`training.masks`' job, so a bad mask raises the same :class:`MaskError`
here and in the trainers. Entries exist only
for prunable parameters; every other parameter is dense. By default the prunable parameters are
the weights of ``nn.Linear`` and ``nn.Conv1d/2d/3d`` layers and biases are kept (Lee et al.'s code
also prunes biases, which start at zero so SNIP scores them 0: ``prune_biases=True`` reproduces
that).
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.masks import MaskError, apply_mask, check_entry

from pruning.errors import MaskIOError

PRUNABLE_MODULES = (nn.Linear, nn.modules.conv._ConvNd)


def prunable_parameters(model: nn.Module, prune_biases: bool = False) -> dict[str, nn.Parameter]:
    """Prunable parameters of ``model`` by name, in ``named_parameters`` order: the ``weight`` of
    every Linear / Conv layer, plus their ``bias`` when ``prune_biases``."""
    wanted: set[int] = set()
    for module in model.modules():
        if isinstance(module, PRUNABLE_MODULES):
            wanted.add(id(module.weight))
            if prune_biases and module.bias is not None:
                wanted.add(id(module.bias))
    out = {name: p for name, p in model.named_parameters() if id(p) in wanted}
    if not out:
        raise MaskError(f"model {type(model).__name__} has no prunable parameters "
                        f"(weights of Linear / Conv layers)")
    return out


class Mask(Mapping[str, torch.Tensor]):
    """Immutable mapping parameter name -> float32 0/1 tensor of the parameter's shape
    (1 = kept, 0 = pruned), with metadata ``info`` (criterion, requested sparsity, scope, seed, ...).
    The tensors are shared, not copied, on access: treat them as read-only.

    >>> mask = pruning.prune(net, "snip", sparsity=0.9, dataset=ds)
    >>> mask.sparsity(), mask.layer_sparsity()["1.weight"]
    >>> mask.apply(net)   # zero pruned weights in place
    """

    def __init__(self, entries: Mapping[str, Any], info: Mapping[str, Any] | None = None):
        if not isinstance(entries, Mapping) or len(entries) == 0:
            raise MaskError("a mask needs at least one entry name -> 0/1 tensor")
        if info is not None and not isinstance(info, Mapping):
            raise MaskError(f"mask info must be a mapping (criterion, sparsity, ...), got "
                            f"{type(info).__name__}")
        self._entries = {str(k): check_entry(str(k), v).cpu().to(torch.float32).contiguous()
                         for k, v in entries.items()}
        for t in self._entries.values():
            t.requires_grad_(False)
        self.info: dict[str, Any] = dict(info or {})

    # Mapping protocol ----------------------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return (list(self) == list(other)
                and all(torch.equal(self[k], torch.as_tensor(other[k]).to(torch.float32))
                        for k in self))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        criterion = self.info.get("criterion", "?")
        return (f"Mask({len(self)} entries, criterion={criterion!r}, "
                f"kept {self.kept()}/{self.total()}, sparsity={self.sparsity():.4f})")

    # construction ----------------------------------------------------------------------------
    @classmethod
    def dense(cls, model: nn.Module, prune_biases: bool = False) -> "Mask":
        """All-ones mask over ``model``'s prunable parameters (sparsity 0)."""
        params = prunable_parameters(model, prune_biases)
        return cls({k: torch.ones_like(p, dtype=torch.float32, device="cpu")
                    for k, p in params.items()}, {"criterion": "dense", "sparsity": 0.0})

    @staticmethod
    def stack(masks: list[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Per-trial masks for the vectorized trainer: name -> tensor [N, *shape], trial i's mask
        at index i. All masks need the same names and shapes."""
        if not masks:
            raise MaskError("Mask.stack needs a non-empty list of masks")
        names = list(masks[0])
        for i, m in enumerate(masks[1:], start=1):
            if list(m) != names:
                raise MaskError(f"Mask.stack: mask {i} has entries {list(m)}, mask 0 has {names}")
        out = {}
        for name in names:
            shapes = {tuple(m[name].shape) for m in masks}
            if len(shapes) != 1:
                raise MaskError(f"Mask.stack: entry {name!r} has different shapes {sorted(shapes)}")
            out[name] = torch.stack([torch.as_tensor(m[name]).to(torch.float32) for m in masks])
        return out

    # accounting ----------------------------------------------------------------------------
    def kept(self, name: str | None = None) -> int:
        """Number of kept entries (in one entry ``name``, or in all)."""
        tensors = [self._entry(name)] if name is not None else self._entries.values()
        return int(sum(int(t.sum()) for t in tensors))

    def total(self, name: str | None = None) -> int:
        """Number of entries (in one entry ``name``, or in all)."""
        tensors = [self._entry(name)] if name is not None else self._entries.values()
        return int(sum(t.numel() for t in tensors))

    def density(self, name: str | None = None) -> float:
        """Fraction kept: kept / total (overall, or of entry ``name``)."""
        return self.kept(name) / self.total(name)

    def sparsity(self, name: str | None = None) -> float:
        """Fraction pruned: 1 - density (overall over the masked parameters, or of ``name``)."""
        return 1.0 - self.density(name)

    def layer_sparsity(self) -> dict[str, float]:
        """Sparsity of every entry."""
        return {k: self.sparsity(k) for k in self}

    def _entry(self, name: str) -> torch.Tensor:
        if name not in self._entries:
            raise MaskError(f"mask has no entry {name!r}; entries: {', '.join(self._entries)}")
        return self._entries[name]

    # use -------------------------------------------------------------------------------------
    def apply(self, model: nn.Module) -> nn.Module:
        """Zero the pruned weights of ``model`` in place (idempotent,
        :func:`training.masks.apply_mask`) and return it."""
        if not isinstance(model, nn.Module):
            raise MaskError(f"a mask applies to a torch.nn.Module, got {type(model).__name__}")
        apply_mask(model, self)
        return model

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: totals, per-entry kept / total / sparsity / shape, and ``info``."""
        return {
            "kept": self.kept(), "total": self.total(), "density": self.density(),
            "sparsity": self.sparsity(), "info": _jsonable(self.info),
            "layers": {k: {"shape": list(t.shape), "kept": self.kept(k), "total": t.numel(),
                           "sparsity": self.sparsity(k)} for k, t in self._entries.items()},
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tensors with ``torch.save`` to ``path`` (bool tensors, ``.pt`` added if
        missing) and the :meth:`to_dict` summary beside it as ``.json``. Returns the ``.pt``."""
        path = Path(path)
        if path.suffix != ".pt":
            path = path.with_name(path.name + ".pt")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"entries": {k: v.bool() for k, v in self._entries.items()},
                        "info": _jsonable(self.info)}, path)
            path.with_suffix(".json").write_text(json.dumps(self.to_dict(), indent=2))
        except OSError as exc:
            raise MaskIOError(f"cannot write the mask {path} ({exc.strerror or exc})") from None
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Mask":
        """Read a mask written by :meth:`save` (the ``.pt`` file): a file that cannot be read
        raises :class:`MaskIOError`, one that holds no mask :class:`MaskError`. The criterion a
        file saved before 2026-12 records as ``info["method"]`` is read as ``info["criterion"]``."""
        path = Path(path)
        if not path.exists() and path.with_name(path.name + ".pt").exists():
            path = path.with_name(path.name + ".pt")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise MaskIOError(f"{path}: cannot read a mask file ({exc.strerror or exc})") from None
        try:
            blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            entries, info = blob["entries"], blob["info"]
        except (pickle.UnpicklingError, RuntimeError, KeyError, TypeError, EOFError,
                ValueError) as exc:
            raise MaskError(f"{path}: not a mask file written by Mask.save ({exc})") from None
        if "method" in info and "criterion" not in info:   # saved before 2026-12
            info = {("criterion" if k == "method" else k): v for k, v in info.items()}
        return cls(entries, info)


def _jsonable(value: Any) -> Any:
    """Info values as JSON types (tuples become lists, unknown objects their ``str``)."""
    return json.loads(json.dumps(value, default=str))
