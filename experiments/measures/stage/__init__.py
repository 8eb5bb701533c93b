"""Lee et al. (2021)'s stage as a measurement: the local Lipschitz constant L every N steps of
each probed run up to its goal or budget, with the noise and the loss at the same points (spec:
``[probes] lipschitz_every`` and its keys, :mod:`experiments.spec.tables.probes`), beside the
initialization and the early probes.

- :mod:`~experiments.measures.stage.store`: the ``stage_probes`` table and its rows;
- :mod:`~experiments.measures.stage.inside`: L taken inside the runs (``lipschitz_in_run``),
  the group's watch (:meth:`Stage.watch`);
- :mod:`~experiments.measures.stage.view`: the stage's points, ratios, stages, verdicts and
  sentences;
- :mod:`~experiments.measures.stage.section`: its sub-section of Theory vs measurement and
  Figure 10.

By replay, the probes' tasks measure it in the same replays as the points along [0, H]
(:mod:`experiments.measures.probes.tasks`) and write it in the level's transaction: it has no
task of its own.
"""

from __future__ import annotations

from typing import Any

from experiments.measurement import Measurement, Part, ReportContext, register, table_enabled
from experiments.measures.stage.store import STAGE_PROBES


@register("stage")
class Stage(Measurement):
    """L at Lee et al.'s stage (module docstring)."""

    tables = (STAGE_PROBES,)

    def wanted(self, spec: Any) -> bool:
        return table_enabled(spec, "probes") and bool(spec.probes.lipschitz_every)

    def pending(self, ctx: Any) -> bool:
        return False   # measured by the probes' replays or inside the groups' runs

    def watch(self, spec: Any, group: Any):
        """L inside ``group``'s runs (:func:`~experiments.measures.stage.inside.inside_plan`;
        None unless ``lipschitz_in_run`` and the group is at a probed batch size)."""
        from experiments.measures.stage.inside import inside_plan   # late: torch

        return inside_plan(spec, group.sparsity, group.batch_size, group.seed, group.max_steps,
                           group.delay)

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.stage.section import stage_part   # late: matplotlib

        return stage_part(ctx)
