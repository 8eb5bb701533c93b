"""L at Lee et al.'s stage as a measurement: L every N steps of each probed run up to its goal
or budget (spec: ``[probes] lipschitz_every``), beside the initialization and the early probes.

- :mod:`~experiments.measures.stage.view`: the stage's points, ratios, stages, verdicts and
  sentences;
- :mod:`~experiments.measures.stage.section`: its sub-section of Theory vs measurement and
  Figure 10.
"""

from __future__ import annotations

from typing import Any

from experiments.measurement import Measurement, Part, ReportContext, register


@register("stage")
class Stage(Measurement):
    """L at Lee et al.'s stage (module docstring)."""

    def wanted(self, spec: Any) -> bool:
        return False   # its rows are written with the probes' (experiments.run.probes)

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.stage.section import stage_part   # late: matplotlib

        return stage_part(ctx)
