"""Gradient noise: |G|^2, tr(Sigma), the simple and the Hessian-weighted noise scales.

McCandlish, Kaplan, Amodei et al. (2018), "An Empirical Model of Large-Batch Training": with
per-example gradients g_i of mean G and covariance Sigma on the data,

    B_simple = tr(Sigma) / |G|^2,        B_noise = tr(H Sigma) / (G^T H G),

(equal when the Hessian H is proportional to I), and a mini-batch of B examples drawn with
replacement has E|G_B|^2 = |G|^2 + tr(Sigma) / B, which gives the two-batch unbiased estimators.

Conventions. Sigma is the covariance of the finite example set, divided by n (not n - 1):
Sigma = (1/n) sum_i (g_i - G)(g_i - G)^T. With that convention E|G_B|^2 = |G|^2 + tr(Sigma)/B is
exact for batches drawn uniformly with replacement from the set.

- :func:`gradient_noise`: exact |G|^2 and tr(Sigma) on a finite set from per-example gradients
  (chunked ``vmap`` of ``grad``), and B_noise with Hessian-vector products.
- :func:`two_batch_estimates`: the unbiased estimators from two batch sizes.
- :class:`NoiseStream`: streams of those, numerators and denominators averaged separately.
- :func:`two_batch_noise`: draws the batches from a model and data set and feeds a stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike
import torch
from torch import nn
from torch.func import grad, vmap

from training.data import Dataset

from .errors import TheoryError, check_int
from .functional import FlatLoss, flat_loss

DEFAULT_HESSIAN_EXAMPLES = 64
# Per-example gradients held at once while H is applied to them (bounds their memory).
HVP_GROUP = 16


@dataclass(frozen=True)
class NoiseEstimate:
    """Gradient-noise statistics of one network on one finite example set.

    ``g_sq`` = |G|^2; ``trace_sigma`` = tr(Sigma) (divide-by-n convention); ``b_simple`` =
    tr(Sigma)/|G|^2; ``trace_h_sigma`` = tr(H Sigma) estimated on ``hessian_examples`` examples;
    ``g_h_g`` = G^T H G; ``b_noise`` = their ratio (nan when ``hessian_examples`` is 0);
    ``n`` examples, ``n_params`` kept coordinates, ``loss`` the mean loss on the set.
    """

    g_sq: float
    trace_sigma: float
    b_simple: float
    b_noise: float
    n: int
    n_params: int
    loss: float
    trace_h_sigma: float
    g_h_g: float
    hessian_examples: int


def _ratio(num: float, den: float) -> float:
    return num / den if den != 0 else math.inf if num > 0 else math.nan


def gradient_moments(fl: FlatLoss, chunk: int | None = None) -> tuple[torch.Tensor, float]:
    """Mean gradient G and tr(Sigma) (divide by n) over ``fl``'s set in one pass.

    Chunk statistics are merged with Chan et al.'s (1979) pairwise update,
    M2 = M2_a + M2_b + |m_a - m_b|^2 n_a n_b / (n_a + n_b), which avoids the cancellation of
    mean |g_i|^2 - |G|^2 when the noise is small next to the mean.
    """
    count, mean, m2 = 0, torch.zeros_like(fl.theta), 0.0
    for g in fl.per_example_gradients(chunk=chunk):
        c = g.shape[0]
        m_c = g.mean(0)
        m2_c = float((g - m_c).pow(2).sum())
        delta = m_c - mean
        m2 += m2_c + float(delta.pow(2).sum()) * count * c / (count + c)
        mean = mean + delta * (c / (count + c))
        count += c
    return mean, m2 / count


def gradient_noise(model: nn.Module, dataset: Dataset, mask: Mapping[str, torch.Tensor] | None = None,
                   examples: int | Sequence[int] | torch.Tensor | None = None,
                   chunk: int | None = None,
                   hessian_examples: int | None = DEFAULT_HESSIAN_EXAMPLES, seed: int = 0,
                   split: str = "train", dtype: torch.dtype = torch.float64) -> NoiseEstimate:
    """Exact gradient-noise statistics of ``model`` on a finite set (McCandlish et al., 2018).

    The set is ``split`` (default the training split), or ``examples`` of it (a seeded sample of
    that many, or the given indices). With ``mask`` only kept coordinates count (pruned weights
    are held at zero). Per-example gradients are computed ``chunk`` at a time (default: as many as
    fit ``functional.PER_EXAMPLE_BYTES``), so memory does not grow with the set.

    B_noise: tr(H Sigma) = (1/n) sum_i (g_i - G)^T H (g_i - G) with H the Hessian of the mean loss
    on the whole set, averaged over a seeded sample of ``hessian_examples`` examples (unbiased; all
    examples, hence exact, if ``None`` or >= n; skipped, b_noise = nan, if 0); G^T H G from one
    Hessian-vector product. Cost: one full-set Hessian-vector product per sampled example. Away
    from a minimum H may be indefinite, so G^T H G (and B_noise) can be small or negative: read
    B_noise together with ``g_h_g``.
    """
    if hessian_examples is not None and (isinstance(hessian_examples, bool)
                                         or not isinstance(hessian_examples, int)
                                         or hessian_examples < 0):
        raise TheoryError(f"hessian_examples must be an integer >= 0 or None (all), "
                          f"got {hessian_examples!r}")
    fl = flat_loss(model, dataset, mask=mask, examples=examples, seed=seed, split=split,
                   dtype=dtype)
    mean, trace_sigma = gradient_moments(fl, chunk)
    g_sq = float(mean.pow(2).sum())
    m = fl.n if hessian_examples is None else min(hessian_examples, fl.n)
    trace_h_sigma = g_h_g = math.nan
    if m > 0:
        hess = fl.hessian()
        g_h_g = float(mean @ hess(mean))
        trace_h_sigma = _trace_h_sigma(fl, hess, mean, m, seed, chunk)
    return NoiseEstimate(g_sq=g_sq, trace_sigma=trace_sigma, b_simple=_ratio(trace_sigma, g_sq),
                         b_noise=_ratio(trace_h_sigma, g_h_g), n=fl.n, n_params=fl.dim,
                         loss=float(fl.loss()), trace_h_sigma=trace_h_sigma, g_h_g=g_h_g,
                         hessian_examples=m)


def _trace_h_sigma(fl: FlatLoss, hess: Callable[[torch.Tensor], torch.Tensor], mean: torch.Tensor,
                   m: int, seed: int, chunk: int | None) -> float:
    """(1/m) sum over m sampled examples of (g_i - G)^T H (g_i - G), ``hess`` = ``fl.hessian()``."""
    if m == fl.n:
        x, y = fl.x, fl.y
    else:
        # a stream independent of the one that chose ``examples``
        gen = torch.Generator().manual_seed(int(seed) + 0x9E3779B9)
        idx = torch.randperm(fl.n, generator=gen)[:m].to(fl.x.device)
        x, y = fl.x[idx], fl.y[idx]
    total = 0.0
    for g in fl.per_example_gradients(chunk=min(fl.per_example_chunk(chunk), HVP_GROUP), x=x, y=y):
        d = g - mean
        total += float((d * hess(d)).sum())
    return total / m


@dataclass(frozen=True)
class TwoBatchEstimate:
    """Unbiased estimates of |G|^2 and tr(Sigma) from two batch sizes (scalars or arrays)."""

    g_sq: float | np.ndarray
    trace_sigma: float | np.ndarray

    @property
    def b_simple(self) -> float | np.ndarray:
        return self.trace_sigma / self.g_sq


def _check_batch_sizes(b_small: int, b_big: int) -> None:
    check_int(b_small, "b_small")
    check_int(b_big, "b_big")
    if b_big <= b_small:
        raise TheoryError(f"b_big must exceed b_small, got b_small={b_small}, b_big={b_big}")


def two_batch_estimates(g_small_sq: ArrayLike, g_big_sq: ArrayLike, b_small: int,
                        b_big: int) -> TwoBatchEstimate:
    """McCandlish et al. (2018, appendix A.1) unbiased estimators from E|G_B|^2 = |G|^2 + tr(Sigma)/B:

        |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
        tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

    ``g_small_sq`` / ``g_big_sq``: squared norms of mean gradients over batches of ``b_small`` /
    ``b_big`` examples (floats or arrays, one entry per draw). Each estimate is unbiased; their
    ratio is not, so average numerators and denominators first (:class:`NoiseStream`).
    """
    _check_batch_sizes(b_small, b_big)
    small, big = np.asarray(g_small_sq, dtype=float), np.asarray(g_big_sq, dtype=float)
    g_sq = (b_big * big - b_small * small) / (b_big - b_small)
    trace = (small - big) / (1.0 / b_small - 1.0 / b_big)
    if g_sq.ndim == 0:
        return TwoBatchEstimate(float(g_sq), float(trace))
    return TwoBatchEstimate(g_sq, trace)


@dataclass(frozen=True)
class NoiseStream:
    """Running average of two-batch estimates; B_simple as the ratio of the averages.

    ``decay`` = 1 gives the plain average of all updates; ``decay`` < 1 an exponential moving
    average (bias-corrected: sums and weight decay alike). Immutable: ``update`` returns a new
    stream.
    """

    b_small: int
    b_big: int
    decay: float = 1.0
    g_sq_sum: float = 0.0
    trace_sum: float = 0.0
    weight: float = 0.0

    def __post_init__(self) -> None:
        _check_batch_sizes(self.b_small, self.b_big)
        if not 0.0 < self.decay <= 1.0:
            raise TheoryError(f"decay must be in (0, 1], got {self.decay!r}")

    def update(self, g_small_sq: ArrayLike, g_big_sq: ArrayLike) -> "NoiseStream":
        """Add one draw (floats) or several in order (1-D arrays)."""
        est = two_batch_estimates(np.atleast_1d(g_small_sq), np.atleast_1d(g_big_sq),
                                  self.b_small, self.b_big)
        k = est.g_sq.shape[0]
        # weight of the j-th new draw after all k: decay^(k-1-j)
        w = self.decay ** np.arange(k - 1, -1, -1, dtype=float)
        old = self.decay ** k
        return replace(self, g_sq_sum=old * self.g_sq_sum + float(w @ est.g_sq),
                       trace_sum=old * self.trace_sum + float(w @ est.trace_sigma),
                       weight=old * self.weight + float(w.sum()))

    def _mean(self, total: float) -> float:
        if self.weight == 0:
            raise TheoryError("NoiseStream has no updates yet")
        return total / self.weight

    @property
    def g_sq(self) -> float:
        return self._mean(self.g_sq_sum)

    @property
    def trace_sigma(self) -> float:
        return self._mean(self.trace_sum)

    @property
    def b_simple(self) -> float:
        return _ratio(self.trace_sigma, self.g_sq)


def batch_gradient_norms(fl: FlatLoss, batches: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """|G_B|^2 of the mean gradient over each row of ``batches`` (``[draws, B]`` example indices
    into ``fl``'s set), vectorized over draws in chunks of ``chunk`` (default: about
    ``fl.chunk`` examples per pass)."""
    size = chunk or max(1, fl.chunk // batches.shape[1])
    batch_grad = vmap(grad(fl.batch_loss), in_dims=(None, 0, 0))
    out = []
    for i in range(0, batches.shape[0], size):
        idx = batches[i:i + size].to(fl.x.device)
        out.append(batch_grad(fl.theta, fl.x[idx], fl.y[idx]).pow(2).sum(1))
    return torch.cat(out)


def two_batch_noise(model: nn.Module, dataset: Dataset, b_small: int, b_big: int, draws: int = 100,
                    mask: Mapping[str, torch.Tensor] | None = None,
                    examples: int | Sequence[int] | torch.Tensor | None = None, seed: int = 0,
                    split: str = "train", decay: float = 1.0,
                    dtype: torch.dtype = torch.float64) -> NoiseStream:
    """Two-batch noise estimates from ``draws`` random batches (McCandlish et al., 2018).

    Each draw takes ``b_big`` examples uniformly with replacement from the set (so the estimators
    are unbiased for the divide-by-n Sigma) and uses its first ``b_small`` as the small batch, as
    a data-parallel run would (one worker's batch inside the global one). Returns the stream of all
    draws: ``.g_sq``, ``.trace_sigma``, ``.b_simple``.
    """
    check_int(draws, "draws")
    stream = NoiseStream(b_small, b_big, decay)
    fl = flat_loss(model, dataset, mask=mask, examples=examples, seed=seed, split=split, dtype=dtype)
    gen = torch.Generator().manual_seed(int(seed))
    batches = torch.randint(fl.n, (draws, b_big), generator=gen)
    big = batch_gradient_norms(fl, batches)
    small = batch_gradient_norms(fl, batches[:, :b_small])
    return stream.update(small.cpu().numpy(), big.cpu().numpy())
