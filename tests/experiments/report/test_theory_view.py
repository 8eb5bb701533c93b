"""The theory view on its own: probe summaries, predictions from the fits computed once, and why
a run gets no prediction (values, not rendered text)."""

import math

import pandas as pd
import pytest

from experiments.report import analysis as A
from experiments.report import theory_view as V
from experiments.report.runs import load_runs

from ..synthetic import PROBES, TRUTH


def view(run_dir):
    runs = load_runs([run_dir])
    fits = A.fit_series(runs.groups, runs.order)
    return runs, fits, V.theory_view(runs.groups, runs.probes, fits, runs.labels,
                                     [r.optimizer for r in runs.runs])


def test_probe_summary_reads_the_runs():
    """L: trajectory mean after step 0 (the initialization's 1.0 left out); sigma2 and B_simple
    over the last 20 % (ratio of sums); Delta: loss at step 0."""
    rows = [(0, 0.0, "loss", 2.3), (0, 0.0, "local_lipschitz", 1.0), (5, 0.5, "local_lipschitz", 3.0),
            (9, 0.9, "local_lipschitz", 2.0), (5, 0.5, "trace_sigma", 100.0), (5, 0.5, "g_sq", 1.0),
            (9, 0.9, "trace_sigma", 6.0), (9, 0.9, "g_sq", 2.0), (10, 1.0, "trace_sigma", 8.0),
            (10, 1.0, "g_sq", 2.0)]
    probes = pd.DataFrame([("r", "dense", 0.0, *r) for r in rows],
                          columns=["run", "series", "sparsity", "step", "fraction", "quantity", "value"])
    s = V.probe_summary(probes).set_index("series").loc["dense"]
    assert (s.L, s.L_source, s.delta) == (2.5, "local_lipschitz", 2.3)
    assert (s.sigma2, s.b_simple) == (7.0, 14.0 / 4.0)
    assert math.isnan(s.b_noise)


def test_predictions_use_the_fits_and_match_the_closed_forms(full):
    runs, fits, part = view(full)
    (outcome,) = part.runs
    assert outcome.run == runs.labels[0] and outcome.left_out == () and outcome.reason == ""
    assert outcome.l_source == "local_lipschitz"
    pred = outcome.prediction
    # eps from the dense probes: 4 sigma^2 / B_simple (last 20 % of the runs)
    assert pred.eps == pytest.approx(4 * PROBES[0.0]["trace_sigma"] / PROBES[0.0]["b_simple"])
    for level, series in zip(pred.levels, runs.order):
        # the measured critical batch is the fit computed once, not a second fit
        assert level.b_crit_measured == fits.objects[series].b_crit
        assert level.b_crit_interval == fits.objects[series].intervals["b_crit"]
    t = part.table.set_index(["series", "quantity"])
    assert len(t) == 2   # the bound's structure only: no noise-scale row is scored here
    assert t.loc[("90 % sparse", V.Q_BOUND), "predicted"] == pytest.approx(TRUTH[0.9][1], rel=1e-6)
    ratio = t.loc[("90 % sparse", V.Q_RATIO)]
    assert ratio.relative_error == pytest.approx(ratio.predicted / ratio.measured - 1)
    assert set(part.curves.series) == {"dense", "90 % sparse"} and len(part.curves) == 12
    assert [what for what, _, _ in part.formulas][-1].startswith("Critical batch")   # SGD: no momentum form


def test_no_prediction_without_dense_probes(partial):
    _, _, part = view(partial)
    (outcome,) = part.runs
    assert outcome.prediction is None and part.table.empty and part.curves.empty
    assert outcome.reason == "the dense level needs a fitted curve and probes to calibrate on"
    assert outcome.left_out == ((0.0, "no probes"), (0.9, "no probes"))


def test_nqm_sets_sgd_momentum_and_preconditioning_side_by_side():
    df = V.nqm_curves()
    assert list(dict.fromkeys(df["optimizer"])) == ["sgd", "momentum", "preconditioned"]
    for _, g in df.groupby("optimizer"):
        steps = g.sort_values("batch_size").steps.to_numpy()
        assert (steps[1:] <= steps[:-1]).all() and steps[0] > 2 * steps[-1]
    first = df[df["batch_size"] == 1.0].set_index("optimizer")["steps"]
    # Zhang et al. 2019: preconditioning needs fewer steps than momentum, momentum than SGD at most
    assert first["preconditioned"] < 0.5 * first["momentum"] <= first["sgd"]
    # Nesterov is drawn as heavy ball, Adam and AdamW as preconditioned heavy ball
    assert V.NQM_OPTIMIZER["nesterov"] == "momentum"
    assert V.NQM_OPTIMIZER["adamw"] == V.NQM_OPTIMIZER["adam"] == "preconditioned"
    df.loc[:, "steps"] = 0.0   # a caller's edit does not reach the cached curves
    assert V.nqm_curves()["steps"].min() > 0
