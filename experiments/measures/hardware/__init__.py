"""Time to result on real hardware as a measurement: a run folder's DDP cost model
(``cost_model.json``, measured once per machine and workload by ``sparsescale study``,
:mod:`experiments.run.costcache`, or by ``sparsescale bench ddp``) combined with the measured
steps-to-result (:mod:`~experiments.measures.hardware.view`). It owns no store table and no
task: its report section comes after the Tables, and ``time_to_result.csv`` beside the report."""

from __future__ import annotations

from typing import Any

from experiments.measurement import Measurement, Part, ReportContext, register

HEADING = "Time to result on real hardware"


@register("hardware")
class Hardware(Measurement):
    """Predicted time to result on k data-parallel workers (module docstring)."""

    def wanted(self, spec: Any) -> bool:
        return False   # its cost model is measured by the runner's cost_model option

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.hardware.view import (   # late: the report's modules
            hardware_tables, hardware_view, time_to_result_frame,
        )
        from experiments.report.sections import Paragraphs, Section, table_section

        runs = ctx.runs
        hardware = hardware_view(runs.runs, runs.order, ctx.points)
        tables = tuple(table_section(*t) for t in hardware_tables(hardware))
        frame = time_to_result_frame(hardware, runs.info())
        return Part(appendix=(Section(HEADING, 2, (Paragraphs(tuple(hardware.paragraphs)),
                                                   *tables)),),
                    files={"time_to_result": frame if len(frame) else None})
