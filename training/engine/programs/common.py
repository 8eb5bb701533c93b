"""The pieces every program shares: the stacked loss and its gradient with respect to the outputs
(the hand-written programs' backward starts from it, and the loop's evaluation reads it), and the
widening of autocast's low-precision outputs to float32 before a loss.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def stacked_loss_and_grad(out: Tensor, y: Tensor, task: str) -> tuple[Tensor, Tensor]:
    """Per-trial mean loss [N] and its gradient with respect to ``out`` [N, B, ...].

    Cross-entropy: l = mean_b(logsumexp(z_b) - z_b[y_b]), dl/dz_b = (softmax(z_b) - e_{y_b}) / B.
    Per-token labels (``out`` [N, B, T, classes]): the same over the B * T positions, the mean
    over examples of each example's mean over its positions.
    Regression: l = 1/2 mean_b (f_b - y_b)^2, dl/df_b = (f_b - y_b) / B.
    """
    if task == "classification" and out.dim() > 3:
        loss, dout = stacked_loss_and_grad(out.reshape(out.shape[0], -1, out.shape[-1]),
                                           y.expand(out.shape[:-1]).flatten(1), task)
        return loss, dout.reshape(out.shape)
    batch = out.shape[1]
    out = widen(out)   # under bf16 autocast: the loss and its gradient in float32
    if task == "classification":
        # classes on dim 1, examples innermost: CPU softmax over a short innermost dim is ~10x
        # slower than over a middle one
        logp = torch.log_softmax(out.transpose(1, 2), 1)
        target = y.unsqueeze(1)
        loss = logp.gather(1, target).squeeze(1).mean(-1).neg()
        dout = logp.exp_()
        dout.scatter_add_(1, target, torch.full_like(target, -1, dtype=dout.dtype))
        return loss, dout.div_(batch).transpose(1, 2)
    diff = out - y
    return 0.5 * diff.square().mean(-1), diff.div_(batch)


def widen(t: Tensor) -> Tensor:
    """``t`` in float32 when autocast left it in a lower precision (bfloat16, float16); else
    ``t`` itself (float32 and float64 outputs are never touched)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
