"""Sparsity masks on weights, gradients and optimizer buffers: the one place they are checked and
enforced.

A mask maps parameter names to 0/1 tensors (1 = kept, 0 = pruned) shaped like the parameter, or
``[N, *shape]`` for N trials trained together (one mask per trial). Masked training keeps pruned
weights exactly zero in three places, in this order:

1. weights: :func:`apply_mask` zeroes them once, before training;
2. gradients: :func:`mask_` zeroes their gradients before every update;
3. optimizer buffers: SGD's momentum buffer is a = mu a + g (``torch.optim.SGD``, dampening 0),
   so it starts at zero and only ever adds masked gradients: it stays exactly zero without a
   further step, and so does the update w -= lr a (or lr (g + mu a) for Nesterov).

Multiplying by 0 or 1 is exact in floating point, so masking never perturbs a kept weight.
Every bad mask raises :class:`MaskError`, whichever function (trainer, probe, ``pruning.Mask``)
receives it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from training.errors import SparsescaleError

Tensor = torch.Tensor


class MaskError(SparsescaleError, ValueError):
    """A mask is malformed or does not fit a model: names the entry and what was expected."""


def check_entry(name: str, value: Any) -> Tensor:
    """One mask entry as a real, non-empty tensor of 0 and 1 (its dtype and device unchanged)."""
    try:
        t = torch.as_tensor(value).detach()
    except (TypeError, ValueError, RuntimeError) as exc:   # None, strings, ragged lists, ...
        reason = str(exc).partition("\n")[0]
        raise MaskError(f"mask entry {name!r} is not a 0/1 tensor ({type(value).__name__}: "
                        f"{reason})") from None
    if t.numel() == 0 or t.is_complex():
        raise MaskError(f"mask entry {name!r} is {'empty' if t.numel() == 0 else 'complex'}; "
                        f"allowed: a real 0/1 tensor shaped like its parameter")
    if t.dtype != torch.bool:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise MaskError(f"mask entry {name!r} has non-finite values; allowed: 0 and 1")
        if not bool(((t == 0) | (t == 1)).all()):
            raise MaskError(f"mask entry {name!r} has values other than 0 and 1")
    return t


def named_parameters(model_or_params: nn.Module | Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Parameters by name of a module, or a mapping name -> parameter as given."""
    if isinstance(model_or_params, nn.Module):
        return dict(model_or_params.named_parameters())
    if isinstance(model_or_params, Mapping):
        return dict(model_or_params)
    raise MaskError(f"a mask applies to a torch.nn.Module or a mapping name -> parameter, got "
                    f"{type(model_or_params).__name__}")


def check_mask(mask: Mapping[str, Any] | None, named_params: nn.Module | Mapping[str, Tensor],
               trials: int | None = None) -> dict[str, Tensor]:
    """``mask`` checked against the parameters (a module or name -> parameter): every entry names
    a parameter and is a 0/1 tensor shaped like it or, when ``trials`` is given,
    ``[trials, *shape]`` (one mask per trial). Returns name -> tensor ({} for no mask)."""
    if mask is None:
        return {}
    if not isinstance(mask, Mapping):
        raise MaskError(f"a mask must be a mapping name -> 0/1 tensor, got {type(mask).__name__}")
    params = named_parameters(named_params)
    out = {}
    for name, value in mask.items():
        if name not in params:
            raise MaskError(f"mask entry {name!r} is not a parameter of the model; "
                            f"parameters: {', '.join(map(str, params))}")
        m = check_entry(name, value)
        shape = tuple(params[name].shape)
        allowed = [shape] if trials is None else [shape, (trials, *shape)]
        if tuple(m.shape) not in allowed:
            per_trial = "" if trials is None else f" (shared) or {allowed[1]} (one per trial)"
            raise MaskError(f"mask entry {name!r} has shape {tuple(m.shape)}; allowed: "
                            f"{shape}{per_trial}")
        out[name] = m
    return out


@torch.no_grad()
def apply_mask(model_or_named_params: nn.Module | Mapping[str, Tensor],
               mask: Mapping[str, Any] | None) -> dict[str, Tensor]:
    """Zero the masked weights in place (idempotent; no autograd record). The whole mask is
    checked (:func:`check_mask`) before any weight changes, so a refused mask leaves the model as
    it was. Returns the mask entries on their parameters' device and dtype, ready for
    :func:`mask_` on the gradients."""
    params = named_parameters(model_or_named_params)
    masks = {name: m.to(device=params[name].device, dtype=params[name].dtype)
             for name, m in check_mask(mask, params).items()}
    mask_([params[name] for name in masks], list(masks.values()))
    return masks


def mask_(tensors: Sequence[Tensor], masks: Sequence[Tensor | None]) -> None:
    """``tensors[i] *= masks[i]`` in place (None: a dense parameter): weights once, gradients
    before every update (module docstring). Masks broadcast: a shared mask ``[*shape]`` over
    stacked per-trial tensors ``[N, *shape]`` masks every trial."""
    pairs = [(t, m) for t, m in zip(tensors, masks, strict=True) if m is not None]
    if pairs:
        torch._foreach_mul_([g for g, _ in pairs], [m for _, m in pairs])
