"""The sweep itself as the report's first part: the studies' overview, the scaling findings,
Figures 1-4 and 7, the core tables (steps to result, the fits, the bound's structure, the step
ratios, the probes' inputs to the theory, what is missing and what it cost), what was fitted
and predicted, the theory's formulas and the study specs, and ``summary.csv``. Its groups are
the study's own (planned and trained by the runner), so it owns no store table and no task.

- :mod:`~experiments.measures.sweep.figures`: the five figures and their captions;
- :mod:`~experiments.measures.sweep.sections`: the overview, the tables and the closing sections.
"""

from __future__ import annotations

from typing import Any

from experiments.measurement import Measurement, Part, ReportContext, register


@register("sweep")
class Sweep(Measurement):
    """Steps to result against batch size and sparsity, and the theory beside it (module
    docstring)."""

    def wanted(self, spec: Any) -> bool:
        return False   # its groups are the study's plan

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.sweep.sections import sweep_part   # late: matplotlib

        return sweep_part(ctx)
