"""Per-example squared gradient norms of one layer, from its inputs and output gradients.

A backward pass of a batch's loss computes, for every layer, the gradient of the loss with respect
to the layer's output, ``d`` (one row per example). For the layers below the gradient of example
i's loss with respect to the layer's parameters is a sum over positions p (sequence positions,
convolution windows, token slots; one position for a 2-d input) of simple terms, so its squared
norm follows from ``d`` and the layer's input without the batch's per-example gradients ever being
stored (Goodfellow 2015, "Efficient per-example gradient computations"):

- ``nn.Linear``, z_p = W a_p + b: g_i(W) = sum_p d_ip a_ip^T, g_i(b) = sum_p d_ip, and

      |g_i(W)|^2 = sum_pq (d_ip . d_iq)(a_ip . a_iq)          (the Gram form, P^2 (in + out))
                 = |D_i^T A_i|_F^2                             (materialized, P in out)

  the Gram form only where it takes under half the materialized form's multiplications (small
  batched products with a short P x P output run several times slower per multiplication on a
  CPU; one position: |d_i|^2 |a_i|^2). The Gram form is the "ghost norm" of
  Li, Tramer, Liang and Hashimoto (2022, "Large language models can be strong differentially
  private learners").
- ``nn.Conv1d`` / ``nn.Conv2d``: a Linear layer applied to every unfolded input window, one group
  at a time (Rochette, Manoel and Tramel 2019, "Efficient per-example gradient computations in
  convolutional neural networks"); any padding mode, stride, dilation and groups.
- ``nn.Embedding``: g_i = sum_p e_{k_ip} d_ip^T (one-hot rows), so |g_i|^2 = sum over the distinct
  tokens k of example i of |sum_{p: k_ip = k} d_ip|^2 (repeated tokens add up before squaring);
  ``padding_idx`` positions get no gradient. A small vocabulary (at most twice the positions)
  materializes g_i, adding each position's row of d to its token's.
- ``nn.LayerNorm`` / ``nn.RMSNorm``: g_i(weight) = sum_p d_ip o xhat_ip with xhat the normalized
  input, g_i(bias) = sum_p d_ip, materialized (they have one weight per feature).

A layer called several times in one forward (weight sharing inside the layer) has the sum of its
calls' terms as its per-example gradient: its calls are concatenated along the positions before
squaring, so the cross terms count. Norms are computed in at least float32 (float64 stays float64).

:func:`layer_sq_norms` takes a layer, its calls' inputs and the gradients of their outputs (None
for a call whose output got no gradient) and returns ``[B]`` squared norms over the layer's own
parameters that require gradients. :func:`layer_terms` adds the same to a :class:`Terms` without
reducing them, so that a caller summing over the batch and over many layers (the noise monitor)
takes all their norms in one fused call. :func:`job_function` gives, instead, the layer's job
for the kernel of :mod:`theory.monitor.kernel`, which computes the same sums over the
batch in one call for all layers (tested against these terms and a float64 loop over the
examples). :func:`unsupported` says why a layer is not one of these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from theory.errors import TheoryError

# Up to this many token slots per example, an Embedding's norms come from the Gram matrix of its
# output gradients (P^2 D per example, a few kernels); beyond it, from summing the rows of equal
# tokens (P D, with a sort of the batch's tokens).
EMBEDDING_GRAM_POSITIONS = 64

# The Gram form of a sequence layer's norms is used only where it needs fewer than 1 / this of the
# multiplications of materializing the per-example gradients (measured on a CPU at B = 32-64:
# the materialized form wins up to about twice the Gram form's multiplications).
GRAM_ADVANTAGE = 2

# A materialized per-example product of more elements than this is reduced to its examples'
# norms at once (read while in cache, freed before the next layer's); a smaller one is left to
# the caller's one fused norm (fewer operator calls, which is what small steps pay for).
REDUCE_AT = 1 << 16

_WIDE = (torch.float32, torch.float64)

SUPPORTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding, nn.LayerNorm, nn.RMSNorm)


def unsupported(module: nn.Module) -> str | None:
    """Why ``module``'s own parameters have no per-example norms here (None when they do): a type
    outside :data:`SUPPORTED` (exact types: a subclass may compute something else), or an option
    that couples examples or that the formulas above do not cover."""
    kind = type(module)
    if kind not in SUPPORTED:
        return kind.__name__
    if kind is nn.Embedding and module.scale_grad_by_freq:
        return "Embedding(scale_grad_by_freq=True) (scales by counts over the whole batch)"
    return None


class Terms:
    """A layer's per-example squared norms as ``squares``, tensors with the batch first whose
    examples' squared norms add up to them (per-example gradients or parts of them), plus
    ``extras``, ``[B]`` tensors added as they are (the Gram forms). The sum over the batch is the
    sum of the squares' whole squared norms plus the extras' sums, which a caller can take for
    many layers at once (one ``torch._foreach_norm``) without a per-layer reduction."""

    __slots__ = ("extras", "squares")

    def __init__(self) -> None:
        self.squares: list[torch.Tensor] = []
        self.extras: list[torch.Tensor] = []

    def per_example(self, b: int, like: torch.Tensor) -> torch.Tensor:
        """``[B]`` squared norms (in the compute dtype of ``like``, a gradient)."""
        out = [_flat_sq(t) for t in self.squares] + self.extras
        if not out:
            return torch.zeros(b, dtype=_compute_dtype(like), device=like.device)
        return out[0] if len(out) == 1 else torch.stack(out).sum(0)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    dt = t.dtype
    # (a Python test first: torch.promote_types is a dispatched operator, called every step)
    return dt if dt in _WIDE else torch.promote_types(dt, torch.float32)


def _rows(t: torch.Tensor, b: int, *shape: int) -> torch.Tensor:
    """``t`` as ``[b, -1, *shape]``, without a dispatch when it already has that many dims."""
    return t if t.dim() == 2 + len(shape) else t.reshape(b, -1, *shape)


def _flat_sq(t: torch.Tensor) -> torch.Tensor:
    """Squared norm of each row of ``t`` (all but the first dimension flattened)."""
    t = t.reshape(t.shape[0], -1)
    return torch.linalg.vecdot(t, t)


def _positions(parts: list[torch.Tensor], dt: torch.dtype, dim: int = 1) -> torch.Tensor:
    """The calls' tensors concatenated along the positions, in ``dt`` (no copy for one call in
    ``dt``)."""
    t = parts[0] if len(parts) == 1 else torch.cat(parts, dim)
    return t if t.dtype == dt else t.to(dt)


def _outer_terms(terms: Terms, d: torch.Tensor, a: torch.Tensor, bias: bool = False) -> None:
    """Add |sum_p d_np a_np^T|_F^2 (+ |sum_p d_np|^2 with ``bias``) to ``terms``: the Gram form
    where ``GRAM_ADVANTAGE`` P (O + K) < O K, else the materialized ``[N, O, K]`` sums."""
    n, p, o = d.shape
    k = a.shape[2]
    if GRAM_ADVANTAGE * p * (o + k) < o * k:
        gram_d = torch.bmm(d, d.transpose(1, 2))
        gram_a = torch.bmm(a, a.transpose(1, 2))
        if bias:
            gram_a += 1.0      # the bias's gradient: a column of ones appended to a
        terms.extras.append(torch.linalg.vecdot(gram_d.reshape(n, -1), gram_a.reshape(n, -1)))
        return
    product = torch.bmm(d.transpose(1, 2), a)
    terms.squares.append(product if product.numel() <= REDUCE_AT else
                         torch.linalg.vector_norm(product.reshape(n, -1), dim=1))
    if bias:
        terms.squares.append(d.sum(1))


def outer_sq(d: torch.Tensor, a: torch.Tensor, bias: bool = False) -> torch.Tensor:
    """|sum_p d_np a_np^T|_F^2 for each n: ``d`` ``[N, P, O]``, ``a`` ``[N, P, K]`` -> ``[N]``,
    by the Gram form when ``GRAM_ADVANTAGE`` P (O + K) < O K, else by materializing the
    ``[N, O, K]`` sums. With ``bias``, plus |sum_p d_np|^2 (the bias's gradient: a column of ones
    appended to a)."""
    terms = Terms()
    _outer_terms(terms, d, a, bias)
    return terms.per_example(d.shape[0], d)


def _linear(terms: Terms, module: nn.Linear, calls: list[tuple[torch.Tensor, torch.Tensor]]
            ) -> None:
    b = calls[0][0].shape[0]
    dt = _compute_dtype(calls[0][1])
    weight = module.weight.requires_grad
    bias = module.bias is not None and module.bias.requires_grad
    if len(calls) == 1 and calls[0][0].dim() == 2:
        # one position: g_i(W) = d_i a_i^T, |g_i(W)|^2 = |d_i|^2 |a_i|^2: the narrower of d and
        # a scaled by the other's row norms (two kernels); g_i(b) = d_i as it is
        a, d = calls[0]
        if d.dtype != dt or a.dtype != dt:
            a, d = a.to(dt), d.to(dt)
        if weight:
            small, big = (a, d) if a.shape[1] < d.shape[1] else (d, a)
            terms.squares.append(small * torch.linalg.vector_norm(big, dim=1, keepdim=True))
        if bias:
            terms.squares.append(d)
        return
    a = _positions([_rows(x, b, module.in_features) for x, _ in calls], dt)
    d = _positions([_rows(g, b, module.out_features) for _, g in calls], dt)
    if weight:
        _outer_terms(terms, d, a, bias=bias)
    elif bias:
        terms.squares.append(d.sum(1))


def _windows(conv: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The input windows of each output position, ``[B, in_channels x kernel, positions]`` in
    the order of ``conv.weight``'s flattened (in_channel, kernel...) axes."""
    two_d = isinstance(conv, nn.Conv2d)
    padding = conv.padding
    if isinstance(padding, str) or conv.padding_mode != "zeros":
        # as the layer's own forward: pad first (any mode; 'same' may be asymmetric)
        mode = "constant" if conv.padding_mode == "zeros" else conv.padding_mode
        x = F.pad(x, conv._reversed_padding_repeated_twice, mode=mode)
        padding = (0, 0) if two_d else (0,)
    if two_d:
        return F.unfold(x, conv.kernel_size, dilation=conv.dilation, padding=padding,
                        stride=conv.stride)
    return F.unfold(x.unsqueeze(2), (1, conv.kernel_size[0]), dilation=(1, conv.dilation[0]),
                    padding=(0, padding[0]), stride=(1, conv.stride[0]))


def _conv(terms: Terms, module: nn.Conv1d | nn.Conv2d,
          calls: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    b, groups = calls[0][0].shape[0], module.groups
    dt = _compute_dtype(calls[0][1])
    # [B, channels, positions] per call, concatenated along the positions
    a = torch.cat([_windows(module, x.to(dt)) for x, _ in calls], 2)
    d = torch.cat([g.reshape(b, module.out_channels, -1).to(dt) for _, g in calls], 2)
    if module.weight.requires_grad:
        positions = a.shape[2]
        a_g = a.view(b, groups, -1, positions).transpose(2, 3).reshape(b * groups, positions, -1)
        d_g = d.view(b, groups, -1, positions).transpose(2, 3).reshape(b * groups, positions, -1)
        group = Terms()
        _outer_terms(group, d_g, a_g)
        # one row per (example, group): an example's groups side by side
        terms.squares += [t.reshape(b, -1) for t in group.squares]
        terms.extras += [t.view(b, groups).sum(1) for t in group.extras]
    if module.bias is not None and module.bias.requires_grad:
        terms.squares.append(d.sum(2))


def embedding_slots(module: nn.Embedding, calls: list[tuple[torch.Tensor, torch.Tensor]]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The calls' token ids ``[B, P]`` and output gradients ``[B, P, D]`` along the positions,
    the gradients zero at ``padding_idx`` (which gets no gradient)."""
    b = calls[0][0].shape[0]
    dt = _compute_dtype(calls[0][1])
    idx = _positions([x if x.dim() == 2 else x.reshape(b, -1) for x, _ in calls], torch.int64)
    d = _positions([_rows(g, b, module.embedding_dim) for _, g in calls], dt)
    if module.padding_idx is not None:
        d = d * (idx != module.padding_idx).unsqueeze(2).to(dt)
    return idx, d


def _embedding(terms: Terms, module: nn.Embedding, calls: list[tuple[torch.Tensor, torch.Tensor]]
               ) -> None:
    if not module.weight.requires_grad:
        return
    idx, d = embedding_slots(module, calls)
    b, dt = d.shape[0], d.dtype
    positions = idx.shape[1]
    if positions == 1:
        terms.squares.append(d)
    elif module.num_embeddings <= GRAM_ADVANTAGE * positions:
        # a small vocabulary: g_i = onehot_i^T d_i materialized, [V, D] per example, by adding
        # each position's row to its token's (four operator calls)
        rows = d.new_zeros(b, module.num_embeddings, module.embedding_dim)
        terms.squares.append(rows.scatter_add_(1, idx.unsqueeze(2).expand_as(d), d))
    elif positions <= EMBEDDING_GRAM_POSITIONS:
        # sum over position pairs holding the same token of d_p . d_q
        same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(dt)
        gram = torch.bmm(d, d.transpose(1, 2))
        terms.extras.append(torch.linalg.vecdot(gram.reshape(b, -1), same.reshape(b, -1)))
    else:
        # one row per (example, token): the gradient rows of equal tokens within an example add
        example = torch.arange(b, device=idx.device).unsqueeze(1).expand_as(idx)
        keys = (example * module.num_embeddings + idx).reshape(-1)
        uniq, inverse = torch.unique(keys, return_inverse=True)
        rows = d.new_zeros(uniq.numel(), module.embedding_dim).index_add_(
            0, inverse, d.reshape(-1, d.shape[2]))
        terms.extras.append(d.new_zeros(b).index_add_(0, uniq // module.num_embeddings,
                                                      rows.square().sum(1)))


def normalized(module: nn.LayerNorm | nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """The normalized input xhat, by the layer's own kernel without its affine parameters."""
    if isinstance(module, nn.LayerNorm):
        return F.layer_norm(x, module.normalized_shape, eps=module.eps)
    return F.rms_norm(x, module.normalized_shape, eps=module.eps)


def _norm(terms: Terms, module: nn.LayerNorm | nn.RMSNorm,
          calls: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    b = calls[0][0].shape[0]
    dt = _compute_dtype(calls[0][1])
    shape = module.normalized_shape
    weight = module.weight is not None and module.weight.requires_grad
    bias = getattr(module, "bias", None)
    bias = bias is not None and bias.requires_grad
    g = _positions([_rows(g, b, *shape) for _, g in calls], dt)
    if weight:
        x = _positions([_rows(x, b, *shape) for x, _ in calls], dt)
        terms.squares.append(torch.linalg.vecdot(g, normalized(module, x), dim=1))  # sum_p g o xhat
    if bias:
        terms.squares.append(g.sum(1))


# -- the kernel's jobs (theory/monitor/csrc/example_norms.cpp computes the same sums) --------

# a job's layer kind and flags, as the C++ routine reads them
LINEAR, CONV, EMBEDDING, NORM = 0, 1, 2, 3
WEIGHT, BIAS, RMS = 1, 2, 4

# (kind, input, output gradient, flags, n, eps): n the groups of a convolution, the padding
# index of an embedding (-1: none), the normalized elements of a norm layer
Job = tuple[int, torch.Tensor, torch.Tensor, int, int, float]


def _flags(module: nn.Module) -> int:
    # (the parameters' dict read directly: Module.__getattr__ costs a microsecond a name, and
    # this runs for every layer at every measured step)
    params = module._parameters
    w, b = params.get("weight"), params.get("bias")
    return ((WEIGHT if w is not None and w.requires_grad else 0)
            | (BIAS if b is not None and b.requires_grad else 0))


def _joined(calls: list[tuple[torch.Tensor, torch.Tensor]], b: int, x_width: int,
            g_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One call's (input, gradient) as they are; several calls' as ``[B, positions, width]``
    concatenated along the positions (their cross terms count)."""
    if len(calls) == 1:
        return calls[0]
    return (torch.cat([x.reshape(b, -1, x_width) for x, _ in calls], 1),
            torch.cat([g.reshape(b, -1, g_width) for _, g in calls], 1))


def _linear_job(module: nn.Linear, calls: list[tuple[torch.Tensor, torch.Tensor]]) -> Job:
    if len(calls) == 1:
        return LINEAR, calls[0][0], calls[0][1], _flags(module), 0, 0.0
    x, g = _joined(calls, calls[0][0].shape[0], module.in_features, module.out_features)
    return LINEAR, x, g, _flags(module), 0, 0.0


def _conv_job(module: nn.Conv1d | nn.Conv2d, calls: list[tuple[torch.Tensor, torch.Tensor]]
              ) -> Job:
    b = calls[0][0].shape[0]
    dt = _compute_dtype(calls[0][1])
    a = _positions([_windows(module, x.to(dt)) for x, _ in calls], dt, 2)
    d = _positions([g.reshape(b, module.out_channels, -1) for _, g in calls], dt, 2)
    return CONV, a, d, _flags(module), module.groups, 0.0


def _embedding_job(module: nn.Embedding, calls: list[tuple[torch.Tensor, torch.Tensor]]) -> Job:
    x, g = calls[0]
    if len(calls) > 1:
        b = x.shape[0]
        x = torch.cat([x.reshape(b, -1) for x, _ in calls], 1)
        g = torch.cat([g.reshape(b, -1, module.embedding_dim) for _, g in calls], 1)
    padding = -1 if module.padding_idx is None else module.padding_idx
    return EMBEDDING, x, g, _flags(module) & WEIGHT, padding, 0.0


def _norm_job(module: nn.LayerNorm | nn.RMSNorm, calls: list[tuple[torch.Tensor, torch.Tensor]]
              ) -> Job:
    n = math.prod(module.normalized_shape)
    x, g = _joined(calls, calls[0][0].shape[0], n, n)
    eps = module.eps
    if eps is None:     # RMSNorm's default: the machine epsilon of the computation's dtype
        eps = torch.finfo(_compute_dtype(g)).eps
    rms = RMS if isinstance(module, nn.RMSNorm) else 0
    return NORM, x, g, _flags(module) | rms, n, float(eps)


JobFunction = Callable[[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]], Job]


def job_function(module: nn.Module) -> JobFunction:
    """The function that turns ``module``'s calls' (input, output gradient) pairs into one job
    of the kernel (:mod:`theory.monitor.kernel`), which computes the sum over the batch
    of the squared norms that :func:`terms_function`'s terms hold: ``f(module, calls)``."""
    for kinds, job_of in _JOBS:
        if isinstance(module, kinds):
            return job_of
    raise TheoryError(f"{type(module).__name__} is not supported (layer_norms.SUPPORTED)")


_LAYERS = ((nn.Linear, _linear), ((nn.Conv1d, nn.Conv2d), _conv), (nn.Embedding, _embedding),
           ((nn.LayerNorm, nn.RMSNorm), _norm))

_JOBS = ((nn.Linear, _linear_job), ((nn.Conv1d, nn.Conv2d), _conv_job),
         (nn.Embedding, _embedding_job), ((nn.LayerNorm, nn.RMSNorm), _norm_job))

TermsFunction = Callable[[Terms, nn.Module, list[tuple[torch.Tensor, torch.Tensor]]], None]


def terms_function(module: nn.Module) -> TermsFunction:
    """The function that adds ``module``'s terms to a :class:`Terms`, called as ``f(terms,
    module, calls)`` with ``calls`` its calls' (input, output gradient) pairs, at least one (a
    caller that computes many steps looks it up once)."""
    for kinds, terms_of in _LAYERS:
        if isinstance(module, kinds):
            return terms_of
    raise TheoryError(f"{type(module).__name__} is not supported (layer_norms.SUPPORTED)")


def layer_terms(terms: Terms, module: nn.Module, inputs: Sequence[torch.Tensor],
                grads: Sequence[torch.Tensor | None]) -> bool:
    """Add ``module``'s per-example squared norms to ``terms`` (:func:`layer_sq_norms`); False
    when none of its calls' outputs got a gradient."""
    terms_of = terms_function(module)
    calls = [(x, g) for x, g in zip(inputs, grads) if g is not None]
    if not calls:
        return False
    terms_of(terms, module, calls)
    return True


def layer_sq_norms(module: nn.Module, inputs: Sequence[torch.Tensor],
                   grads: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """``[B]`` squared norms of each example's gradient with respect to ``module``'s own
    parameters, from the inputs of its calls in one forward pass and the gradients of their
    outputs (module docstring); calls whose output got no gradient contribute nothing, and None
    is returned when none did. ``module`` must pass :func:`unsupported`."""
    terms = Terms()
    if not layer_terms(terms, module, inputs, grads):
        return None
    return terms.per_example(inputs[0].shape[0], next(g for g in grads if g is not None))
