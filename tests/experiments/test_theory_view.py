"""The theory view on its own: probe summaries, predictions from the fits computed once, and why
a run gets no prediction (values, not rendered text)."""

import math

import pandas as pd
import pytest

from experiments import analysis as A
from experiments import theory_view as V
from experiments.runs import load_runs

from .synthetic import PROBES, TRUTH


def view(run_dir):
    runs = load_runs([run_dir])
    fits = A.fit_series(runs.groups, runs.order)
    return runs, fits, V.theory_view(runs.groups, runs.probes, fits, runs.labels,
                                     [r.optimizer for r in runs.runs])


def test_held_is_a_factor_either_way():
    assert V.held(0.5) and V.held(1 / 1.49 - 1) and V.held(0.0)
    assert not V.held(0.51) and not V.held(1 / 1.51 - 1) and not V.held(-1.0)


def test_probe_summary_prefers_the_trajectory_and_falls_back_to_initialization():
    rows = [("init", 0, "hessian_top", 9.0), ("init", 0, "loss", 2.3), ("init", 0, "trace_sigma", 5.0),
            ("trajectory", 1, "local_lipschitz", 1.0), ("trajectory", 2, "local_lipschitz", 3.0),
            ("trajectory", 3, "local_lipschitz", 2.0), ("trajectory", 1, "trace_sigma", 7.0)]
    probes = pd.DataFrame([("r", "dense", 0.0, *r) for r in rows] +
                          [("r", "90 % sparse", 0.9, "init", 0, "hessian_top", 4.0)],
                          columns=["run", "series", "sparsity", "phase", "step", "quantity", "value"])
    s = V.probe_summary(probes).set_index("series")
    assert (s.loc["dense", "L"], s.loc["dense", "L_source"]) == (2.0, "local_lipschitz")
    assert (s.loc["dense", "sigma2"], s.loc["dense", "delta"]) == (7.0, 2.3)
    assert (s.loc["90 % sparse", "L"], s.loc["90 % sparse", "L_source"]) == (4.0, "hessian_top")
    assert math.isnan(s.loc["90 % sparse", "delta"]) and math.isnan(s.loc["dense", "b_simple"])


def test_predictions_use_the_fits_and_match_the_closed_forms(full):
    runs, fits, part = view(full)
    (outcome,) = part.runs
    assert outcome.run == runs.labels[0] and outcome.left_out == () and outcome.reason == ""
    assert outcome.l_source == "local_lipschitz"
    pred = outcome.prediction
    # eps from the dense probes: 4 sigma^2 / B_simple (medians of the trajectory)
    assert pred.eps == pytest.approx(4 * PROBES[0.0]["trace_sigma"] / PROBES[0.0]["b_simple"])
    for level, series in zip(pred.levels, runs.order):
        # the measured critical batch is the fit computed once, not a second fit
        assert level.b_crit_measured == fits.objects[series].b_crit
        assert level.b_crit_interval == fits.objects[series].intervals["b_crit"]
    t = part.table.set_index(["series", "quantity"])
    assert len(t) == 4
    assert t.loc[("90 % sparse", V.Q_BOUND), "predicted"] == pytest.approx(TRUTH[0.9][1], rel=1e-6)
    assert t.loc[("dense", V.Q_NOISE), "predicted"] == PROBES[0.0]["b_simple"]
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


def test_nqm_curves_per_optimizer():
    df = V.nqm_curves(["nesterov", "sgd"])
    assert sorted(set(df.optimizer)) == ["momentum", "sgd"]    # Nesterov is drawn as heavy ball
    for _, g in df.groupby("optimizer"):
        steps = g.sort_values("batch_size").steps.to_numpy()
        assert (steps[1:] <= steps[:-1]).all() and steps[0] > 2 * steps[-1]
