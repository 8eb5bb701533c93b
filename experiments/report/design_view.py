"""A study's store as the input of a design (:mod:`theory.verdicts.design`), and its
pre-declared stopping rule applied to its paired runs (:mod:`theory.verdicts.sequential`).

Design: the points of one per-run metric, and the text ``sparsescale design`` prints.

The metric is either a quantity of the ``stage_probes`` table (several points per run: Lee
et al. (2021)'s L, ``local_lipschitz``, by default, from step ``start`` on, as at their stage), or
a column of the ``trials`` table (one value per run, e.g. ``hit_step`` or ``final_metric``). A
run is one (seed, trial) of a (sparsity, batch size); runs of two levels with the same (seed,
trial, batch size) are pairs (the same initialization seed and data order).

Stopping (``[stopping]``, :mod:`experiments.spec.tables.stopping`), for the report: The paired statistic: per batch size, the steps >= 1,000 that every run of both levels reached,
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

from theory.errors import TheoryError
from theory.verdicts.design import (SampleSize, VarianceComponents, sample_size, sample_sizes,
                                    variance_components)
from theory.verdicts.lee_stage import QUANTITY, STAGE_START, stage_table
from theory.verdicts.sequential import Look, look

from experiments.spec.tables.stopping import Stopping
from experiments.store.results import Results

SCALES = ("log", "linear")
# trials columns that are the run's own measurement, not its settings or keys
TRIAL_METRICS = ("hit_step", "final_metric")


def metric_points(results: Results, metric: str = QUANTITY, start: int = STAGE_START,
                  scale: str = "log") -> pd.DataFrame:
    """The points of ``metric`` (module docstring), columns ``sparsity, batch_size, seed,
    trial, step, value`` and ``y`` (``value`` on the analysis ``scale``: its natural log,
    positive finite values only, or as is)."""
    if scale not in SCALES:
        raise TheoryError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    stage = results.stage_probes
    if metric in set(stage.quantity):
        rows = stage[(stage.quantity == metric) & (stage.step >= start)]
    elif metric in TRIAL_METRICS:
        rows = results.trials.assign(step=0, value=results.trials[metric])
    else:
        known = sorted(set(stage.quantity)) + list(TRIAL_METRICS)
        raise TheoryError(f"metric {metric!r} is not in this store; allowed: "
                          f"{', '.join(known)}")
    rows = rows[["sparsity", "batch_size", "seed", "trial", "step", "value"]].astype(
        {"value": float})
    values = rows.value.to_numpy()
    keep = np.isfinite(values) & ((values > 0) if scale == "log" else True)
    rows = rows[keep]
    if rows.empty:
        raise TheoryError(f"metric {metric!r} has no finite values"
                          + (" > 0" if scale == "log" else "") + f" from step {start} on")
    return rows.assign(y=np.log(rows.value) if scale == "log" else rows.value)


def design(results: Results, metric: str = QUANTITY, start: int = STAGE_START,
           scale: str = "log", effect: float = 0.1, level: float = 0.9, power: float = 0.8,
           points: Sequence[float] = (), reference: float = 0.0, t_quantiles: bool = False
           ) -> tuple[VarianceComponents, float, tuple[SampleSize, ...]]:
    """(components, delta, sample sizes) of a pilot store: ``effect`` is relative on the log scale
    (delta = log(1 + effect)) and absolute on the linear one; ``points``: points per run to
    size for (default: the pilot's own, 2x, 4x and 8x)."""
    frame = metric_points(results, metric, start, scale)
    comps = variance_components(frame, "y", reference=reference)
    delta = math.log1p(effect) if scale == "log" else float(effect)
    if not delta > 0:
        raise TheoryError(f"effect must be > 0, got {effect!r}")
    per_run = max(1, round(comps.points_per_run))
    chosen = tuple(points) or ((1,) if math.isnan(comps.within) else
                               tuple(per_run * k for k in (1, 2, 4, 8)))
    return comps, delta, sample_sizes(comps, delta, chosen, level, power, t_quantiles)


def format_design(comps: VarianceComponents, delta: float, rows: Sequence[SampleSize],
                  metric: str, scale: str, effect: float) -> str:
    """The text of ``sparsescale design``: the components used, then runs and pairs needed per
    number of points per run, with the points that design takes in all."""
    on = f"log {metric}" if scale == "log" else metric
    size = f"{effect:.0%} in {metric}" if scale == "log" else f"{effect:g} in {metric}"
    lines = [f"variance components of {on} ({comps.runs} runs in {comps.cells} cells, "
             f"{comps.points} points, {comps.points_per_run:.1f} a run):",
             f"  between runs          sigma_b^2 = {comps.between:.4g} "
             f"(SD {math.sqrt(comps.between):.3g})"]
    if not math.isnan(comps.within):
        lines.append(f"  within a run (points) sigma_w^2 = {comps.within:.4g} "
                     f"(SD {math.sqrt(comps.within):.3g})")
    else:
        lines.append("  within a run (points) none: one value per run")
    lines.append(f"  SD of run means       {comps.run_mean_sd:.3g}")
    if math.isnan(comps.cov_paired):
        lines.append(f"  paired runs           {comps.pairs} pair(s): too few for a covariance")
    else:
        lines.append(f"  paired runs           {comps.pairs} pairs, covariance "
                     f"{comps.cov_paired:.4g} (shares {comps.paired_correlation:.0%} of sigma_b^2)")
    first = rows[0]
    lines += ["", f"to resolve {size} (delta = {delta:.4g} on the {scale} scale) with a "
                  f"{first.level:.0%} two-sided interval and {first.power:.0%} power:",
              "  points/run  design       needed  points in all"]
    for r in rows:
        kind = "pairs" if r.paired else "runs/level"
        total = r.n * r.points * 2
        lines.append(f"  {r.points:>10g}  {kind:<11}{r.n:>7}  {total:>13g}")
    if not math.isnan(comps.within) and comps.between > 0:
        # the runs no number of points per run can go below: sigma_w^2 / m -> 0
        floor = sample_size(comps.between, delta, first.level, first.power, paired=False)
        lines.append(f"  however many points per run: at least {floor} runs/level unpaired")
    return "\n".join(lines)


def paired_differences(stage: pd.DataFrame, stopping: Stopping, seeds: Sequence[int],
                       start: int = STAGE_START) -> np.ndarray:
    """The per-pair differences of mean log metric (module docstring) over the runs of
    ``seeds``, every batch size's pairs together."""
    rows = stage_table(stage, stopping.metric, start)
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


def looks(stage: pd.DataFrame, stopping: Stopping, seeds: Sequence[int]) -> tuple[Look, ...]:
    """The looks of the rule up to the first that stops (the last look of a fixed rule is its
    only one), each once its whole round of seeds is stored; none where a look has fewer than
    two pairs."""
    per = len(seeds) // stopping.rounds
    resolution = math.log1p(stopping.effect)
    stored = [set(stage[stage.sparsity == s].seed)
              for s in (stopping.sparsity, stopping.reference)]
    out = []
    for k in range(1, stopping.rounds + 1):
        # a look needs its whole round at both levels: a partial round is no look
        if not all(set(seeds[(k - 1) * per:k * per]) <= have for have in stored):
            break
        d = paired_differences(stage, stopping, seeds[:k * per])
        if len(d) < 2:
            break
        out.append(look(d, k, stopping.rounds, stopping.boundary, stopping.alpha, resolution))
        if out[-1].stop:
            break
    return tuple(out)


def stopping_lines(stage: pd.DataFrame, stopping: Stopping | None,
                   seeds: Sequence[int]) -> list[str]:
    """The rule as declared, then one line per look and the answer (empty without a rule)."""
    if stopping is None:
        return []
    lines = [f"Stopping rule, declared in the spec before the data: {stopping.describe()}."]
    taken = looks(stage, stopping, seeds) if len(stage) else ()
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
