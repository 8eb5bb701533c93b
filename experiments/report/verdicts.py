"""Every part's verdicts, as the report shows them: the columns of a verdict row
(:data:`VERDICT_COLUMNS`), the claims in words (:func:`claim_words`), the Findings' table
(:func:`findings_table`), the claims' table of Theory vs measurement (:func:`verdict_table`)
and ``verdicts.csv`` (:func:`verdicts_frame`). Each measurement judges its own claims
(:meth:`experiments.measurement.Measurement.report`: the probes', L at Lee et al.'s stage, the
delay axis').

Shared by those that judge the sweep's curves: :func:`level_curves` (one measured curve per
level) and :func:`level_runs` (every run with its steps, those that missed the goal censored
at their budget, :mod:`theory.verdicts.step_ratio`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from theory.models.predict import MeasuredCurve
from theory.verdicts.step_ratio import RUN_COLUMNS

from experiments.report.formatting import fmt_interval, fmt_num

VERDICT_COLUMNS = ["run", "series", "sparsity", "claim", "tier", "value", "low", "high",
                   "allowed_low", "allowed_high", "verdict", "reason", "statistic"]
METAPARAMETER_KEYS = ["lr", "momentum", "decay_steps", "end_factor"]


def level_curves(reached: pd.DataFrame) -> list[MeasuredCurve]:
    """One measured curve per sparsity level of one run's reached groups (every seed's point)."""
    return [MeasuredCurve(s, tuple(c["batch_size"].astype(float)),
                          tuple(c["steps_to_result"].astype(float)))
            for s, c in reached.sort_values(["batch_size", "seed"]).groupby("sparsity")]


def level_runs(groups: pd.DataFrame, trials: pd.DataFrame | None,
               replicates: bool = False) -> pd.DataFrame:
    """Every run of one study's finished groups with its steps or, where it missed the goal, its
    budget (``theory.verdicts.step_ratio.RUN_COLUMNS``). A run is a trial where ``replicates``
    (each trial ran to its own goal, ``stop = "all"``) and a cell's trials share their
    metaparameters; otherwise a group, whose steps are its best trial's (best of N)."""
    done = groups[groups["status"] == "done"]
    rows = []
    for g in done.itertuples(index=False):
        mine = (trials[trials["group_key"] == g.key] if trials is not None and len(trials)
                else None)
        if (replicates and mine is not None and len(mine)
                and len(mine[METAPARAMETER_KEYS].astype(str).drop_duplicates()) == 1):
            rows += [(float(g.sparsity), int(g.batch_size), (int(g.seed), int(t.trial)),
                      float(t.hit_step) if t.status == "reached" else float(g.max_steps),
                      t.status == "reached") for t in mine.itertuples(index=False)]
        else:
            hit = not pd.isna(g.steps_to_result)
            rows.append((float(g.sparsity), int(g.batch_size), (int(g.seed), -1),
                         float(g.steps_to_result) if hit else float(g.max_steps), hit))
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS))


def verdicts_frame(table: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """The verdicts as ``verdicts.csv`` stores them: ``study`` (the run's spec name) first, then
    :data:`VERDICT_COLUMNS`, rows by run, claim, tier and level."""
    study = dict(zip(info["run"], info["study"]))
    out = table.assign(study=[study[r] for r in table["run"]])[["study", *VERDICT_COLUMNS]]
    return out.sort_values(["run", "claim", "tier", "sparsity"], kind="stable").reset_index(drop=True)


def verdict_table(table: pd.DataFrame) -> pd.DataFrame:
    """The verdict table as shown: claim, tier, level, value [interval], allowed range, verdict."""
    return pd.DataFrame({
        "series": table["series"], "claim": table["claim"], "tier": table["tier"],
        "value [90 % interval]": [f"{fmt_num(v, 3)} {fmt_interval(lo, hi)}" for v, lo, hi in
                                  zip(table["value"], table["low"], table["high"])],
        "allowed": [fmt_interval(a, b) if np.isfinite(a) else "–"
                    for a, b in zip(table["allowed_low"], table["allowed_high"])],
        "verdict": table["verdict"]}, columns=["series", "claim", "tier", "value [90 % interval]",
                                               "allowed", "verdict"])


# the claims in words, with the paper each comes from (theory.verdicts.claims, theory.verdicts.lee_stage)
CLAIM_WORDS = {
    "mccandlish": "B_simple at the goal predicts B_crit (McCandlish et al. 2018)",
    "lee_sparsity (S_min ratio)": "L Δ explains the sparse/dense S_min ratio, early probes "
                                  "(Lee et al. 2021)",
    "lee_sparsity (median step ratio)": "L Δ explains the sparse/dense step ratio, early probes "
                                        "(Lee et al. 2021)",
    "shape_slope": "perfect scaling at small batch sizes (Shallue et al. 2019)",
    "shape_plateau": "a plateau at the largest batch size (Shallue et al. 2019)",
    "stich_one_parameter": "one parameter explains both saturations: τ_crit(B) = 1 + B_crit(0) / B "
                           "(Stich et al. 2021)",
    "stich_lr_guideline": "the tuned learning rate follows the delay guideline "
                          "(Stich et al. 2021)",
    "delay_sparsity": "sparsity changes the critical delay as it changes B_crit "
                      "(Lee et al. 2021's question, asked of asynchrony)",
}


def claim_words(claim: str) -> str:
    """A claim id in words; the ones at Lee et al.'s stage carry their steps."""
    if claim in CLAIM_WORDS:
        return CLAIM_WORDS[claim]
    for prefix, words in (("lee_L_rises", "L larger when sparse"),
                          ("lee_L_explains", "L explains the sparse/dense step ratio")):
        if claim.startswith(prefix):
            where = claim[len(prefix):].strip(" ()")
            return f"{words}, at Lee's stage ({where}) (Lee et al. 2021)"
    return claim


def findings_table(table: pd.DataFrame) -> pd.DataFrame:
    """The verdicts as the Findings open: claim (with its series), tier, verdict and the
    numbers (value [90 % interval], and the allowed range)."""
    def numbers(r) -> str:
        allowed = (f"; allowed {fmt_interval(r.allowed_low, r.allowed_high)}"
                   if np.isfinite(r.allowed_low) else "")
        interval = fmt_interval(r.low, r.high) if np.isfinite(r.low) else "(no interval)"
        return f"{fmt_num(r.value, 3)} {interval}{allowed}"

    return pd.DataFrame({
        "claim": [f"{claim_words(r.claim)}: {r.series}" for r in table.itertuples(index=False)],
        "tier": table["tier"], "verdict": table["verdict"],
        "the numbers": [numbers(r) for r in table.itertuples(index=False)]},
        columns=["claim", "tier", "verdict", "the numbers"])
