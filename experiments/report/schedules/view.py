"""The shoot-out's numbers, from the store's ``policy_runs`` rows: per (run, sparsity, seed,
policy) the steps, examples and modelled seconds to the goal over replicates, each with a 90 %
interval, and the verdict against the best fixed batch size.

Intervals: the geometric mean over replicates with its 90 % t interval on the logarithm (times
to a goal are positive and skewed; a t interval needs at least 2 replicates, the table asks for
5). Verdict: the paired ratio policy / best fixed of each replicate's modelled time (the same
data seed in both) — its geometric mean and 90 % t interval; a replicate where the best fixed B
missed the goal counts at its whole budget (:func:`censored`). ``beats`` when the interval lies
below 1, ``loses`` above 1, ``inconclusive`` otherwise; ``not reached`` when a replicate of the
policy missed the goal in its budget. The gain is 1 - the ratio. Anchor claims: each paper's own
reported gain, in its own terms (time for Pollux, Gray et al. and Seesaw, steps for Merrill et
al.), beside the same quantity here.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from scipy import stats

LEVEL = 0.9
BEST_FIXED = "best fixed"
# name -> (paper, its claimed gain, the quantity it is claimed in)
CLAIMS = {
    "goodput": ("Qiao et al. 2021 (Pollux)", "37-50 % shorter job time", "seconds"),
    "noise_ramp": ("Gray et al. 2024", "18 % less training time", "seconds"),
    "cbs_warmup": ("Merrill et al. 2025", "43 % fewer gradient steps", "steps"),
    "seesaw": ("Meterez et al. 2025 (Seesaw)", "about 36 % less wall-clock time", "seconds"),
}
QUANTITIES = {"steps": "steps_to_result", "examples": "examples_to_result",
              "seconds": "seconds_to_result"}


def geometric(values: np.ndarray) -> tuple[float, float, float]:
    """Geometric mean and its ``LEVEL`` t interval on the log scale (nan: fewer than 2 values
    or a non-positive one)."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0 or np.any(~np.isfinite(v)) or np.any(v <= 0):
        return math.nan, math.nan, math.nan
    logs = np.log(v)
    m = float(logs.mean())
    if len(v) < 2:
        return math.exp(m), math.nan, math.nan
    half = float(stats.t.ppf(0.5 + LEVEL / 2, len(v) - 1) * logs.std(ddof=1) / math.sqrt(len(v)))
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, sparsity, seed, policy): replicates, reached, each quantity's
    geometric mean and interval, the time ratio to the best fixed B, its interval, verdict and
    gain (module docstring)."""
    out = []
    for (run, sparsity, seed), level in rows.groupby(["run", "sparsity", "seed"], sort=False):
        fixed = level[level.policy == BEST_FIXED].set_index("replicate")
        for policy, runs in level.groupby("policy", sort=False):
            runs = runs.set_index("replicate")
            row = {"run": run, "sparsity": sparsity, "seed": seed, "policy": policy,
                   "start": int(runs.batch_size.iloc[0]), "replicates": len(runs),
                   "reached": int(runs.steps_to_result.notna().sum()),
                   "measured": float(runs.measured_examples.mean())}
            for name, col in QUANTITIES.items():
                row[name], row[f"{name}_low"], row[f"{name}_high"] = geometric(
                    runs[col].astype(float).to_numpy())
            row.update(_verdict(runs, fixed, policy))
            out.append(row)
    return pd.DataFrame(out)


def _verdict(runs: pd.DataFrame, fixed: pd.DataFrame, policy: str) -> dict:
    if policy == BEST_FIXED:
        return {"ratio": 1.0, "ratio_low": math.nan, "ratio_high": math.nan, "verdict": "",
                "gain": math.nan, "claim_ratio": math.nan, "censored": False}
    if runs.steps_to_result.isna().any():
        return {"ratio": math.nan, "ratio_low": math.nan, "ratio_high": math.nan,
                "verdict": "not reached", "gain": math.nan, "claim_ratio": math.nan,
                "censored": False}
    both = runs.index.intersection(fixed.index)
    col = CLAIMS.get(policy, ("", "", "seconds"))[2]
    base = censored(fixed.loc[both])
    ratio = lambda c: (runs.loc[both, QUANTITIES[c]].astype(float) / base[c]).to_numpy()  # noqa: E731
    g, lo, hi = geometric(ratio("seconds"))
    claim = geometric(ratio(col))[0]
    verdict = ("inconclusive" if not (math.isfinite(lo) and math.isfinite(hi))
               else "beats" if hi < 1 else "loses" if lo > 1 else "inconclusive")
    return {"ratio": g, "ratio_low": lo, "ratio_high": hi, "verdict": verdict,
            "gain": 1 - g, "claim_ratio": claim,
            "censored": bool(fixed.loc[both].steps_to_result.isna().any())}


def censored(fixed: pd.DataFrame) -> pd.DataFrame:
    """The best fixed B's steps, examples and modelled seconds per replicate, a replicate that
    missed the goal counted at its whole budget (a lower bound on its time to the goal: the
    ratios are then upper bounds, so a "beats" verdict stays conservative)."""
    b = fixed.batch_size.astype(float)
    per_step = (fixed.t_fixed + fixed.t_example * b).astype(float).fillna(1.0)
    budget = fixed.max_steps.astype(float)
    return pd.DataFrame({
        "steps": fixed.steps_to_result.astype(float).fillna(budget),
        "examples": fixed.examples_to_result.astype(float).fillna(budget * b),
        "seconds": fixed.seconds_to_result.astype(float).fillna(budget * per_step)})


def trajectories(rows: pd.DataFrame) -> pd.DataFrame:
    """Long table of B against examples seen: one row per segment start of each run's schedule
    (``run, sparsity, seed, policy, replicate, examples, batch_size``), plus the run's end (its
    goal, or its budget)."""
    out = []
    for r in rows.itertuples(index=False):
        segs = json.loads(r.schedule)
        end = int(r.steps_to_result) if pd.notna(r.steps_to_result) else int(r.max_steps)
        key = (r.run, r.sparsity, r.seed, r.policy, r.replicate)
        seen, last, b = 0, 0, segs[0][1]
        for start, nb, _ in segs:
            if start > end:
                break
            seen, last, b = seen + (start - last) * b, start, nb
            out.append((*key, seen, b))
        out.append((*key, seen + (end - last) * b, b))
    return pd.DataFrame(out, columns=["run", "sparsity", "seed", "policy", "replicate",
                                      "examples", "batch_size"])
