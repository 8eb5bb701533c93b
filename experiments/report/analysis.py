"""The report's analysis tables: small pure pandas functions of the stacked stored tables.

Every function takes DataFrames with ``run`` and ``series`` columns (:class:`experiments.report.runs.
RunSet`) and returns a DataFrame with a deterministic row order, in the style of Shallue et al.
(2019)'s released analysis code (google-research ``batch_science``). Per (run, sparsity, batch
size), over the replicate seeds stored:

- steps-to-result = the median over the seeds whose group reached the goal (Shallue et al. 2019:
  a batch size where no trial met the goal has no point on the curve);
- best metaparameters = the best trial of the seed with the fewest steps (ties: lowest seed).

Each series with at least three batch sizes on its curve is fitted with
S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018, :func:`theory.fit_scaling`, over all
seed-level points with bootstrap intervals); its regimes follow ``theory.models.scaling``. The fits are
computed once (:func:`fit_series`) and passed on to the theory view and the summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from theory.errors import TheoryError
from theory.models.scaling import PERFECT_SLOPE, ScalingFit, batch_at_slope, fit_scaling

from experiments.spec.search import Dimension, at_edge

# Bootstrap replicates of every scaling fit (fixed seed: the report is deterministic).
N_BOOT = 1000
FIT_LEVEL = 0.9
# Share of a search dimension's range (on its own scale) counted as its edge (Shallue et al. 2019).
EDGE_FRACTION = 0.1
METAPARAMETERS = ("lr", "momentum", "effective_lr", "decay_steps", "end_factor")
POINT_COLUMNS = ["run", "series", "sparsity", "batch_size", "seeds", "seeds_reached", "status",
                 "steps", "max_steps", "n_trials", "n_reached", "n_diverged", "trial_steps",
                 "wall_time", *METAPARAMETERS]


def ordered(df: pd.DataFrame, order: Sequence[str]) -> pd.DataFrame:
    """Rows sorted by series in report ``order``, then by batch size."""
    rank = {s: i for i, s in enumerate(order)}
    return (df.assign(_rank=df["series"].map(rank)).sort_values(["_rank", "batch_size"], kind="stable")
            .drop(columns="_rank").reset_index(drop=True))


def reached_groups(groups: pd.DataFrame) -> pd.DataFrame:
    """The groups that finished and reached the goal (the points of the measured curves)."""
    return groups[(groups["status"] == "done") & groups["steps_to_result"].notna()]


# ---------------------------------------------------------------------------------------------
# measured curves


def points_table(groups: pd.DataFrame, trials: pd.DataFrame, planned: pd.DataFrame,
                 order: Sequence[str]) -> pd.DataFrame:
    """One row per planned or stored (run, sparsity, batch size): steps-to-result (median over
    reaching seeds), best metaparameters, trials reached / diverged, cost, and ``status``
    ('reached' | 'not reached' | 'failed' | 'missing': planned, no group stored)."""
    rows = []
    for (run, series, sparsity, b), g in groups.groupby(
            ["run", "series", "sparsity", "batch_size"], sort=False):
        done = g[g["status"] == "done"]
        reached = done.dropna(subset=["steps_to_result"]).sort_values(["steps_to_result", "seed"])
        row = {"run": run, "series": series, "sparsity": float(sparsity), "batch_size": int(b),
               "seeds": len(g), "seeds_reached": len(reached),
               "status": "reached" if len(reached) else ("not reached" if len(done) else "failed"),
               "steps": float(reached["steps_to_result"].median()) if len(reached) else math.nan,
               "max_steps": int(g["max_steps"].max()),
               "n_trials": int(done["n_trials"].sum()), "n_reached": int(done["n_reached"].sum()),
               "n_diverged": int(done["n_diverged"].sum()),
               "trial_steps": int(g["trial_steps"].sum()), "wall_time": float(g["wall_time"].sum())}
        best = {k: math.nan for k in METAPARAMETERS}
        if len(reached) and not pd.isna(reached["best_trial"].iloc[0]):
            top = reached.iloc[0]
            t = trials[(trials["run"] == run) & (trials["group_key"] == top["key"])
                       & (trials["trial"] == int(top["best_trial"]))]
            if len(t):
                best = {k: float(t[k].iloc[0]) if not pd.isna(t[k].iloc[0]) else math.nan
                        for k in METAPARAMETERS}
        rows.append(row | best)
    stored = {(row["run"], row["sparsity"], row["batch_size"]) for row in rows}
    cells = planned[["run", "series", "sparsity", "batch_size"]].drop_duplicates()
    rows += [{"run": run, "series": series, "sparsity": s, "batch_size": b, "seeds": 0,
              "seeds_reached": 0, "status": "missing", "steps": math.nan, "max_steps": math.nan,
              "n_trials": 0, "n_reached": 0, "n_diverged": 0, "trial_steps": 0, "wall_time": 0.0,
              **{k: math.nan for k in METAPARAMETERS}}
             for run, series, s, b in cells.itertuples(index=False) if (run, s, b) not in stored]
    return ordered(pd.DataFrame(rows, columns=POINT_COLUMNS), order)


def search_edges(points: pd.DataFrame, spaces: Mapping[str, Mapping[str, Dimension]]
                 ) -> pd.DataFrame:
    """For each point's best lr and momentum: True where the value lies in the outer 10 % of its
    run's searched range (``spaces``: run -> search space; a key left out was not searched) on
    the range's own scale (``experiments.spec.search.at_edge``), a sign that the optimum may lie
    outside the search space (Shallue et al. 2019)."""
    out = pd.DataFrame(index=points.index)
    for key in ("lr", "momentum"):
        flags = []
        for run, value in zip(points["run"], points[key]):
            dim = spaces[run].get(key)
            flags.append(bool(dim is not None and not math.isnan(value)
                              and at_edge(value, dim, EDGE_FRACTION)))
        out[f"{key}_at_edge"] = flags
    return out


def step_ratios(points: pd.DataFrame, order: Sequence[str],
                dense_of: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Measured steps of every sparse series over the dense series it is measured against, at
    each batch size where both reached the goal (Lee et al. 2021's comparison). ``dense_of``:
    run -> the run whose dense series that is (default: the run itself;
    :meth:`experiments.report.runs.RunSet.dense_runs`); ``dense_series`` names it."""
    rows = []
    reached = points[points["status"] == "reached"]
    for run in dict.fromkeys(points["run"]):
        mine = reached[reached["run"] == run]
        ref = (dense_of or {}).get(run, run)
        dense = reached[(reached["run"] == ref) & (reached["sparsity"] == 0.0)]
        steps = dense.set_index("batch_size")["steps"]
        for (series, sparsity), g in mine[mine["sparsity"] > 0].groupby(["series", "sparsity"], sort=False):
            common = g[g["batch_size"].isin(steps.index)]
            rows += [{"run": run, "series": series, "sparsity": sparsity, "batch_size": int(b),
                      "ratio": float(s / steps[b]), "dense_series": dense["series"].iloc[0]}
                     for b, s in zip(common["batch_size"], common["steps"])]
    return ordered(pd.DataFrame(rows, columns=["run", "series", "sparsity", "batch_size", "ratio",
                                               "dense_series"]), order)


# ---------------------------------------------------------------------------------------------
# fits


@dataclass(frozen=True)
class Fits:
    """Scaling fits per series: ``table`` (one row per series, fitted or with the reason it
    could not be) and ``objects`` series -> ScalingFit (regimes via ``ScalingFit.regime``)."""

    table: pd.DataFrame
    objects: dict[str, ScalingFit]


FIT_COLUMNS = ["series", "points", "s_min", "s_min_lo", "s_min_hi", "b_crit", "b_crit_lo",
               "b_crit_hi", "perfect_until", "largest_useful_batch", "residual_sd", "note"]


def series_curve(groups: pd.DataFrame, series: str) -> pd.DataFrame:
    """The seed-level points of one series' measured curve, by batch size then seed."""
    g = reached_groups(groups)
    return g[g["series"] == series].sort_values(["batch_size", "seed"])


def fit_series(groups: pd.DataFrame, order: Sequence[str]) -> Fits:
    """Fit S(B) = S_min (1 + B_crit / B) to every series' seed-level points (groups that reached
    the goal), with bootstrap intervals over seeds (several seeds) or residuals (one)."""
    rows, objects = [], {}
    for series in order:
        g = series_curve(groups, series)
        row = {"series": series, "points": int(g["batch_size"].nunique())}
        try:
            fit = fit_scaling(g["batch_size"].to_numpy(float), g["steps_to_result"].to_numpy(float),
                              seeds=g["seed"].to_numpy() if g["seed"].nunique() > 1 else None,
                              n_boot=N_BOOT, level=FIT_LEVEL, seed=0)
        except TheoryError as exc:
            rows.append(row | {"note": f"not fitted: {exc}"})
            continue
        objects[series] = fit
        iv = fit.intervals
        row |= {"s_min": fit.s_min, "s_min_lo": iv["s_min"][0], "s_min_hi": iv["s_min"][1],
                "b_crit": fit.b_crit, "b_crit_lo": iv["b_crit"][0], "b_crit_hi": iv["b_crit"][1],
                "perfect_until": perfect_scaling_until(fit.b_crit),
                "largest_useful_batch": fit.largest_useful_batch,
                "residual_sd": fit.residual_sd,
                "note": ("B_crit at the edge of what the batch sizes resolve: a bound"
                         if fit.b_crit_at_bound else "")}
        rows.append(row)
    return Fits(pd.DataFrame(rows, columns=FIT_COLUMNS), objects)


def perfect_scaling_until(b_crit: float) -> float:
    """Batch size where the fitted curve's slope -B_crit / (B + B_crit) reaches the perfect-scaling
    threshold of ``theory.models.scaling`` (B_crit / 4 for a slope of -0.8)."""
    return batch_at_slope(b_crit, PERFECT_SLOPE)


# ---------------------------------------------------------------------------------------------
# what is missing and what it cost


def missing_table(groups: pd.DataFrame, probes: pd.DataFrame, planned: pd.DataFrame,
                  runs: Sequence[str]) -> pd.DataFrame:
    """Planned groups not in the store ('missing'), stored groups that failed ('failed', with
    the last line of their error) and, for runs that plan probes, planned sparsity levels without
    probes ('no probes'); rows by run in ``runs`` order, then state, sparsity, B, seed."""
    rows = []
    for run in runs:
        mine, plan = groups[groups["run"] == run], planned[planned["run"] == run]
        stored = set(zip(mine["sparsity"].astype(float), mine["batch_size"].astype(int),
                         mine["seed"].astype(int)))
        for s, b, seed in plan[["sparsity", "batch_size", "seed"]].itertuples(index=False):
            if (s, b, seed) not in stored:
                rows.append({"run": run, "sparsity": s, "batch_size": b, "seed": seed,
                             "state": "missing", "detail": "not in the store (not run yet or interrupted)"})
        for g in mine[mine["status"] == "failed"].itertuples(index=False):
            detail = (str(g.error).strip().splitlines() or ["failed"])[-1][:200] if g.error else "failed"
            rows.append({"run": run, "sparsity": float(g.sparsity), "batch_size": int(g.batch_size),
                         "seed": int(g.seed), "state": "failed", "detail": detail})
        if plan["probes"].any():
            probed = set(probes.loc[probes["run"] == run, "sparsity"].astype(float))
            for s in sorted(set(plan["sparsity"].astype(float)) - probed):
                rows.append({"run": run, "sparsity": s, "batch_size": None, "seed": None,
                             "state": "no probes", "detail": "noise and smoothness not measured"})
    df = pd.DataFrame(rows, columns=["run", "sparsity", "batch_size", "seed", "state", "detail"])
    rank = {r: i for i, r in enumerate(runs)}
    return (df.assign(_r=df["run"].map(rank)).sort_values(["_r", "state", "sparsity", "batch_size", "seed"],
                                                         kind="stable", na_position="last")
            .drop(columns="_r").reset_index(drop=True))


def cost_table(groups: pd.DataFrame, study: pd.DataFrame, planned: pd.DataFrame,
               missing: pd.DataFrame) -> pd.DataFrame:
    """Per run (``study`` rows, in order): groups planned / done / failed / missing, trials,
    trial-steps (updates summed over trials), wall time summed over groups, the versions
    that produced the store, and the device(s) and precision the groups trained on."""
    rows = []
    for s in study.itertuples(index=False):
        g = groups[groups["run"] == s.run]
        m = missing[missing["run"] == s.run]
        rows.append({"run": s.run, "created": s.created,
                     "planned": int((planned["run"] == s.run).sum()),
                     "done": int((g["status"] == "done").sum()),
                     "failed": int((g["status"] == "failed").sum()),
                     "missing": int((m["state"] == "missing").sum()),
                     "trials": int(g["n_trials"].sum()), "trial_steps": int(g["trial_steps"].sum()),
                     "wall_time_s": float(g["wall_time"].sum()),
                     "sparsescale": s.lib_version, "torch": s.torch_version,
                     "python": s.python_version, "device": devices(g),
                     "precision": distinct(g, "precision")})
    return pd.DataFrame(rows)


def distinct(groups: pd.DataFrame, column: str) -> str:
    """The distinct values of ``column`` among ``groups`` (comma-separated), or "not recorded"
    (a store written before the column existed, or no group stored)."""
    values = sorted({str(v) for v in groups.get(column, pd.Series(dtype=object)) if pd.notna(v)})
    return ", ".join(values) if values else "not recorded"


def devices(groups: pd.DataFrame) -> str:
    """Where the groups trained: each distinct device as "name (device[, CUDA c, driver d])",
    from the store's device columns."""
    if "device" not in groups:
        return "not recorded"
    seen = []
    for r in groups[groups["device"].notna()].itertuples(index=False):
        cuda = (f", CUDA {r.cuda_version}, driver {r.driver_version}"
                if pd.notna(r.cuda_version) else "")
        name = r.device_name if pd.notna(r.device_name) else "unknown"
        label = f"{name} ({r.device}{cuda})"
        if label not in seen:
            seen.append(label)
    return "; ".join(seen) if seen else "not recorded"


# ---------------------------------------------------------------------------------------------
# summary.csv


def summary_frame(points: pd.DataFrame, edges: pd.DataFrame, fits: Fits, predicted: pd.DataFrame,
                  ratios: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """One row per planned or stored (run, sparsity, batch size): measurement, best
    metaparameters, the fit (regime, fitted steps, S_min, B_crit), the measured step ratio to
    dense and the theory's predicted steps and step ratio (``predicted``: series, batch_size,
    steps, ratio); ``info`` gives each run's study name and optimizer."""
    by_run = info.set_index("run")
    df = points.join(edges).copy()
    df.insert(0, "study", [by_run.loc[r, "study"] for r in df["run"]])
    df.insert(1, "optimizer", [by_run.loc[r, "optimizer"] for r in df["run"]])
    df = df.rename(columns={"steps": "steps_to_result"})
    ft = fits.table.set_index("series")
    fitted = [fits.objects.get(s) for s in df["series"]]
    df["regime"] = [fit.regime(b)[0] if fit else "" for fit, b in zip(fitted, df["batch_size"])]
    df["fit_steps"] = [float(fit.predict(b)) if fit else math.nan
                       for fit, b in zip(fitted, df["batch_size"])]
    df["fit_s_min"] = [ft.loc[s, "s_min"] if s in ft.index else math.nan for s in df["series"]]
    df["fit_b_crit"] = [ft.loc[s, "b_crit"] if s in ft.index else math.nan for s in df["series"]]
    pred = predicted.set_index(["series", "batch_size"])
    keys = list(zip(df["series"], df["batch_size"].astype(float)))
    df["predicted_steps"] = [pred["steps"].get(k, math.nan) for k in keys]
    ratio = ratios.set_index(["series", "batch_size"])["ratio"]
    df["ratio_to_dense"] = [ratio.get((s, int(b)), math.nan) for s, b in keys]
    df.loc[(df["sparsity"] == 0.0) & (df["status"] == "reached"), "ratio_to_dense"] = 1.0
    df["predicted_ratio_to_dense"] = [pred["ratio"].get(k, math.nan) for k in keys]
    return df.drop(columns=["wall_time"])
