"""Curvature of the training loss: Hessian spectrum and trace, Lee et al.'s local Lipschitz constant.

All functions take a model and a data set and work on the mean loss over a finite example set
(the training split by default) through :mod:`theory.estimators.functional`: Hessian-vector products by
reverse-over-reverse differentiation on gradient graphs built once per point
(:meth:`FlatLoss.hessian`), full-set quantities summed in chunks, and with a mask only
the kept coordinates (the Hessian restricted to unpruned weights, ``P H P^T``; pruned weights held
at zero). Computations run in float64 by default.

Networks with batch normalization or randomness: the loss differentiated is that of the network
in eval mode (:mod:`theory.estimators.functional`), a deterministic mean of per-example losses. Batch
normalization normalizes with its running statistics, buffers held fixed, so the Hessian has no
term through batch statistics; dropout is the identity. lambda_max, tr(H) and Lee et al.'s L are
therefore the eval-mode network's, at the running statistics the model holds; attention runs
through the math backend of ``scaled_dot_product_attention``, whose second derivatives exist.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh
from torch import nn

from training.data import Dataset
from training.models import check_output

from theory.errors import TheoryError, check_int
from theory.estimators.functional import FlatLoss, Weights, flat_loss, parameter_vector

__all__ = ["hessian_operator", "hessian_top_eigenvalues", "hessian_trace", "TraceEstimate",
           "local_lipschitz", "LocalLipschitz", "LEE_GAMMAS"]

Examples = int | Sequence[int] | torch.Tensor | None
Mask = Mapping[str, torch.Tensor] | None

# Lee et al. (2021), check.py: gamma in {0.1, ..., 0.9}.
LEE_GAMMAS = tuple(round(0.1 * i, 1) for i in range(1, 10))
# Below this many kept coordinates the Hessian is built densely (ARPACK needs k < dimension).
DENSE_LIMIT = 64


def hessian_operator(fl: FlatLoss) -> LinearOperator:
    """The full-set Hessian over kept coordinates as a float64 scipy ``LinearOperator`` (its
    gradient graph built once, see :meth:`FlatLoss.hessian`)."""
    hess = fl.hessian()

    def matvec(v: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.ascontiguousarray(v).reshape(-1), dtype=fl.theta.dtype,
                            device=fl.theta.device)
        return hess(t).cpu().numpy().astype(np.float64)

    return LinearOperator((fl.dim, fl.dim), matvec=matvec, rmatvec=matvec, dtype=np.float64)


def dense_hessian(fl: FlatLoss) -> torch.Tensor:
    """The Hessian over kept coordinates built column by column from Hessian-vector products."""
    h = fl.hvp(torch.eye(fl.dim, dtype=fl.theta.dtype, device=fl.theta.device))
    return 0.5 * (h + h.T)


def hessian_top_eigenvalues(model: nn.Module, dataset: Dataset, k: int = 1, mask: Mask = None,
                            examples: Examples = None, which: str = "LA", tol: float = 1e-8,
                            maxiter: int | None = None, seed: int = 0, split: str = "train",
                            chunk: int | None = None, dtype: torch.dtype = torch.float64,
                            return_eigenvectors: bool = False
                            ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Top ``k`` eigenvalues of the loss Hessian, largest first, by implicitly restarted Lanczos
    (ARPACK ``eigsh``; Lehoucq, Sorensen and Yang 1998) on Hessian-vector products.

    ``which``: ``"LA"`` largest algebraic (the sharpest directions; default) or ``"LM"`` largest
    magnitude. ``tol``: ARPACK's relative accuracy of the eigenvalues; ``maxiter``: its restart
    limit (default 10 x dimension). The start vector is seeded by ``seed`` so results are
    reproducible. When the kept dimension is at most ``DENSE_LIMIT`` (or k does not fit ARPACK's
    k < dimension) the Hessian is built densely and diagonalised exactly. With
    ``return_eigenvectors`` also returns the ``[dim, k]`` eigenvectors in kept coordinates.
    """
    check_output(model, dataset, "hessian_top_eigenvalues")
    check_int(k, "k")
    if which not in ("LA", "LM"):
        raise TheoryError(f"which {which!r}; allowed: LA (largest algebraic), LM (largest magnitude)")
    fl = flat_loss(model, dataset, mask=mask, examples=examples, seed=seed, split=split,
                   chunk=chunk, dtype=dtype)
    if k > fl.dim:
        raise TheoryError(f"k must be <= the number of kept parameters ({fl.dim}), got {k}")
    if fl.dim <= DENSE_LIMIT or k >= fl.dim - 1:
        values, vectors = np.linalg.eigh(dense_hessian(fl).cpu().numpy().astype(np.float64))
    else:
        v0 = np.random.default_rng(seed).standard_normal(fl.dim)
        try:
            values, vectors = eigsh(hessian_operator(fl), k=k, which=which, tol=tol, v0=v0,
                                    maxiter=maxiter)
        except ArpackNoConvergence as exc:
            raise TheoryError(f"Lanczos did not converge to tol={tol} within maxiter={maxiter} "
                              f"({len(exc.eigenvalues)} of {k} eigenvalues): raise tol or maxiter"
                              ) from None
    key = values if which == "LA" else np.abs(values)
    order = np.argsort(key)[::-1][:k]
    if return_eigenvectors:
        return values[order], vectors[:, order]
    return values[order]


def lanczos_top(fl: FlatLoss, iterations: int = 20, seed: int = 0,
                hessian: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
    """Largest Ritz value of ``iterations`` Lanczos steps on the Hessian of ``fl`` (Lanczos 1950;
    full reorthogonalization, Golub and Van Loan 2013, sec. 10.1): a fixed, small cost of
    ``iterations`` Hessian-vector products. The Ritz value is a lower bound of lambda_max that
    converges fastest for the extreme eigenvalue; ``iterations`` >= the kept dimension gives it
    exactly (up to round-off). Start vector seeded by ``seed``. ``hessian``: ``fl.hessian()``
    when the caller already built it (the probes share it with B_noise's products)."""
    iterations = min(check_int(iterations, "iterations"), fl.dim)
    hess = hessian or fl.hessian()
    gen = torch.Generator().manual_seed(int(seed))
    q = torch.randn(fl.dim, generator=gen, dtype=torch.float64).to(fl.theta)
    basis = [q / q.norm()]
    alphas, betas = [], []
    for k in range(iterations):
        w = hess(basis[-1])
        alphas.append(float(w @ basis[-1]))
        Q = torch.stack(basis)
        w = w - Q.T @ (Q @ w)
        w = w - Q.T @ (Q @ w)   # twice: one Gram-Schmidt pass loses orthogonality in float32
        beta = float(w.norm())
        if k == iterations - 1 or beta <= 1e-10 * max(1.0, abs(alphas[-1])):
            break
        betas.append(beta)
        basis.append(w / beta)
    tri = np.diag(alphas) + np.diag(betas[:len(alphas) - 1], 1) + np.diag(betas[:len(alphas) - 1], -1)
    return float(np.linalg.eigvalsh(tri)[-1])


@dataclass(frozen=True)
class TraceEstimate:
    """A Hessian trace estimate: ``value``, its standard error (Hutchinson only, else nan), the
    method and the number of Hessian-vector products spent."""

    value: float
    stderr: float
    method: str
    matvecs: int

    def __float__(self) -> float:
        return self.value


def _rademacher(rows: int, dim: int, gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    signs = torch.randint(0, 2, (rows, dim), generator=gen).to(device=like.device, dtype=like.dtype)
    return 2 * signs - 1


def hessian_trace(model: nn.Module, dataset: Dataset, mask: Mask = None, examples: Examples = None,
                  method: str = "hutch++", matvecs: int = 90, seed: int = 0, split: str = "train",
                  chunk: int | None = None, dtype: torch.dtype = torch.float64) -> TraceEstimate:
    """Randomised estimate of tr(H) over kept coordinates from ``matvecs`` Hessian-vector products.

    ``"hutchinson"`` (Hutchinson 1989): mean of z^T H z over Rademacher z, unbiased, standard error
    from the sample spread. ``"hutch++"`` (Meyer, Musco, Musco and Woodruff 2021): with m =
    ``matvecs`` split in thirds, Q = orth(H S) for Rademacher S (m/3 columns), then
    tr(Q^T H Q) + (3/m) tr(G^T (I - QQ^T) H (I - QQ^T) G); exact once m/3 >= the dimension.
    """
    check_output(model, dataset, "hessian_trace")
    check_int(matvecs, "matvecs")
    fl = flat_loss(model, dataset, mask=mask, examples=examples, seed=seed, split=split,
                   chunk=chunk, dtype=dtype)
    gen = torch.Generator().manual_seed(int(seed))
    hess = fl.hessian()
    if method == "hutchinson":
        z = _rademacher(matvecs, fl.dim, gen, fl.theta)
        samples = (z * hess(z)).sum(1)
        stderr = float(samples.std() / math.sqrt(matvecs)) if matvecs > 1 else math.nan
        return TraceEstimate(float(samples.mean()), stderr, method, matvecs)
    if method == "hutch++":
        if matvecs < 3:
            raise TheoryError(f"hutch++ needs matvecs >= 3, got {matvecs}")
        third = matvecs // 3
        s = _rademacher(third, fl.dim, gen, fl.theta)
        g = _rademacher(matvecs - 2 * third, fl.dim, gen, fl.theta)
        q, _ = torch.linalg.qr(hess(s).T)  # [dim, r] orthonormal columns
        q = q[:, : min(third, fl.dim)]
        top = float((q.T * hess(q.T)).sum())
        g_perp = g - (g @ q) @ q.T
        rest = float((g_perp * hess(g_perp)).sum()) / g.shape[0]
        return TraceEstimate(top + rest, math.nan, method, matvecs)
    raise TheoryError(f"method {method!r}; allowed: hutchinson, hutch++")


@dataclass(frozen=True)
class LocalLipschitz:
    """Lee et al.'s local Lipschitz constant: ``value`` = max over ``gammas`` of ``ratios``."""

    value: float
    gammas: tuple[float, ...]
    ratios: tuple[float, ...]

    def __float__(self) -> float:
        return self.value


def local_lipschitz(model: nn.Module, dataset: Dataset, w_prev: Weights, w_next: Weights,
                    mask: Mask = None, gammas: Sequence[float] = LEE_GAMMAS,
                    examples: Examples = None, seed: int = 0, split: str = "train",
                    chunk: int | None = None, dtype: torch.dtype = torch.float64,
                    grad_prev: torch.Tensor | None = None) -> LocalLipschitz:
    """Local Lipschitz constant of the gradient along one step, as Lee, Ajanthan, Torr and Jaggi
    (2021) measure it (their ``check.py``): full-set gradients (the training split by default),

        w_g = (1 - gamma) w_prev + gamma w_next,
        L_g = ||grad f(w_g) - grad f(w_prev)|| / ||gamma (w_next - w_prev)||,

    reported as the max over ``gammas`` (default 0.1, ..., 0.9). ``w_prev`` / ``w_next``: state
    dicts with every parameter of ``model`` or flat vectors of all parameters in
    ``model.named_parameters()`` order (``torch.nn.utils.parameters_to_vector``); the buffers
    (batch normalization's running statistics) are ``w_prev``'s where it is a state dict holding
    them, else the model's, and held fixed along the step (``w_next``'s are ignored). With ``mask``,
    pruned coordinates of both are held at zero and norms run over kept coordinates.
    ``grad_prev``: the full-set gradient at ``w_prev`` if already known (kept coordinates, in
    ``dtype``), saving one pass. On a quadratic f every L_g equals |H d| / |d|, d = w_next - w_prev.
    """
    check_output(model, dataset, "local_lipschitz")
    gammas = check_gammas(gammas)
    fl = flat_loss(model, dataset, mask=mask, examples=examples, seed=seed, split=split,
                   chunk=chunk, dtype=dtype, weights=w_prev)
    prev = fl.theta
    step, step_norm = lipschitz_step(fl, model, w_next)
    if grad_prev is not None and tuple(grad_prev.shape) != (fl.dim,):
        raise TheoryError(f"grad_prev must have shape ({fl.dim},) (kept coordinates), "
                          f"got {tuple(grad_prev.shape)}")
    # every gamma's gradient (and w_prev's when not given) in one pass over the split
    points = [prev + g * step for g in gammas] + ([prev] if grad_prev is None else [])
    grads = fl.gradients(torch.stack(points))
    if grad_prev is None:
        grad_prev = grads[-1]
    return lipschitz_of(grads[:len(gammas)], grad_prev, gammas, step_norm)


def check_gammas(gammas: Sequence[float]) -> tuple[float, ...]:
    """``gammas`` as floats, checked: a non-empty sequence of values in (0, 1]."""
    gammas = tuple(float(g) for g in gammas)
    if not gammas or not all(0.0 < g <= 1.0 for g in gammas):
        raise TheoryError(f"gammas must be a non-empty sequence of values in (0, 1], got {gammas}")
    return gammas


def lipschitz_step(fl: FlatLoss, model: nn.Module, w_next: Weights) -> tuple[torch.Tensor, float]:
    """The step ``w_next - w_prev`` over ``fl``'s kept coordinates (``fl.theta`` = w_prev) and
    its norm, refused when it is zero."""
    step = fl.restrict(parameter_vector(model, w_next).to(device=fl.theta.device,
                                                           dtype=fl.theta.dtype)) - fl.theta
    step_norm = float(step.norm())
    if step_norm == 0.0:
        raise TheoryError("w_next equals w_prev on the kept coordinates: the step is zero")
    return step, step_norm


def lipschitz_of(grads: torch.Tensor, grad_prev: torch.Tensor, gammas: tuple[float, ...],
                 step_norm: float) -> LocalLipschitz:
    """Lee et al. (2021)'s constant from the gradients ``grads[k]`` at w_prev + gammas[k] step
    and ``grad_prev`` at w_prev: max_k |grads[k] - grad_prev| / (gammas[k] |step|)."""
    ratios = tuple(float((grads[k] - grad_prev).norm()) / (g * step_norm)
                   for k, g in enumerate(gammas))
    return LocalLipschitz(max(ratios), gammas, ratios)
