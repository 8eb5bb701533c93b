"""Quasi-random metaparameter search (Shallue et al. 2019; Lee et al. 2021).

Points come from a scrambled Sobol sequence (``scipy.stats.qmc.Sobol``, Owen scrambling) seeded by
the spec's search seed, so a study draws the SAME points at every batch size and sparsity: the
trial budget is identical everywhere and differences come from B, not from luck of the draw.
A unit coordinate u in [0, 1) maps onto a dimension [lo, hi] by its scale:

- ``log``: lo * (hi / lo) ** u
- ``reverse-log``: 1 - (1 - lo) * ((1 - hi) / (1 - lo)) ** u   (1 - x is log-uniform: momentum,
  Adam's beta1 and beta2)
- ``linear``: lo + (hi - lo) * u
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.stats import qmc

from training.config import ADAM_KEYS, ADAM_OPTIMIZERS

from experiments.spec.errors import SpecError

SCALES = ("log", "reverse-log", "linear")
# the searchable metaparameters, in the order they take Sobol coordinates; the Adam keys come
# last, so a spec without them draws the points it drew before they existed
SEARCH_KEYS = ("lr", "momentum", "decay_steps", "end_factor", *ADAM_KEYS)
# torch.optim.Adam's defaults (weight decay 0 for AdamW too): the Adam keys a spec leaves out
ADAM_DEFAULTS = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}


@dataclass(frozen=True)
class Dimension:
    """One metaparameter: searched over [min, max] on ``scale``, or ``fixed`` (min == max).

    ``relative`` (decay_steps only): values are fractions of the group's step budget.
    """

    scale: str
    min: float
    max: float
    relative: bool = False

    @property
    def fixed(self) -> bool:
        return self.min == self.max


def unit_points(n: int, dims: int, seed: int) -> np.ndarray:
    """The first ``n`` points of a scrambled ``dims``-dimensional Sobol sequence, shape [n, dims]."""
    if dims == 0:
        return np.zeros((n, 0))
    sampler = qmc.Sobol(d=dims, scramble=True, seed=np.random.default_rng(seed))
    with warnings.catch_warnings():
        # balance properties need powers of two; other counts are still a valid prefix
        warnings.simplefilter("ignore", UserWarning)
        return sampler.random(n)


def to_scale(u: float, dim: Dimension) -> float:
    """Map a unit coordinate onto ``dim`` (see the module docstring)."""
    lo, hi = dim.min, dim.max
    if dim.fixed:
        return float(lo)
    if dim.scale == "log":
        return lo * (hi / lo) ** u
    if dim.scale == "reverse-log":
        return 1.0 - (1.0 - lo) * ((1.0 - hi) / (1.0 - lo)) ** u
    return lo + (hi - lo) * u


def from_scale(x: float, dim: Dimension) -> float:
    """Inverse of :func:`to_scale`: where ``x`` sits in [0, 1] along ``dim``."""
    lo, hi = dim.min, dim.max
    if dim.fixed:
        return 0.0
    if dim.scale == "log":
        return math.log(x / lo) / math.log(hi / lo)
    if dim.scale == "reverse-log":
        return math.log((1.0 - x) / (1.0 - lo)) / math.log((1.0 - hi) / (1.0 - lo))
    return (x - lo) / (hi - lo)


def sample(space: Mapping[str, Dimension], n: int, seed: int, max_steps: int | None = None,
           momentum_used: bool = True) -> list[dict[str, float | int | None]]:
    """``n`` metaparameter points (dicts for ``training.Trial``) from the search ``space``.

    Only non-fixed dimensions take a Sobol coordinate, in the fixed order of ``SEARCH_KEYS``.
    A ``relative`` decay is a fraction of ``max_steps``; without ``decay_steps`` the schedule is
    constant. ``momentum_used=False`` (plain SGD) records momentum 0.
    """
    searched = [k for k in SEARCH_KEYS if k in space and not space[k].fixed]
    u = unit_points(n, len(searched), seed)
    out = []
    for row in u:
        point: dict[str, float | int | None] = {}
        for key in SEARCH_KEYS:
            if key not in space:
                continue
            dim = space[key]
            point[key] = to_scale(float(row[searched.index(key)]) if key in searched else 0.0, dim)
        if "decay_steps" in point:
            d = point["decay_steps"]
            if space["decay_steps"].relative:
                if max_steps is None:
                    raise SpecError(["search.decay_steps: relative = true needs a step budget "
                                     "(max_steps) to be a fraction of"])
                d = d * max_steps
            point["decay_steps"] = max(1, int(round(d)))
        else:
            point["decay_steps"] = None
        point.setdefault("momentum", 0.0)
        point.setdefault("end_factor", 1.0)
        if not momentum_used:
            point["momentum"] = 0.0
        out.append(point)
    return out


def optimizer_search(search: Mapping[str, Dimension],
                     overrides: Mapping[str, Mapping[str, Dimension]], optimizer: str
                     ) -> dict[str, Dimension]:
    """The search space ``optimizer`` uses: the shared dimensions with its
    ``[search.optimizers.<optimizer>]`` overrides. ``adam`` / ``adamw`` drop momentum and fill
    beta1, beta2, eps and weight_decay left out with :data:`ADAM_DEFAULTS`; the SGD family
    drops the Adam keys."""
    out = {**search, **overrides.get(optimizer, {})}
    if optimizer not in ADAM_OPTIMIZERS:
        return {k: d for k, d in out.items() if k not in ADAM_KEYS}
    out.pop("momentum", None)
    for key, value in ADAM_DEFAULTS.items():
        out.setdefault(key, Dimension("linear", value, value))
    return out


def at_edge(value: float, dim: Dimension, fraction: float = 0.1) -> bool:
    """True if ``value`` lies within the outer ``fraction`` of ``dim``'s range on its scale (for
    the learning rate: the outer 10 % of its log range), a sign that the optimum may lie outside
    the search space."""
    if dim.fixed:
        return False
    pos = from_scale(value, dim)
    return pos < fraction or pos > 1.0 - fraction
