"""The registry of models: ``register`` a builder under a name, ``build`` it seeded for a data set.

Any ``nn.Module`` of your own works without registering: the registry names the bundled models
(:mod:`training.models.zoo`) and a process's own, for studies and the command line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from training import randomness
from training.data.dataset import Dataset, check_dataset
from training.errors import ModelError
from training.models.initialization import initialize
from training.registry import Registry


Builder = Callable[..., nn.Module]
MODELS: Registry[Builder] = Registry("model", ModelError, sort=True)


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator adding a model builder to the registry as ``name``: the way to add a named
    model to this process.

    The builder is called as ``fn(dataset, **options)``: ``dataset`` is the
    :class:`training.Dataset` the model trains on (read ``input_shape``, ``task`` and
    ``num_classes`` from it, or use :func:`output_size`), ``options`` are a study's
    ``[workload] model_options`` (JSON values). It must return a fresh ``torch.nn.Module`` whose
    parameters are drawn from torch's global generator, which :func:`build` seeds with the
    study's seed (so every replicate seed gives its own initialization, the same in every
    process). A study names it as ``[workload] model = "<name>"``.

    A registration lives in the process that made it: the worker processes of a study (the
    local pool, Dask) do not see one made in a notebook or a script. For a model of your own,
    name its factory by import path instead (``model = "mymodels:mlp"``, same signature; see
    :mod:`experiments.spec.factories`).

    A name already registered by another function is refused with a :class:`ModelError`
    (:class:`training.registry.Registry`); ``MODELS.remove(name)`` frees it.
    """
    return MODELS.register(name)


def list_models() -> list[str]:
    """Names accepted by :func:`build`."""
    return MODELS.names()


def output_size(dataset: Dataset) -> int:
    """Output units: one per class, or one for regression."""
    return dataset.num_classes if dataset.task == "classification" else 1


def build(name: str, dataset: Dataset, seed: int = 0, *, init: str = "torch",
          **options: Any) -> nn.Module:
    """Build model ``name`` for ``dataset`` (input shape and output size taken from it),
    initialized with ``seed`` by scheme ``init`` (``"torch"``: as the builder makes it;
    ``"lee"``: :func:`training.models.initialization.lee_init_`)."""
    check_dataset(dataset, "build")
    builder = MODELS.get(name)
    with seeded(seed):
        try:
            model = builder(dataset, **options)
        except TypeError as exc:
            raise ModelError(f"bad options for model {name!r}: {exc}") from None
    return initialize(model, init, seed)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with torch's global CPU generator seeded by ``seed``, restored after.

    One body at a time: the generator is process-wide, so models built by concurrent threads (a
    thread pool running groups) each get their own seed's weights."""
    with randomness.preserved("cpu"):
        torch.manual_seed(seed)
        yield


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())
