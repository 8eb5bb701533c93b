"""The numbers behind a study report, computed only from stored results.

Everything here reads :class:`experiments.store.Results` (never a study's in-memory state) and
returns pandas DataFrames with deterministic row order, so the same store always gives the same
report. Several run folders can be combined (e.g. an SGD and a momentum study): each run gets a
label "study (optimizer)" and every curve is a *series* = (run, sparsity level).

Per (run, sparsity, batch size) the report uses, over the replicate seeds stored:

- steps-to-result = the median over the seeds whose group reached the goal (Shallue et al. 2019:
  a batch size where no trial met the goal has no point on the curve);
- best metaparameters = the best trial of the seed with the fewest steps (ties: lowest seed).

Each series with at least three batch sizes on its curve is fitted with
S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018, :func:`theory.fit_scaling`, over all
seed-level points with bootstrap intervals); its regimes follow ``theory.scaling``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from theory import bounds, nqm
from theory.errors import TheoryError
from theory.predict import MeasuredCurve, ProbeSummary, predict_levels
from theory.scaling import MAXIMAL_SLOPE, PERFECT_SLOPE, batch_at_slope, fit_scaling

from .search import at_edge
from .spec import Dimension
from .store import Results, load_results
from training.errors import SparsescaleError


class ReportError(SparsescaleError):
    """The report cannot be written as asked: names the argument and what is allowed."""


# A prediction "held" when it is within this factor of the measurement (either direction).
HELD_FACTOR = 1.5
# Bootstrap replicates of every scaling fit (fixed seed: the report is deterministic).
N_BOOT = 1000
FIT_LEVEL = 0.9
# Bootstrap replicates of the fits inside the prediction (their intervals are not reported).
PREDICTION_BOOT = 50
# Share of a search dimension's range (on its own scale) counted as its edge (Shallue et al. 2019).
EDGE_FRACTION = 0.1
METAPARAMETERS = ("lr", "momentum", "effective_lr", "decay_steps", "end_factor")


@dataclass(frozen=True)
class Run:
    """One run folder's stored results and the label its series carry in a combined report."""

    results: Results
    label: str

    @property
    def spec(self) -> dict:
        return self.results.spec

    @property
    def name(self) -> str:
        return str(self.spec.get("name") or self.results.study["name"].iloc[0])

    @property
    def optimizer(self) -> str:
        return str(self.spec["optimizer"])


def load_runs(run_dirs: list[str | Path]) -> tuple[Run, ...]:
    """Load every run folder (``experiments.load_results``) and label it "study (optimizer)";
    a repeated label gets " #2", " #3", ... in the order given."""
    if isinstance(run_dirs, (str, Path)) or not run_dirs:
        raise ReportError(f"run_dirs must be a non-empty list of run folders, got {run_dirs!r}")
    results = [load_results(d) for d in run_dirs]
    for d, r in zip(run_dirs, results):
        if r.study.empty:
            raise ReportError(f"run_dirs: {d} holds a store without a study row; run a study into it")
    runs, seen = [], {}
    for r in results:
        name, opt = r.spec["name"], r.spec["optimizer"]
        # a sub-study of a multi-optimizer spec is named "<study>-<optimizer>"; a pruning series
        # (experiments.series) is labelled by the series
        base = f"{r.spec.get('series') or name.removesuffix('-' + opt)} ({opt})"
        seen[base] = seen.get(base, 0) + 1
        runs.append(Run(r, base if seen[base] == 1 else f"{base} #{seen[base]}"))
    return tuple(runs)


def sparsity_label(sparsity: float) -> str:
    return "dense" if sparsity == 0 else f"{fmt_pct(sparsity)} sparse"


def series_label(run: Run, sparsity: float, combined: bool) -> str:
    return f"{run.label}, {sparsity_label(sparsity)}" if combined else sparsity_label(sparsity)


# ---------------------------------------------------------------------------------------------
# formatting shared by the tables, the findings text and the files (fixed, locale-free)


def fmt_num(x, digits: int = 4) -> str:
    """Fixed formatting: integers as integers, other numbers to ``digits`` significant digits,
    missing values as an en dash."""
    if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA:
        return "–"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)) or (float(x).is_integer() and abs(x) < 1e15):
        return f"{int(x)}"
    if 10**digits <= abs(x) < 1e15:
        return f"{x:.0f}"       # 1788 rather than 1.79e+03
    return f"{float(x):.{digits}g}"


def fmt_pct(fraction: float) -> str:
    return f"{100 * fraction:g} %"


def fmt_interval(lo: float, hi: float) -> str:
    return f"[{fmt_num(lo, 3)}, {fmt_num(hi, 3)}]"


# ---------------------------------------------------------------------------------------------
# measured curves


def stacked(runs: tuple[Run, ...], table: str) -> pd.DataFrame:
    """One table of every run, with ``run`` (label) and ``series`` columns."""
    combined = len(runs) > 1
    frames = []
    for r in runs:
        df = getattr(r.results, table).copy()
        df.insert(0, "run", r.label)
        df.insert(1, "series", [series_label(r, s, combined) for s in df["sparsity"]])
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def series_order(runs: tuple[Run, ...]) -> list[str]:
    """Series in report order: runs as given, sparsity ascending (planned or stored)."""
    combined = len(runs) > 1
    out = []
    for r in runs:
        levels = sorted(set(r.spec.get("sparsities", [])) | set(r.results.groups["sparsity"]))
        out += [series_label(r, s, combined) for s in levels]
    return out


def points_table(runs: tuple[Run, ...]) -> pd.DataFrame:
    """One row per planned or stored (run, sparsity, batch size): steps-to-result (median over
    reaching seeds), best metaparameters, trials reached / diverged, cost, and ``status``
    ('reached' | 'not reached' | 'failed' | 'missing': planned, no group stored)."""
    groups, trials = stacked(runs, "groups"), stacked(runs, "trials")
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
    combined = len(runs) > 1
    for r in runs:
        stored = {(row["sparsity"], row["batch_size"]) for row in rows if row["run"] == r.label}
        planned = planned_groups(r)[["sparsity", "batch_size"]].drop_duplicates()
        rows += [{"run": r.label, "series": series_label(r, s, combined), "sparsity": s, "batch_size": b,
                  "seeds": 0, "seeds_reached": 0, "status": "missing", "steps": math.nan,
                  "max_steps": math.nan, "n_trials": 0, "n_reached": 0, "n_diverged": 0,
                  "trial_steps": 0, "wall_time": 0.0, **{k: math.nan for k in METAPARAMETERS}}
                 for s, b in planned.itertuples(index=False) if (s, b) not in stored]
    cols = ["run", "series", "sparsity", "batch_size", "seeds", "seeds_reached", "status", "steps",
            "max_steps", "n_trials", "n_reached", "n_diverged", "trial_steps", "wall_time",
            *METAPARAMETERS]
    return _ordered(pd.DataFrame(rows, columns=cols), runs)


def _ordered(df: pd.DataFrame, runs: tuple[Run, ...]) -> pd.DataFrame:
    """Sort rows by series in report order, then by batch size."""
    rank = {s: i for i, s in enumerate(series_order(runs))}
    return (df.assign(_rank=df["series"].map(rank)).sort_values(["_rank", "batch_size"], kind="stable")
            .drop(columns="_rank").reset_index(drop=True))


def search_edges(runs: tuple[Run, ...], points: pd.DataFrame) -> pd.DataFrame:
    """For each point's best metaparameters: True where the value lies in the outer 10 % of its
    searched range on the range's own scale (``experiments.search.at_edge``), a sign that the
    optimum may lie outside the search space (Shallue et al. 2019)."""
    spaces = {r.label: r.spec.get("search", {}) for r in runs}
    # plain SGD records momentum 0 whatever the search space says: it was not searched
    sgd = {r.label for r in runs if r.optimizer == "sgd"}
    out = pd.DataFrame(index=points.index)
    for key in ("lr", "momentum"):
        flags = []
        for run, value in zip(points["run"], points[key]):
            raw = None if key == "momentum" and run in sgd else spaces[run].get(key)
            dim = Dimension(**raw) if isinstance(raw, dict) else None
            flags.append(bool(dim is not None and not math.isnan(value)
                              and at_edge(value, dim, EDGE_FRACTION)))
        out[f"{key}_at_edge"] = flags
    return out


# ---------------------------------------------------------------------------------------------
# fits


@dataclass(frozen=True)
class Fits:
    """Scaling fits per series: ``table`` (one row per series, fitted or with the reason it
    could not be) and ``objects`` series -> ScalingFit (regimes via ``ScalingFit.regime``)."""

    table: pd.DataFrame
    objects: dict


def fit_series(runs: tuple[Run, ...]) -> Fits:
    """Fit S(B) = S_min (1 + B_crit / B) to every series' seed-level points (groups that reached
    the goal), with bootstrap intervals over seeds (several seeds) or residuals (one)."""
    groups = stacked(runs, "groups")
    groups = groups[(groups["status"] == "done") & groups["steps_to_result"].notna()]
    rows, objects = [], {}
    for series in series_order(runs):
        g = groups[groups["series"] == series].sort_values(["batch_size", "seed"])
        row = {"series": series, "points": int(g["batch_size"].nunique())}
        try:
            fit = fit_scaling(g["batch_size"].to_numpy(float), g["steps_to_result"].to_numpy(float),
                              seeds=g["seed"].to_numpy() if g["seed"].nunique() > 1 else None,
                              n_boot=N_BOOT, level=FIT_LEVEL, rng=0)
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
    cols = ["series", "points", "s_min", "s_min_lo", "s_min_hi", "b_crit", "b_crit_lo",
            "b_crit_hi", "perfect_until", "largest_useful_batch", "residual_sd", "note"]
    return Fits(pd.DataFrame(rows, columns=cols), objects)


def perfect_scaling_until(b_crit: float) -> float:
    """Batch size where the fitted curve's slope -B_crit / (B + B_crit) reaches the perfect-scaling
    threshold of ``theory.scaling`` (B_crit / 4 for a slope of -0.8)."""
    return batch_at_slope(b_crit, PERFECT_SLOPE)


# ---------------------------------------------------------------------------------------------
# sparse beside dense


# Spec entries that make two runs' dense networks the same experiment.
DENSE_KEYS = ("workload", "optimizer", "goal", "batch_sizes", "search", "trials", "budget", "eval",
              "seeds")


def dense_run(run: Run, runs: tuple[Run, ...]) -> Run:
    """The run whose dense series ``run`` is measured against: itself if it plans a dense level,
    else the first run that does with the same ``DENSE_KEYS`` (a pruning series other than a
    study's first trains no dense level of its own, ``experiments.series``)."""
    if 0.0 in run.spec.get("sparsities", []):
        return run
    same = [r for r in runs if 0.0 in r.spec.get("sparsities", [])
            and all(r.spec.get(k) == run.spec.get(k) for k in DENSE_KEYS)]
    return same[0] if same else run


def step_ratios(runs: tuple[Run, ...], points: pd.DataFrame) -> pd.DataFrame:
    """Measured steps of every sparse series over its run's dense series (:func:`dense_run`), at
    each batch size where both reached the goal (Lee et al. 2021's comparison)."""
    rows = []
    reached = points[points["status"] == "reached"]
    combined = len(runs) > 1
    for r in runs:
        mine = reached[reached["run"] == r.label]
        ref = dense_run(r, runs)
        dense = reached[(reached["run"] == ref.label) & (reached["sparsity"] == 0.0)]
        dense = dense.set_index("batch_size")["steps"]
        for (series, sparsity), g in mine[mine["sparsity"] > 0].groupby(["series", "sparsity"], sort=False):
            common = g[g["batch_size"].isin(dense.index)]
            rows += [{"run": r.label, "series": series, "sparsity": sparsity, "batch_size": int(b),
                      "ratio": float(s / dense[b]), "dense_series": series_label(ref, 0.0, combined)}
                     for b, s in zip(common["batch_size"], common["steps"])]
    return _ordered(pd.DataFrame(rows, columns=["run", "series", "sparsity", "batch_size", "ratio",
                                                "dense_series"]), runs)


# ---------------------------------------------------------------------------------------------
# what is missing and what it cost


def planned_groups(run: Run) -> pd.DataFrame:
    """Every (sparsity, batch size, seed) the run's spec plans."""
    spec = run.spec
    rows = [(float(s), int(b), int(seed)) for s in spec["sparsities"] for b in spec["batch_sizes"]
            for seed in spec["seeds"]]
    return pd.DataFrame(rows, columns=["sparsity", "batch_size", "seed"])


def missing_table(runs: tuple[Run, ...]) -> pd.DataFrame:
    """Planned groups not in the store ('missing'), stored groups that failed ('failed', with
    the first line of their error) and planned sparsity levels without probes."""
    rows = []
    for r in runs:
        groups = r.results.groups
        stored = set(zip(groups["sparsity"].astype(float), groups["batch_size"].astype(int),
                         groups["seed"].astype(int)))
        for s, b, seed in planned_groups(r).itertuples(index=False):
            if (s, b, seed) not in stored:
                rows.append({"run": r.label, "sparsity": s, "batch_size": b, "seed": seed,
                             "state": "missing", "detail": "not in the store (not run yet or interrupted)"})
        for g in groups[groups["status"] == "failed"].itertuples(index=False):
            detail = (str(g.error).strip().splitlines() or ["failed"])[-1][:200] if g.error else "failed"
            rows.append({"run": r.label, "sparsity": float(g.sparsity), "batch_size": int(g.batch_size),
                         "seed": int(g.seed), "state": "failed", "detail": detail})
        if r.spec.get("probes", {}).get("enabled", False):
            probed = set(r.results.probes["sparsity"].astype(float))
            for s in sorted(set(map(float, r.spec["sparsities"])) - probed):
                rows.append({"run": r.label, "sparsity": s, "batch_size": None, "seed": None,
                             "state": "no probes", "detail": "noise and smoothness not measured"})
    df = pd.DataFrame(rows, columns=["run", "sparsity", "batch_size", "seed", "state", "detail"])
    order = {r.label: i for i, r in enumerate(runs)}
    return (df.assign(_r=df["run"].map(order)).sort_values(["_r", "state", "sparsity", "batch_size", "seed"],
                                                          kind="stable", na_position="last")
            .drop(columns="_r").reset_index(drop=True))


def cost_table(runs: tuple[Run, ...], missing: pd.DataFrame) -> pd.DataFrame:
    """Per run: groups planned / done / failed / missing, trials, trial-steps (updates summed over
    trials), wall time summed over groups, and the versions that produced the store."""
    rows = []
    for r in runs:
        g, study = r.results.groups, r.results.study.iloc[0]
        m = missing[missing["run"] == r.label]
        rows.append({"run": r.label, "created": study["created"],
                     "planned": len(planned_groups(r)), "done": int((g["status"] == "done").sum()),
                     "failed": int((g["status"] == "failed").sum()),
                     "missing": int((m["state"] == "missing").sum()),
                     "trials": int(g["n_trials"].sum()), "trial_steps": int(g["trial_steps"].sum()),
                     "wall_time_s": float(g["wall_time"].sum()),
                     "sparsescale": study["lib_version"], "torch": study["torch_version"],
                     "python": study["python_version"]})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# the generated "Findings" paragraph


def held(relative_error: float) -> bool:
    """A prediction held when predicted / measured lies within [1 / HELD_FACTOR, HELD_FACTOR]."""
    return bool(abs(math.log1p(relative_error)) <= math.log(HELD_FACTOR)) if relative_error > -1 else False


def _scaling_sentence(name: str, f: pd.Series, reached: pd.Series) -> str:
    """Where perfect scaling ends for one fitted series (or that the measured range does not show
    it, when the fit puts B_crit at the edge of what the batch sizes resolve)."""
    if f["note"] and f["b_crit"] > reached.max():
        return (f"{name}: perfect scaling did not end within the measured batch sizes (up to "
                f"B = {int(reached.max())}); B_crit is only bounded below.")
    if f["note"] and f["b_crit"] < reached.min():
        return (f"{name}: no perfect scaling at the measured batch sizes (from B = {int(reached.min())}): "
                f"steps barely fall with B (S_min = {fmt_num(f['s_min'], 3)} steps).")
    perfect = reached[reached <= f["perfect_until"]]
    last = (f"the largest measured batch size in that regime is B = {int(perfect.max())}" if len(perfect)
            else "no measured batch size lies in that regime")
    return (f"{name}: perfect scaling ends near B ≈ {fmt_num(f['perfect_until'], 3)} "
            f"(B_crit / {perfect_scaling_until(1.0) ** -1:g} with fitted B_crit = {fmt_num(f['b_crit'], 3)}, "
            f"{int(FIT_LEVEL * 100)} % interval {fmt_interval(f['b_crit_lo'], f['b_crit_hi'])}; "
            f"{last}); beyond B ≈ {fmt_num(f['largest_useful_batch'], 3)} doubling the batch "
            f"saves under {100 * (1 - 2 ** MAXIMAL_SLOPE):.0f} % of the steps "
            f"(S_min = {fmt_num(f['s_min'], 3)} steps).")


def findings_text(runs: tuple[Run, ...], points: pd.DataFrame, fits: Fits, ratios: pd.DataFrame,
                  predictions: pd.DataFrame, missing: pd.DataFrame) -> list[str]:
    """Sentences stating, from the numbers: where perfect scaling ends per series, how many more
    steps sparsity costs, whether the theory's predictions held, and what is missing."""
    out = []
    ft = fits.table.set_index("series")
    for name in series_order(runs):
        p = points[(points["series"] == name) & (points["status"] == "reached")]
        if name not in ft.index or pd.isna(ft.loc[name, "b_crit"]):
            reason = ft.loc[name, "note"] if name in ft.index else "no groups stored"
            out.append(f"{name}: {len(p)} batch size(s) reached the goal; no scaling fit ({reason}).")
            continue
        out.append(_scaling_sentence(name, ft.loc[name], p["batch_size"]))
    for (run, series), r in ratios.groupby(["run", "series"], sort=False):
        dense = r["dense_series"].iloc[0]
        lo, hi = r.loc[r["ratio"].idxmin()], r.loc[r["ratio"].idxmax()]
        more = r["ratio"].median()
        out.append(f"{series} needs {fmt_num(more, 3)}× the steps of {dense} (median over "
                   f"{len(r)} batch sizes where both reached the goal; from {fmt_num(lo['ratio'], 3)}× "
                   f"at B = {int(lo['batch_size'])} to {fmt_num(hi['ratio'], 3)}× "
                   f"at B = {int(hi['batch_size'])}).")
    scored = predictions.dropna(subset=["relative_error"])
    for series, rows in scored.groupby("series", sort=False):
        parts = [f"{r.quantity} predicted {fmt_num(r.predicted, 3)} vs measured {fmt_num(r.measured, 3)} "
                 f"({r.relative_error:+.0%}, {'held' if held(r.relative_error) else 'did not hold'})"
                 for r in rows.itertuples(index=False)]
        out.append(f"Theory for {series}: " + "; ".join(parts) + ".")
    if len(scored):
        out.append(f"(A prediction held when within a factor {HELD_FACTOR:g} of the measurement: "
                   f"{sum(held(e) for e in scored['relative_error'])} of {len(scored)} did.)")
    if len(runs) > 1:
        dense = [(r.label, ft.loc[series_label(r, 0.0, True), "b_crit"]) for r in runs
                 if series_label(r, 0.0, True) in ft.index]
        dense = [(label, b) for label, b in dense if not pd.isna(b)]
        if len(dense) > 1:
            base_label, base = dense[0]
            out += [f"Dense B_crit of {label} is {fmt_num(b / base, 3)}× that of {base_label}."
                    for label, b in dense[1:]]
    counts = missing["state"].value_counts()
    if len(missing):
        words = {"missing": "groups missing", "failed": "failed", "no probes": "sparsity levels without probes"}
        parts = [f"{int(counts[s])} {w}" for s, w in words.items() if s in counts]
        out.append("Incomplete: " + ", ".join(parts) + " (listed under Missing and failed); "
                   "the numbers above use only what the store holds.")
    return out


# ---------------------------------------------------------------------------------------------
# theory beside measurement


@dataclass(frozen=True)
class TheoryPart:
    """What theory says about the runs, beside the measurement.

    ``table``: long form (series, quantity, predicted, measured, relative_error);
    ``curves``: predicted steps and step ratio to dense (series, batch_size, steps, ratio) at the
    measured batch sizes (on the dense level calibrated, not predicted);
    ``statement``: in words, per run, what was fitted and what was predicted; ``inputs``: the probe values
    used (:func:`probe_summary`); ``formulas``: (what, LaTeX, Unicode);
    ``nqm``: noisy-quadratic-model steps (optimizer, batch_size, steps) with its caption and note.
    """

    table: pd.DataFrame
    curves: pd.DataFrame
    statement: list[str]
    inputs: pd.DataFrame
    formulas: list
    nqm: pd.DataFrame
    nqm_caption: str
    nqm_note: str


# The noisy quadratic model drawn beside the measurement (Zhang et al. 2019's setup, shrunk so the
# report stays fast: d coordinates, coarse lr / momentum grids, target a fixed share of the
# initial loss). Its batch axis is in the model's own units.
NQM_DIM = 200
NQM_TARGET_SHARE = 0.01
NQM_BATCH_SIZES = 2.0 ** np.arange(0, 15)
NQM_SGD_LRS = np.logspace(-4, 0.5, 72)
NQM_MOMENTUM_LRS = np.logspace(-4, 1, 24)
NQM_MOMENTA = 1.0 - np.logspace(-2.5, 0, 9)[:-1]
NQM_MAX_STEPS = 10**6
# the NQM has heavy-ball momentum only; Nesterov studies are compared with it
NQM_OPTIMIZER = {"sgd": "sgd", "momentum": "momentum", "nesterov": "momentum"}


def nqm_curves(optimizers: list[str]) -> pd.DataFrame:
    """Steps to target of the noisy quadratic model (h_i = 1/i, C = H, x_0 ~ N(0, I)) per batch
    size, best lr (and momentum) on a grid, for each NQM optimizer the study's optimizers map to;
    columns optimizer, batch_size, steps, best_lr, best_momentum."""
    return _nqm_curves(tuple(sorted({NQM_OPTIMIZER[o] for o in optimizers}))).copy()


@cache
def _nqm_curves(nqm_optimizers: tuple[str, ...]) -> pd.DataFrame:
    # the model does not depend on the store: computed once per process
    spectrum = nqm.paper_spectrum(NQM_DIM)
    target = NQM_TARGET_SHARE * spectrum.initial_loss()
    frames = []
    for opt in nqm_optimizers:
        kw = ({"lrs": NQM_SGD_LRS} if opt == "sgd" else {"lrs": NQM_MOMENTUM_LRS, "momenta": NQM_MOMENTA})
        c = nqm.steps_to_target(spectrum, target, NQM_BATCH_SIZES, opt, max_steps=NQM_MAX_STEPS, **kw)
        frames.append(pd.DataFrame({"optimizer": opt, "batch_size": c.batch_sizes, "steps": c.steps,
                                    "best_lr": c.best_lr, "best_momentum": c.best_momentum}))
    df = pd.concat(frames, ignore_index=True)
    return df[np.isfinite(df["steps"])].reset_index(drop=True)


NQM_NOTE = (f"NQM: loss ½ xᵀHx, h_i = 1/i, d = {NQM_DIM}, gradient noise C = H / B, target = "
            f"{NQM_TARGET_SHARE:.0%} of the initial loss, best lr (and momentum) on a grid; "
            "its batch axis is in the model's own units: compare shapes, not positions.")


def formulas(optimizers: list[str]) -> list[tuple[str, str, str]]:
    """(what, LaTeX, Unicode rendering) of the convergence-bound derivation (``theory.bounds``,
    sympy), with the momentum form of the optimal step when a study used momentum. The Unicode
    form (sympy's pretty printer, sigma^2 written as a square) reads offline without a TeX engine."""
    import sympy as sp

    sigma = sp.Symbol("sigma", positive=True)
    items = [("Convergence bound (1/K) Σ E‖∇f‖² ≤", "bound", False),
             ("Steps for the bound to reach ε at step η, K(η, B)", "steps", False),
             ("Optimal step η*(B)", "lr_opt", False),
             ("Fewest steps K*(B)", "steps_opt", False),
             ("Large-batch limit S_min", "s_min", False),
             ("Small-batch limit E_min = lim B K*(B)", "e_min", False),
             ("Critical batch B_crit = E_min / S_min", "b_crit", False)]
    if any(o != "sgd" for o in optimizers):
        items.append(("Optimal base step with momentum μ (effective step η / (1 − μ))", "lr_opt", True))
    out = []
    for what, key, momentum in items:
        expr = bounds.derivation(momentum).as_dict()[key].subs(bounds.SIGMA2, sigma**2)
        out.append((what, bounds.latex(momentum)[key], sp.pretty(expr, use_unicode=True)))
    return out


def probe_summary(probes: pd.DataFrame) -> pd.DataFrame:
    """Per (run, series, sparsity) the probe values the theory needs: L = Lee et al.'s local
    Lipschitz constant (median along the reference trajectory; the top Hessian eigenvalue at
    initialization when no trajectory was probed), sigma2 = tr(Sigma) and B_simple (median along
    the trajectory, else at initialization), Delta = the loss at initialization (f_inf taken as 0)."""
    rows = []
    for (run, series, sparsity), g in probes.dropna(subset=["value"]).groupby(
            ["run", "series", "sparsity"], sort=False):
        def pick(quantity: str) -> float:
            for phase in ("trajectory", "init"):
                v = g[(g["quantity"] == quantity) & (g["phase"] == phase)]["value"]
                if len(v):
                    return float(v.median())
            return math.nan

        init_loss = g[(g["quantity"] == "loss") & (g["phase"] == "init")]["value"]
        lipschitz = pick("local_lipschitz")
        rows.append({"run": run, "series": series, "sparsity": float(sparsity),
                     "L": lipschitz if not math.isnan(lipschitz) else pick("hessian_top"),
                     "L_source": "local_lipschitz" if not math.isnan(lipschitz) else "hessian_top",
                     "sigma2": pick("trace_sigma"),
                     "delta": float(init_loss.iloc[0]) if len(init_loss) else math.nan,
                     "b_simple": pick("b_simple"), "b_noise": pick("b_noise")})
    return pd.DataFrame(rows, columns=["run", "series", "sparsity", "L", "L_source", "sigma2", "delta",
                                       "b_simple", "b_noise"])


def theory_view(runs: tuple[Run, ...], fits: Fits) -> TheoryPart:
    """Everything theory contributes to the report: predictions from the probes (with their
    errors against the measurement), the formulas, and the noisy quadratic model."""
    optimizers = [r.optimizer for r in runs]
    inputs = probe_summary(stacked(runs, "probes"))
    table, curves, notes = predictions(runs, fits, inputs)
    nqm_opts = ", ".join(sorted({NQM_OPTIMIZER[o] for o in optimizers}))
    if "nesterov" in optimizers:
        nqm_opts += "; Nesterov is compared with heavy-ball momentum"
    caption = ("(a) Measured steps-to-result of every series divided by its value at the smallest "
               "batch size. (b) The noisy quadratic model (Zhang et al. 2019) for the study's "
               f"optimizer(s) ({nqm_opts}), normalized "
               "the same way; dashed: perfect scaling. Nothing is fitted: compare where each curve "
               "leaves perfect scaling and whether momentum extends it. " + NQM_NOTE)
    return TheoryPart(table=table, curves=curves, statement=notes, inputs=inputs,
                      formulas=formulas(optimizers), nqm=nqm_curves(optimizers), nqm_caption=caption,
                      nqm_note=NQM_NOTE)


PREDICTION_COLUMNS = ["series", "quantity", "predicted", "measured", "relative_error"]
Q_BOUND = "critical batch B_crit (bound 4σ²/ε)"
Q_NOISE = "critical batch B_crit ≈ B_simple (noise scale)"
Q_RATIO = "steps / dense steps (median over B)"


def predictions(runs: tuple[Run, ...], fits: Fits, probes: pd.DataFrame
                ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Theory beside measurement per run (``theory.predict.predict_levels``): the dense level
    calibrates the bound's one scale constant, eps comes from the dense probes, every other level
    is predicted from its own probes. Returns the long table (series, quantity, predicted,
    measured, relative_error), the predicted curves (series, batch_size, steps, ratio) at the
    measured batch sizes, and one sentence per run saying what was fitted and predicted (or why
    nothing could be)."""
    groups = stacked(runs, "groups")
    groups = groups[(groups["status"] == "done") & groups["steps_to_result"].notna()]
    table, curves, notes = [], [], []
    combined = len(runs) > 1
    for run in runs:
        mine = probes[probes["run"] == run.label].set_index("sparsity")
        summaries, measured, skipped = [], [], []
        for sparsity in sorted(set(groups.loc[groups["run"] == run.label, "sparsity"])):
            series = series_label(run, sparsity, combined)
            if series not in fits.objects:
                skipped.append(f"{sparsity_label(sparsity)} (no fitted curve)")
                continue
            if sparsity not in mine.index:
                skipped.append(f"{sparsity_label(sparsity)} (no probes)")
                continue
            row = mine.loc[sparsity]
            try:
                summaries.append(ProbeSummary(sparsity, row["L"], row["sigma2"], row["delta"],
                                              None if math.isnan(row["b_simple"]) else row["b_simple"]))
            except TheoryError as exc:
                skipped.append(f"{sparsity_label(sparsity)} (probes unusable: {exc})")
                continue
            g = groups[(groups["run"] == run.label) & (groups["sparsity"] == sparsity)].sort_values(
                ["batch_size", "seed"])
            measured.append(MeasuredCurve(sparsity, tuple(g["batch_size"].astype(float)),
                                          tuple(g["steps_to_result"].astype(float)),
                                          tuple(g["seed"]) if g["seed"].nunique() > 1 else None))
        skip_text = f" Left out: {', '.join(skipped)}." if skipped else ""
        if not any(m.sparsity == 0.0 for m in measured):
            notes.append(f"{run.label}: no theory prediction: the dense level needs a fitted curve and "
                         f"probes to calibrate on.{skip_text}")
            continue
        try:
            pred = predict_levels(summaries, measured, reference=0.0, n_boot=PREDICTION_BOOT, rng=0)
        except TheoryError as exc:
            notes.append(f"{run.label}: no theory prediction: {exc}.{skip_text}")
            continue
        source = mine["L_source"].iloc[0]
        notes.append(
            f"{run.label}: fitted on measured curves: S_min and B_crit of every curve (fit_scaling) and "
            f"the bound's one scale constant c = {fmt_num(pred.scale, 3)} on the dense curve. Set from the "
            f"dense probes, not from any curve: the goal on the gradient norm ε = 4σ²/B_simple = "
            f"{fmt_num(pred.eps, 3)}. Predicted with nothing further fitted: every sparse level's steps "
            f"(c·{pred.form} bound with its own L = {source.replace('_', ' ')}, σ² = tr Σ and Δ = initial "
            f"loss), its critical batch and its step ratio to dense; and every level's critical batch "
            f"from its noise scale B_simple.{skip_text}")
        for lv in pred.levels:
            series = series_label(run, lv.sparsity, combined)
            curves += [{"series": series, "batch_size": float(b), "steps": float(p), "ratio": float(r)}
                       for b, p, r in zip(lv.batch_sizes, lv.predicted_steps, lv.step_ratio_predicted)]
            table.append({"series": series, "quantity": Q_NOISE, "predicted": lv.b_crit_noise_scale,
                          "measured": lv.b_crit_measured, "relative_error": lv.b_crit_noise_scale_error})
            if lv.is_reference:
                continue
            both = np.isfinite(lv.step_ratio_measured)
            meas = float(np.median(lv.step_ratio_measured[both])) if both.any() else math.nan
            predicted = float(np.median(lv.step_ratio_predicted[both])) if both.any() else math.nan
            table += [{"series": series, "quantity": Q_BOUND, "predicted": lv.b_crit_predicted,
                       "measured": lv.b_crit_measured, "relative_error": lv.b_crit_error},
                      {"series": series, "quantity": Q_RATIO, "predicted": predicted, "measured": meas,
                       "relative_error": predicted / meas - 1.0}]
    return (pd.DataFrame(table, columns=PREDICTION_COLUMNS),
            pd.DataFrame(curves, columns=["series", "batch_size", "steps", "ratio"]), notes)
