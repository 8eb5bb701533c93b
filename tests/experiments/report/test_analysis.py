"""The analysis tables as pure functions of small hand-made frames: every value checked."""

import math

import pandas as pd
import pytest

from experiments.report import analysis as A
from experiments.spec.search import Dimension

RUN, DENSE, SPARSE = "s (momentum)", "dense", "90 % sparse"
ORDER = [DENSE, SPARSE]


def group(sparsity, b, seed, steps, status="done", best=0, error=None):
    return {"run": RUN, "series": DENSE if sparsity == 0 else SPARSE, "sparsity": sparsity,
            "batch_size": b, "seed": seed, "key": f"{sparsity}-{b}-{seed}", "status": status,
            "steps_to_result": steps, "best_trial": best if steps is not None else None,
            "max_steps": 1000, "n_trials": 0 if status == "failed" else 2,
            "n_reached": int(steps is not None), "n_diverged": 1, "trial_steps": 10 * b,
            "wall_time": 1.5, "error": error}


def frames(groups):
    g = pd.DataFrame(groups)
    g["steps_to_result"] = g["steps_to_result"].astype("Int64")
    g["best_trial"] = g["best_trial"].astype("Int64")
    trials = pd.DataFrame([{"run": RUN, "group_key": r["key"], "trial": t, "lr": 0.1 * (t + 1) * r["seed"] + r["batch_size"] / 1000,
                            "momentum": 0.9, "effective_lr": 1.0, "decay_steps": None, "end_factor": 1.0}
                           for r in groups for t in range(2)])
    return g, trials


def planned(cells, probes=True):
    return pd.DataFrame([(RUN, DENSE if s == 0 else SPARSE, s, b, seed, probes) for s, b, seed in cells],
                        columns=["run", "series", "sparsity", "batch_size", "seed", "probes"])


def test_points_median_best_seed_status_and_missing_cells():
    groups, trials = frames([
        group(0.0, 8, 0, 120), group(0.0, 8, 1, 100, best=1), group(0.0, 8, 2, None),   # 2 of 3 reach
        group(0.0, 16, 0, None),                                                      # none reaches
        group(0.9, 8, 0, None, status="failed", error="boom"),
    ])
    plan = planned([(s, b, seed) for s in (0.0, 0.9) for b in (8, 16) for seed in (0, 1, 2)])
    p = A.points_table(groups, trials, plan, ORDER)
    assert list(zip(p.series, p.batch_size, p.status)) == [
        (DENSE, 8, "reached"), (DENSE, 16, "not reached"), (SPARSE, 8, "failed"), (SPARSE, 16, "missing")]
    first = p.iloc[0]
    assert (first.steps, first.seeds, first.seeds_reached, first.n_trials, first.n_reached) == (110, 3, 2, 6, 2)
    # best metaparameters: the best trial (1) of the seed with the fewest steps (seed 1)
    assert first.lr == pytest.approx(0.1 * 2 * 1 + 0.008)
    assert math.isnan(p.iloc[1].steps) and math.isnan(p.iloc[1].lr)
    assert p.iloc[2].n_trials == 0 and p.iloc[2].trial_steps == 80
    assert p.iloc[3].seeds == 0 and math.isnan(p.iloc[3].max_steps)


def test_points_ties_go_to_the_lowest_seed():
    groups, trials = frames([group(0.0, 8, 1, 100, best=1), group(0.0, 8, 0, 100, best=0)])
    p = A.points_table(groups, trials, planned([(0.0, 8, 0), (0.0, 8, 1)]), ORDER)
    assert p.iloc[0].lr == pytest.approx(0.1 * 1 * 0 + 0.008)     # seed 0, trial 0


def test_search_edges_on_each_dimensions_own_scale():
    points = pd.DataFrame({"run": [RUN] * 3, "lr": [1.5e-3, 0.05, math.nan], "momentum": [0.9] * 3})
    lr = Dimension("log", 1e-3, 1.0)    # outer 10 % of the log range: below 2e-3, above 0.5
    edges = A.search_edges(points, {RUN: {"lr": lr}})
    assert edges.lr_at_edge.tolist() == [True, False, False]
    assert not edges.momentum_at_edge.any()      # momentum was not searched in this run


def test_step_ratios_at_common_batch_sizes_only():
    points = pd.DataFrame({"run": RUN, "series": [DENSE, DENSE, SPARSE, SPARSE, SPARSE],
                           "sparsity": [0.0, 0.0, 0.9, 0.9, 0.9], "batch_size": [8, 16, 8, 16, 32],
                           "status": ["reached", "reached", "reached", "not reached", "reached"],
                           "steps": [100.0, 60.0, 250.0, math.nan, 80.0]})
    r = A.step_ratios(points, ORDER)
    assert r[["series", "batch_size", "ratio"]].values.tolist() == [[SPARSE, 8, 2.5]]


def test_step_ratios_against_another_runs_dense_series():
    # a pruning series without a dense level of its own is measured against the first series'
    first, check = "snip (sgd)", "snip-shuffle (sgd)"
    points = pd.DataFrame({"run": [first, first, check], "sparsity": [0.0, 0.9, 0.9],
                           "series": [f"{first}, dense", f"{first}, 90 % sparse",
                                      f"{check}, 90 % sparse"],
                           "batch_size": 8, "status": "reached", "steps": [100.0, 200.0, 300.0]})
    r = A.step_ratios(points, list(points["series"]), {first: first, check: first})
    assert r[["series", "ratio", "dense_series"]].values.tolist() == [
        [f"{first}, 90 % sparse", 2.0, f"{first}, dense"],
        [f"{check}, 90 % sparse", 3.0, f"{first}, dense"]]
    assert A.step_ratios(points, list(points["series"]))["series"].tolist() == [
        f"{first}, 90 % sparse"]   # by default each run against its own dense series only


def test_fit_series_recovers_an_exact_curve_and_says_why_not():
    sizes = [8, 16, 32, 64, 128]
    groups, _ = frames([group(0.0, b, 0, round(100 * (1 + 64 / b))) for b in sizes]
                       + [group(0.9, b, 0, 300) for b in (8, 16)])
    fits = A.fit_series(groups, ORDER)
    dense = fits.table.set_index("series").loc[DENSE]
    assert dense.s_min == pytest.approx(100, rel=1e-3) and dense.b_crit == pytest.approx(64, rel=1e-2)
    assert dense.perfect_until == pytest.approx(dense.b_crit / 4)
    assert dense.largest_useful_batch == pytest.approx(4 * dense.b_crit)
    assert dense.s_min_lo <= dense.s_min <= dense.s_min_hi and dense.points == 5
    assert fits.objects[DENSE].b_crit == dense.b_crit and SPARSE not in fits.objects
    sparse = fits.table.set_index("series").loc[SPARSE]
    assert sparse.points == 2 and sparse.note.startswith("not fitted: ") and "3 distinct" in sparse.note


def test_missing_failed_and_unprobed():
    groups, _ = frames([group(0.0, 8, 0, 100), group(0.9, 8, 0, None, status="failed",
                                                    error="Traceback ...\nRuntimeError: out of memory\n")])
    probes = pd.DataFrame({"run": [RUN], "sparsity": [0.0]})
    plan = planned([(0.0, 8, 0), (0.0, 8, 1), (0.9, 8, 0)])
    m = A.missing_table(groups, probes, plan, [RUN])
    assert m[["sparsity", "state", "detail"]].values.tolist() == [
        [0.9, "failed", "RuntimeError: out of memory"],
        [0.0, "missing", "not in the store (not run yet or interrupted)"],
        [0.9, "no probes", "noise and smoothness not measured"]]
    assert m.seed.tolist()[:2] == [0, 1]
    assert A.missing_table(groups, probes, planned([(0.0, 8, 0), (0.9, 8, 0)], probes=False),
                           [RUN]).state.tolist() == ["failed"]
    study = pd.DataFrame([{"run": RUN, "created": "2026-01-01", "lib_version": "1", "torch_version": "2",
                           "python_version": "3"}])
    cost = A.cost_table(groups, study, plan, m).iloc[0]
    assert (cost.planned, cost.done, cost.failed, cost.missing, cost.trials, cost.trial_steps) == (3, 1, 1, 1, 2, 160)
    assert cost.wall_time_s == 3.0 and cost.sparsescale == "1"


def test_summary_joins_fit_ratios_and_predictions():
    sizes = [8, 16, 32, 64]
    groups, trials = frames([group(0.0, b, 0, round(100 * (1 + 64 / b))) for b in sizes]
                            + [group(0.9, b, 0, round(200 * (1 + 64 / b))) for b in sizes])
    plan = planned([(s, b, 0) for s in (0.0, 0.9) for b in sizes])
    points = A.points_table(groups, trials, plan, ORDER)
    edges = A.search_edges(points, {RUN: {}})
    fits = A.fit_series(groups, ORDER)
    predicted = pd.DataFrame({"series": [SPARSE], "batch_size": [8.0], "steps": [1700.0], "ratio": [1.9]})
    info = pd.DataFrame({"run": [RUN], "study": ["s"], "optimizer": ["momentum"]})
    s = A.summary_frame(points, edges, fits, predicted, A.step_ratios(points, ORDER), info)
    assert list(s.columns[:3]) == ["study", "optimizer", "run"] and "wall_time" not in s
    dense, sparse = s[s.sparsity == 0.0], s[s.sparsity == 0.9]
    assert (dense.ratio_to_dense == 1.0).all()
    assert sparse.ratio_to_dense.tolist() == pytest.approx([2.0] * 4, rel=1e-2)
    assert sparse.fit_s_min.iloc[0] == pytest.approx(200, rel=1e-2)
    assert dense.regime.tolist()[0] == "perfect scaling"
    assert sparse.predicted_steps.iloc[0] == 1700.0 and math.isnan(sparse.predicted_steps.iloc[1])
    assert sparse.predicted_ratio_to_dense.iloc[0] == 1.9
