"""Gradient noise: |G|^2, tr(Sigma), the simple and the Hessian-weighted noise scales.

McCandlish, Kaplan, Amodei et al. (2018), "An Empirical Model of Large-Batch Training": with
per-example gradients g_i of mean G and covariance Sigma on the data,

    B_simple = tr(Sigma) / |G|^2,        B_noise = tr(H Sigma) / (G^T H G),

(equal when the Hessian H is proportional to I), and a mini-batch of B examples drawn with
replacement has E|G_B|^2 = |G|^2 + tr(Sigma) / B, which gives the two-batch unbiased estimators
(their appendix A.1).

What is estimated: the quantities of the *split* sampled (the training split by default), with
Sigma = (1/N) sum_i (g_i - G)(g_i - G)^T over its N examples (divide by N), whatever the sample
size. A probe on a subsample of n examples corrects its finite-set statistics with the
finite-population correction of :mod:`theory.estimators.sampling` (unbiased |G|^2 and tr(Sigma), exact
when n = N); the finite-set statistics of the sample itself stay available
(``NoiseEstimate.finite``, ``NoiseStream.finite_g_sq``). Averages over draws are ratios of
averages: B_simple = mean tr(Sigma) / mean |G|^2, never a mean of ratios.

Networks with batch normalization or randomness (dropout): every estimate here is of the network
in eval mode (:mod:`theory.estimators.functional`: batch normalization with its running statistics, dropout
the identity), whose loss is a mean of per-example losses; g_i, G and Sigma are that loss's, and
the estimators are exactly unbiased for its B_simple. The train-mode alternative, the two-batch
estimator (McCandlish et al. 2018, appendix A.1) applied to gradients of train-mode batches, whose
normalization statistics and dropout masks change with the batch, measures another quantity and is
not what is reported; :func:`two_batch_noise` draws its batches from the same eval-mode loss.

- :func:`gradient_noise`: from per-example gradients (chunked ``vmap`` of ``grad``) of a sample
  or the whole split, with jackknife standard errors, and B_noise with Hessian-vector products.
- :func:`two_batch_estimates`: the unbiased estimators from two batch sizes.
- :class:`NoiseStream`: streams of those, numerators and denominators averaged separately.
- :func:`two_batch_noise`: draws the batches from a model and data set and feeds a stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike
import torch
from torch import nn

from training.data import Dataset
from training.models import check_output

from theory.errors import TheoryError, check_int
from theory.estimators.example_norms import chunk_moments, weighted_layers
from theory.estimators.functional import FlatLoss, flat_loss, split_size
from theory.estimators.sampling import (
    JACKKNIFE_GROUPS, GroupMoments, noise_scale, split_coefficients, split_estimate, to_split,
)

DEFAULT_HESSIAN_EXAMPLES = 64
# Per-example gradients held at once while H is applied to them (bounds their memory).
HVP_GROUP = 16


@dataclass(frozen=True)
class FiniteSetNoise:
    """The same statistics of the sampled set itself, as a finite population (exact for it, not
    for the split): |m|^2, its divide-by-n covariance trace, their ratio, and the Hessian-weighted
    pair."""

    g_sq: float
    trace_sigma: float
    b_simple: float
    trace_h_sigma: float
    g_h_g: float
    b_noise: float


@dataclass(frozen=True)
class NoiseEstimate:
    """Gradient-noise estimates of one network for the split its ``n`` examples were sampled
    from (``population`` examples; the sample is the split when n = population).

    ``g_sq`` ~ |G|^2 and ``trace_sigma`` ~ tr(Sigma) (divide-by-N convention), unbiased;
    ``b_simple`` = trace_sigma / g_sq (inf when the |G|^2 estimate is <= 0); ``*_se`` their
    jackknife standard errors (0 when n = population). ``trace_h_sigma`` ~ tr(H Sigma) (estimated
    on ``hessian_examples`` examples) and ``g_h_g`` ~ G^T H G get the same correction with H the
    Hessian of the sampled set; ``b_noise`` = their ratio (nan when ``hessian_examples`` is 0).
    ``n_params`` kept coordinates, ``loss`` the mean loss on the sample, ``finite`` the sample's
    own finite-set statistics; ``gradient`` the sample's mean gradient over kept coordinates (in
    the estimate's dtype), to reuse (e.g. as ``theory.local_lipschitz``'s ``grad_prev``).
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
    population: int
    g_sq_se: float
    trace_sigma_se: float
    b_simple_se: float
    finite: FiniteSetNoise
    gradient: torch.Tensor | None = field(default=None, repr=False, compare=False)


def _ratio(num: float, den: float) -> float:
    return num / den if den != 0 else math.inf if num > 0 else math.nan


def gradient_group_moments(fl: FlatLoss, chunk: int | None = None,
                           groups: int = JACKKNIFE_GROUPS,
                           losses: list[float] | None = None) -> GroupMoments:
    """Per-example gradient moments of ``fl``'s set in ``groups`` contiguous groups (for the
    jackknife of :mod:`theory.estimators.sampling`), in one pass: from per-example gradient norms
    (:mod:`theory.estimators.example_norms`) for Linear and Conv1d networks, else from chunked per-example
    gradients. ``losses``: a list that gets the summed loss of every chunk of the set when the
    pass computes them (the per-example-norm path), left empty otherwise."""
    bounds = np.linspace(0, fl.n, min(groups, fl.n) + 1).round().astype(int)
    spans = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    # the closed-form per-example gradients are those of the task's own losses
    if fl.own_loss is None and weighted_layers(fl.model) is not None:
        size = chunk or fl.chunk
        seen: list[float] = []
        parts = [[chunk_moments(fl, fl.x[i:min(i + size, hi)], fl.y[i:min(i + size, hi)], seen)
                  for i in range(lo, hi, size)] for lo, hi in spans]
        if all(p is not None for group in parts for p in group):
            if losses is not None:
                losses += seen
            return GroupMoments.of_parts(parts)
    return GroupMoments.of_chunks([
        list(fl.per_example_gradients(chunk=chunk, x=fl.x[lo:hi], y=fl.y[lo:hi]))
        for lo, hi in spans])


def _check_distinct(examples: int | Sequence[int] | torch.Tensor | None) -> None:
    """Given indices must be a sample without replacement for the split correction to hold."""
    if examples is not None and not isinstance(examples, int):
        idx = torch.as_tensor(examples).reshape(-1)
        if idx.unique().numel() != idx.numel():
            raise TheoryError("examples indices must be distinct (a sample without replacement)")


def gradient_noise(model: nn.Module, dataset: Dataset, mask: Mapping[str, torch.Tensor] | None = None,
                   examples: int | Sequence[int] | torch.Tensor | None = None,
                   chunk: int | None = None,
                   hessian_examples: int | None = DEFAULT_HESSIAN_EXAMPLES, seed: int = 0,
                   split: str = "train", dtype: torch.dtype = torch.float64) -> NoiseEstimate:
    """Gradient-noise estimates of ``model`` for ``split`` (McCandlish et al. 2018, appendix A).

    The sample is the whole ``split`` (default the training split; every estimate exact), or
    ``examples`` of it: a seeded sample without replacement of that many, or the given distinct
    indices (taken as such a sample). With m the sample's mean gradient, s^2 its covariance trace
    divided by n - 1 and N the split's size, the estimates for the split are

        |G|^2 ~ |m|^2 - (1 - n/N) s^2 / n,    tr(Sigma) ~ (N - 1)/N s^2,    B_simple = ratio,

    unbiased for every n >= 2 (:mod:`theory.estimators.sampling`), with delete-a-group jackknife standard
    errors; ``finite`` keeps the sample's own finite-set statistics. With ``mask`` only kept
    coordinates count (pruned weights are held at zero). Per-example gradients are computed
    ``chunk`` at a time (default: as many as fit ``functional.PER_EXAMPLE_BYTES``), so memory
    does not grow with the set.

    B_noise: the sample's tr(H Sigma) = (1/n) sum_i (g_i - m)^T H (g_i - m), with H the Hessian of
    the mean loss on the sample, averaged over a seeded sample of ``hessian_examples`` examples
    (unbiased; all examples, hence exact, if ``None`` or >= n; skipped, b_noise = nan, if 0), and
    m^T H m from one Hessian-vector product, both corrected to the split as above with H held
    fixed. Cost: one Hessian-vector product on the sample per sampled example. Away from a
    minimum H may be indefinite, so G^T H G (and B_noise) can be small or negative: read B_noise
    together with ``g_h_g``.
    """
    check_output(model, dataset, "gradient_noise")
    if hessian_examples is not None and (isinstance(hessian_examples, bool)
                                         or not isinstance(hessian_examples, int)
                                         or hessian_examples < 0):
        raise TheoryError(f"hessian_examples must be an integer >= 0 or None (all), "
                          f"got {hessian_examples!r}")
    _check_distinct(examples)
    fl = flat_loss(model, dataset, mask=mask, examples=examples, seed=seed, split=split,
                   dtype=dtype)
    population = split_size(dataset, split)
    # the whole split is exact: no jackknife groups needed
    losses: list[float] = []
    moments = gradient_group_moments(fl, chunk, groups=1 if fl.n == population else JACKKNIFE_GROUPS,
                                     losses=losses)
    est = split_estimate(moments, population)
    mean = moments.total()[1]
    curved = curvature_noise(fl, mean, population, hessian_examples, seed, chunk)
    finite = FiniteSetNoise(g_sq=est.finite_g_sq, trace_sigma=est.finite_trace_sigma,
                            b_simple=_ratio(est.finite_trace_sigma, est.finite_g_sq),
                            trace_h_sigma=curved.set_trace_h_sigma, g_h_g=curved.set_g_h_g,
                            b_noise=_ratio(curved.set_trace_h_sigma, curved.set_g_h_g))
    # the moments' pass computed every chunk's loss: no second pass for the mean loss
    loss = sum(losses) / fl.n if losses else float(fl.loss())
    return NoiseEstimate(g_sq=est.g_sq, trace_sigma=est.trace_sigma, b_simple=est.b_simple,
                         b_noise=curved.b_noise, n=fl.n, n_params=fl.dim,
                         loss=loss, trace_h_sigma=curved.trace_h_sigma, g_h_g=curved.g_h_g,
                         hessian_examples=curved.hessian_examples, population=population,
                         g_sq_se=est.g_sq_se, trace_sigma_se=est.trace_sigma_se,
                         b_simple_se=est.b_simple_se, finite=finite, gradient=mean)


@dataclass(frozen=True)
class CurvatureNoise:
    """The Hessian-weighted half of :class:`NoiseEstimate`: the sample's own tr(H Sigma) and
    m^T H m (``set_*``), both corrected to the split (``trace_h_sigma``, ``g_h_g``), their ratio
    ``b_noise`` (nan when ``hessian_examples`` is 0) and the examples tr(H Sigma) averaged."""

    set_trace_h_sigma: float
    set_g_h_g: float
    trace_h_sigma: float
    g_h_g: float
    b_noise: float
    hessian_examples: int


def curvature_noise(fl: FlatLoss, mean: torch.Tensor, population: int,
                    hessian_examples: int | None = DEFAULT_HESSIAN_EXAMPLES, seed: int = 0,
                    chunk: int | None = None,
                    hessian: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    products: Callable[[torch.Tensor], torch.Tensor] | None = None
                    ) -> CurvatureNoise:
    """B_noise = tr(H Sigma) / (G^T H G) of ``fl``'s set, a sample of a split of ``population``
    examples, from its mean gradient ``mean`` (McCandlish et al. 2018): as
    :func:`gradient_noise` computes it (``hessian_examples`` sampled examples, seeded by
    ``seed``; 0: skipped), with ``hessian`` = ``fl.hessian()`` when the caller already built it
    (a Lanczos run on the same set shares it). ``products``: another ``v -> H v`` of the same
    Hessian for tr(H Sigma)'s products (rows ``[r, dim]`` at once; e.g.
    :func:`theory.estimators.mlp_passes.mlp_hessian`), G^T H G staying on ``hessian``."""
    m = fl.n if hessian_examples is None else min(hessian_examples, fl.n)
    set_h_sigma = set_g_h_g = math.nan
    if m > 0:
        hess = hessian or fl.hessian()
        set_g_h_g = float(mean @ hess(mean))
        set_h_sigma = _trace_h_sigma(fl, products or hess, mean, m, seed, chunk)
    g_h_g, trace_h_sigma = to_split(set_g_h_g, set_h_sigma, fl.n, population)
    return CurvatureNoise(set_h_sigma, set_g_h_g, trace_h_sigma, g_h_g,
                          _ratio(trace_h_sigma, g_h_g), m)


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
    ``b_big`` examples drawn with replacement from a finite set (floats or arrays, one entry per
    draw); G and Sigma (divide by n) are that set's. Each estimate is unbiased; their ratio is
    not, so average numerators and denominators first (:class:`NoiseStream`).
    """
    _check_batch_sizes(b_small, b_big)
    small, big = np.asarray(g_small_sq, dtype=float), np.asarray(g_big_sq, dtype=float)
    g_sq = (b_big * big - b_small * small) / (b_big - b_small)
    trace = (small - big) / (1.0 / b_small - 1.0 / b_big)
    if g_sq.ndim == 0:
        return TwoBatchEstimate(float(g_sq), float(trace))
    return TwoBatchEstimate(g_sq, trace)


def weighted_mean_cov(weight: float, weight_sq: float, g_sum: float, t_sum: float,
                      gg_sum: float, tt_sum: float, gt_sum: float
                      ) -> tuple[tuple[float, float], tuple[float, float, float]]:
    """Weighted means of a stream of (g, t) estimates from its weighted sums (weights w: ``weight``
    = sum w, ``weight_sq`` = sum w^2, ``gg_sum`` = sum w g^2, ...) and the covariance of those
    means as (Var g, Var t, Cov(g, t)) (nan with one draw): the reliability-weighted sample
    covariance times sum w^2 / (sum w)^2. Plain floats: a training loop calls it every step."""
    w, w2 = weight, weight_sq
    g, t = g_sum / w, t_sum / w
    dof = 1.0 - w2 / w**2
    if not dof > 0:
        return (g, t), (math.nan,) * 3
    f = w2 / w**2 / dof
    return (g, t), ((gg_sum / w - g * g) * f, (tt_sum / w - t * t) * f, (gt_sum / w - g * t) * f)


def ratio_se(g: float, t: float, cov: tuple[float, float, float]) -> float:
    """Standard error of B_simple = t / g by the delta method, from (Var g, Var t, Cov(g, t)):
    Var(t/g) ~ (Var t + R^2 Var g - 2 R Cov(g, t)) / g^2, R = t/g (nan when g <= 0)."""
    if not g > 0:
        return math.nan
    r = t / g
    return math.sqrt(max(cov[1] + r * r * cov[0] - 2 * r * cov[2], 0.0)) / g


@dataclass(frozen=True)
class NoiseStream:
    """Running average of two-batch estimates; B_simple as the ratio of the averages
    (McCandlish et al. 2018, appendix A.1: average |G|^2 and tr(Sigma) separately).

    ``decay`` = 1 gives the plain average of all updates; ``decay`` < 1 an exponential moving
    average (bias-corrected: sums and weight decay alike). Immutable: ``update`` returns a new
    stream.

    The draws estimate the finite set they are drawn from (``finite_g_sq``,
    ``finite_trace_sigma``). When that set is a sample of ``pool`` examples drawn without
    replacement from a split of ``population``, ``g_sq`` / ``trace_sigma`` / ``b_simple`` are
    corrected to the split (:func:`theory.estimators.sampling.to_split`, linear, so still unbiased);
    otherwise they equal the finite-set ones. Standard errors (``*_se``) come from the spread of
    the draws (weighted variance of the mean; B_simple's by the delta method) and cover the
    batch draws only, not the choice of the pool.
    """

    b_small: int
    b_big: int
    decay: float = 1.0
    pool: int | None = None
    population: int | None = None
    weight: float = 0.0
    weight_sq: float = 0.0
    # weighted sums of the per-draw estimates (g = |G|^2, t = tr Sigma), their squares and product
    g_sum: float = 0.0
    t_sum: float = 0.0
    gg_sum: float = 0.0
    tt_sum: float = 0.0
    gt_sum: float = 0.0

    def __post_init__(self) -> None:
        _check_batch_sizes(self.b_small, self.b_big)
        if not 0.0 < self.decay <= 1.0:
            raise TheoryError(f"decay must be in (0, 1], got {self.decay!r}")
        if (self.pool is None) != (self.population is None) or (
                self.pool is not None and not 2 <= self.pool <= self.population):
            raise TheoryError(f"pool and population must both be None or satisfy "
                              f"2 <= pool <= population, got pool={self.pool!r}, "
                              f"population={self.population!r}")

    def update(self, g_small_sq: ArrayLike, g_big_sq: ArrayLike) -> "NoiseStream":
        """Add one draw (floats) or several in order (1-D arrays)."""
        est = two_batch_estimates(np.atleast_1d(g_small_sq), np.atleast_1d(g_big_sq),
                                  self.b_small, self.b_big)
        g, t = est.g_sq, est.trace_sigma
        # weight of the j-th new draw after all k: decay^(k-1-j)
        w = self.decay ** np.arange(len(g) - 1, -1, -1, dtype=float)
        old = self.decay ** len(g)
        return replace(self, weight=old * self.weight + float(w.sum()),
                       weight_sq=old ** 2 * self.weight_sq + float(w @ w),
                       g_sum=old * self.g_sum + float(w @ g), t_sum=old * self.t_sum + float(w @ t),
                       gg_sum=old * self.gg_sum + float(w @ (g * g)),
                       tt_sum=old * self.tt_sum + float(w @ (t * t)),
                       gt_sum=old * self.gt_sum + float(w @ (g * t)))

    def _finite(self) -> tuple[np.ndarray, np.ndarray]:
        if self.weight == 0:
            raise TheoryError("NoiseStream has no updates yet")
        mean, (vg, vt, cgt) = weighted_mean_cov(self.weight, self.weight_sq, self.g_sum,
                                                self.t_sum, self.gg_sum, self.tt_sum, self.gt_sum)
        return np.array(mean), np.array([[vg, cgt], [cgt, vt]])

    def _split(self) -> tuple[np.ndarray, np.ndarray]:
        mean, cov = self._finite()
        if self.pool is None:
            return mean, cov
        bias, scale = split_coefficients(self.pool, self.population)
        a = np.array([[1.0, -bias], [0.0, scale]])
        return a @ mean, a @ cov @ a.T

    @property
    def finite_g_sq(self) -> float:
        """|G|^2 of the finite set the batches are drawn from (the pool)."""
        return float(self._finite()[0][0])

    @property
    def finite_trace_sigma(self) -> float:
        """tr(Sigma) (divide by its size) of the finite set the batches are drawn from."""
        return float(self._finite()[0][1])

    @property
    def g_sq(self) -> float:
        return float(self._split()[0][0])

    @property
    def trace_sigma(self) -> float:
        return float(self._split()[0][1])

    @property
    def b_simple(self) -> float:
        return noise_scale(self.trace_sigma, self.g_sq)

    @property
    def g_sq_se(self) -> float:
        return float(math.sqrt(self._split()[1][0, 0]))

    @property
    def trace_sigma_se(self) -> float:
        return float(math.sqrt(self._split()[1][1, 1]))

    @property
    def b_simple_se(self) -> float:
        (g, t), cov = self._split()
        return ratio_se(g, t, (cov[0, 0], cov[1, 1], cov[0, 1]))


def batch_gradient_norms(fl: FlatLoss, batches: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """|G_B|^2 of the mean gradient over each row of ``batches`` (``[draws, B]`` example indices
    into ``fl``'s set), vectorized over draws in chunks of ``chunk`` (default: about
    ``fl.chunk`` examples per pass)."""
    size = chunk or max(1, fl.chunk // batches.shape[1])
    out = []
    for i in range(0, batches.shape[0], size):
        idx = batches[i:i + size].to(fl.x.device)
        out.append(fl.mapped_gradients(fl.batch_loss, fl.theta, fl.x[idx], fl.y[idx]).pow(2).sum(1))
    return torch.cat(out)


def two_batch_noise(model: nn.Module, dataset: Dataset, b_small: int, b_big: int, draws: int = 100,
                    mask: Mapping[str, torch.Tensor] | None = None,
                    examples: int | Sequence[int] | torch.Tensor | None = None, seed: int = 0,
                    split: str = "train", decay: float = 1.0,
                    dtype: torch.dtype = torch.float64) -> NoiseStream:
    """Two-batch noise estimates of ``split`` from ``draws`` random batches (McCandlish et al.
    2018, appendix A.1).

    Each draw takes ``b_big`` examples uniformly with replacement from the pool (the whole split,
    or ``examples`` of it drawn without replacement, as :func:`gradient_noise`) and uses its first
    ``b_small`` as the small batch, as a data-parallel run would (one worker's batch inside the
    global one). The estimators are unbiased for the pool's divide-by-n Sigma and |G|^2; a pool
    smaller than the split is corrected to the split (:class:`NoiseStream` ``pool`` /
    ``population``). Returns the stream of all draws: ``.g_sq``, ``.trace_sigma``,
    ``.b_simple`` and their standard errors.
    """
    check_output(model, dataset, "two_batch_noise")
    check_int(draws, "draws")
    _check_distinct(examples)
    fl = flat_loss(model, dataset, mask=mask, examples=examples, seed=seed, split=split, dtype=dtype)
    population = split_size(dataset, split)
    pooled = fl.n < population
    stream = NoiseStream(b_small, b_big, decay, pool=fl.n if pooled else None,
                         population=population if pooled else None)
    gen = torch.Generator().manual_seed(int(seed))
    batches = torch.randint(fl.n, (draws, b_big), generator=gen)
    big = batch_gradient_norms(fl, batches)
    small = batch_gradient_norms(fl, batches[:, :b_small])
    return stream.update(small.cpu().numpy(), big.cpu().numpy())
