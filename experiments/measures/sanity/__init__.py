"""The pruning sanity checks as a measurement: a study with ``[pruning] sanity = [...]`` trains
one series per check (``experiments.spec.series``: shuffled, matched-random, reinitialized and
inverted masks), and its report sets each beside its criterion (Frankle et al. 2021; Su et al.
2020). It owns no store table and no task of its own: the series are groups of the sweep. Its
view is :mod:`~experiments.measures.sanity.view`, its tables, figure and sentences
:mod:`~experiments.measures.sanity.section`."""

from __future__ import annotations

from typing import Any

from experiments.measurement import Measurement, Part, ReportContext, register


@register("sanity")
class Sanity(Measurement):
    """The sanity series beside their criterion (module docstring)."""

    def wanted(self, spec: Any) -> bool:
        return bool(getattr(spec, "sanity", ()) or getattr(spec, "pruning_sanity", None))

    def pending(self, ctx: Any) -> bool:
        return False   # its series are groups of the sweep

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.sanity.section import sanity_part   # late: matplotlib
        from experiments.measures.sanity.view import sanity_view

        return sanity_part(sanity_view(ctx.runs, ctx.points, ctx.fits, ctx.ratios))
