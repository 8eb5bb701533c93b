"""The ``[search]`` table: the search space of each metaparameter (a value, or ``{scale, min,
max}``), its seed, and per-optimizer overrides (``[search.optimizers.<optimizer>]``). The space
itself and its quasi-random points: :mod:`experiments.spec.search`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.config import ADAM_KEYS, ADAM_OPTIMIZERS

from experiments.spec.checks import Checker
from experiments.spec.search import SCALES, SEARCH_KEYS, Dimension

# the value of a dimension a spec leaves out
DEFAULTS = {"momentum": 0.9, "end_factor": 1.0}


# bounds of each searchable metaparameter: (lo, hi, lo_open, hi_open)
_BOUNDS = {"lr": (0.0, None, True, False), "momentum": (0.0, 1.0, False, True),
           "decay_steps": (0.0, None, True, False), "end_factor": (0.0, 1.0, False, False),
           "beta1": (0.0, 1.0, False, True), "beta2": (0.0, 1.0, False, True),
           "eps": (0.0, None, True, False), "weight_decay": (0.0, None, False, False)}


def dimension(ck: Checker, raw: Any, path: str, key: str) -> Dimension | None:
    """A search dimension: a value (fixed) or ``{scale, min, max}`` (``relative`` for
    decay_steps only) within ``key``'s bounds."""
    lo_b, hi_b, lo_open, hi_open = _BOUNDS[key]
    if not isinstance(raw, dict):
        v = ck.number(raw, path, lo_b, hi_b, hi_open=hi_open, lo_open=lo_open)
        return None if v is None else Dimension("linear", v, v)
    allowed = ("scale", "min", "max") + (("relative",) if key == "decay_steps" else ())
    ck.keys(raw, path, allowed)
    n = len(ck.problems)
    scale = ck.choice(raw.get("scale", "log"), f"{path}.scale", SCALES)
    lo = ck.number(raw.get("min"), f"{path}.min", lo_b, hi_b, hi_open=hi_open, lo_open=lo_open)
    hi = ck.number(raw.get("max"), f"{path}.max", lo_b, hi_b, hi_open=hi_open, lo_open=lo_open)
    relative = raw.get("relative", False)
    if not isinstance(relative, bool):
        ck.add(f"{path}.relative", f"found {relative!r}; allowed: true or false")
    if lo is not None and hi is not None and lo > hi:
        ck.add(path, f"min {lo} > max {hi}; allowed: min <= max")
    if scale == "log" and lo is not None and lo <= 0:
        ck.add(f"{path}.min", f"found {lo}; allowed: > 0 on a log scale")
    if scale == "reverse-log" and hi is not None and hi >= 1:
        ck.add(f"{path}.max", f"found {hi}; allowed: < 1 on a reverse-log scale (1 - x is logged)")
    if relative is True and hi is not None and hi > 1:
        ck.add(f"{path}.max", f"found {hi}; allowed: <= 1 for a relative decay (fraction of budget)")
    if len(ck.problems) > n:
        return None
    return Dimension(scale, lo, hi, bool(relative))


def search_overrides(ck: Checker, se: Mapping[str, Any], optimizers: tuple[str | None, ...]
                     ) -> dict[str, dict[str, Dimension]]:
    """The ``[search.optimizers.<optimizer>]`` tables (each for an optimizer of the study), and a
    problem for Adam keys that no optimizer of the study uses."""
    listed = [o for o in optimizers if o]
    tables = ck.table(se, "optimizers", "search.optimizers") or {}
    ck.keys(tables, "search.optimizers", tuple(listed))
    out: dict[str, dict[str, Dimension]] = {}
    for opt in listed:
        path = f"search.optimizers.{opt}"
        table = ck.table(tables, opt, path) if opt in tables else None
        if table is not None:
            ck.keys(table, path, SEARCH_KEYS)
            out[opt] = {k: dimension(ck, table[k], f"{path}.{k}", k)
                        for k in SEARCH_KEYS if k in table}
    if not any(o in ADAM_OPTIMIZERS for o in listed):
        for key in ADAM_KEYS:
            if key in se:
                ck.add(f"search.{key}", f"used by optimizers {', '.join(ADAM_OPTIMIZERS)} only; "
                                        f"the study's: {', '.join(listed)}")
    return out


def search_table(ck: Checker, raw: Mapping[str, Any], optimizers: tuple[str | None, ...]
                 ) -> tuple[int | None, dict[str, Dimension], dict[str, dict[str, Dimension]]]:
    """The ``[search]`` table: (seed, dimensions, per-optimizer overrides); ``lr`` is required,
    ``momentum`` and ``end_factor`` default to :data:`DEFAULTS`."""
    se = ck.table(raw, "search", "search") or {}
    ck.keys(se, "search", ("seed",) + SEARCH_KEYS + ("optimizers",))
    seed = ck.integer(se.get("seed", 0), "search.seed", 0)
    if "lr" not in se:
        ck.add("search.lr", "missing; allowed: {scale = log|reverse-log|linear, min, max} or a value")
    space = {}
    for key in SEARCH_KEYS:
        if key in se:
            space[key] = dimension(ck, se[key], f"search.{key}", key)
        elif key in DEFAULTS:
            space[key] = Dimension("linear", DEFAULTS[key], DEFAULTS[key])
    return seed, space, search_overrides(ck, se, optimizers)
