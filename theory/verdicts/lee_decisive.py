"""The decisive form of Lee et al. (2021)'s claim at their stage (issue 47): what the paired
interval resolves, the step ratio at tuned settings, and the bias control.

- :func:`resolution`: the paired interval [lo, hi] of L_s / L_ref either excludes 1 (*decided*:
  L is larger, or smaller) or bounds the difference: L_s is within +-X of L_ref with
  X = max(hi - 1, 1 - lo), the smallest symmetric difference the interval excludes. The claim
  ``lee_L_resolved`` holds when the interval is decided or X <= ``effect`` (the resolution the
  study was planned for, ``[stopping] effect``), and is inconclusive otherwise; the row stores X
  as its value and the ratio's interval beside it.
- :func:`tuned_steps_verdict`: the step ratio of :func:`theory.verdicts.step_ratio.censored_step_ratio`
  (Kaplan-Meier medians over runs, runs that missed the goal censored at their budget, paired
  bootstrap over runs; best of N beside it) as its own row: holds when its interval lies above 1
  (the sparse network needs more steps), does not hold below 1.
- :func:`compare`: two levels held in two tables (the bias control's: the dense network with
  and without biases, the sparse one against the dense one without biases), the L ratio at
  Lee's stage (paired over runs, :func:`theory.verdicts.lee_stage.overall_ratio`) and the step
  ratio, each as a row whose claim names the cause it isolates (:data:`CAUSES`).

Runs pair across tables as they pair across levels: by (seed, trial), which fix the
initialization and the data order (:mod:`theory.verdicts.lee_stage`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from theory.errors import TheoryError
from theory.verdicts.claims import FAILS, HOLDS, INCONCLUSIVE, Verdict
from theory.verdicts.lee_stage import (
    STAGE_START, StageRatio, interval_side, overall_ratio,
)
from theory.verdicts.step_ratio import STATISTIC, StepRatio, censored_step_ratio, describe

RESOLUTION_STATISTIC = ("X = max(hi - 1, 1 - lo) of the paired 90 % t interval of L_s / L_ref "
                        "(each run's mean log L over the stage)")
PAIRED_STATISTIC = "each run's mean log L over the stage, paired t interval over runs"
# what each comparison of the bias control isolates: (claim, what is compared)
CAUSES = {"biases": "biases removed", "weights": "weights pruned",
          "weights_kept_biases": "weights pruned, biases kept"}
# the two tables' levels inside compare (any two distinct labels in [0, 1))
_REF, _OTHER = 0.0, 0.5


def resolution(ratio: StageRatio, effect: float, start: int = STAGE_START) -> Verdict:
    """The ``lee_L_resolved`` row of one level (module docstring) from its stage ratio (from
    step ``start`` on)'s paired interval (the Welch one where the runs are not paired)."""
    if not 0 < effect:
        raise TheoryError(f"effect must be > 0 (a fraction such as 0.1), got {effect}")
    paired = not math.isnan(ratio.paired[0])
    lo, hi = ratio.paired if paired else ratio.interval
    which = "paired" if paired else "Welch (runs not paired)"
    claim = f"lee_L_resolved (steps >= {start})"
    if math.isnan(lo) or math.isnan(ratio.value):
        return Verdict(claim, "paper", ratio.sparsity, math.nan, (lo, hi), (0.0, effect),
                       INCONCLUSIVE, "no interval (fewer than two runs a level)",
                       RESOLUTION_STATISTIC)
    x = max(hi - 1.0, 1.0 - lo)
    side = interval_side((lo, hi))
    numbers = f"L_s/L_ref = {ratio.value:.3g}, {which} interval [{lo:.3g}, {hi:.3g}]"
    if side:
        verdict = HOLDS
        says = (f"decided: the interval excludes 1, L is {'larger' if side > 0 else 'smaller'} "
                f"in the sparse network")
    elif x <= effect:
        verdict, says = HOLDS, (f"L of the {ratio.sparsity:g} network is within +-{100 * x:.1f} % "
                                f"of the reference's (resolution planned: {100 * effect:g} %)")
    else:
        verdict, says = INCONCLUSIVE, (f"unresolved: the interval spans +-{100 * x:.1f} %, wider "
                                       f"than the {100 * effect:g} % planned")
    return Verdict(claim, "paper", ratio.sparsity, x, (lo, hi), (0.0, effect), verdict,
                   f"{numbers}; {says}", RESOLUTION_STATISTIC)


def tuned_steps_verdict(steps: StepRatio, claim: str = "lee_steps_tuned (steps to the goal)"
                        ) -> Verdict:
    """The step ratio as its own row (module docstring)."""
    side = interval_side(steps.interval)
    verdict = {1: HOLDS, -1: FAILS, 0: INCONCLUSIVE}[side]
    return Verdict(claim, "paper", steps.sparsity, steps.value, steps.interval, (1.0, math.inf),
                   verdict, describe(steps), STATISTIC)


def _relabel(frame: pd.DataFrame, level: float, label: float) -> pd.DataFrame:
    return frame[frame["sparsity"] == level].assign(sparsity=label)


def compare(table: pd.DataFrame, reference_table: pd.DataFrame, runs: pd.DataFrame,
            reference_runs: pd.DataFrame, level: float, reference_level: float, cause: str,
            start: int = STAGE_START, interval: float = 0.9, n_boot: int = 1000,
            rng: int = 0) -> tuple[Verdict, Verdict]:
    """L and steps of ``level`` in (``table``, ``runs``) over ``reference_level`` in
    (``reference_table``, ``reference_runs``): the ``lee_L_rises: <cause>`` row (the paired
    interval where the runs pair, else Welch; holds above 1) and the ``lee_steps: <cause>`` row
    (:func:`tuned_steps_verdict`). ``table``s: Lee's stage (:data:`theory.verdicts.lee_stage.STAGE_COLUMNS`);
    ``runs``: :data:`theory.verdicts.step_ratio.RUN_COLUMNS`; ``cause``: a key of
    :data:`CAUSES`."""
    if cause not in CAUSES:
        raise TheoryError(f"unknown cause {cause!r}; allowed: {', '.join(CAUSES)}")
    name = CAUSES[cause]
    both = pd.concat([_relabel(table, level, _OTHER),
                      _relabel(reference_table, reference_level, _REF)], ignore_index=True)
    ratio = overall_ratio(both, _OTHER, _REF, start, interval)
    paired = not math.isnan(ratio.paired[0])
    primary = ratio.paired if paired else ratio.interval
    side = interval_side(primary)
    where = (f"steps {ratio.steps[0]}-{ratio.steps[-1]}, {ratio.runs[0]} and {ratio.runs[1]} runs"
             if ratio.steps else "no step reached by every run of both")
    reason = (f"L ({level:g}) / L ({reference_level:g}, reference) = {ratio.value:.3g} "
              f"[{primary[0]:.3g}, {primary[1]:.3g}] ({'paired' if paired else 'Welch'}; {where})")
    l_row = Verdict(f"lee_L_rises: {name}", "paper", level, ratio.value, primary,
                    (1.0, math.inf), {1: HOLDS, -1: FAILS, 0: INCONCLUSIVE}[side], reason,
                    PAIRED_STATISTIC)
    steps = censored_step_ratio(pd.concat([_relabel(runs, level, _OTHER),
                                           _relabel(reference_runs, reference_level, _REF)]),
                                _OTHER, _REF, interval, n_boot, rng)
    step_row = tuned_steps_verdict(replace(steps, sparsity=level), f"lee_steps: {name}")
    return l_row, step_row
