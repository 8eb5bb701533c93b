"""Per-example gradient moments of Linear and Conv1d networks, without materializing every
example's whole gradient.

For a layer z = W a + b inside a network, the gradient of example i's loss with respect to its
weights is the outer product delta_i a_i^T (and delta_i for the bias), delta_i = dl_i/dz_i, so the
squared norm of example i's gradient over the kept coordinates (mask M of W, m of b) is

    |g_i|^2 = sum_layers  sum_jk delta_ij^2 M_jk a_ik^2 + sum_j m_j delta_ij^2
            = sum_layers  (delta_i o delta_i)^T (M (a_i o a_i) + m)

(Goodfellow 2015, "Efficient per-example gradient computations"): one extra matrix product per
layer from the activations and output gradients that a single backward pass of the summed loss
already computes. A Conv1d layer is a Linear layer applied at every output position t to the
unfolded input window u_it, so example i's weight gradient is sum_t delta_it u_it^T: one batched
matrix product per layer gives it (Rochette, Manoel and Tramel 2019, "Efficient per-example
gradient computations in convolutional neural networks"), and its masked squared norm follows.
With that pass's summed gradient, a chunk of c examples yields the moments (c, mean gradient,
M2 = sum_i |g_i|^2 - c |mean|^2) that :class:`theory.estimators.sampling.GroupMoments` needs. On the MNIST-1D
MLP's 7,200 training examples this takes 0.03 s instead of 0.8 s with ``torch.func.vmap``.

Applies to networks built only of ``nn.Linear`` layers (on 2-d inputs), ``nn.Conv1d`` layers
(one group, zero padding), each called once per forward, and parameter-free layers that act on
each example alone (:data:`PER_EXAMPLE`, dropout included: the probes run the network in eval
mode, where it is the identity): nothing there mixes examples, so the per-example losses
are independent. Any other network (normalization, weight sharing, 2-d convolutions) gets
``None`` and the caller materializes per-example gradients. Per-example norms are computed in the
loss's dtype and summed in float64; the subtraction in M2 then loses the digits of
1 + |mean|^2 / (M2 / c) ~ 1 + 1 / B_simple.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from theory.estimators.functional import FlatLoss

# parameter-free layers that act on each example alone (their subclasses may not: exact types);
# dropout is the identity in eval mode, where the probes run (training.models.evaluation)
PER_EXAMPLE = (nn.Sequential, nn.Identity, nn.Flatten, nn.Unflatten, nn.ReLU, nn.LeakyReLU,
               nn.Tanh, nn.Sigmoid, nn.GELU, nn.SiLU, nn.Softplus, nn.Dropout, nn.Dropout1d,
               nn.AlphaDropout, nn.FeatureAlphaDropout)


def _supported(module: nn.Module) -> bool:
    if type(module) is nn.Linear:
        return True
    return (type(module) is nn.Conv1d and module.groups == 1 and module.padding_mode == "zeros"
            and isinstance(module.padding, tuple))


def weighted_layers(model: nn.Module) -> dict[str, nn.Module] | None:
    """The network's ``nn.Linear`` and ``nn.Conv1d`` layers by name, or None if it holds any
    other layer but :data:`PER_EXAMPLE` ones, a grouped or non-zero-padded convolution, or a
    buffer."""
    if any(True for _ in model.buffers()):
        return None
    layers: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if _supported(module):
            layers[name] = module
        elif type(module) not in PER_EXAMPLE:
            return None
    return layers or None


def chunk_moments(fl: FlatLoss, x: torch.Tensor, y: torch.Tensor,
                  losses: list[float] | None = None) -> tuple[int, torch.Tensor, float] | None:
    """(count, mean gradient over kept coordinates, sum of squared deviations of the per-example
    gradients from it) of the examples ``x, y`` under ``fl``'s loss at its ``theta``, from one
    backward pass (module docstring); None when the network is not one this applies to.
    ``losses``: a list that gets the chunk's summed loss appended (the forward pass computes it
    anyway: a caller that needs the mean loss saves a pass over the examples)."""
    layers = weighted_layers(fl.model)
    if layers is None:
        return None
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {name: [] for name in layers}

    def capture(name: str, module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        seen[name].append((args[0], out))

    theta = fl.theta.detach().requires_grad_(True)
    hooks = [module.register_forward_hook(partial(capture, name)) for name, module in layers.items()]
    try:
        with torch.enable_grad():
            total = fl.batch_loss(theta, x, y) * x.shape[0]
    finally:
        for h in hooks:
            h.remove()
    calls = [v[0] for name, v in seen.items()
             if len(v) == 1 and v[0][0].dim() == (2 if type(layers[name]) is nn.Linear else 3)]
    if len(calls) != len(layers):
        return None
    summed, *deltas = torch.autograd.grad(total, [theta, *(out for _, out in calls)])
    keep = _masks(fl)
    sq = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    for (name, module), (a, _), delta in zip(layers.items(), calls, deltas):
        prefix = f"{name}." if name else ""
        d, a = delta, a.detach()
        weight = keep[prefix + "weight"].to(d.dtype)
        if type(module) is nn.Linear:
            sq += (d.square() * (a.square() @ weight.T)).sum(1).double()
        else:
            grads = torch.bmm(d, _unfold(module, a).transpose(1, 2))   # [n, out, in x kernel]
            sq += (grads.square_().flatten(1) @ weight.reshape(-1)).double()
            d = d.sum(2)
        if prefix + "bias" in keep:
            sq += (d.square() @ keep[prefix + "bias"].to(d.dtype)).double()
    count = x.shape[0]
    if losses is not None:
        losses.append(float(total.detach()))
    mean = summed.detach() / count
    return count, mean, float(sq.sum()) - count * float(mean.double().square().sum())


def _unfold(conv: nn.Conv1d, a: torch.Tensor) -> torch.Tensor:
    """The input windows of each output position, ``[n, in_channels x kernel, positions]`` in the
    order of ``conv.weight``'s flattened (in_channel, kernel) axes."""
    return F.unfold(a.unsqueeze(2), (1, conv.kernel_size[0]), dilation=(1, conv.dilation[0]),
                    padding=(0, conv.padding[0]), stride=(1, conv.stride[0]))


def _masks(fl: FlatLoss) -> dict[str, torch.Tensor]:
    """Each parameter's 0/1 keep mask (float64), from ``fl``'s kept coordinates."""
    ones = fl.embed(torch.ones(fl.dim, dtype=torch.float64, device=fl.theta.device))
    pieces = torch.split(ones, [s.numel() for s in fl.shapes])
    return {n: p.view(s) for n, p, s in zip(fl.names, pieces, fl.shapes)}
