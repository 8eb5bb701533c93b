"""One pass over a set for many points of a plain ReLU MLP: full-set gradients, per-example
gradient moments and losses, with the backward pass written out.

A probe point of :func:`theory.probe_trajectory` needs, on the full training split, the mean
gradient, per-example gradient moments and the mean loss at ``average`` consecutive weights (the
noise) and the mean gradient at Lee et al. (2021)'s nine gamma points of one step (their local
Lipschitz constant). For a network z_1 = W_1 x + b_1, a_l = relu(z_l), z_{l+1} = W_{l+1} a_l +
b_{l+1}, ..., with the cross-entropy of softmax(z_L), every one of those gradients follows from
one forward and one backward pass of the summed loss,

    delta_L = softmax(z_L) - onehot(y),    delta_l = (W_{l+1}^T delta_{l+1}) o [a_l > 0],
    dL/dW_l = sum_i delta_li a_{l-1,i}^T,  dL/db_l = sum_i delta_li,

and the per-example squared gradient norms over kept coordinates (mask M_l of W_l, m_l of b_l)
are sum_l (delta_li o delta_li)^T (M_l (a_{l-1,i} o a_{l-1,i}) + m_l) (Goodfellow 2015, as in
:mod:`theory.estimators.example_norms`). Here the m points' weights are stacked ``[m, out, in]`` and each
layer is one batched matrix product over all points: one pass over the examples for the
``average`` noise points and the nine gamma points together, instead of ``average``
per-example-norm passes and one ``vmap``-of-``grad`` pass. Same quantities: the values agree
with those passes up to the order of float sums (tested against float64 autograd).

Applies to ``nn.Sequential`` of an optional ``nn.Flatten``, then ``nn.Linear`` layers with bias
and ``nn.ReLU`` between them, a Linear layer last, no buffers, with the classification loss of
:func:`training.goal.classification_loss` (2-d logits) and no loss of the data set's own:
:func:`plain_mlp` says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from training.models import plain_relu_mlp

from theory.errors import TheoryError
from theory.estimators.functional import DEFAULT_CHUNK, FlatLoss

__all__ = ["HESSIAN_ROWS", "MLP_CHUNK", "MlpPass", "mlp_hessian", "mlp_pass", "plain_mlp"]

# Examples a chunk of :func:`mlp_pass`: 1024, as the separate passes take them. 512 was faster
# on the loaded 2-core VM (0.20 against 0.26 s a point; the same with less load), but Lee's L
# at the 90 % sparse B = 8 run's first weights, where consecutive gradients nearly cancel, is
# resolved to only ~1e-5 in float32 and moved with the chunk size (256 / 512 / 1024 / 2048:
# 0.1337025 / 0.1337009 / 0.1337028 / 0.1337008; float64 0.1337024, the separate passes
# 0.1337038); 1024 keeps every quickstart value within 1e-5 of the separate passes'.
MLP_CHUNK = DEFAULT_CHUNK
# Rows of :func:`mlp_hessian` applied at once: tr(H Sigma)'s 16 products of the quickstart's
# 1,024-example sample took 60 ms at once, 48 ms in fours, 53 ms one by one (the loaded VM, one
# thread; [1024, rows, 100] activations stay in the cache for a few rows).
HESSIAN_ROWS = 4


def plain_mlp(fl: FlatLoss) -> list[nn.Linear] | None:
    """The Linear layers of ``fl.model`` when this module's pass applies to ``fl`` (module
    docstring: ``training.models.plain_relu_mlp``, the classification loss, no loss of the
    data set's own, inputs that flatten to 2-d), else None."""
    layers = plain_relu_mlp(fl.model)
    if (layers is None or fl.task != "classification" or fl.own_loss is not None
            or (fl.x.dim() != 2 and type(fl.model[0]) is not nn.Flatten)):
        return None
    index = {id(m): i for i, m in enumerate(fl.model)}
    expected = [f"{index[id(m)]}.{kind}" for m in layers for kind in ("weight", "bias")]
    return layers if list(fl.names) == expected else None


@dataclass(frozen=True)
class MlpPass:
    """What :func:`mlp_pass` returns: ``gradients`` ``[m, dim]``, the mean gradient of the set
    at each point over kept coordinates; ``parts`` for each of the first ``k`` points, the
    per-chunk moments ``(count, mean gradient, sum of squared deviations)`` that
    :meth:`theory.estimators.sampling.GroupMoments.of_parts` takes; ``losses`` the summed loss of each
    chunk at each of those points."""

    gradients: torch.Tensor
    parts: list[list[tuple[int, torch.Tensor, float]]]
    losses: list[list[float]]


def mlp_pass(fl: FlatLoss, thetas: torch.Tensor, k: int = 0, chunk: int = MLP_CHUNK) -> MlpPass:
    """Mean gradients of ``fl``'s set at the points ``thetas`` ``[m, dim]`` (kept coordinates),
    and per-example gradient moments and losses at the first ``k`` of them, in one pass over
    the set, ``chunk`` examples at a time (module docstring). ``fl`` must be one
    :func:`plain_mlp` accepts."""
    layers = plain_mlp(fl)
    if layers is None:
        raise TheoryError("mlp_pass needs a plain ReLU MLP (Linear layers with bias, ReLU between "
                          "them) with the classification loss; use theory.gradient_noise and "
                          "theory.local_lipschitz for other networks")
    m = thetas.shape[0]
    full = torch.stack([fl.embed(t) for t in thetas]) if fl.kept is not None else thetas
    pieces = torch.split(full, [s.numel() for s in fl.shapes], dim=1)
    weights = [p.reshape(m, *s) for p, s in zip(pieces[0::2], fl.shapes[0::2])]
    biases = [p.reshape(m, -1, 1) for p in pieces[1::2]]
    ones = fl.embed(torch.ones(fl.dim, dtype=thetas.dtype, device=thetas.device))
    keep = [p.reshape(s) for p, s in zip(torch.split(ones, [s.numel() for s in fl.shapes]),
                                         fl.shapes)]
    masks_w, masks_b = keep[0::2], keep[1::2]
    dense = [bool(mw.min() > 0) for mw in masks_w]
    sums = [torch.zeros_like(w) for w in weights] + [torch.zeros_like(b) for b in biases]
    parts: list[list[tuple[int, torch.Tensor, float]]] = [[] for _ in range(k)]
    losses: list[list[float]] = [[] for _ in range(k)]
    last = len(weights) - 1
    for i in range(0, fl.n, chunk):
        x = fl.x[i:i + chunk].flatten(1)
        y = fl.y[i:i + chunk]
        c = x.shape[0]
        # every activation is held transposed, [m, width, c]: the softmax over 10 classes and
        # the reductions then run along the long example axis (log_softmax along a last
        # axis of 10 was 16x slower on the CPU)
        acts = [x.T]
        for j, (w, b) in enumerate(zip(weights, biases)):
            z = torch.matmul(w, acts[-1]).add_(b)
            acts.append(z if j == last else z.relu_())
        logp = F.log_softmax(acts[-1], dim=1)                       # [m, classes, c]
        rows = torch.arange(c, device=x.device)
        delta = logp.exp()
        delta[:, y, rows] -= 1.0                                    # per-example dl/dz_L
        picked = logp[:, y, rows]                                   # -loss of each example
        sq = torch.zeros(k, c, dtype=torch.float64, device=x.device) if k else None
        grads_w, grads_b = [], []
        for j in range(last, -1, -1):
            a = acts[j]
            grads_w.append(torch.matmul(delta, a.transpose(-1, -2)))
            grads_b.append(delta.sum(-1, keepdim=True))
            if k:
                d2 = delta[:k].square()
                a2 = a.square() if j == 0 else a[:k].square()
                if dense[j]:   # M = 1: sum_j d_j^2 sum_k a_k^2
                    norms = d2.sum(1) * (a2.sum(-2) + 1)
                else:
                    norms = (d2 * torch.matmul(masks_w[j], a2)).sum(1) \
                        + (d2 * masks_b[j].view(-1, 1)).sum(1)
                sq += norms.double()
            if j > 0:
                delta = torch.ops.aten.threshold_backward(
                    torch.matmul(weights[j].transpose(1, 2), delta), a, 0)
        grads_w.reverse()
        grads_b.reverse()
        flat = torch.cat([g.reshape(m, -1) for pair in zip(grads_w, grads_b) for g in pair], 1)
        kept = flat if fl.kept is None else flat.index_select(1, fl.kept)   # [m, dim], summed
        for p in range(k):
            mean = kept[p] / c
            parts[p].append((c, mean, float(sq[p].sum()) - c * float(mean.double().square().sum())))
            losses[p].append(-float(picked[p].sum()))
        for total, g in zip(sums, grads_w + grads_b):
            total += g
    total = torch.cat([g.reshape(m, -1) for pair in zip(sums[:len(weights)], sums[len(weights):])
                       for g in pair], 1)
    gradients = (total if fl.kept is None else total.index_select(1, fl.kept)) / fl.n
    return MlpPass(gradients, parts, losses)


def mlp_hessian(fl: FlatLoss) -> Callable[[torch.Tensor], torch.Tensor]:
    """The Hessian of ``fl``'s mean loss at ``fl.theta`` over kept coordinates as a function
    ``v -> H v`` (``v`` of shape ``[dim]`` or ``[r, dim]``), for a network
    :func:`plain_mlp` accepts, by Pearlmutter's (1994) R-operator written out: with the forward
    pass (z_l, a_l, softmax p) and the backward pass (delta_l, of the mean loss) computed once
    here, a direction (dW_l, db_l) gives

        Rz_1 = dW_1 x + db_1,   Ra_l = Rz_l o [z_l > 0],   Rz_{l+1} = W_{l+1} Ra_l + dW_{l+1} a_l + db_{l+1},
        Rdelta_L = p o (Rz_L - p^T Rz_L) / n,
        Rdelta_l = (dW_{l+1}^T delta_{l+1} + W_{l+1}^T Rdelta_{l+1}) o [z_l > 0],
        (H v)_{W_l} = sum_i Rdelta_li a_{l-1,i}^T + delta_li Ra_{l-1,i}^T,   (H v)_{b_l} = sum_i Rdelta_li

    (ReLU's second derivative is zero almost everywhere, as autograd takes it). The forward
    and backward pass at theta are shared by every product, and ``HESSIAN_ROWS`` rows at a time
    are batched matrix products (examples first, ``[n, rows, width]``, so a weight the rows
    share is one product over n x rows): the same values as :meth:`FlatLoss.hessian` up to the order of float sums
    (tested against it)."""
    layers = plain_mlp(fl)
    if layers is None:
        raise TheoryError("mlp_hessian needs a plain ReLU MLP (Linear layers with bias, ReLU "
                          "between them) with the classification loss")
    full = fl.embed(fl.theta.detach())
    sizes = [s.numel() for s in fl.shapes]
    pieces = torch.split(full, sizes)
    weights = [p.view(s) for p, s in zip(pieces[0::2], fl.shapes[0::2])]
    biases = [p for p in pieces[1::2]]
    last = len(weights) - 1
    # examples first, [n, (r,) width]: every product with a weight shared by the r rows is
    # one matrix product over n x r rows
    acts, on = [fl.x.flatten(1)], []
    with torch.no_grad():
        for j, (w, b) in enumerate(zip(weights, biases)):
            z = torch.addmm(b, acts[-1], w.T)
            if j < last:
                on.append(z > 0)
                z = z.relu_()
            acts.append(z)
        p = F.softmax(acts[-1], dim=1)                              # [n, classes]
        deltas = [p.clone()]
        deltas[0][torch.arange(fl.n, device=p.device), fl.y] -= 1.0
        deltas[0] /= fl.n                                           # of the mean loss
        for j in range(last, 0, -1):
            deltas.insert(0, (deltas[0] @ weights[j]) * on[j - 1])
    masks = [m.to(p.dtype).unsqueeze(1) for m in on]               # [n, 1, width]
    n = fl.n

    def product(v: torch.Tensor) -> torch.Tensor:
        if v.shape[-1:] != (fl.dim,) or v.dim() > 2:
            raise TheoryError(f"v must have shape ({fl.dim},) or (m, {fl.dim}), "
                              f"got {tuple(v.shape)}")
        rows = v.reshape(-1, fl.dim).to(full.dtype)
        return torch.cat([rows_product(rows[i:i + HESSIAN_ROWS])
                          for i in range(0, rows.shape[0], HESSIAN_ROWS)]).reshape(v.shape)

    def rows_product(rows: torch.Tensor) -> torch.Tensor:
        r = rows.shape[0]
        dfull = rows if fl.kept is None else rows.new_zeros(r, fl.full_size).index_copy_(
            1, fl.kept, rows)
        parts = torch.split(dfull, sizes, dim=1)
        dw = [q.reshape(r, *s) for q, s in zip(parts[0::2], fl.shapes[0::2])]   # [r, out, in]
        db = parts[1::2]                                                         # [r, out]
        with torch.no_grad():
            r_acts = [None]                                         # R a_0 = 0: x is data
            for j, w in enumerate(weights):
                out = w.shape[0]
                rz = (acts[j] @ dw[j].reshape(r * out, -1).T).view(n, r, out).add_(db[j])
                if j > 0:
                    rz += (r_acts[j].reshape(n * r, -1) @ w.T).view(n, r, out)
                r_acts.append(rz.mul_(masks[j]) if j < last else rz)
            rz = r_acts[-1]                                         # [n, r, classes]
            q = p.unsqueeze(1)
            rdelta = q * (rz - (q * rz).sum(2, keepdim=True)) / n
            out_w, out_b = [], []
            for j in range(last, -1, -1):
                out, width = weights[j].shape
                hw = (rdelta.reshape(n, r * out).T @ acts[j]).view(r, out, width)
                if j > 0:
                    hw += (deltas[j].T @ r_acts[j].reshape(n, r * width)).view(
                        out, r, width).transpose(0, 1)
                out_w.append(hw)
                out_b.append(rdelta.sum(0))
                if j > 0:
                    back = (deltas[j] @ dw[j].transpose(0, 1).reshape(out, r * width)).view(
                        n, r, width)
                    back += (rdelta.reshape(n * r, out) @ weights[j]).view(n, r, width)
                    rdelta = back.mul_(masks[j - 1])
        out_w.reverse()
        out_b.reverse()
        hv = torch.cat([g.reshape(r, -1) for pair in zip(out_w, out_b) for g in pair], 1)
        return hv if fl.kept is None else hv.index_select(1, fl.kept)

    return product
