"""The gradient-delay axis in the report: steps to result S(B, tau), the critical delay beside
the critical batch size, and Stich, Mohtashami & Jaggi (2021)'s claims judged with intervals.

Definitions (stated in the report as here):

- S(B, tau): the median over the seeds whose group reached the goal, as S(B) (the analysis's
  rule); the tuned learning rate at (B, tau) is the effective learning rate lr / (1 - momentum)
  of the best trial of the seed with the fewest steps, the metaparameter search having run per
  (B, tau) group as per B.
- B_crit(tau): the scaling fit S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018) of each
  level's curve at delay tau (:func:`experiments.report.analysis.fit_series`).
- The critical delay tau_crit(B): the delay at which S(B, tau) reaches :data:`CRITICAL_FACTOR`
  times S(B, 0), interpolated linearly in tau between the two measured delays that bracket it.
  Factor 2 because the delayed-SGD bound (``theory.models.delay``) grows linearly in tau,
  K(B, tau) / K(B, 0) = 1 + tau / tau_crit(B), so its own tau_crit is where the steps double. A
  delay that did not reach the goal counts with its step budget (a lower bound on its steps): the
  interpolated tau_crit is then an upper bound ("<="); when no measured delay doubles the steps,
  tau_crit exceeds the largest (">=", left out of the verdicts).

The claims, with the one parameter M read off the batch axis as the synchronous fit's B_crit
(without additive noise the bound gives B_crit(0) = M and tau_crit(B) = 1 + M / B):

- ``stich_one_parameter``: the measured tau_crit(B) over the predicted 1 + B_crit(0) / B,
  geometric mean over the batch sizes where tau_crit was bracketed;
- ``stich_lr_guideline``: the tuned learning rate's ratio lr(B, tau) / lr(B, 0) over the
  guideline's (1 + M/B) / (1 + M/B + tau) (``theory.models.delay.lr_ratio``), geometric mean over
  the reached (B, tau > 0);
- ``delay_sparsity``: Lee et al. (2021)'s question asked of asynchrony: the sparse / dense ratio
  of tau_crit(B) over the ratio the levels' B_crit(0) predict, (1 + M_s / B) / (1 + M_d / B),
  geometric mean over common B.

Each is judged in a factor-2 tier (:data:`TIER`): "holds" when the whole 90 % interval (bootstrap
over replicate seeds, :data:`N_BOOT` replicates, every fit redone per replicate) lies in
[1/2, 2], "does not hold" when it lies wholly outside, else "inconclusive". With fewer seeds than
``theory.verdicts.step_ratio.units_needed`` (5 at 90 %) the seeds cannot carry a 90 % interval
(the widest, their [min, max], covers a median with chance 1 - 2^(1 - k) only): the verdict is
then "inconclusive" whatever the bootstrap says, and the reason gives the value and the seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from theory.errors import TheoryError
from theory.models.delay import lr_ratio
from theory.models.scaling import fit_scaling
from theory.verdicts.claims import FAILS, HOLDS, INCONCLUSIVE
from theory.verdicts.step_ratio import units_needed

from experiments.report import analysis as A
from experiments.report.formatting import fmt_interval, fmt_num
from experiments.report.verdicts import VERDICT_COLUMNS

CRITICAL_FACTOR = 2.0
TIER = (0.5, 2.0)
N_BOOT = 100
LEVEL = 0.9
CELL = ["run", "sparsity", "series", "batch_size", "delay"]   # report order: runs, levels
# each claim's statistic, as the verdict tables record it
STATISTICS = {
    "stich_one_parameter": "measured tau_crit(B) over 1 + B_crit(0) / B, geometric mean over B; "
                           "seed bootstrap",
    "stich_lr_guideline": "tuned lr(B, tau) / lr(B, 0) over the guideline's ratio, geometric "
                          "mean over (B, tau > 0); seed bootstrap",
    "delay_sparsity": "sparse / dense tau_crit(B) over the ratio B_crit(0) predicts, geometric "
                      "mean over B; seed bootstrap",
}


@dataclass(frozen=True)
class DelayPart:
    """The delay axis of a report's runs: ``points`` one row per (run, level, B, tau) (S, its
    budget, the tuned learning rate), ``critical`` one per (run, level, B) (tau_crit and how it
    was found), ``b_crit`` one per (run, level, tau) (the fit, ``level`` naming the level's
    series), ``m`` series -> the level's synchronous B_crit (the one parameter), ``verdicts`` in
    :data:`experiments.report.verdicts.VERDICT_COLUMNS`; empty frames without a delay axis."""

    points: pd.DataFrame = field(default_factory=pd.DataFrame)
    critical: pd.DataFrame = field(default_factory=pd.DataFrame)
    b_crit: pd.DataFrame = field(default_factory=pd.DataFrame)
    verdicts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=VERDICT_COLUMNS))
    m: dict[str, float] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return len(self.points) > 0


def has_delays(groups: pd.DataFrame) -> bool:
    """Whether any stored group trained with a gradient delay."""
    return "delay" in groups and bool((groups["delay"] != 0).any())


def group_best(groups: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """``groups`` (done ones) with ``lr``: the effective learning rate of the group's best
    trial (NaN where it has none)."""
    done = groups[groups["status"] == "done"].copy()
    best = trials[["run", "group_key", "trial", "effective_lr"]].rename(
        columns={"group_key": "key", "trial": "best_trial", "effective_lr": "lr"})
    done["best_trial"] = done["best_trial"].astype("float")
    best = best.assign(best_trial=best["best_trial"].astype(float))
    return done.merge(best, on=["run", "key", "best_trial"], how="left")


def cell_table(done: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, level, B, tau) of ``done`` (group rows with ``lr``, seeds possibly
    repeated by a bootstrap draw): S (median over reaching seeds, NaN when none reached), the
    step budget and the tuned lr (the best trial of the seed with the fewest steps)."""
    g = done.groupby(CELL, sort=True)
    reached = done.dropna(subset=["steps_to_result"]).sort_values(
        [*CELL, "steps_to_result", "seed"], kind="stable")
    by = reached.groupby(CELL, sort=True)
    out = pd.DataFrame({"max_steps": g["max_steps"].max().astype(int),
                        "seeds": g["seed"].nunique()})
    out["steps"] = by["steps_to_result"].median().astype(float)
    out["seeds_reached"] = by["seed"].nunique()
    out["lr"] = by["lr"].first()
    out["seeds_reached"] = out["seeds_reached"].fillna(0).astype(int)
    return out.reset_index()[[*CELL, "steps", "max_steps", "seeds_reached", "seeds", "lr"]]


def critical_delay(delays: Sequence[int], steps: Sequence[float], budgets: Sequence[int]
                   ) -> tuple[float, str]:
    """tau_crit at one batch size from S at each delay (NaN: not reached within its budget),
    with its kind: "" (interpolated), "<=" (an unreached delay counted at its budget), ">="
    (no measured delay doubles the steps: the largest), or "none" (delay 0 did not reach)."""
    d = np.asarray(delays, float)
    s = np.asarray(steps, float)
    order = np.argsort(d)
    d, s, b = d[order], s[order], np.asarray(budgets, float)[order]
    if d[0] != 0 or math.isnan(s[0]):
        return math.nan, "none"
    target = CRITICAL_FACTOR * s[0]
    for i in range(1, len(d)):
        si, bound = (s[i], "") if not math.isnan(s[i]) else (b[i], "<=")
        if si >= target:
            prev = s[i - 1]
            return float(d[i - 1] + (target - prev) * (d[i] - d[i - 1]) / (si - prev)), bound
    return float(d[-1]), ">="


def critical_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, level, B): tau_crit and its kind (:func:`critical_delay`)."""
    rows = []
    for (run, sparsity, series, b), g in cells.groupby(CELL[:4], sort=True):
        tau, kind = critical_delay(g["delay"], g["steps"], g["max_steps"])
        rows.append({"run": run, "series": series, "sparsity": sparsity, "batch_size": int(b),
                     "tau_crit": tau, "kind": kind})
    return pd.DataFrame(rows, columns=[*CELL[:4], "tau_crit", "kind"])


def sync_b_crit(done: pd.DataFrame) -> dict[tuple[str, float], float]:
    """(run, level) -> the fitted B_crit of its synchronous curve (seed-level points), where it
    can be fitted: the one parameter M of the claims."""
    out = {}
    for (run, sparsity), g in done[(done["delay"] == 0)
                                   & done["steps_to_result"].notna()].groupby(["run", "sparsity"]):
        try:
            fit = fit_scaling(g["batch_size"].to_numpy(float), g["steps_to_result"].to_numpy(float),
                              n_boot=1, seed=0)
        except TheoryError:
            continue
        out[(run, float(sparsity))] = fit.b_crit
    return out


def claim_values(done: pd.DataFrame) -> dict[tuple[str, float, str], float]:
    """(run, level, claim) -> the claim's value (module docstring) on these group rows."""
    cells = cell_table(done)
    crit = critical_table(cells)
    m = sync_b_crit(done)
    out: dict[tuple[str, float, str], float] = {}
    bracketed = crit[crit["kind"].isin(["", "<="]) & (crit["tau_crit"] > 0)]
    predicted = {}
    for r in bracketed.itertuples(index=False):
        if (r.run, r.sparsity) in m:
            predicted[(r.run, r.sparsity, r.batch_size)] = (
                r.tau_crit, 1 + m[(r.run, r.sparsity)] / r.batch_size)
    for (run, sparsity) in {k[:2] for k in predicted}:
        ratios = [t / p for (ru, s, _), (t, p) in predicted.items() if (ru, s) == (run, sparsity)]
        out[(run, sparsity, "stich_one_parameter")] = _gmean(ratios)
    sync = cells[cells["delay"] == 0].set_index(CELL[:4])["lr"]
    for (run, sparsity), g in cells[(cells["delay"] > 0) & cells["lr"].notna()].groupby(
            ["run", "sparsity"]):
        if (run, sparsity) not in m:
            continue
        ratios = [r.lr / sync[(r.run, r.sparsity, r.series, r.batch_size)]
                  / float(lr_ratio(m[(run, sparsity)], r.batch_size, r.delay))
                  for r in g.itertuples(index=False)
                  if not math.isnan(sync.get((r.run, r.sparsity, r.series, r.batch_size), math.nan))]
        if ratios:
            out[(run, sparsity, "stich_lr_guideline")] = _gmean(ratios)
    for (run, sparsity, b), (tau, _) in predicted.items():
        if sparsity == 0 or (run, 0.0, b) not in predicted or (run, 0.0) not in m:
            continue
        dense_tau = predicted[(run, 0.0, b)][0]
        expected = (1 + m[(run, sparsity)] / b) / (1 + m[(run, 0.0)] / b)
        out.setdefault((run, sparsity, "_sparsity"), []).append(tau / dense_tau / expected)
    for key in [k for k in out if k[2] == "_sparsity"]:
        out[(key[0], key[1], "delay_sparsity")] = _gmean(out.pop(key))
    return out


def _gmean(values: Sequence[float]) -> float:
    v = np.asarray(values, float)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.exp(np.mean(np.log(v)))) if len(v) else math.nan


def bootstrap(done: pd.DataFrame, n_boot: int, seed: int = 0) -> dict[tuple[str, float, str], tuple[float, float, float, int]]:
    """(run, level, claim) -> (value, low, high, seeds): each claim's value on the stored seeds
    and its ``LEVEL`` percentile interval over ``n_boot`` draws of the seeds with replacement
    (per run; every fit redone per draw)."""
    point = claim_values(done)
    draws: dict[tuple[str, float, str], list[float]] = {k: [] for k in point}
    rng = np.random.default_rng(seed)
    seeds = {run: np.array(sorted(g["seed"].unique())) for run, g in done.groupby("run")}
    by_seed = {(run, s): g for (run, s), g in done.groupby(["run", "seed"])}
    for _ in range(n_boot if any(len(s) > 1 for s in seeds.values()) else 0):
        frames = []
        for run, ss in seeds.items():
            for i, s in enumerate(rng.choice(ss, len(ss))):
                frames.append(by_seed[(run, s)].assign(seed=i))   # a drawn seed, its own copy
        values = claim_values(pd.concat(frames, ignore_index=True))
        for k in draws:
            if not math.isnan(values.get(k, math.nan)):
                draws[k].append(values[k])
    q = ((1 - LEVEL) / 2, (1 + LEVEL) / 2)
    return {k: (v, *(np.quantile(draws[k], q) if len(draws[k]) > 1 else (math.nan, math.nan)),
                len(seeds[k[0]])) for k, v in point.items() if not math.isnan(v)}


def judge(value: float, low: float, high: float, seeds: int) -> tuple[str, str]:
    """The verdict in the factor-2 tier and its reason."""
    lo, hi = TIER
    if seeds < 2 or math.isnan(low):
        return INCONCLUSIVE, f"{fmt_num(value, 3)} on one seed: no interval over seeds"
    where = f"{fmt_num(value, 3)} {fmt_interval(low, high)}"
    if seeds < units_needed(LEVEL):
        return INCONCLUSIVE, (f"{where} over {seeds} seeds: too few for a {LEVEL:.0%} interval "
                              f"(at least {units_needed(LEVEL)})")
    if lo <= low and high <= hi:
        return HOLDS, f"{where} lies within [{lo:g}, {hi:g}]"
    if high < lo or low > hi:
        return FAILS, f"{where} lies outside [{lo:g}, {hi:g}]"
    return INCONCLUSIVE, f"{where} straddles [{lo:g}, {hi:g}]"


def delay_view(groups: pd.DataFrame, trials: pd.DataFrame, n_boot: int | None = None
               ) -> DelayPart:
    """The delay axis of the stacked stored ``groups`` and ``trials`` (``experiments.report.
    runs.RunSet``'s, every delay): points, critical delays, B_crit per tau and the verdicts
    (``n_boot`` seed draws, default :data:`N_BOOT`)."""
    if not has_delays(groups):
        return DelayPart()
    done = group_best(groups, trials)
    cells = cell_table(done)
    crit = critical_table(cells)
    curves = reached_by_delay(groups)
    order = list(dict.fromkeys(curves["series"]))
    fits = A.fit_series(curves, order).table
    level = {name: (base, run, s, d) for name, base, run, s, d in
             curves[["series", "level", "run", "sparsity", "delay"]].drop_duplicates()
             .itertuples(index=False)}
    b_crit = fits.assign(**{col: [level[s][i] for s in fits["series"]] for i, col in
                            enumerate(("level", "run", "sparsity", "delay"))})
    labels = dict(zip(zip(done["run"], done["sparsity"]), done["series"]))
    rows = []
    for (run, sparsity, claim), (value, low, high, seeds) in sorted(bootstrap(done, n_boot or N_BOOT).items()):
        verdict, reason = judge(value, low, high, seeds)
        rows.append({"run": run, "series": labels[(run, sparsity)], "sparsity": sparsity,
                     "claim": claim, "tier": "within 2x", "value": value, "low": low,
                     "high": high, "allowed_low": TIER[0], "allowed_high": TIER[1],
                     "verdict": verdict, "reason": reason, "statistic": STATISTICS[claim]})
    m = {labels[key]: value for key, value in sync_b_crit(done).items()}
    return DelayPart(cells, crit, b_crit, pd.DataFrame(rows, columns=VERDICT_COLUMNS), m)


def reached_by_delay(groups: pd.DataFrame) -> pd.DataFrame:
    """The groups with their series named per delay ("dense, τ = 4", ``level`` the level's own
    name): the curves the scaling fit takes, one per (run, level, tau)."""
    g = groups.assign(level=groups["series"])
    g["series"] = [f"{s}, τ = {d}" for s, d in zip(g["series"], g["delay"])]
    return g.sort_values(["run", "sparsity", "delay", "batch_size", "seed"], kind="stable")
