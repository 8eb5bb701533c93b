"""Theory beside measurement: what the probes predict, the bound's formulas, and the noisy
quadratic model, computed from the stacked stored tables and the measured curves' fits.

- :func:`predictions`: per run, Lee et al. (2021)'s SGD bound calibrated by its one scale
  constant on the dense curve and evaluated with every sparse level's own probes
  (``theory.predict.predict_levels``, given the fits :func:`experiments.analysis.fit_series`
  computed once), and every level's critical batch from its noise scale B_simple
  (McCandlish et al. 2018);
- :func:`probe_summary`: the probe values the theory needs per level;
- :func:`formulas`: the bound's derivation (``theory.bounds``, sympy) as LaTeX and Unicode;
- :func:`nqm_curves`: the noisy quadratic model (Zhang et al. 2019) for the study's optimizers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import pandas as pd
import sympy as sp

from theory import bounds, nqm
from theory.errors import TheoryError
from theory.predict import MeasuredCurve, Prediction, ProbeSummary, predict_levels

from .analysis import Fits, reached_groups

# A prediction "held" when it is within this factor of the measurement (either direction).
HELD_FACTOR = 1.5


def held(relative_error: float) -> bool:
    """A prediction held when predicted / measured lies within [1 / HELD_FACTOR, HELD_FACTOR]."""
    return bool(abs(math.log1p(relative_error)) <= math.log(HELD_FACTOR)) if relative_error > -1 else False


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
                      formulas=formulas(optimizers), nqm=nqm_curves(optimizers))


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


def nqm_curves(optimizers: Sequence[str]) -> pd.DataFrame:
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


def formulas(optimizers: Sequence[str]) -> list[tuple[str, str, str]]:
    """(what, LaTeX, Unicode rendering) of the convergence-bound derivation (``theory.bounds``,
    sympy), with the momentum form of the optimal step when a study used momentum. The Unicode
    form (sympy's pretty printer, sigma^2 written as a square) reads offline without a TeX engine."""
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


PREDICTION_COLUMNS = ["series", "quantity", "predicted", "measured", "relative_error"]
Q_BOUND = "critical batch B_crit (bound 4σ²/ε)"
Q_NOISE = "critical batch B_crit ≈ B_simple (noise scale)"
Q_RATIO = "steps / dense steps (median over B)"


def predictions(groups: pd.DataFrame, fits: Fits, inputs: pd.DataFrame, runs: Sequence[str]
                ) -> tuple[pd.DataFrame, pd.DataFrame, list[RunPrediction]]:
    """Theory beside measurement per run (``theory.predict.predict_levels``): the dense level
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
            pd.DataFrame(curves, columns=["series", "batch_size", "steps", "ratio"]), outcomes)
