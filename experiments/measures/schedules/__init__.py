"""The batch-size policies' shoot-out as a measurement: every policy of ``[schedules]`` against
the best fixed batch size of the same study's sweep, over replicate data orders (spec: the
``[schedules]`` table, :mod:`experiments.spec.tables.schedules`).

- :mod:`~experiments.measures.schedules.tasks`: the shoot-out of each (sparsity, seed), in the
  driver;
- :mod:`~experiments.measures.schedules.store`: the ``policy_runs`` table, its rows, their
  writer and reader;
- :mod:`~experiments.measures.schedules.section`: its report section (its numbers:
  :mod:`experiments.report.schedules.view`, which ``advise --schedule`` reads too).

It is registered last: the runner calls its finish after every other measurement's, so the
shoot-out reads the study's branching rows (the CBS warmup policy's) once they are written.
"""

from __future__ import annotations

from typing import Any

from experiments.measurement import (
    Measurement, Part, ReportContext, RunContext, register, table_enabled,
)
from experiments.measures.schedules.store import POLICY_RUNS, done


@register("schedules")
class Schedules(Measurement):
    """The policies' shoot-out (module docstring)."""

    tables = (POLICY_RUNS,)

    def wanted(self, spec: Any) -> bool:
        return table_enabled(spec, "schedules")

    def pending(self, ctx: RunContext) -> bool:
        stored = done(ctx.store)
        return any((float(s), int(seed)) not in stored
                   for s in ctx.spec.sparsities for seed in ctx.spec.seeds)

    def start(self, ctx: RunContext):
        """The function that runs the shoot-out in the driver (nothing is submitted: it reads
        what the measurements before it write)."""
        def finish(quiet: bool) -> None:
            from experiments.measures.schedules.tasks import run_schedules   # late: torch

            run_schedules(ctx.spec, ctx.dataset, ctx.store, quiet)

        return finish

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.schedules.section import schedules_part   # late: matplotlib

        return schedules_part(ctx)
