"""Per-example squared norms of preconditioned gradients, |P o g_i|^2, of one layer from its
inputs and output gradients (the preconditioned part of :mod:`theory.monitor.parts`).

P scales each parameter elementwise (Adam's 1 / (sqrt(v_hat) + eps)), so the factored forms of
:mod:`theory.monitor.layer_norms` (|d_i|^2 |a_i|^2, the Gram form) no longer apply, except on
one position: there g_i(W) = d_i a_i^T and

    |P o g_i(W)|^2 = sum_ok P_ok^2 d_io^2 a_ik^2 = (d_i^2)^T (P^2) (a_i^2)

(one product of the batch's squared output gradients with P^2). Elsewhere each example's
gradient is formed as the same module's formulas give it (the materialized forms: the
``[B, O, K]`` sums of a Linear layer over positions or a convolution's windows, an Embedding's
``[B, V, D]`` rows, a norm layer's ``[B, features]``) and scaled by P before squaring, so this
part costs memory of the batch's per-example gradients of one layer at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from theory.errors import TheoryError
from theory.monitor.layer_norms import (
    Terms, _compute_dtype, _positions, _rows, _windows, embedding_slots, normalized,
)

Pairs = list[tuple[torch.Tensor, torch.Tensor]]
# a layer's P by parameter name ("weight", "bias"); None: not preconditioned (left out)
Scales = dict[str, torch.Tensor | None]


def _linear(terms: Terms, module: nn.Linear, calls: Pairs, p: Scales) -> None:
    b = calls[0][0].shape[0]
    dt = _compute_dtype(calls[0][1])
    a = _positions([_rows(x, b, module.in_features) for x, _ in calls], dt)
    d = _positions([_rows(g, b, module.out_features) for _, g in calls], dt)
    if p.get("weight") is not None:
        w = p["weight"].to(dt)
        if a.shape[1] == 1:
            terms.extras.append(((d[:, 0] ** 2) @ (w * w) * a[:, 0] ** 2).sum(1))
        else:
            terms.squares.append(torch.bmm(d.transpose(1, 2), a) * w)
    if p.get("bias") is not None:
        terms.squares.append(d.sum(1) * p["bias"].to(dt))


def _conv(terms: Terms, module: nn.Conv1d | nn.Conv2d, calls: Pairs, p: Scales) -> None:
    b, groups = calls[0][0].shape[0], module.groups
    dt = _compute_dtype(calls[0][1])
    a = torch.cat([_windows(module, x.to(dt)) for x, _ in calls], 2)
    d = torch.cat([g.reshape(b, module.out_channels, -1).to(dt) for _, g in calls], 2)
    if p.get("weight") is not None:
        positions = a.shape[2]
        a_g = a.view(b, groups, -1, positions).transpose(2, 3).reshape(b * groups, positions, -1)
        d_g = d.view(b, groups, -1, positions).transpose(2, 3).reshape(b * groups, positions, -1)
        # [B G, O / G, K / G] -> [B, O, K / G]: the rows of the weight's flattened layout
        product = torch.bmm(d_g.transpose(1, 2), a_g).reshape(b, module.out_channels, -1)
        terms.squares.append(product * p["weight"].to(dt).reshape(module.out_channels, -1))
    if p.get("bias") is not None:
        terms.squares.append(d.sum(2) * p["bias"].to(dt))


def _embedding(terms: Terms, module: nn.Embedding, calls: Pairs, p: Scales) -> None:
    if p.get("weight") is None:
        return
    idx, d = embedding_slots(module, calls)
    rows = d.new_zeros(d.shape[0], module.num_embeddings, module.embedding_dim)
    rows.scatter_add_(1, idx.unsqueeze(2).expand_as(d), d)
    terms.squares.append(rows * p["weight"].to(d.dtype))


def _norm(terms: Terms, module: nn.LayerNorm | nn.RMSNorm, calls: Pairs, p: Scales) -> None:
    b = calls[0][0].shape[0]
    dt = _compute_dtype(calls[0][1])
    shape = module.normalized_shape
    g = _positions([_rows(g, b, *shape) for _, g in calls], dt)
    if p.get("weight") is not None:
        x = _positions([_rows(x, b, *shape) for x, _ in calls], dt)
        terms.squares.append(torch.linalg.vecdot(g, normalized(module, x), dim=1)
                             * p["weight"].to(dt))
    if p.get("bias") is not None:
        terms.squares.append(g.sum(1) * p["bias"].to(dt))


ScaledFunction = Callable[[Terms, nn.Module, Pairs, Scales], None]

_LAYERS: tuple[tuple[type | tuple[type, ...], ScaledFunction], ...] = (
    (nn.Linear, _linear), ((nn.Conv1d, nn.Conv2d), _conv), (nn.Embedding, _embedding),
    ((nn.LayerNorm, nn.RMSNorm), _norm))


def scaled_function(module: nn.Module) -> ScaledFunction:
    """The function adding ``module``'s preconditioned per-example terms to a :class:`Terms`:
    ``f(terms, module, calls, scales)`` (a layer of :data:`theory.monitor.layer_norms.SUPPORTED`)."""
    for kinds, scaled in _LAYERS:
        if isinstance(module, kinds):
            return scaled
    raise TheoryError(f"{type(module).__name__} has no preconditioned per-example terms; "
                      f"supported: the layers of theory.monitor.layer_norms.SUPPORTED")
