"""The batch-size policies' shoot-out as a measurement (``[schedules]``): each policy of
``theory.policies`` against the best fixed batch size, from the sweep's best trials. Its
report section is :mod:`~experiments.measures.schedules.section`, its numbers
:mod:`experiments.report.schedules.view`."""

from __future__ import annotations

from typing import Any

from experiments.measurement import Measurement, Part, ReportContext, register


@register("schedules")
class Schedules(Measurement):
    """The policies against the best fixed batch size (module docstring)."""

    def wanted(self, spec: Any) -> bool:
        return False   # the runner runs it after the sweep (experiments.run.schedules)

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.schedules.section import schedules_part   # late: matplotlib

        return schedules_part(ctx)
