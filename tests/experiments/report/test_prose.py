"""The report's sentences from hand-made tables: the numbers they state are the tables' numbers."""

import pandas as pd

from experiments.report import theory_view as V
from experiments.report.analysis import FIT_COLUMNS
from experiments.report.prose import (
    findings_text, optimizer_sentences, prediction_statement, scaling_sentence,
)
from theory.models.predict import Prediction

MISSING = pd.DataFrame(columns=["run", "sparsity", "batch_size", "seed", "state", "detail"])


def fit_row(series, b_crit, note="", s_min=120.0):
    return dict(zip(FIT_COLUMNS, [series, 5, s_min, 100.0, 140.0, b_crit, b_crit / 2, b_crit * 2,
                                  b_crit / 4, 4 * b_crit, 0.05, note]))


def points(series, sizes):
    return pd.DataFrame({"run": "r", "series": series, "batch_size": sizes, "status": "reached"})


def test_scaling_sentence_states_the_fit():
    text = scaling_sentence("dense", pd.Series(fit_row("dense", 200.0)), pd.Series([8, 16, 32, 64, 128]))
    assert text == ("dense: perfect scaling ends near B ≈ 50 (B_crit / 4 with fitted B_crit = 200, "
                    "90 % interval [100, 400]; the largest measured batch size in that regime is "
                    "B = 32); beyond B ≈ 800 doubling the batch saves under 13 % of the steps "
                    "(S_min = 120 steps).")


def test_scaling_sentence_for_a_bound_at_either_edge():
    above = scaling_sentence("dense", pd.Series(fit_row("dense", 1e6, note="a bound")), pd.Series([8, 64]))
    assert above == ("dense: perfect scaling did not end within the measured batch sizes (up to "
                     "B = 64); B_crit is only bounded below.")
    below = scaling_sentence("dense", pd.Series(fit_row("dense", 0.5, note="a bound")), pd.Series([8, 64]))
    assert below.startswith("dense: no perfect scaling at the measured batch sizes (from B = 8)")


def test_findings_from_the_tables():
    fits = pd.DataFrame([fit_row("dense", 200.0),
                         {"series": "90 % sparse", "points": 2, "note": "not fitted: too few"}],
                        columns=FIT_COLUMNS)
    pts = pd.concat([points("dense", [8, 16, 32]), points("90 % sparse", [8, 16])])
    ratios = pd.DataFrame({"run": "r", "series": "90 % sparse", "sparsity": 0.9,
                           "batch_size": [8, 16, 32], "ratio": [1.5, 2.0, 2.5],
                           "dense_series": "dense"})
    missing = pd.DataFrame({"run": "r", "sparsity": [0.9, 0.9, 0.0], "batch_size": [8, 16, None],
                            "seed": [0, 0, None], "state": ["missing", "missing", "no probes"],
                            "detail": ""})
    text = findings_text(pts, fits, ratios, missing, ["dense", "90 % sparse"], ["r"])
    assert len(text) == 4 and text[0].startswith("dense: perfect scaling ends near B ≈ 50")
    assert text[1] == "90 % sparse: 2 batch size(s) reached the goal; no scaling fit (not fitted: too few)."
    assert text[2] == ("90 % sparse needs 2× the steps of dense (median over 3 batch sizes where both "
                       "reached the goal; from 1.5× at B = 8 to 2.5× at B = 32).")
    assert text[3] == ("Incomplete: 2 groups missing, 1 sparsity levels without probes (listed under "
                       "Missing and failed); the numbers above use only what the store holds.")


def test_findings_compare_the_dense_critical_batch_of_combined_runs():
    fits = pd.DataFrame([fit_row("a (sgd), dense", 100.0), fit_row("b (momentum), dense", 250.0)],
                        columns=FIT_COLUMNS)
    pts = pd.concat([points("a (sgd), dense", [8, 16, 32]), points("b (momentum), dense", [8, 16, 32])])
    text = findings_text(pts, fits, pd.DataFrame(columns=["run", "series", "batch_size", "ratio"]),
                         MISSING,
                         ["a (sgd), dense", "b (momentum), dense"], ["a (sgd)", "b (momentum)"])
    assert text[-1] == "Dense B_crit of b (momentum) is 2.5× that of a (sgd)."


def test_prediction_statement():
    none = V.RunPrediction("r", None, "no dense fit", ((0.5, "no probes"), (0.9, "no fitted curve")))
    assert prediction_statement(none) == ("r: no theory prediction: no dense fit. Left out: 50 % sparse "
                                          "(no probes), 90 % sparse (no fitted curve).")
    pred = Prediction(reference=0.0, scale=1.23456, eps=0.5, eps_source="reference probe",
                      form="asymptotic", levels=())
    text = prediction_statement(V.RunPrediction("r", pred, l_source="hessian_top"))
    assert "c = 1.23 on the dense curve" in text and "ε = 4σ²/B_simple = 0.5." in text
    assert "c·asymptotic bound with its own L = hessian top" in text and "Left out" not in text


# the multi-optimizer verdict: which optimizer extends perfect scaling further
OPTIMIZERS = {"opt (momentum)": "momentum", "opt (adamw)": "adamw"}


def b_crit_fits(rows):
    return pd.DataFrame(rows, columns=["series", "b_crit", "b_crit_lo", "b_crit_hi", "note"])


def test_separated_intervals_name_the_optimizer_with_the_larger_critical_batch():
    table = b_crit_fits([("opt (momentum), dense", 450.0, 380.0, 530.0, ""),
                         ("opt (adamw), dense", 900.0, 700.0, 1200.0, ""),
                         ("opt (momentum), 90 % sparse", 660.0, 500.0, 800.0, ""),
                         ("opt (adamw), 90 % sparse", 700.0, 600.0, 900.0, "")])
    dense, sparse = optimizer_sentences(table, OPTIMIZERS, [0.9, 0.0])
    assert dense == ("Which optimizer extends perfect scaling further, dense: opt (adamw) extends "
                     "perfect scaling further (the intervals do not overlap). Fitted B_crit (90 % "
                     "intervals): opt (adamw) 900 [700, 1200]; opt (momentum) 450 [380, 530].")
    assert sparse.startswith("Which optimizer extends perfect scaling further, 90 % sparse: not "
                             "resolved: opt (adamw) has the largest B_crit but the intervals overlap")


def test_a_bound_decides_nothing_and_unfitted_levels_are_skipped():
    table = b_crit_fits([("opt (momentum), dense", 450.0, 380.0, 530.0, ""),
                         ("opt (adamw), dense", 9000.0, 5000.0, 20000.0,
                          "B_crit at the edge of what the batch sizes resolve: a bound"),
                         ("opt (momentum), 90 % sparse", 660.0, 500.0, 800.0, "")])
    (dense,) = optimizer_sentences(table, OPTIMIZERS, [0.0, 0.9])
    assert "dense: not resolved: a critical batch at the edge" in dense
    assert "opt (adamw) 9000 [5000, 20000] (a bound: at the edge of the measured batch sizes)" in dense


def test_one_optimizer_has_no_comparison():
    table = b_crit_fits([("a (momentum), dense", 450.0, 380.0, 530.0, ""),
                         ("b (momentum), dense", 900.0, 700.0, 1200.0, "")])
    assert optimizer_sentences(table, {"a (momentum)": "momentum", "b (momentum)": "momentum"},
                               [0.0]) == []
