"""Theory beside measurement: what the probes predict, the bound's formulas, and the noisy
quadratic model, computed from the stacked stored tables and the measured curves' fits.

- :func:`predictions`: per run, Lee et al. (2021)'s SGD bound calibrated by its one scale
  constant on the dense curve and evaluated with every sparse level's own probes
  (``theory.models.predict.predict_levels``, given the fits :func:`experiments.report.analysis.fit_series`
  computed once), and every level's critical batch from its noise scale B_simple
  (McCandlish et al. 2018);
- :func:`probe_summary`: the probe values the theory needs per level;
- :func:`formulas`: the bound's derivation (``theory.models.bounds``, sympy) as LaTeX and Unicode;
- :func:`nqm_curves`: the noisy quadratic model (Zhang et al. 2019) with SGD, heavy-ball momentum
  and Adam-like preconditioning, beside whatever the study ran.
"""

from __future__ import annotations

from pathlib import Path

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import pandas as pd
import sympy as sp

from theory.models import bounds, nqm
from theory.errors import TheoryError
from theory.models.predict import MeasuredCurve, Prediction, ProbeSummary, predict_levels

from experiments.report.analysis import Fits, reached_groups

@dataclass(frozen=True)
class RunPrediction:
    """What the theory could say about one run: ``prediction`` (None when none could be made;
    ``reason`` then says why), the levels ``left_out`` as (sparsity, why), and where L came from
    (``l_source``: ``local_lipschitz`` or ``hessian_top``)."""

    run: str
    prediction: Prediction | None
    reason: str = ""
    left_out: tuple[tuple[float, str], ...] = ()
    l_source: str = ""


@dataclass(frozen=True)
class TheoryPart:
    """What theory says about the runs, beside the measurement.

    ``table``: long form (series, quantity, predicted, measured, relative_error);
    ``curves``: predicted steps and step ratio to dense (series, batch_size, steps, ratio) at the
    measured batch sizes (on the dense level calibrated, not predicted);
    ``runs``: per run, what was predicted or why nothing could be (:class:`RunPrediction`);
    ``inputs``: the probe values used (:func:`probe_summary`); ``formulas``: (what, LaTeX,
    Unicode); ``nqm``: noisy-quadratic-model steps (:func:`nqm_curves`).
    """

    table: pd.DataFrame
    curves: pd.DataFrame
    runs: list[RunPrediction]
    inputs: pd.DataFrame
    formulas: list[tuple[str, str, str]]
    nqm: pd.DataFrame


def theory_view(groups: pd.DataFrame, probes: pd.DataFrame, fits: Fits, runs: Sequence[str],
                optimizers: Sequence[str]) -> TheoryPart:
    """Everything theory contributes to the report: predictions from the probes (with their
    errors against the measurement), the formulas, and the noisy quadratic model."""
    inputs = probe_summary(probes)
    table, curves, outcomes = predictions(groups, fits, inputs, runs)
    return TheoryPart(table=table, curves=curves, runs=outcomes, inputs=inputs,
                      formulas=formulas(optimizers), nqm=nqm_curves())


# The noisy quadratic model drawn beside the measurement (Zhang et al. 2019's setup, shrunk so the
# report stays fast: d coordinates, coarse lr / momentum grids, target a fixed share of the
# initial loss). Its batch axis is in the model's own units.
NQM_DIM = 200
NQM_TARGET_SHARE = 0.01
NQM_BATCH_SIZES = 2.0 ** np.arange(0, 15)
NQM_SGD_LRS = np.logspace(-4, 0.5, 72)
NQM_MOMENTUM_LRS = np.logspace(-4, 1, 24)
NQM_MOMENTA = 1.0 - np.logspace(-2.5, 0, 9)[:-1]
# preconditioning moves the best lr at small batch below the momentum grid
NQM_PRECOND_LRS = np.logspace(-6, 1, 30)
NQM_MAX_STEPS = 10**6
# the NQM has heavy-ball momentum only (Nesterov studies are compared with it); Adam-type studies
# with heavy ball under Adam-like diagonal preconditioning p_i = h_i^-1/2 (theory.models.nqm.ADAM_POWER)
NQM_OPTIMIZER = {"sgd": "sgd", "momentum": "momentum", "nesterov": "momentum",
                 "adam": "preconditioned", "adamw": "preconditioned"}
NQM_CURVES = ("sgd", "momentum", "preconditioned")


def nqm_curves() -> pd.DataFrame:
    """Steps to target of the noisy quadratic model (h_i = 1/i, C = H, x_0 ~ N(0, I)) per batch
    size, best lr (and momentum) on a grid, for SGD, heavy-ball momentum and heavy ball with
    Adam-like preconditioning (:data:`NQM_CURVES`); columns optimizer, batch_size, steps,
    best_lr, best_momentum."""
    return _nqm_curves().copy()


@cache
def _nqm_curves() -> pd.DataFrame:
    # the model does not depend on the store: computed once per process
    spectrum = nqm.paper_spectrum(NQM_DIM)
    target = NQM_TARGET_SHARE * spectrum.initial_loss()
    grids = {"sgd": {"lrs": NQM_SGD_LRS},
             "momentum": {"lrs": NQM_MOMENTUM_LRS, "momenta": NQM_MOMENTA},
             "preconditioned": {"lrs": NQM_PRECOND_LRS, "momenta": NQM_MOMENTA,
                                "precond": nqm.ADAM_POWER}}
    frames = []
    for opt in NQM_CURVES:
        c = nqm.steps_to_target(spectrum, target, NQM_BATCH_SIZES, "sgd" if opt == "sgd" else "momentum",
                                max_steps=NQM_MAX_STEPS, **grids[opt])
        frames.append(pd.DataFrame({"optimizer": opt, "batch_size": c.batch_sizes, "steps": c.steps,
                                    "best_lr": c.best_lr, "best_momentum": c.best_momentum}))
    df = pd.concat(frames, ignore_index=True)
    return df[np.isfinite(df["steps"])].reset_index(drop=True)


# written into a run folder by the probes when eval mode changes the model (experiments.measures.probes.tasks)
PROBE_DEFINITION_FILE = "probe_definition.txt"


def probe_definition_text(run_dir: Path) -> str | None:
    """What the probes of the run in ``run_dir`` measured (``theory.estimators.functional.probe_definition``),
    when the run recorded it: for a model with batch normalization or dropout."""
    path = Path(run_dir) / PROBE_DEFINITION_FILE
    return path.read_text().strip() if path.exists() else None


NQM_NOTE = (f"NQM: loss ½ xᵀHx, h_i = 1/i, d = {NQM_DIM}, gradient noise C = H / B, target = "
            f"{NQM_TARGET_SHARE:.0%} of the initial loss, best lr (and momentum) on a grid; "
            "preconditioned: heavy ball with step a·h_i^-½ per coordinate (Adam-like); "
            "its batch axis is in the model's own units: compare shapes, not positions.")


def formulas(optimizers: Sequence[str]) -> list[tuple[str, str, str]]:
    """(what, LaTeX, Unicode rendering) of the convergence-bound derivation (``theory.models.bounds``,
    sympy), with the momentum form of the optimal step when a study used momentum (heavy ball or
    Nesterov; Adam's step does not scale with 1 / (1 - beta1)). The Unicode
    form (sympy's pretty printer, sigma^2 written as a square) reads offline without a TeX engine."""
    sigma = sp.Symbol("sigma", positive=True)
    items = [("Convergence bound (1/K) Σ E‖∇f‖² ≤", "bound", False),
             ("Steps for the bound to reach ε at step η, K(η, B)", "steps", False),
             ("Optimal step η*(B)", "lr_opt", False),
             ("Fewest steps K*(B)", "steps_opt", False),
             ("Large-batch limit S_min", "s_min", False),
             ("Small-batch limit E_min = lim B K*(B)", "e_min", False),
             ("Critical batch B_crit = E_min / S_min", "b_crit", False)]
    if any(o in ("momentum", "nesterov") for o in optimizers):
        items.append(("Optimal base step with momentum μ (effective step η / (1 − μ))", "lr_opt", True))
    out = []
    for what, key, momentum in items:
        expr = bounds.derivation(momentum).as_dict()[key].subs(bounds.SIGMA2, sigma**2)
        out.append((what, bounds.latex(momentum)[key], sp.pretty(expr, use_unicode=True)))
    return out


def probe_summary(probes: pd.DataFrame) -> pd.DataFrame:
    """Per (run, series, sparsity) the probe values the bound needs, from the probes along the
    runs: L = Lee et al.'s local Lipschitz constant (trajectory mean after step 0, their summary:
    they never measure at initialization, theory.verdicts.summaries), sigma2 =
    tr(Sigma) and B_simple (ratio of sums) over the last 20 % of the runs, Delta = the loss at
    step 0 (f_inf taken as 0), B_noise (median along the runs)."""
    rows = []
    for (run, series, sparsity), g in probes.dropna(subset=["value"]).groupby(
            ["run", "series", "sparsity"], sort=False):
        def values(quantity: str, late: bool = False) -> pd.Series:
            return g[(g["quantity"] == quantity) & ((g["fraction"] >= 0.8) if late else True)]["value"]

        lipschitz = g[(g["quantity"] == "local_lipschitz") & (g["step"] > 0)]["value"]
        loss0 = g[(g["quantity"] == "loss") & (g["step"] == 0)]
        sigma2, g_sq = values("trace_sigma", True), values("g_sq", True)
        rows.append({"run": run, "series": series, "sparsity": float(sparsity),
                     "L": float(lipschitz.mean()) if len(lipschitz) else math.nan,
                     "L_source": "local_lipschitz",
                     "sigma2": float(sigma2.mean()) if len(sigma2) else math.nan,
                     "delta": float(loss0["value"].mean()) if len(loss0) else math.nan,
                     "b_simple": float(sigma2.sum() / g_sq.sum()) if len(g_sq) else math.nan,
                     "b_noise": float(values("b_noise").median())})
    return pd.DataFrame(rows, columns=["run", "series", "sparsity", "L", "L_source", "sigma2", "delta",
                                       "b_simple", "b_noise"])


PREDICTION_COLUMNS = ["series", "quantity", "predicted", "measured", "relative_error"]
# structure of the bound, not predictions: with one eps shared by all levels, 4 sigma^2 / eps
# scales as sigma_s^2 / sigma_d^2 by construction (scored claims: experiments.report.verdicts)
Q_BOUND = "critical batch 4σ²/ε (structure of the bound)"
Q_RATIO = "steps / dense steps, median over B (bound)"


def predictions(groups: pd.DataFrame, fits: Fits, inputs: pd.DataFrame, runs: Sequence[str]
                ) -> tuple[pd.DataFrame, pd.DataFrame, list[RunPrediction]]:
    """Theory beside measurement per run (``theory.models.predict.predict_levels``): the dense level
    calibrates the bound's one scale constant, eps comes from the dense probes, every other level
    is predicted from its own probes; each level's measured curve keeps the fit of ``fits``.
    Returns the long table (series, quantity, predicted, measured, relative_error), the predicted
    curves (series, batch_size, steps, ratio) at the measured batch sizes, and per run what was
    predicted or why nothing could be."""
    groups = reached_groups(groups)
    series_of = dict(zip(zip(groups["run"], groups["sparsity"]), groups["series"]))
    table, curves, outcomes = [], [], []
    for run in runs:
        mine = inputs[inputs["run"] == run].set_index("sparsity")
        summaries, measured, fitted, left_out = [], [], {}, []
        for sparsity in sorted(set(groups.loc[groups["run"] == run, "sparsity"])):
            series = series_of[(run, sparsity)]
            if series not in fits.objects:
                left_out.append((sparsity, "no fitted curve"))
                continue
            if sparsity not in mine.index:
                left_out.append((sparsity, "no probes"))
                continue
            row = mine.loc[sparsity]
            try:
                summaries.append(ProbeSummary(sparsity, row["L"], row["sigma2"], row["delta"],
                                              None if math.isnan(row["b_simple"]) else row["b_simple"]))
            except TheoryError as exc:
                left_out.append((sparsity, f"probes unusable: {exc}"))
                continue
            g = groups[(groups["run"] == run) & (groups["sparsity"] == sparsity)].sort_values(
                ["batch_size", "seed"])
            measured.append(MeasuredCurve(sparsity, tuple(g["batch_size"].astype(float)),
                                          tuple(g["steps_to_result"].astype(float)),
                                          tuple(g["seed"]) if g["seed"].nunique() > 1 else None))
            fitted[sparsity] = fits.objects[series]
        if not any(m.sparsity == 0.0 for m in measured):
            outcomes.append(RunPrediction(run, None, "the dense level needs a fitted curve and "
                                          "probes to calibrate on", tuple(left_out)))
            continue
        try:
            pred = predict_levels(summaries, measured, reference=0.0, fits=fitted)
        except TheoryError as exc:
            outcomes.append(RunPrediction(run, None, str(exc), tuple(left_out)))
            continue
        outcomes.append(RunPrediction(run, pred, "", tuple(left_out), mine["L_source"].iloc[0]))
        for lv in pred.levels:
            series = series_of[(run, lv.sparsity)]
            curves += [{"series": series, "batch_size": float(b), "steps": float(p), "ratio": float(r)}
                       for b, p, r in zip(lv.batch_sizes, lv.predicted_steps, lv.step_ratio_predicted)]
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
            pd.DataFrame(curves, columns=["series", "batch_size", "steps", "ratio"]), outcomes)
