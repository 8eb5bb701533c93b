"""The ``[budget]`` table: the step budget of a group, fixed or a rule in examples seen."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from experiments.spec.checks import Checker


@dataclass(frozen=True)
class Budget:
    """Step budget: ``max_steps`` fixed, or ``clamp(ceil(examples / B), min, max)``."""

    max_steps: int | None = None
    examples: int | None = None
    min: int = 1
    max: int | None = None

    def steps(self, batch_size: int) -> int:
        """The step budget of a group at ``batch_size``."""
        if self.max_steps is not None:
            return self.max_steps
        steps = max(self.min, math.ceil(self.examples / batch_size))
        return min(steps, self.max) if self.max is not None else steps


def budget_table(ck: Checker, raw: Mapping[str, Any]) -> Budget | None:
    """The ``[budget]`` table: ``max_steps = N``, or ``{examples = N, min = ..., max = ...}``
    (default ``max_steps = 1000``); None after a problem."""
    bu = ck.table(raw, "budget", "budget") or {"max_steps": 1000}
    ck.keys(bu, "budget", ("max_steps", "examples", "min", "max"))
    budget = None
    if "max_steps" in bu and "examples" in bu:
        ck.add("budget", "found both max_steps and examples; allowed: one of them")
    elif "max_steps" in bu:
        ms = ck.integer(bu["max_steps"], "budget.max_steps", 1)
        extra = sorted(set(bu) & {"min", "max"})
        if extra:
            ck.add(f"budget.{extra[0]}", "only used with budget.examples; allowed: remove it")
        budget = Budget(max_steps=ms) if ms is not None else None
    elif "examples" in bu:
        ex = ck.integer(bu["examples"], "budget.examples", 1)
        lo = ck.integer(bu.get("min", 1), "budget.min", 1)
        hi = ck.integer(bu["max"], "budget.max", 1) if "max" in bu else None
        if lo is not None and hi is not None and lo > hi:
            ck.add("budget", f"min {lo} > max {hi}; allowed: min <= max")
        elif ex is not None and lo is not None:
            budget = Budget(examples=ex, min=lo, max=hi)
    elif bu:
        ck.add("budget", "missing max_steps or examples; allowed: max_steps = N or "
                         "{examples = N, min = ..., max = ...}")
    return budget
