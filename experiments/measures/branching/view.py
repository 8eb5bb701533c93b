"""The critical batch three ways, per series and seed, for the report: CBS(t) measured by
branching (Merrill et al. 2025, the store's ``branching`` table), B_simple from the probes
(McCandlish et al. 2018: ``theory.summarize``'s B_simple at the goal, with its hierarchical
bootstrap interval) and the sweep's fitted B_crit (S(B) = S_min (1 + B_crit / B), with its
bootstrap interval), and the batch-size warmup beside the best fixed batch size (the store's
``warmup`` table).

- :func:`critical_table`: one row per (run, series, seed) with CBS at the goal (the checkpoint
  at the base run's steps-to-result H), B_simple at the goal, B_crit, and the branching cost in
  trial-steps beside the run's sweep (``groups.trial_steps``);
- :func:`warmup_table`: one row per (run, series, seed): steps- and examples-to-result of the
  warmup and of the best fixed B, median and range over replicates;
- :func:`branching_sentences`: the findings, with their numbers, whatever they show.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from theory.errors import TheoryError
from theory.verdicts.summaries import find, summarize

from experiments.report.formatting import fmt_interval, fmt_num, fmt_pct, grid_interval

CRITICAL_COLUMNS = ["run", "series", "sparsity", "seed", "base_batch", "goal_step", "k_max", "n_seeds",
                    "cbs", "cbs_low", "cbs_high", "upper_end", "b_simple", "b_simple_low", "b_simple_high",
                    "b_crit", "b_crit_low", "b_crit_high", "trial_steps", "warmup_trial_steps",
                    "sweep_trial_steps"]
WARMUP_COLUMNS = ["run", "series", "sparsity", "seed", "schedule", "examples_budget", "replicates",
                  "warmup_steps", "warmup_steps_min", "warmup_steps_max", "warmup_examples",
                  "best_fixed", "fixed_steps", "fixed_steps_min", "fixed_steps_max", "fixed_examples",
                  "base_batch", "base_steps"]


def critical_table(branching: pd.DataFrame, warmup: pd.DataFrame, probes: pd.DataFrame,
                   fits: pd.DataFrame, groups: pd.DataFrame) -> pd.DataFrame:
    """CBS at the goal beside B_simple at the goal and the fitted B_crit (module docstring)."""
    rows = []
    fit = fits.set_index("series")
    for (run, series, sparsity, seed), g in branching.groupby(["run", "series", "sparsity", "seed"], sort=False):
        goal = g.sort_values("step").iloc[-1]
        simple = _b_simple(probes[(probes["run"] == run) & (probes["sparsity"] == sparsity)], sparsity)
        crit = [fit.loc[series, k] if series in fit.index and k in fit.columns else math.nan
                for k in ("b_crit", "b_crit_lo", "b_crit_hi")]
        w = warmup[(warmup["run"] == run) & (warmup["sparsity"] == sparsity) & (warmup["seed"] == seed)]
        rows.append({"run": run, "series": series, "sparsity": float(sparsity), "seed": int(seed),
                     "base_batch": int(goal.batch_size), "goal_step": int(goal.goal_step),
                     "k_max": int(goal.k_max), "n_seeds": int(goal.n_seeds), "cbs": float(goal.critical_batch),
                     "cbs_low": float(goal.low), "cbs_high": float(goal.high),
                     "upper_end": bool(goal.critical_batch >= goal.k_max * goal.batch_size),
                     "b_simple": simple[0], "b_simple_low": simple[1], "b_simple_high": simple[2],
                     "b_crit": float(crit[0]), "b_crit_low": float(crit[1]), "b_crit_high": float(crit[2]),
                     "trial_steps": int(goal.trial_steps),
                     "warmup_trial_steps": int(w.trial_steps.iloc[0]) if len(w) else 0,
                     "sweep_trial_steps": int(groups.loc[groups["run"] == run, "trial_steps"].sum())})
    return pd.DataFrame(rows, columns=CRITICAL_COLUMNS)


def _b_simple(probes: pd.DataFrame, sparsity: float) -> tuple[float, float, float]:
    """B_simple at the goal of one level (value, interval), NaN without probes."""
    try:
        s = find(summarize(probes, statistics=("b_simple_goal",), n_boot=500), sparsity, "b_simple_goal")
    except TheoryError:
        return math.nan, math.nan, math.nan
    return s.value, s.interval[0], s.interval[1]


def warmup_table(warmup: pd.DataFrame) -> pd.DataFrame:
    """The warmup against the best fixed B per (run, series, seed) (module docstring): the best
    fixed B has the fewest median steps among those that reached the goal in every replicate."""
    rows = []
    for (run, series, sparsity, seed), g in warmup.groupby(["run", "series", "sparsity", "seed"], sort=False):
        warm = g[g["kind"] == "warmup"]
        fixed = g[g["kind"] == "fixed"]
        full = fixed.groupby("batch_size")["steps_to_result"].agg(lambda v: v.notna().all())
        medians = fixed.groupby("batch_size")["steps_to_result"].median()[full]
        best = None if medians.empty else int(medians.astype(float).idxmin())
        ws, fs = _spread(warm), _spread(fixed[fixed["batch_size"] == best]) if best else (math.nan,) * 4
        base = int(fixed["batch_size"].min()) if len(fixed) else 0
        rows.append({"run": run, "series": series, "sparsity": float(sparsity), "seed": int(seed),
                     "schedule": schedule_text(warm["schedule"].iloc[0]) if len(warm) else "",
                     "examples_budget": int(g["examples_budget"].iloc[0]), "replicates": len(warm),
                     "warmup_steps": ws[0], "warmup_steps_min": ws[1], "warmup_steps_max": ws[2],
                     "warmup_examples": ws[3], "best_fixed": best, "fixed_steps": fs[0],
                     "fixed_steps_min": fs[1], "fixed_steps_max": fs[2], "fixed_examples": fs[3],
                     "base_batch": base, "base_steps": _spread(fixed[fixed["batch_size"] == base])[0]})
    return pd.DataFrame(rows, columns=WARMUP_COLUMNS)


def _spread(rows: pd.DataFrame) -> tuple[float, float, float, float]:
    """Median, min and max steps-to-result and median examples-to-result over replicates (NaN
    when a replicate missed the goal: its median is then not a steps-to-result)."""
    steps = rows["steps_to_result"].astype(float).to_numpy()
    if not len(steps) or np.isnan(steps).any():
        return math.nan, math.nan, math.nan, math.nan
    return (float(np.median(steps)), float(steps.min()), float(steps.max()),
            float(np.median(rows["examples_to_result"].astype(float))))


def schedule_text(schedule_json: str) -> str:
    """'8 → 64 (step 30) → 128 (step 41)': the warmup's batch sizes and where each starts."""
    segs = json.loads(schedule_json)
    return " → ".join(f"{b}" + (f" (step {s})" if s else "") for s, b, _ in segs)


def _change(steps: float, reference: float) -> str:
    """'12.5 % fewer steps' / '3 % more steps' (of ``steps`` against ``reference``)."""
    change = steps / reference - 1.0
    return f"{fmt_pct(round(abs(change), 3))} {'fewer' if change < 0 else 'more'} steps"


def branching_sentences(critical: pd.DataFrame, warm: pd.DataFrame) -> list[str]:
    """Findings: CBS at the goal beside B_crit and B_simple, the cost share of the sweep, and
    the warmup against the best fixed B, with intervals, whatever they show."""
    out = []
    for r in critical.itertuples(index=False):
        cbs = grid_interval(r.cbs, r.cbs_low, r.cbs_high, open_above=bool(r.upper_end))
        out.append(f"{r.series}, seed {r.seed}: the critical batch measured by branching at the goal "
                   f"(step H = {r.goal_step} of the best B = {r.base_batch} run; k up to {r.k_max}, "
                   f"{r.n_seeds} branch seeds) is CBS = {cbs}"
                   + (" (the largest branch passed: a lower bound)" if r.upper_end else "")
                   + f"; the sweep's fitted B_crit is {fmt_num(r.b_crit, 3)} "
                   f"{fmt_interval(r.b_crit_low, r.b_crit_high)} and B_simple at the goal "
                   f"{fmt_num(r.b_simple, 3)} {fmt_interval(r.b_simple_low, r.b_simple_high)}.")
    for run, g in critical.groupby("run", sort=False):
        cost, sweep = int(g["trial_steps"].sum()), int(g["sweep_trial_steps"].iloc[0])
        warmup = int(g["warmup_trial_steps"].sum())
        out.append(f"{run}: branching cost {cost} trial-steps, {fmt_pct(round(cost / sweep, 3))} of the "
                   f"sweep's {sweep}" + (f"; the warmup comparison {warmup} more "
                                         f"({fmt_pct(round(warmup / sweep, 3))})" if warmup else "") + ".")
    for r in warm.itertuples(index=False):
        if math.isnan(r.warmup_steps):
            out.append(f"{r.series}, seed {r.seed}: the CBS(t) warmup ({r.schedule}) did not reach the goal "
                       f"in every replicate within {r.examples_budget} examples.")
            continue
        head = (f"{r.series}, seed {r.seed}: the CBS(t) warmup ({r.schedule}) reached the goal in "
                f"{fmt_num(r.warmup_steps)} steps (median of {r.replicates} replicates, range "
                f"[{fmt_num(r.warmup_steps_min)}, {fmt_num(r.warmup_steps_max)}]; "
                f"{fmt_num(r.warmup_examples)} examples)")
        if r.best_fixed is None or math.isnan(r.fixed_steps):
            out.append(head + f"; no fixed batch size reached it in every replicate within "
                              f"{r.examples_budget} examples.")
            continue
        out.append(head + f", against {fmt_num(r.fixed_steps)} [{fmt_num(r.fixed_steps_min)}, "
                          f"{fmt_num(r.fixed_steps_max)}] steps ({fmt_num(r.fixed_examples)} examples) "
                          f"for the best fixed batch size B = {r.best_fixed} under the same "
                          f"{r.examples_budget}-example budget: {_change(r.warmup_steps, r.fixed_steps)}"
                          + ("" if math.isnan(r.base_steps) else
                             f"; against the base batch size B = {r.base_batch} ({fmt_num(r.base_steps)} "
                             f"steps): {_change(r.warmup_steps, r.base_steps)}") + ".")
    return out
