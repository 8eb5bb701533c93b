"""The ``[eval]`` table: when the goal metric is evaluated (a :class:`training.EvalSchedule`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.config import EvalSchedule
from training.errors import SparsescaleError

from experiments.spec.checks import Checker


def eval_table(ck: Checker, table: Mapping[str, Any]) -> EvalSchedule | None:
    """The ``[eval]`` table as a :class:`training.EvalSchedule` (None after a problem: an unknown
    key, too, keeps the schedule from being built)."""
    n_before = len(ck.problems)
    ck.keys(table, "eval", ("kind", "every", "first", "ratio", "max_gap"))
    kind = ck.choice(table.get("kind", "interval"), "eval.kind", ("interval", "geometric"))
    for key in ("every", "first", "max_gap"):
        if key in table:
            ck.integer(table[key], f"eval.{key}", 1)
    if "ratio" in table:
        ck.number(table["ratio"], "eval.ratio", 1.0, lo_open=True)
    if len(ck.problems) > n_before or kind is None:
        return None
    try:
        return EvalSchedule(**table)
    except (SparsescaleError, TypeError) as exc:
        ck.add("eval", str(exc))
        return None
