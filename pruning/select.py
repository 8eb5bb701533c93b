"""From scores to a 0/1 mask: keep exactly round(N * (1 - sparsity)) entries.

Scores are keep-priorities (larger = more worth keeping). Ties are broken deterministically:
among equal scores the entry that comes first wins, in parameter order then row-major order
(a stable sort). ``-inf`` marks entries that must go first (already pruned in an iterative
schedule); NaN scores are an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from pruning.errors import PruningError

SCOPES = ("global", "layer", "even")


def check_sparsity(sparsity: float) -> float:
    """``sparsity`` as a float in [0, 1), else PruningError naming what is allowed."""
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) \
            or not math.isfinite(sparsity) or not 0.0 <= sparsity < 1.0:
        raise PruningError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
    return float(sparsity)


def check_scope(scope: str) -> str:
    """``scope`` if it is one of SCOPES, else PruningError naming what is allowed."""
    if scope not in SCOPES:
        raise PruningError(f"unknown scope {scope!r}; allowed: {', '.join(SCOPES)}")
    return scope


def kept_count(n: int, sparsity: float) -> int:
    """Entries kept out of ``n`` at ``sparsity``: Python's ``round(n * (1 - sparsity))``."""
    return int(round(n * (1.0 - sparsity)))


def layer_quotas(sizes: list[int], sparsity: float) -> list[int]:
    """Kept entries per layer for ``scope="layer"``: each layer keeps floor(n_l * (1 - s)) and the
    remaining round(N * (1 - s)) - sum of floors go one each to the layers with the largest
    fractional parts (largest-remainder apportionment; ties to the earlier layer), so every layer
    is within one entry of its share and the total is exact."""
    density = 1.0 - sparsity
    exact = [n * density for n in sizes]
    quotas = [min(n, math.floor(e)) for n, e in zip(sizes, exact)]
    extra = kept_count(sum(sizes), sparsity) - sum(quotas)
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - quotas[i]), i))
    for i in order[:max(extra, 0)]:
        quotas[i] += 1
    return quotas


def even_quotas(sizes: list[int], sparsity: float) -> list[int]:
    """Kept entries per layer for ``scope="even"``: the round(N * (1 - s)) kept entries split
    evenly across the layers, a layer never keeping more than it has (water-filling): the largest
    level t with sum_l min(n_l, t) <= K, then one more each for the first K - sum_l min(n_l, t)
    layers (parameter order) with n_l > t. Each quota is non-decreasing in K, so an iterative
    schedule never has to revive a pruned entry."""
    k = kept_count(sum(sizes), sparsity)
    lo, hi = 0, max(sizes)
    while lo < hi:   # largest t with sum(min(n, t)) <= k
        t = (lo + hi + 1) // 2
        lo, hi = (t, hi) if sum(min(n, t) for n in sizes) <= k else (lo, t - 1)
    quotas = [min(n, lo) for n in sizes]
    extra = k - sum(quotas)
    for i in [i for i, n in enumerate(sizes) if n > lo][:extra]:
        quotas[i] += 1
    return quotas


def _keep_top(flat: torch.Tensor, k: int) -> torch.Tensor:
    keep = torch.zeros(flat.numel(), dtype=torch.float32)
    if k > 0:
        order = torch.sort(flat, descending=True, stable=True).indices
        keep[order[:k]] = 1.0
    return keep


def _flat_scores(scores: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    flat = {k: v.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
            for k, v in scores.items()}
    for name, v in flat.items():
        if bool(torch.isnan(v).any()):
            raise PruningError(f"pruning scores of {name!r} contain NaN")
    return flat


def top_k_per_entry(scores: Mapping[str, torch.Tensor],
                    counts: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """0/1 tensors keeping the ``counts[name]`` highest-scoring entries of every ``name``."""
    flat = _flat_scores(scores)
    for name, v in flat.items():
        if not 0 <= counts[name] <= v.numel():
            raise PruningError(f"kept count of {name!r} must be in [0, {v.numel()}], "
                               f"got {counts[name]}")
    return {k: _keep_top(v, counts[k]).reshape(scores[k].shape) for k, v in flat.items()}


def top_k_mask(scores: Mapping[str, torch.Tensor], sparsity: float,
               scope: str = "global") -> dict[str, torch.Tensor]:
    """0/1 tensors keeping the highest-scoring round(N * (1 - sparsity)) entries, either ranked
    across all entries at once (``"global"``, one threshold as SNIP) or within each entry with
    :func:`layer_quotas` (``"layer"``) or :func:`even_quotas` (``"even"``)."""
    check_sparsity(sparsity)
    check_scope(scope)
    if scope != "global":
        sizes = [v.numel() for v in scores.values()]
        quotas = (layer_quotas if scope == "layer" else even_quotas)(sizes, sparsity)
        return top_k_per_entry(scores, dict(zip(scores, quotas)))
    flat = _flat_scores(scores)
    names = list(flat)
    keep = _keep_top(torch.cat([flat[k] for k in names]),
                     kept_count(sum(v.numel() for v in flat.values()), sparsity))
    parts = torch.split(keep, [flat[k].numel() for k in names])
    return {k: p.reshape(scores[k].shape) for k, p in zip(names, parts)}
