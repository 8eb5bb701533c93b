"""The theory probes as a measurement: noise and smoothness along the best runs, per level,
seed and batch size, and L at Lee et al.'s stage (spec: the ``[probes]`` table,
:mod:`experiments.spec.tables.probes`). Its tasks are :mod:`experiments.run.probes`'s; its
tables (``probes``, ``stage_probes``) are still defined with the core ones
(:mod:`experiments.store.schema`), and the report's Theory vs measurement section reads them
(:mod:`experiments.report.theory_view`, :mod:`experiments.report.lee_stage_view`): the last
kind to move into its folder."""

from __future__ import annotations

from typing import Any

from experiments.measurement import Measurement, Part, ReportContext, RunContext, register


@register("probes")
class Probes(Measurement):
    """The probes along the runs and at Lee et al.'s stage (module docstring)."""

    def wanted(self, spec: Any) -> bool:
        settings = getattr(spec, "probes", None)
        return bool(settings is not None and settings.enabled)

    def pending(self, ctx: RunContext) -> bool:
        probed = ctx.store.probed_sparsities()
        return any(s not in probed for s in ctx.spec.sparsities)

    def check(self, spec: Any, n_train: int) -> list[str]:
        return [f"probes.{key}: found {value} > {n_train} (the training set size); allowed: "
                f"2..{n_train}" for key in ("examples", "curvature_examples")
                if (value := getattr(spec.probes, key)) is not None and value > n_train]

    def start(self, ctx: RunContext):
        from experiments.run.probes import start_probes

        return start_probes(ctx.spec, ctx.dataset, ctx.store, executor=ctx.executor)

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.probes.section import probes_part   # late: matplotlib

        return probes_part(ctx)
