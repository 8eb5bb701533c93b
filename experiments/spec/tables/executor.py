"""The ``[executor]`` table: how many worker processes train the groups (not in the hash: it
does not change what is measured)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiments.spec.checks import Checker

KEYS = ("workers",)


def executor_table(ck: Checker, raw: Mapping[str, Any]) -> int | None:
    """``[executor] workers`` (None: the runner's default)."""
    table = ck.table(raw, "executor", "executor") or {}
    ck.keys(table, "executor", KEYS)
    return ck.integer(table["workers"], "executor.workers", 1) if "workers" in table else None
