"""The ``[executor]`` table: how many worker processes train the groups, and how a cell's
program is chosen (neither is in the hash: they do not change what is measured, and the store
records each cell's program, which every later group of the cell runs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiments.spec.checks import Checker

KEYS = ("workers", "program_choice")
# ``program_choice`` (training.engine.choice.SETTINGS; a program's name, which the environment
# variable also accepts to force one, is for tests, not for a study's spec)
PROGRAM_CHOICES = ("measure", "rules")


def executor_table(ck: Checker, raw: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """``[executor] workers`` (None: the runner's default) and ``program_choice`` (None: the
    environment's ``SPARSESCALE_PROGRAM_CHOICE``, else "measure")."""
    table = ck.table(raw, "executor", "executor") or {}
    ck.keys(table, "executor", KEYS)
    workers = ck.integer(table["workers"], "executor.workers", 1) if "workers" in table else None
    program_choice = (ck.choice(table["program_choice"], "executor.program_choice",
                                PROGRAM_CHOICES) if "program_choice" in table else None)
    return workers, program_choice
