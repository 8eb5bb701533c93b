"""What the trainers and probes read of a model's structure: the layers that decide how its trials
are computed (2-D convolutions, batch statistics, recurrent or attention layers), its activation
floats per example, and whether it is a plain ReLU MLP (whose passes the probes write out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Features:
    """What the strategy rules read of a model (``training.engine.strategy``), taken once per
    cell: its scalar ``parameters``, whether it has 2-D convolutions (``conv2d``), batch
    statistics (``batch_statistics``), recurrent or attention layers (``sequence_layers``),
    and the floats one example's forward pass writes (``activation_floats``, at the cell's
    input shape)."""

    parameters: int
    conv2d: bool
    batch_statistics: bool
    sequence_layers: bool
    activation_floats: int


def features(model: nn.Module, input_shape: Sequence[int]) -> Features:
    """The :class:`Features` of ``model`` for inputs of one example's ``input_shape``."""
    return Features(sum(p.numel() for p in model.parameters()), has_conv2d(model),
                    batch_dependent(model), sequence_layers(model),
                    activation_floats(model, input_shape))


def batch_dependent(model: nn.Module) -> bool:
    """Whether an example's output depends on the other examples of its batch in train mode
    (batch statistics)."""
    return any(isinstance(m, nn.modules.batchnorm._NormBase) for m in model.modules())


def has_conv2d(model: nn.Module) -> bool:
    """Whether ``model`` has a 2-D convolution (the ``per_trial`` program's models: oneDNN's
    convolutions, trial by trial)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def sequence_layers(model: nn.Module) -> bool:
    """Whether ``model`` has recurrent or attention layers (``torch.func`` has no batching rule
    over trials for the first, and loops over the fused kernel of the second)."""
    return any(isinstance(m, (nn.RNNBase, nn.MultiheadAttention)) for m in model.modules())


def plain_relu_mlp(model: nn.Module) -> list[nn.Linear] | None:
    """The Linear layers of ``model`` when it is ``nn.Sequential`` of an optional leading
    ``nn.Flatten()`` (default dims), then ``nn.Linear`` layers with bias and ``nn.ReLU`` between
    them, a Linear layer last (``mlp``, ``linear``), and no buffers; else None. The probes'
    replay (``training.replay``) and passes (``theory.estimators.mlp_passes``) write such a network's
    backward pass out."""
    if type(model) is not nn.Sequential or any(True for _ in model.buffers()):
        return None
    mods = list(model)
    if mods and type(mods[0]) is nn.Flatten and (mods[0].start_dim, mods[0].end_dim) == (1, -1):
        mods = mods[1:]
    linear, relu = mods[0::2], mods[1::2]
    if (len(mods) % 2 == 0 or any(type(m) is not nn.Linear or m.bias is None for m in linear)
            or any(type(m) is not nn.ReLU for m in relu)):
        return None
    return linear


def activation_floats(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Floats one example's forward pass writes: every leaf module's output (all tensors of a
    tuple, e.g. a recurrent layer's), plus the im2col patches of convolutions. The pass runs in
    eval mode, so it neither updates running statistics nor draws random numbers."""
    total = 0

    def hook(module, inputs, output):
        nonlocal total
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        total += sum(t.numel() for t in outputs if isinstance(t, torch.Tensor))
        if isinstance(module, nn.modules.conv._ConvNd):
            total += output.numel() // module.out_channels * (
                module.in_channels // module.groups) * math.prod(module.kernel_size)

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    was_training = model.training
    try:
        with torch.no_grad():
            p = next(model.parameters())
            model.eval()
            model(torch.zeros(1, *input_shape, dtype=p.dtype, device=p.device))
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return total
