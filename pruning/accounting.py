"""Per-layer accounting of a mask: kept / total weights and FLOPs per example.

FLOPs are counted for the Linear / Conv layers from their output shapes, recorded by forward
hooks on one example: a weight tensor applied at P output positions per example (P = 1 for a
Linear layer on flat inputs, the number of output pixels / time steps for a convolution) costs
P * (its number of entries) multiply-accumulates, i.e. 2 P n FLOPs (one multiply and one add
each), of which a sparse layer keeps 2 P * kept; a bias costs P * n additions. Padding positions
count as computed; activations, pooling and residual additions are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from training.masks import check_mask

from pruning.mask import PRUNABLE_MODULES

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ["parameter", "layer", "kind", "shape", "total", "kept", "density",
           "flops_dense", "flops_kept"]


def _positions(model: nn.Module, example: torch.Tensor) -> dict[str, int]:
    """Module name -> output positions per example of every Linear / Conv module."""
    out: dict[str, int] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, PRUNABLE_MODULES):
            channels = module.out_features if isinstance(module, nn.Linear) else module.out_channels

            def hook(mod, inputs, output, name=name, channels=channels):
                out[name] = output.numel() // (output.shape[0] * channels)

            handles.append(module.register_forward_hook(hook))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(example)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return out


def _example(model: nn.Module, mask: Mapping[str, torch.Tensor] | None,
             example: torch.Tensor | tuple[int, ...] | None) -> torch.Tensor | None:
    if example is None and mask is not None:
        example = tuple(getattr(mask, "info", {}).get("input_shape") or ()) or None
    if example is None:
        return None
    p = next(model.parameters())
    if isinstance(example, torch.Tensor):
        return example[:1].to(device=p.device, dtype=p.dtype)
    return torch.zeros((1, *example), device=p.device, dtype=p.dtype)


def report(model: nn.Module, mask: Mapping[str, torch.Tensor] | None = None,
           example: torch.Tensor | tuple[int, ...] | None = None) -> pd.DataFrame:
    """One row per Linear / Conv weight and per other masked parameter, plus a ``total`` row.

    Columns: ``parameter``, ``layer`` (module name), ``kind`` (weight / bias), ``shape``,
    ``total`` and ``kept`` entries, ``density``, and ``flops_dense`` / ``flops_kept`` per example
    (see the module docstring). FLOPs need an input: ``example`` (a batch, its first row is used,
    or an input shape without batch); by default the ``input_shape`` recorded in ``mask.info`` by
    ``pruning.prune``. Without one the FLOP columns are left out.
    """
    import pandas as pd  # imported here: trainer worker processes import pruning without it

    entries = check_mask(mask, model)
    owners = {}
    for mod_name, module in model.named_modules():
        if isinstance(module, PRUNABLE_MODULES):
            for kind in ("weight", "bias"):
                if getattr(module, kind, None) is not None:
                    owners[f"{mod_name}.{kind}" if mod_name else kind] = (mod_name, kind)
    x = _example(model, mask, example)
    positions = _positions(model, x) if x is not None else None

    rows = []
    for name, p in model.named_parameters():
        layer, kind = owners.get(name, (None, None))
        if name not in entries and kind != "weight":
            continue
        kept = int(entries[name].sum()) if name in entries else p.numel()
        row = {"parameter": name, "layer": layer, "kind": kind or "other",
               "shape": tuple(p.shape), "total": p.numel(), "kept": kept,
               "density": kept / p.numel()}
        if positions is not None:
            if layer is None:  # a masked parameter outside Linear / Conv: not counted
                row.update(flops_dense=None, flops_kept=None)
            else:
                per_entry = positions[layer] * (2 if kind == "weight" else 1)
                row.update(flops_dense=per_entry * p.numel(), flops_kept=per_entry * kept)
        rows.append(row)
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if positions is not None
                                        or not c.startswith("flops")])
    total = {"parameter": "total", "layer": None, "kind": None, "shape": None,
             "total": int(table["total"].sum()), "kept": int(table["kept"].sum())}
    total["density"] = total["kept"] / total["total"]
    if positions is not None:
        total.update(flops_dense=int(table["flops_dense"].sum()),
                     flops_kept=int(table["flops_kept"].sum()))
    return pd.concat([table, pd.DataFrame([total])], ignore_index=True)
