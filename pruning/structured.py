"""Structured (channel) pruning to a parameter budget with torch-pruning (Fang et al. 2023).

Unstructured masks keep the network's shape; channel pruning removes whole output channels of
Linear / Conv layers (and the matching inputs of the layers that consume them, found by
torch-pruning's ``DependencyGraph``), so the result is a physically smaller ``nn.Module``.
Channels are ranked by ``GroupMagnitudeImportance`` (L2 norm of each coupled group of weights).

torch-pruning's ``pruning_ratio`` is a *channel* ratio: removing a fraction r of the channels of
two consecutive layers removes about 1 - (1 - r)^2 of the weights between them, so a CNN at
r = 0.5 keeps about 25 % of its parameters. :func:`prune_channels` therefore bisects r until
the kept parameter fraction is within ``tolerance`` (relative, default 2 %) of the target.
Do not combine with ``torch.nn.utils.prune`` masks on the same layers.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from pruning.errors import PruningError
from pruning.mask import PRUNABLE_MODULES

BISECTION_STEPS = 30


@dataclass(frozen=True)
class StructuredReport:
    """What :func:`prune_channels` did. MACs are multiply-accumulates for one example (batch 1),
    counted by ``torch_pruning.utils.count_ops_and_params``."""

    target_fraction: float
    param_fraction: float
    channel_ratio: float
    global_pruning: bool
    params_before: int
    params_after: int
    macs_before: int
    macs_after: int

    @property
    def macs_fraction(self) -> float:
        return self.macs_after / self.macs_before

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), macs_fraction=self.macs_fraction)


def output_layer(model: nn.Module) -> nn.Module:
    """The last Linear / Conv module registered in ``model`` (its outputs are the predictions,
    so its output channels are never pruned)."""
    layers = [m for m in model.modules() if isinstance(m, PRUNABLE_MODULES)]
    if not layers:
        raise PruningError(f"model {type(model).__name__} has no Linear / Conv layers to prune")
    return layers[-1]


def _count(model: nn.Module, example: torch.Tensor) -> tuple[int, int]:
    import torch_pruning as tp  # here, not at import: `import pruning` needs only torch

    macs, params = tp.utils.count_ops_and_params(model, example)
    return int(macs), int(params)


def _pruned_copy(model: nn.Module, example: torch.Tensor, ratio: float, global_pruning: bool,
                 ignored: list[str]) -> nn.Module:
    import torch_pruning as tp

    work = copy.deepcopy(model).eval()
    if ratio <= 0.0:
        return work
    modules = dict(work.named_modules())
    pruner = tp.pruner.MetaPruner(
        work, example, importance=tp.importance.GroupMagnitudeImportance(p=2),
        pruning_ratio=ratio, global_pruning=global_pruning,
        ignored_layers=[modules[name] for name in ignored])
    pruner.step()
    return work


def prune_channels(model: nn.Module, example_input: torch.Tensor, param_fraction: float,
                   tolerance: float = 0.02, global_pruning: bool | None = None,
                   ignored_layers: list[nn.Module] | None = None,
                   ) -> tuple[nn.Module, StructuredReport]:
    """A copy of ``model`` with whole channels removed so that it keeps ``param_fraction`` of its
    parameters to within ``tolerance`` (relative): |kept / total / param_fraction - 1| <= tol.

    ``example_input``: a batch of inputs (only its first example is used, for tracing and MAC
    counts). ``global_pruning``: rank channels within each layer at the same channel ratio
    (False), across layers (True), or (None) try the per-layer ratio first and fall back to the
    global ranking, whose finer steps help narrow networks. ``ignored_layers``: modules of
    ``model`` whose output channels are kept (default: the output layer, :func:`output_layer`).
    The caller's model is not modified. Raises PruningError if no channel ratio reaches the target
    (channels are too coarse for it).
    """
    if not (isinstance(param_fraction, (int, float)) and 0.0 < param_fraction <= 1.0):
        raise PruningError(f"param_fraction must be a number in (0, 1], got {param_fraction!r}")
    if not 0.0 < tolerance < 1.0:
        raise PruningError(f"tolerance must be in (0, 1), got {tolerance!r}")
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 1 \
            or example_input.shape[0] < 1:
        raise PruningError("example_input must be a tensor holding a batch of at least one input")
    example = example_input[:1]
    names = {id(m): n for n, m in model.named_modules()}
    keep = ignored_layers if ignored_layers is not None else [output_layer(model)]
    if any(id(m) not in names for m in keep):
        raise PruningError("ignored_layers must be modules of the model being pruned")
    ignored = [names[id(m)] for m in keep]
    macs_before, params_before = _count(copy.deepcopy(model).eval(), example)
    modes = [False, True] if global_pruning is None else [bool(global_pruning)]

    # (relative error, channel ratio, global ranking?, pruned copy) of the closest try so far
    best = (0.0, 0.0, bool(global_pruning), copy.deepcopy(model))
    if param_fraction < 1.0:
        best = (float("inf"), *best[1:])
        for mode in modes:
            lo, hi = 0.0, 0.999
            for _ in range(BISECTION_STEPS):
                ratio = (lo + hi) / 2
                pruned = _pruned_copy(model, example, ratio, mode, ignored)
                fraction = _count(pruned, example)[1] / params_before
                error = abs(fraction / param_fraction - 1.0)
                if error < best[0]:
                    best = (error, ratio, mode, pruned)
                if error <= tolerance / 4:
                    break
                lo, hi = (ratio, hi) if fraction > param_fraction else (lo, ratio)
            if best[0] <= tolerance:
                break
    error, ratio, mode, pruned = best
    macs_after, params_after = _count(pruned, example)
    if error > tolerance:
        raise PruningError(f"channel pruning cannot reach param_fraction {param_fraction} within "
                         f"{tolerance:.0%}: closest is {params_after / params_before:.4f} at "
                         f"channel ratio {ratio:.4f} (channels too coarse; try a wider model or "
                         f"a larger tolerance)")
    return pruned.train(model.training), StructuredReport(
        target_fraction=float(param_fraction), param_fraction=params_after / params_before,
        channel_ratio=ratio, global_pruning=mode, params_before=params_before,
        params_after=params_after, macs_before=macs_before, macs_after=macs_after)
