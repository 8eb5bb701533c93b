"""The ``[branching]`` table of a study spec: the critical batch measured by branching from
checkpoints of the best run at a small batch size (Merrill et al. 2025;
:mod:`experiments.run.branching`), and the batch-size warmup built from it::

    [branching]
    enabled = true
    batch_size = "smallest"      # base run: the best trial at this B ("smallest" that reached the goal)
    checkpoints = 8              # K, evenly spaced over [0, H] (H: the base run's steps-to-result)
    k_max = 64                   # branches at k B, k = 1, 2, 4, ..., k_max (a power of two)
    window_fraction = 0.1        # W = this fraction of the base run's H B examples (or window = N examples)
    eps = 0.01                   # relative tolerance on the seed-averaged held-out loss
    seeds = 3                    # branch seeds (1, or >= 3 for intervals)
    multipliers = [0.5, 1.0, 2.0]   # lr multipliers on the rule-scaled lr (must include 1)
    level = 0.9                  # bootstrap interval level
    warmup = true                # the CBS(t) warmup against fixed B under one examples budget
    warmup_replicates = 3        # data orders of the warmup and of each fixed B
    warmup_examples = 20000      # the examples budget (default: twice the base run's to its goal)

Validation goes through :class:`experiments.spec.checks.Checker`: one line per problem naming
the key, with the closest valid key for a mistyped one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from theory.estimators.branching import (
    DEFAULT_CHECKPOINTS, DEFAULT_EPS, DEFAULT_MULTIPLIERS, DEFAULT_WINDOW_FRACTION,
)
from training.config import is_int

from experiments.spec.checks import Checker

BASE_RULES = ("smallest",)


@dataclass(frozen=True)
class Branching:
    """The ``[branching]`` table (module docstring); disabled unless ``enabled = true``."""

    enabled: bool = False
    batch_size: str | int = "smallest"
    checkpoints: int = DEFAULT_CHECKPOINTS
    k_max: int = 64
    window_fraction: float = DEFAULT_WINDOW_FRACTION
    window: int | None = None
    eps: float = DEFAULT_EPS
    seeds: int = 3
    multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS
    level: float = 0.9
    warmup: bool = True
    warmup_replicates: int = 3
    warmup_examples: int | None = None

    def canonical(self) -> dict[str, Any]:
        """JSON-able form (the spec hash); a given window replaces the fraction."""
        out = asdict(self) | {"multipliers": list(self.multipliers)}
        if self.window is not None:
            del out["window_fraction"]
        return out


KEYS = tuple(f.name for f in fields(Branching))


def branching(ck: Checker, raw: Mapping[str, Any], batch_sizes: tuple[int, ...] | None) -> Branching:
    """The validated ``[branching]`` table of ``raw`` (defaults where a key is missing); problems
    go to ``ck`` and their keys keep the default."""
    table = ck.table(raw, "branching", "branching") or {}
    ck.keys(table, "branching", KEYS)
    d = Branching()
    out: dict[str, Any] = {}
    for key in ("enabled", "warmup"):
        value = table.get(key, getattr(d, key))
        if isinstance(value, bool):
            out[key] = value
        else:
            ck.add(f"branching.{key}", f"found {value!r}; allowed: true or false")
    base = table.get("batch_size", d.batch_size)
    if base in BASE_RULES or (is_int(base) and batch_sizes is not None and base in batch_sizes):
        out["batch_size"] = base
    else:
        sizes = ", ".join(map(str, batch_sizes or ()))
        ck.add("branching.batch_size", f"found {base!r}; allowed: {', '.join(map(repr, BASE_RULES))} or one "
                                       f"of the study's batch sizes ({sizes})")
    for key, lo in (("checkpoints", 2), ("k_max", 1), ("seeds", 1), ("warmup_replicates", 1)):
        if key in table:
            out[key] = ck.integer(table[key], f"branching.{key}", lo)
    k_max = out.get("k_max") or d.k_max
    if "k_max" in table and out["k_max"] is not None and k_max & (k_max - 1):
        ck.add("branching.k_max", f"found {k_max}; allowed: a power of two (1, 2, 4, ...)")
    if out.get("seeds") == 2:
        ck.add("branching.seeds", "found 2; allowed: 1, or >= 3 (intervals need 3 seeds)")
    for key in ("window", "warmup_examples"):
        if key in table:
            out[key] = ck.integer(table[key], f"branching.{key}", 1)
    if "window" in table and out["window"] is not None and "window_fraction" in table:
        ck.add("branching", "found both window and window_fraction; allowed: one of them")
    if "window_fraction" in table:
        out["window_fraction"] = ck.number(table["window_fraction"], "branching.window_fraction", 0, 1, lo_open=True)
    if "eps" in table:
        out["eps"] = ck.number(table["eps"], "branching.eps", 0)
    if "level" in table:
        out["level"] = ck.number(table["level"], "branching.level", 0, 1, lo_open=True, hi_open=True)
    if "multipliers" in table:
        out["multipliers"] = _multipliers(ck, table["multipliers"])
    return Branching(**{k: v for k, v in out.items() if v is not None})


def _multipliers(ck: Checker, value: Any) -> tuple[float, ...] | None:
    """Distinct positive finite numbers, 1 among them."""
    ok = isinstance(value, list) and value and all(
        not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v < float("inf") for v in value)
    if not ok or len(set(value)) != len(value) or 1 not in value:
        ck.add("branching.multipliers", f"found {value!r}; allowed: a list of distinct positive numbers "
                                        f"that includes 1 (the base run's own lr)")
        return None
    return tuple(float(v) for v in value)
