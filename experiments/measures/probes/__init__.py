"""The theory probes as a measurement: noise and smoothness along the best runs, per level,
seed and batch size, and, in the same replays, L at Lee et al.'s stage (spec: the ``[probes]``
table, :mod:`experiments.spec.tables.probes`).

- :mod:`~experiments.measures.probes.tasks`: the tasks, one probed run each, written one
  transaction per sparsity level;
- :mod:`~experiments.measures.probes.store`: the ``probes`` table, its rows and their writer
  (the level's rows at Lee's stage go to :mod:`experiments.measures.stage`'s table with them).

Its part of the report is the Theory vs measurement section
(:mod:`~experiments.measures.probes.section`, its claims :mod:`~experiments.measures.probes.verdicts`,
Figures 5 and 6 :mod:`~experiments.measures.probes.figures`); the predictions it shares with the
sweep's sections are :mod:`experiments.report.theory_view`'s.
"""

from __future__ import annotations

from typing import Any

from experiments.measurement import (
    Measurement, Part, ReportContext, RunContext, TaskSeconds, register, table_enabled,
)
from experiments.measures.probes.store import PROBES, probed_runs, probed_sparsities
from experiments.run.timing import summed


@register("probes")
class Probes(Measurement):
    """The probes along the runs and at Lee et al.'s stage (module docstring)."""

    tables = (PROBES,)

    def wanted(self, spec: Any) -> bool:
        return table_enabled(spec, "probes")

    def pending(self, ctx: RunContext) -> bool:
        probed = probed_sparsities(ctx.store)
        return any(s not in probed for s in ctx.spec.sparsities)

    def check(self, spec: Any, n_train: int) -> list[str]:
        return [f"probes.{key}: found {value} > {n_train} (the training set size); allowed: "
                f"2..{n_train}" for key in ("examples", "curvature_examples")
                if (value := getattr(spec.probes, key)) is not None and value > n_train]

    def start(self, ctx: RunContext):
        from experiments.measures.probes.tasks import start_probes   # late: torch

        return start_probes(ctx.spec, ctx.dataset, ctx.store, executor=ctx.executor)

    def seconds(self, frame) -> dict[str, TaskSeconds]:
        """The probed runs (:func:`~experiments.measures.probes.store.probed_runs`: the seconds
        of each one's replay and measurements), and their share of the training."""
        # late: importing the stage's package registers it, and it registers after the probes
        from experiments.measures.stage.store import STAGE_PROBES

        runs = probed_runs(frame(PROBES.name), frame(STAGE_PROBES.name))
        return {"probes": TaskSeconds(len(runs), summed(runs.seconds) if len(runs) else 0.0,
                                      "run", share="probe_share")}

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.probes.section import probes_part   # late: matplotlib

        return probes_part(ctx)
