"""SNIP as Lee et al. (2021)'s released code computes it, written out independently of ``pruning``
for the tests, in float64: the ground truth of ``pruning.prune(..., examples="all",
prune_biases=True)``.

Their ``edps/model.py`` multiplies every weight and bias by an all-ones mask c, accumulates
g_mmt += dL_b/dc over the training split in batches of 100 (``edps/prune.py``; L_b the batch's
mean cross-entropy), takes |g_mmt| normalized by its sum over one vector holding all weights,
then all biases, and keeps ``tf.nn.top_k`` of kappa = int(round(N (1 - sparsity))) entries (ties:
the lower index). Normalizing by the sum does not change the ranking, so it is left out here.
"""

import copy

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

F64 = torch.float64


def lee_snip_mask(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sparsity: float,
                  chunk: int = 100) -> dict[str, torch.Tensor]:
    """The 0/1 mask of every Linear / Conv weight and bias of ``model`` (float64 copy) at
    ``sparsity`` (module docstring)."""
    net = _float64_copy(model)
    layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]
    ids = {id(m.weight): "w" for m in layers} | {id(m.bias): "b" for m in layers
                                                  if m.bias is not None}
    named = {k: p.detach() for k, p in net.named_parameters()}
    kind = {k: ids[id(p)] for k, p in net.named_parameters() if id(p) in ids}
    order = [k for k in kind if kind[k] == "w"] + [k for k in kind if kind[k] == "b"]
    c = {k: torch.ones_like(named[k], requires_grad=True) for k in order}
    g_mmt = {k: torch.zeros_like(named[k]) for k in order}
    net.eval()
    for a in range(0, x.shape[0], chunk):
        params = {k: named[k] * c[k] if k in c else named[k] for k in named}
        out = functional_call(net, params, (x[a:a + chunk].to(F64),))
        loss = torch.nn.functional.cross_entropy(out, y[a:a + chunk])
        grads = torch.autograd.grad(loss, [c[k] for k in order])
        for k, g in zip(order, grads):
            g_mmt[k] += g
    scores = np.concatenate([g_mmt[k].abs().flatten().numpy() for k in order])
    kappa = int(round(scores.size * (1.0 - sparsity)))
    keep = np.zeros(scores.size)
    keep[np.argsort(-scores, kind="stable")[:kappa]] = 1.0
    parts = np.split(keep, np.cumsum([named[k].numel() for k in order])[:-1])
    return {k: torch.from_numpy(v).reshape(named[k].shape) for k, v in zip(order, parts)}


def _float64_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).to(F64)
