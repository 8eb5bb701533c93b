"""A study's workload: its data set, its model and the masks of its sparsity levels.

The runner's workers, the driver (masks) and the probes all build the workload's pieces here, so
the network a group trains, the network its mask was scored on and the network the probes
measure are the same, bit for bit:

- the data set is loaded once per process (every group of a study shares it);
- the model is ``training.models.build(model, dataset, seed=seed, **model_options)``;
- the mask of (sparsity, seed) is ``pruning.prune`` of that model's initialization with the
  study's pruning method (Lee et al. 2021 prune at initialization and keep the mask fixed).

A :class:`Workload` is plain picklable data: it is shipped to worker processes with each group.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

import pruning
import training

from .spec import Spec, canonical_json

Mask = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Workload:
    """Names and options of a study's data set and model, and its pruning method."""

    dataset: str
    model: str
    dataset_options: dict[str, Any] = field(default_factory=dict)
    model_options: dict[str, Any] = field(default_factory=dict)
    pruning_method: str = "snip"

    @classmethod
    def of(cls, spec: Spec) -> "Workload":
        """The workload of a validated spec."""
        return cls(spec.dataset, spec.model, dict(spec.dataset_options), dict(spec.model_options),
                   spec.pruning_method)

    def load_dataset(self) -> training.Dataset:
        """The data set (cached per process)."""
        return _dataset_cached(canonical_json({"dataset": self.dataset,
                                               "options": self.dataset_options}))

    def build_model(self, dataset: training.Dataset, seed: int) -> torch.nn.Module:
        """The model initialized with ``seed``."""
        return training.models.build(self.model, dataset, seed=seed, **self.model_options)

    def mask(self, dataset: training.Dataset, sparsity: float, seed: int) -> Mask | None:
        """The mask of ``sparsity`` scored on the initialization ``build_model(dataset, seed)``
        (None when dense)."""
        if sparsity == 0:
            return None
        model = self.build_model(dataset, seed)
        mask = pruning.prune(model, self.pruning_method, sparsity, dataset=dataset, seed=seed)
        return {k: v.detach().clone() for k, v in mask.items()}

    def masks(self, dataset: training.Dataset, keys: Iterable[tuple[float, int]]
              ) -> dict[tuple[float, int], Mask | None]:
        """One mask per distinct (sparsity, seed) of ``keys``."""
        return {(s, seed): self.mask(dataset, s, seed) for s, seed in sorted(set(keys))}


@functools.lru_cache(maxsize=4)
def _dataset_cached(key: str) -> training.Dataset:
    d = json.loads(key)
    return training.data.load(d["dataset"], **d["options"])
