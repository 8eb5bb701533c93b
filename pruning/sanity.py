"""Sanity checks for pruning at initialization (Frankle et al. 2021; Su et al. 2020).

If a criterion's masks train as well after these transforms, the criterion mostly chooses how
dense each layer is, not which weights survive:

- :func:`shuffle_layers`: permute each layer's mask at random (same count per layer, new
  positions; Frankle et al. 2021's "random shuffling", Su et al. 2020's "layerwise rearrange");
- :func:`matched_random`: a fresh uniformly random mask with the same kept count in every layer
  (Su et al. 2020's random tickets with the criterion's layer-wise ratios). It has the same
  distribution as a shuffle; it is drawn independently of the mask's positions, from the seed
  alone, so two criteria with equal layer counts get the same random mask;
- :func:`reinitialize`: the same mask on weights from another initialization (Frankle et al.
  2021's "reinitialization"; a study applies the mask of one init to the weights of another);
- inverted scores are ``pruning.prune(..., keep="lowest")``; random masks in the "global",
  "layer" and "even" variants are ``pruning.prune(model, "random", scope=...)``.

Every transform is seeded by ``torch.Generator().manual_seed(seed)`` and keeps every layer's
kept count exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import nn

from pruning.criteria import random_scores
from pruning.errors import PruningError
from pruning.mask import Mask
from pruning.select import top_k_per_entry


def _as_mask(mask: Mapping[str, torch.Tensor]) -> Mask:
    return mask if isinstance(mask, Mask) else Mask(mask)


def _derived_info(mask: Mask, transform: str, seed: int) -> dict:
    return {**mask.info, "transform": transform, "transform_seed": int(seed)}


def shuffle_layers(mask: Mapping[str, torch.Tensor], seed: int) -> Mask:
    """``mask`` with each entry's values permuted uniformly at random (``torch.randperm`` per
    entry, in entry order): every layer keeps exactly its kept count, at new positions."""
    mask = _as_mask(mask)
    g = torch.Generator().manual_seed(int(seed))
    out = {k: m.reshape(-1)[torch.randperm(m.numel(), generator=g)].reshape(m.shape)
           for k, m in mask.items()}
    return Mask(out, _derived_info(mask, "shuffle", seed))


def matched_random(mask: Mapping[str, torch.Tensor], seed: int) -> Mask:
    """A uniformly random mask with ``mask``'s kept count in every entry: the top-count entries
    of U(0, 1) scores drawn from ``seed`` (``criteria.random_scores``)."""
    mask = _as_mask(mask)
    scores = random_scores(mask, seed)
    out = top_k_per_entry(scores, {k: mask.kept(k) for k in mask})
    return Mask(out, _derived_info(mask, "matched_random", seed))


@torch.no_grad()
def reinitialize(model: nn.Module, seed: int,
                 mask: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
    """A copy of ``model`` with fresh weights: ``reset_parameters()`` of every module that owns
    parameters, in ``model.modules()`` order, under ``torch.manual_seed(seed)`` (the process RNG
    is restored afterwards); then ``mask`` applied (pruned weights zeroed), if given.

    For models built by ``training.models.build`` (modules constructed in the order they are
    registered) this reproduces ``build(name, dataset, seed=seed)`` exactly. Raises PruningError
    naming a module that owns parameters but has no ``reset_parameters``.
    """
    work = copy.deepcopy(model)
    owners = [(n, m) for n, m in work.named_modules()
              if any(True for _ in m.parameters(recurse=False))]
    lacking = [n or type(m).__name__ for n, m in owners if not hasattr(m, "reset_parameters")]
    if lacking:
        raise PruningError(f"cannot reinitialize: module(s) {', '.join(lacking)} own parameters "
                           f"but have no reset_parameters()")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        for _, m in owners:
            m.reset_parameters()
    return _as_mask(mask).apply(work) if mask is not None else work
