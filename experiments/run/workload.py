"""A study's workload: its data set, its model and the masks of its sparsity levels.

The runner's workers, the driver (masks) and the probes all build the workload's pieces here, so
the network a group trains, the network its mask was scored on and the network the probes
measure are the same, bit for bit:

- the data set is loaded once per process (every group of a study shares it), and copied onto
  a GPU once per process (:meth:`Workload.load_dataset` with ``device``);
- the model is ``training.models.build(model, dataset, seed=seed, **model_options)``;
- a data set or model named by import path (``"module:factory"``) is imported by each process
  itself, from its path and the spec's folders, and checked against the spec's digest of its
  source (:mod:`experiments.spec.factories`): the factory is never shipped, only its name;
- the mask of (sparsity, seed) is ``pruning.prune`` of that model's initialization with the
  study's pruning method (Lee et al. 2021 prune at initialization and keep the mask fixed),
  transformed by the series' sanity check if it has one (``experiments.spec.series.series_mask``);
  a criterion named by import path is imported, and checked against its digest, as a factory
  is (its digest under the kind ``"criterion"``).

A :class:`Workload` is plain picklable data: it is shipped to worker processes with each group.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

import pruning
import training

from experiments.spec import factories
from experiments.spec.series import record_masks, series_label, series_mask
from experiments.spec.study import Spec, canonical_json

Mask = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Workload:
    """Names (registered, or import paths) and options of a study's data set and model, its
    pruning method and the sanity check of its pruning series (None: the criterion's own
    masks); for factories by import path, their source digests by kind and the folders to
    search after ``sys.path``."""

    dataset: str
    model: str
    dataset_options: dict[str, Any] = field(default_factory=dict)
    model_options: dict[str, Any] = field(default_factory=dict)
    pruning_method: str = "snip"
    pruning_sanity: str | None = None
    digests: dict[str, str] = field(default_factory=dict)
    folders: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: Spec) -> "Workload":
        """The workload of a validated spec."""
        criterion = spec.method_digests.get(spec.pruning_method)
        digests = {**spec.digests, **({"criterion": criterion} if criterion else {})}
        return cls(spec.dataset, spec.model, dict(spec.dataset_options), dict(spec.model_options),
                   spec.pruning_method, spec.pruning_sanity, digests, spec.folders)

    def load_dataset(self, device: str = "cpu") -> training.Dataset:
        """The data set (cached per process; a factory's by its digest too), on ``device``: a
        GPU's copy is made once per process and kept, so that no group copies it again (the
        trainers' ``Dataset.to`` of a data set already there returns it as it is)."""
        factory = ({"digest": self.digests.get("dataset"), "folders": list(self.folders)}
                   if factories.is_path(self.dataset) else {})
        key = canonical_json({"dataset": self.dataset, "options": self.dataset_options, **factory})
        return _dataset_cached(key) if device == "cpu" else _dataset_on(key, device)

    def build_model(self, dataset: training.Dataset, seed: int) -> torch.nn.Module:
        """The model initialized with ``seed``."""
        if factories.is_path(self.model):
            return factories.build_model(self.model, dataset, seed, self.model_options,
                                         self.folders, self.digests.get("model"))
        return training.models.build(self.model, dataset, seed=seed, **self.model_options)

    def pruned(self, dataset: training.Dataset, sparsity: float, seed: int
               ) -> pruning.Mask | None:
        """The ``pruning.Mask`` of ``sparsity`` for the initialization
        ``build_model(dataset, seed)`` (None when dense): the pruning method's, transformed by
        the series' sanity check (``experiments.spec.series.series_mask``)."""
        if sparsity == 0:
            return None
        if factories.is_path(self.pruning_method):   # imported here, from the spec's folders
            factories.resolve("criterion", self.pruning_method, self.folders,
                              self.digests.get("criterion"))
        return series_mask(self.pruning_method, self.pruning_sanity, sparsity, seed, dataset,
                           functools.partial(self.build_model, dataset))

    def mask(self, dataset: training.Dataset, sparsity: float, seed: int) -> Mask | None:
        """The entries of :meth:`pruned` as plain tensors (None when dense)."""
        return _plain(self.pruned(dataset, sparsity, seed))

    def masks(self, dataset: training.Dataset, keys: Iterable[tuple[float, int]],
              record: str | os.PathLike | None = None) -> dict[tuple[float, int], Mask | None]:
        """One mask per distinct (sparsity, seed) of ``keys``. ``record``: a run folder to
        write the masks' recipes and diagnoses into (``masks.json``,
        ``experiments.spec.series.record_masks``)."""
        made = {key: self.pruned(dataset, *key) for key in sorted(set(keys))}
        sparse = {key: m for key, m in made.items() if m is not None}
        if record is not None and sparse:
            record_masks(record, series_label(self.pruning_method, self.pruning_sanity), sparse,
                         functools.partial(self.build_model, dataset))
        return {key: _plain(m) for key, m in made.items()}


def _plain(mask: pruning.Mask | None) -> Mask | None:
    """A mask's entries as plain tensors (what is shipped to the workers); None stays None."""
    return None if mask is None else {k: v.detach().clone() for k, v in mask.items()}


@functools.lru_cache(maxsize=2)
def _dataset_on(key: str, device: str) -> training.Dataset:
    return _dataset_cached(key).to(training.device.resolve_device(device))


@functools.lru_cache(maxsize=4)
def _dataset_cached(key: str) -> training.Dataset:
    d = json.loads(key)
    if factories.is_path(d["dataset"]):
        return factories.load_dataset(d["dataset"], d["options"], d["folders"], d["digest"])
    return training.data.load(d["dataset"], **d["options"])
