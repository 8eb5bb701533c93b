"""The SGD update of the vectorized trainer, in place on trials stacked along dim 0.

torch.optim.SGD's rules with dampening 0 (Shallue et al. 2019's update rules), per-trial learning
rate and momentum, the gradient masked first so that pruned weights and their momentum stay
exactly zero:

- sgd: w <- w - lr g
- momentum (heavy ball): a <- mu a + g, w <- w - lr a
- nesterov: a <- mu a + g, w <- w - lr (g + mu a)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Tensor = torch.Tensor


def _col(t: Tensor, like: Tensor) -> Tensor:
    """Per-trial scalars [n] shaped to broadcast against a stacked tensor [n, ...]."""
    return t.view(-1, *([1] * (like.dim() - 1)))


def masked_sgd_(params: Sequence[Tensor], bufs: Sequence[Tensor] | None,
                grads: Sequence[Tensor], masks: Sequence[Tensor | None], neg_lr: Tensor,
                mu: Tensor, optimizer: str) -> None:
    """Update ``params`` (and the momentum ``bufs``, None for sgd) in place; ``grads`` are
    overwritten. Every tensor is stacked ``[n, *shape]``; a mask is None, shared ``[*shape]``
    or per trial ``[n, *shape]``; ``neg_lr`` (= -lr) and ``mu`` are ``[n]`` in the
    parameters' dtype."""
    masked = [(g, m) for g, m in zip(grads, masks) if m is not None]
    if masked:
        torch._foreach_mul_([g for g, _ in masked], [m for _, m in masked])
    steps = [_col(neg_lr, p) for p in params]
    if bufs is None:
        torch._foreach_addcmul_(params, grads, steps)
        return
    mus = [_col(mu, p) for p in params]
    torch._foreach_mul_(bufs, mus)
    torch._foreach_add_(bufs, grads)
    if optimizer == "nesterov":
        torch._foreach_addcmul_(grads, bufs, mus)
        torch._foreach_addcmul_(params, grads, steps)
    else:
        torch._foreach_addcmul_(params, bufs, steps)
