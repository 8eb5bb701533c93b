"""The study's pre-declared stopping rule (``[stopping]``, :mod:`experiments.spec.tables.stopping`)
applied to its stored paired runs, for the report.

The paired statistic: per batch size, the steps >= 1,000 that every run of both levels reached,
each run's mean log metric over them, and per pair (seed, trial) the difference sparse minus
reference (:func:`paired_differences`). Look k of a group-sequential rule holds the pairs of the
first k rounds of seeds (the seeds in the spec's order, split evenly); the data of round k
never depend on later rounds, so the decision at each look is the one the study would have
taken then. The study's answer is the first look that stops (:func:`theory.verdicts.sequential.look`):
its repeated interval, exponentiated, is the ratio's interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from theory.verdicts.lee_stage import STAGE_START, stage_table
from theory.verdicts.sequential import Look, look

from experiments.spec.tables.stopping import Stopping


def paired_differences(schedule: pd.DataFrame, stopping: Stopping, seeds: Sequence[int],
                       start: int = STAGE_START) -> np.ndarray:
    """The per-pair differences of mean log metric (module docstring) over the runs of
    ``seeds``, every batch size's pairs together."""
    rows = stage_table(schedule, stopping.metric, start)
    rows = rows[rows.seed.isin(list(seeds))
                & rows.sparsity.isin([stopping.sparsity, stopping.reference])]
    out = []
    for _, g in rows.groupby("batch_size"):
        steps = g.groupby(["sparsity", "seed", "trial"]).step.apply(set)
        if len(steps) < 2:
            continue
        common = set.intersection(*steps)
        means = g[g.step.isin(common)].groupby(["sparsity", "seed", "trial"]).log.mean()
        if stopping.sparsity not in means.index.get_level_values(0) or \
                stopping.reference not in means.index.get_level_values(0):
            continue
        a, r = means.loc[stopping.sparsity], means.loc[stopping.reference]
        both = a.index.intersection(r.index)
        out += list((a.loc[both] - r.loc[both]).to_numpy())
    return np.asarray(out, dtype=float)


def looks(schedule: pd.DataFrame, stopping: Stopping, seeds: Sequence[int]) -> tuple[Look, ...]:
    """The looks of the rule up to the first that stops (the last look of a fixed rule is its
    only one), each once its whole round of seeds is stored; none where a look has fewer than
    two pairs."""
    per = len(seeds) // stopping.rounds
    resolution = math.log1p(stopping.effect)
    stored = [set(schedule[schedule.sparsity == s].seed)
              for s in (stopping.sparsity, stopping.reference)]
    out = []
    for k in range(1, stopping.rounds + 1):
        # a look needs its whole round at both levels: a partial round is no look
        if not all(set(seeds[(k - 1) * per:k * per]) <= have for have in stored):
            break
        d = paired_differences(schedule, stopping, seeds[:k * per])
        if len(d) < 2:
            break
        out.append(look(d, k, stopping.rounds, stopping.boundary, stopping.alpha, resolution))
        if out[-1].stop:
            break
    return tuple(out)


def stopping_lines(schedule: pd.DataFrame, stopping: Stopping | None,
                   seeds: Sequence[int]) -> list[str]:
    """The rule as declared, then one line per look and the answer (empty without a rule)."""
    if stopping is None:
        return []
    lines = [f"Stopping rule, declared in the spec before the data: {stopping.describe()}."]
    taken = looks(schedule, stopping, seeds) if len(schedule) else ()
    if not taken:
        return lines + ["No look yet: fewer than two pairs at Lee's stage."]
    for x in taken:
        lo, hi = (math.exp(v) for v in x.interval)
        lines.append(f"Look {x.look} of {x.looks}: {x.pairs} pairs, ratio "
                     f"{math.exp(x.mean):.3g}, repeated interval [{lo:.3g}, {hi:.3g}], "
                     f"t = {x.statistic:.3g} against c = {x.boundary:.3g} (nominal p "
                     f"{x.nominal:.3g})" + (f": stop ({x.why})." if x.stop else ": go on."))
    last = taken[-1]
    if not last.stop:
        lines.append("The rule has not stopped: the study needs its next round.")
    return lines
