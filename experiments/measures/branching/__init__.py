"""The critical batch by branching as a measurement (Merrill et al. 2025): for every sparsity
level and seed of the sweep, CBS(t) at K checkpoints of the best run at a small batch size, and
the batch-size warmup built from it against the best fixed batch size (spec: the
``[branching]`` table, :mod:`experiments.spec.tables.branching`).

- :mod:`~experiments.measures.branching.tasks`: the tasks, one (sparsity, seed) each;
- :mod:`~experiments.measures.branching.store`: the ``branching`` and ``warmup`` tables, rows
  and their writer;
- :mod:`~experiments.measures.branching.view`: the critical batch three ways, the warmup and
  the sentences;
- :mod:`~experiments.measures.branching.section`: the report's section and Figure 9.
"""

from __future__ import annotations

from typing import Any

from experiments.measurement import (
    Measurement, Part, ReportContext, RunContext, TaskSeconds, register, table_enabled,
)
from experiments.measures.branching.store import BRANCHING, WARMUP, branched
from experiments.run.timing import summed


@register("branching")
class Branching(Measurement):
    """CBS(t) by branching and the warmup from it (module docstring)."""

    tables = (BRANCHING, WARMUP)

    def wanted(self, spec: Any) -> bool:
        return table_enabled(spec, "branching")

    def pending(self, ctx: RunContext) -> bool:
        done = branched(ctx.store)
        return any((float(s), int(seed)) not in done
                   for s in ctx.spec.sparsities for seed in ctx.spec.seeds)

    def check(self, spec: Any, n_train: int) -> list[str]:
        br = spec.branching
        base = br.batch_size if br.batch_size != "smallest" else min(spec.batch_sizes)
        if br.k_max * base <= n_train:
            return []
        return [f"branching.k_max: found {br.k_max}; k_max x the base batch size {base} exceeds "
                f"the training set ({n_train}); allowed: k_max <= {n_train // base}"]

    def start(self, ctx: RunContext):
        from experiments.measures.branching.tasks import start_branching

        return start_branching(ctx.spec, ctx.dataset, ctx.store, executor=ctx.executor)

    def seconds(self, frame) -> dict[str, TaskSeconds]:
        """One measurement per (sparsity, seed): the seconds of each, warmup included."""
        levels = frame(BRANCHING.name).drop_duplicates(["sparsity", "seed"])
        return {"branching": TaskSeconds(len(levels), summed(levels.seconds) if len(levels)
                                         else 0.0, "measurement")}

    def report(self, ctx: ReportContext) -> Part:
        from experiments.measures.branching.section import branching_section   # late: matplotlib
        from experiments.measures.branching.view import (
            branching_sentences, critical_table, warmup_table,
        )

        runs = ctx.runs
        critical = critical_table(runs.branching, runs.warmup, runs.probes, ctx.fits.table,
                                  runs.groups)
        warm = warmup_table(runs.warmup)
        return Part(sections=(branching_section(runs, ctx.fits, critical, warm),)
                    if len(critical) else (),
                    sentences=tuple(branching_sentences(critical, warm)))
