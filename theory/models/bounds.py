"""Steps-to-goal from the smooth nonconvex SGD bound, derived once with sympy.

Bound (Ghadimi & Lan 2013; the form Lee et al. 2021 use): for an L-smooth f, unbiased stochastic
gradients with variance sigma^2 / B at batch size B, Delta = f(w_0) - f_inf and a constant step
eta <= 1/L,

    (1/K) sum_k E||grad f(w_k)||^2 <= 2 Delta / (eta K) + eta L sigma^2 / B.

Derivation (``derivation()`` holds every expression; ``latex()`` prints them):

1. steps to push the bound to the goal eps: K(eta, B) = 2 Delta B / (eta (eps B - eta L sigma^2)),
   finite only while eta L sigma^2 / B < eps;
2. K(eta) has one stationary point, a minimum, at eta_u = eps B / (2 L sigma^2), and decreases
   before it, so under eta <= 1/L the best step is eta*(B) = min(eps B / (2 L sigma^2), 1/L):
   linear in B up to the kink batch B_kink = 2 sigma^2 / eps, then capped;
3. K*(B) = 8 L Delta sigma^2 / (eps^2 B) for B <= B_kink (perfect scaling), and
   2 L Delta B / (eps B - sigma^2) above it, falling to S_min = 2 L Delta / eps;
4. critical batch (McCandlish et al. 2018's B_crit = E_min / S_min, E_min = lim_{B->0} B K*(B)):
   B_crit = 4 sigma^2 / eps, the crossing of the two asymptotes; it does not depend on L or
   Delta, while K* scales with L Delta at every B.

So the constant is 4 for B_crit defined by the crossing of the asymptotes (E_min / S_min,
McCandlish et al. 2018), and 2 for the batch where the step-size cap starts to bind. The exact curve is not S_min (1 + B_crit/B):
at B = B_crit it is 4/3 S_min rather than 2 S_min (``approx_steps`` gives the asymptotic form).

Momentum (heavy ball, Lee et al. 2021 state it through the effective step eta / (1 - mu)): the same
bound holds with eta replaced by eta_eff = eta / (1 - mu) and the cap eta_eff <= 1/L. Hence K*(B)
is unchanged and the best base step is eta*(B, mu) = (1 - mu) eta*(B). This is a reconstruction of
the paper's statement, not a sharper momentum analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import sympy as sp
from numpy.typing import ArrayLike

from theory.errors import TheoryError

L, SIGMA2, DELTA, EPS, B, ETA, K, MU = sp.symbols("L sigma2 Delta epsilon B eta K mu", positive=True)
_SYMBOL_LATEX = {SIGMA2: r"\sigma^{2}", EPS: r"\varepsilon"}
# every numeric function returns a float for scalar inputs, an array when any input is one
Number = float | np.ndarray


@dataclass(frozen=True)
class Derivation:
    """Every expression of one derivation (SGD, or momentum in the base step ``eta``)."""

    bound: sp.Expr            # right-hand side of the convergence bound
    steps: sp.Expr            # K(eta, B): steps for the bound to reach eps
    lr_unconstrained: sp.Expr  # stationary point of K in eta
    lr_max: sp.Expr           # largest allowed step (1/L, or (1 - mu)/L)
    kink_batch: sp.Expr       # B where the stationary step reaches the cap
    lr_opt: sp.Expr           # eta*(B), piecewise
    steps_opt: sp.Expr        # K*(B), piecewise
    s_min: sp.Expr            # lim_{B -> oo} K*(B)
    e_min: sp.Expr            # lim_{B -> 0} B K*(B)
    b_crit: sp.Expr           # E_min / S_min

    def as_dict(self) -> dict[str, sp.Expr]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _derive(step_scale: sp.Expr) -> Derivation:
    """Derive from the bound written in the effective step eta * step_scale (1, or 1/r)."""
    eff = ETA * step_scale
    bound = 2 * DELTA / (eff * K) + eff * L * SIGMA2 / B
    (steps,) = sp.solve(sp.Eq(bound, EPS), K)
    stationary = [r for r in sp.solve(sp.diff(steps, ETA), ETA) if r.is_positive]
    if len(stationary) != 1:
        raise RuntimeError(f"expected one positive stationary step, got {stationary}")
    lr_u = sp.simplify(stationary[0])
    lr_max = sp.simplify(1 / (L * step_scale))
    (kink,) = sp.solve(sp.Eq(lr_u, lr_max), B)
    small = sp.simplify(steps.subs(ETA, lr_u))
    large = sp.simplify(steps.subs(ETA, lr_max))
    s_min = sp.limit(large, B, sp.oo)
    e_min = sp.limit(B * small, B, 0)
    return Derivation(
        bound=bound,
        steps=sp.simplify(steps),
        lr_unconstrained=lr_u,
        lr_max=lr_max,
        kink_batch=sp.simplify(kink),
        lr_opt=sp.Piecewise((lr_u, B <= kink), (lr_max, True)),
        steps_opt=sp.Piecewise((small, B <= kink), (large, True)),
        s_min=sp.simplify(s_min),
        e_min=sp.simplify(e_min),
        b_crit=sp.simplify(e_min / s_min),
    )


@cache
def derivation(momentum: bool = False) -> Derivation:
    """The SGD derivation, or the momentum one (base step eta, effective step eta / (1 - mu))."""
    if not momentum:
        return _derive(sp.Integer(1))
    # derive in r = 1 - mu (declared positive, so sympy can sign the roots), then substitute back
    r = sp.Symbol("r", positive=True)
    exprs = _derive(1 / r).as_dict()
    return Derivation(**{k: v.subs(r, 1 - MU) for k, v in exprs.items()})


def latex(momentum: bool = False) -> dict[str, str]:
    """LaTeX of every derived expression, keyed like :class:`Derivation`'s fields."""
    return {k: sp.latex(v, symbol_names=_SYMBOL_LATEX) for k, v in derivation(momentum).as_dict().items()}


@cache
def _numeric(name: str, momentum: bool):
    args = (L, SIGMA2, DELTA, EPS, B, ETA, MU)
    return sp.lambdify(args, getattr(derivation(momentum), name), modules="numpy")


def _evaluate(name: str, momentum: bool = False, **values: ArrayLike) -> Number:
    """Evaluate a derived expression with numpy broadcasting; unused symbols may be omitted."""
    checked = {k: _check_positive(v, k) for k, v in values.items()}
    if "mu" in checked:
        mu = checked["mu"]
        if np.any(mu >= 1.0):
            raise TheoryError(f"mu must be in [0, 1), got {values['mu']!r}")
    defaults = {"L": 1.0, "sigma2": 1.0, "delta": 1.0, "eps": 1.0, "batch_size": 1.0, "lr": 1.0, "mu": 0.0}
    full = {k: checked.get(k, v) for k, v in defaults.items()}
    out = _numeric(name, momentum)(*full.values())
    shape = np.broadcast_shapes(*(np.shape(v) for v in checked.values()))
    return _scalar_or_array(np.broadcast_to(np.asarray(out, dtype=float), shape))


def steps_at_lr(L: ArrayLike, sigma2: ArrayLike, delta: ArrayLike, eps: ArrayLike,
                batch_size: ArrayLike, lr: ArrayLike, mu: ArrayLike | None = None) -> Number:
    """Bound-guaranteed steps K(eta, B) = 2 Delta B / (eta_e (eps B - eta_e L sigma^2)) with
    eta_e = lr (SGD) or lr / (1 - mu) (momentum); inf where the bound cannot reach ``eps``
    (eta_e L sigma^2 / B >= eps) or the step exceeds the cap eta_e <= 1/L."""
    momentum = mu is not None
    kw = dict(L=L, sigma2=sigma2, delta=delta, eps=eps, batch_size=batch_size, lr=lr)
    if momentum:
        kw["mu"] = mu
    k = np.asarray(_evaluate("steps", momentum, **kw), dtype=float)
    cap = np.asarray(_evaluate("lr_max", momentum, **kw), dtype=float)
    lr_arr = np.asarray(lr, dtype=float)
    k = np.where((k > 0) & (lr_arr <= cap * (1 + 1e-12)), k, np.inf)
    return _scalar_or_array(k)


def sgd_steps(L: ArrayLike, sigma2: ArrayLike, delta: ArrayLike, eps: ArrayLike,
              batch_size: ArrayLike) -> Number:
    """K*(B): fewest steps the bound guarantees with the best constant step (docstring, step 3)."""
    return _evaluate("steps_opt", L=L, sigma2=sigma2, delta=delta, eps=eps, batch_size=batch_size)


def optimal_lr(L: ArrayLike, sigma2: ArrayLike, eps: ArrayLike, batch_size: ArrayLike,
               mu: ArrayLike | None = None) -> Number:
    """eta*(B) = min(eps B / (2 L sigma^2), 1/L) for SGD; times (1 - mu) for momentum."""
    if mu is None:
        return _evaluate("lr_opt", L=L, sigma2=sigma2, eps=eps, batch_size=batch_size)
    return _evaluate("lr_opt", True, L=L, sigma2=sigma2, eps=eps, batch_size=batch_size, mu=mu)


def momentum_steps(L: ArrayLike, sigma2: ArrayLike, delta: ArrayLike, eps: ArrayLike,
                   batch_size: ArrayLike, mu: ArrayLike) -> Number:
    """K*(B) for heavy-ball momentum at the best base step: equal to :func:`sgd_steps` (the bound
    depends on the step only through eta / (1 - mu))."""
    return _evaluate("steps_opt", True, L=L, sigma2=sigma2, delta=delta, eps=eps, batch_size=batch_size, mu=mu)


def min_steps(L: ArrayLike, delta: ArrayLike, eps: ArrayLike) -> Number:
    """S_min = 2 L Delta / eps, the large-batch limit of K*(B)."""
    return _evaluate("s_min", L=L, delta=delta, eps=eps)


def min_examples(L: ArrayLike, sigma2: ArrayLike, delta: ArrayLike, eps: ArrayLike) -> Number:
    """E_min = 8 L Delta sigma^2 / eps^2, the small-batch limit of B K*(B)."""
    return _evaluate("e_min", L=L, sigma2=sigma2, delta=delta, eps=eps)


def critical_batch(sigma2: ArrayLike, eps: ArrayLike) -> Number:
    """B_crit = E_min / S_min = 4 sigma^2 / eps."""
    return _evaluate("b_crit", sigma2=sigma2, eps=eps)


def kink_batch(sigma2: ArrayLike, eps: ArrayLike) -> Number:
    """B_kink = 2 sigma^2 / eps: above it the optimal step is capped at 1/L."""
    return _evaluate("kink_batch", sigma2=sigma2, eps=eps)


def approx_steps(L: ArrayLike, sigma2: ArrayLike, delta: ArrayLike, eps: ArrayLike,
                 batch_size: ArrayLike) -> Number:
    """S_min (1 + B_crit / B): the asymptotic form of K*(B), exact in both limits."""
    b = _check_positive(batch_size, "batch_size")
    return _scalar_or_array(min_steps(L, delta, eps) * (1.0 + critical_batch(sigma2, eps) / b))


def _check_positive(value, name: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise TheoryError(f"{name} must be a number or array of numbers, got {value!r}") from None
    allowed_zero = name == "mu"
    ok = np.isfinite(arr) & ((arr >= 0) if allowed_zero else (arr > 0))
    if not np.all(ok):
        what = "in [0, 1)" if allowed_zero else "positive and finite"
        raise TheoryError(f"{name} must be {what}, got {value!r}")
    return arr


def _scalar_or_array(x: ArrayLike) -> Number:
    x = np.asarray(x, dtype=float)
    return float(x) if x.ndim == 0 else x


__all__ = [
    "Derivation", "derivation", "latex", "steps_at_lr", "sgd_steps", "optimal_lr", "momentum_steps",
    "min_steps", "min_examples", "critical_batch", "kink_batch", "approx_steps",
]
