"""The gradient-delay axis as a measurement (Stich and Karimireddy 2020): a study with
``delays = [0, 1, 2, ...]`` (or ``workers = [...]``) trains a group per (level, B, tau, seed),
and the report sets S(B, tau) beside the theory of ``theory.models.delay``. Its groups are the
sweep's (the spec's delay keys, :func:`experiments.spec.checks.delays`, and the groups' and
trials' ``delay`` column are the study's own axis), so it owns no store table and no task.

- :mod:`~experiments.measures.delay.view`: S(B, tau), critical delays, fits per delay and the
  claims' verdicts;
- :mod:`~experiments.measures.delay.section`: the section; :mod:`~experiments.measures.delay.figures`:
  its two figures.
"""

from __future__ import annotations

from typing import Any

from experiments.measurement import Measurement, Part, ReportContext, register


@register("delay")
class Delay(Measurement):
    """S(B, tau) on the gradient-delay axis (module docstring)."""

    def wanted(self, spec: Any) -> bool:
        return False   # its groups are planned with the sweep's

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.delay.section import delay_section   # late: matplotlib
        from experiments.measures.delay.view import delay_view

        delays = delay_view(ctx.every.groups, ctx.every.trials)
        if not delays.measured:
            return Part(files={"delays": None})
        return Part(sections=(delay_section(ctx.runs, delays),),
                    verdicts=delays.verdicts if len(delays.verdicts) else None,
                    files={"delays": delays.points})
