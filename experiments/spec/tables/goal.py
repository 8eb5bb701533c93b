"""The ``[goal]`` table: the goal metric, its target and the comparison."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.goal import unreachable

from experiments.spec.checks import Checker

COMPARISONS = {"<": True, "<=": False}   # goal comparison -> Goal.strict


def goal_table(ck: Checker, raw: Mapping[str, Any]) -> tuple[str | None, float | None, str | None]:
    """The ``[goal]`` table: (metric, target, comparison), a target the metric can reach."""
    table = ck.table(raw, "goal", "goal", required=True) or {}
    ck.keys(table, "goal", ("metric", "target", "comparison"))
    metric = ck.choice(table.get("metric", "error"), "goal.metric", ("error", "loss"))
    target = ck.number(table.get("target"), "goal.target") if "goal" in raw else None
    comparison = ck.choice(table.get("comparison", "<"), "goal.comparison", tuple(COMPARISONS))
    if metric is not None and target is not None and comparison is not None:
        reason = unreachable(metric, target, COMPARISONS[comparison])
        if reason:
            ck.add("goal.target", f"{reason}; allowed: a target > 0, or 0 with "
                                  'comparison = "<="')
    return metric, target, comparison
