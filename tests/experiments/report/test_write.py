"""Study reports from small synthetic stores (no training): written through the store's public
writing API (``experiments.store.database.open_store`` / ``write_group``, ``experiments.measures.probes.store.write_probes``)."""

from __future__ import annotations

import math
import re
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.report.figures import measurement as F
from experiments.measures.probes import figures as PF
from experiments.report.write import ReportError, write_report
from experiments.report.runs import load_runs
from experiments.store.database import StoreError
from theory.models.walltime import predict_time_to_result
from training.distributed.costmodel import (
    CostModel, CostModelError, Measurements, StepTime, save_cost_model,
)

from ..synthetic import TRUTH, make_store

# the run folders of the shared reports (``full``, ``combined``, ``partial``) are in conftest.py

FIGURES = ("fig1_steps", "fig2_normalized", "fig3_metaparameters", "fig4_trials", "fig5_b_simple",
           "fig6_smoothness", "fig7_nqm")
TABLES = ("Steps to result", "Scaling fits", "Structure of the bound (not scored)",
          "Claims in their own terms", "Theory vs measurement", "Sparse / dense step ratios",
          "Missing and failed", "Cost and versions", "What was fitted and what was predicted",
          "Theory formulas", "Study specs", "Findings")
OUTPUTS = ("report.html", "report.md", "summary.csv", *(f"figures/{f}.png" for f in FIGURES))


def summary(run_dir) -> pd.DataFrame:
    return pd.read_csv(Path(run_dir) / "summary.csv")


def test_same_store_gives_byte_identical_outputs(full, tmp_path):
    again = tmp_path / "again"
    write_report([full], out=again)
    for name in OUTPUTS:
        assert (full / name).read_bytes() == (again / name).read_bytes(), name


def test_another_process_writes_the_same_bytes(partial, tmp_path):
    """No hidden state (hash seeds, caches, font lookups) leaks into the files."""
    import os
    import subprocess
    import sys

    out = tmp_path / "elsewhere"
    code = f"from experiments.report.write import write_report; write_report([{str(partial)!r}], out={str(out)!r})"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).parents[3])
    for name in OUTPUTS:
        assert (partial / name).read_bytes() == (out / name).read_bytes(), name


def test_report_contains_every_figure_and_table(full):
    html_text = (full / "report.html").read_text()
    md = (full / "report.md").read_text()
    # six embedded PNGs (self-contained: no external references at all)
    assert html_text.count('src="data:image/png;base64,') == len(FIGURES)
    assert "http://" not in html_text and "https://" not in html_text and "<script" not in html_text
    for i, name in enumerate(FIGURES, 1):
        png = (full / "figures" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        assert b"Software" not in png and b"tIME" not in png
        assert f"Figure {i}." in html_text and f"](figures/{name}.png)" in md
    for title in TABLES:
        assert title in html_text and title in md, title
    # the theory's formulas come from the sympy derivation
    assert r"\frac{4 \sigma^{2}}{\varepsilon}" in md
    assert "[[workload]]" not in md and 'dataset = "teacher"' in md


def test_summary_matches_the_store(full):
    s = summary(full)
    with sqlite3.connect(full / "results.sqlite") as conn:
        groups = pd.read_sql_query("SELECT sparsity, batch_size, seed, steps_to_result FROM groups", conn)
        best = pd.read_sql_query(
            "SELECT g.sparsity, g.batch_size, g.seed, t.lr FROM groups g JOIN trials t "
            "ON t.group_key = g.key AND t.trial = g.best_trial", conn)
    assert len(s) == groups.groupby(["sparsity", "batch_size"]).ngroups == 12
    assert list(s.sort_values(["sparsity", "batch_size"]).index) == list(s.index)   # sorted rows
    median = groups.groupby(["sparsity", "batch_size"])["steps_to_result"].median()
    for row in s.itertuples():
        assert row.steps_to_result == median[(row.sparsity, row.batch_size)]
        # the best metaparameters are those of the seed with the fewest steps
        fastest = groups[(groups.sparsity == row.sparsity) & (groups.batch_size == row.batch_size)
                         ].sort_values(["steps_to_result", "seed"]).seed.iloc[0]
        assert row.lr == pytest.approx(best.set_index(["sparsity", "batch_size", "seed"]).loc[
            (row.sparsity, row.batch_size, fastest), "lr"], rel=1e-5)
        assert row.n_trials == 12 and row.seeds_reached == 2
    # the smallest batch's best lr sits in the outer 10 % of the log lr range
    assert s.loc[s.batch_size == 8, "lr_at_edge"].all() and not s.loc[s.batch_size > 8, "lr_at_edge"].any()


def test_fit_recovers_the_synthetic_truth(full):
    s = summary(full)
    for sparsity, (s_min, b_crit) in TRUTH.items():
        rows = s[s.sparsity == sparsity]
        # 3 % noise on 12 points: the fit lands within 10 % of the true curve
        assert rows.fit_s_min.iloc[0] == pytest.approx(s_min, rel=0.1)
        assert rows.fit_b_crit.iloc[0] == pytest.approx(b_crit, rel=0.1)
        expected = ["perfect scaling" if b <= b_crit / 4 else "diminishing returns" for b in rows.batch_size]
        assert list(rows.regime) == expected
    ratio = s[s.sparsity == 0.9].set_index("batch_size")["ratio_to_dense"]
    dense = s[s.sparsity == 0.0].set_index("batch_size")["steps_to_result"]
    sparse = s[s.sparsity == 0.9].set_index("batch_size")["steps_to_result"]
    assert ratio.to_numpy() == pytest.approx((sparse / dense).to_numpy(), rel=1e-5)


def test_theory_predictions_against_closed_forms(full):
    """With probes consistent with TRUTH, the bound predicts the sparse curve's shape exactly:
    B_crit = 4 sigma^2 / eps = 100 and steps ratio 2.2 (1 + 100 / B) / (1 + 200 / B)."""
    s = summary(full)
    sparse, dense = s[s.sparsity == 0.9], s[s.sparsity == 0.0]
    b = sparse.batch_size.to_numpy(float)
    (s_d, b_d), (s_s, b_s) = TRUTH[0.0], TRUTH[0.9]
    expected = (s_s * (1 + b_s / b)) / (s_d * (1 + b_d / b))
    assert sparse.predicted_ratio_to_dense.to_numpy() == pytest.approx(expected, rel=1e-5)
    # the one calibrated constant makes the dense prediction match the measured curve on average
    log_gap = np.log(dense.predicted_steps / dense.steps_to_result)
    assert abs(log_gap.mean()) < 1e-3 and log_gap.abs().max() < 0.1   # (median vs geometric mean of seeds)
    md = (full / "report.md").read_text()
    table = md.split("### Structure of the bound (not scored)")[1].split("###")[0]
    assert "| 90 % sparse | critical batch 4σ²/ε (structure of the bound) | 100 |" in table
    assert "held" not in table and "noise scale" not in table   # shown, not scored
    assert "c = " in md and "ε = 4σ²/B_simple = 1." in md


def test_findings_state_the_numbers(full):
    md = (full / "report.md").read_text()
    findings = md.split("## Findings")[1].split("## Figures")[0]
    # dense: B_crit ~ 200, perfect scaling ends near B_crit / 4 ~ 50: the largest measured B there is 32
    dense = findings.split("dense: perfect scaling ends near B ≈ ")[1]
    assert 45 <= float(dense.split(" ")[0]) <= 55
    assert "largest measured batch size in that regime is B = 32" in dense.split("90 % sparse:")[0]
    assert "90 % sparse needs" in findings and "the steps of dense" in findings
    assert "Incomplete" not in findings


def test_combining_two_run_folders(combined):
    out = combined / "both"
    s = summary(out)
    assert sorted(set(zip(s.study, s.optimizer))) == [("shallue", "momentum"), ("shallue", "sgd")]
    assert set(s.series) == {"shallue (sgd), dense", "shallue (sgd), 90 % sparse",
                             "shallue (momentum), dense", "shallue (momentum), 90 % sparse"}
    # momentum doubles B_crit in the synthetic stores
    b = s.groupby("series")["fit_b_crit"].first()
    assert b["shallue (momentum), dense"] / b["shallue (sgd), dense"] == pytest.approx(2.0, rel=0.1)
    md = (out / "report.md").read_text()
    # the momentum stores double B_crit but keep the probes: B_simple at the goal is half of it
    claims = md.split("### Claims in their own terms")[1].split("###")[0]
    assert claims.count("| shallue (momentum), dense | mccandlish | paper | 0.4") == 1
    ratio = re.search(r"Dense B_crit of shallue \(momentum\) is (\S+)× that of shallue \(sgd\)\.", md)
    assert float(ratio.group(1)) == pytest.approx(2.0, rel=0.1)
    assert "Which optimizer extends perfect scaling further, dense: shallue (momentum) extends" in md
    html_text = (out / "report.html").read_text()
    assert html_text.count("data:image/png;base64,") == len(FIGURES)
    assert "Study report: shallue (sgd), shallue (momentum)" in html_text
    # the inputs are left as they were: the combined report went to its own folder
    assert not (combined / "sgd" / "report.html").exists()


def test_partial_run_reports_what_exists_and_lists_what_is_missing(partial):
    s = summary(partial)
    status = {(r.sparsity, r.batch_size): r.status for r in s.itertuples()}
    assert len(status) == 12 and status[(0.9, 128)] == status[(0.9, 256)] == "missing"
    assert status[(0.0, 8)] == "failed" and status[(0.9, 8)] == "not reached"
    assert list(status.values()).count("reached") == 8
    assert np.isnan(s.loc[(s.sparsity == 0.0) & (s.batch_size == 8), "steps_to_result"]).all()
    md = (partial / "report.md").read_text()
    missing = md.split("### Missing and failed")[1].split("###")[0]
    assert missing.count("| missing |") == 2 and "| 90 % sparse | 128 | 0 | missing |" in missing
    assert "| dense | 8 | 0 | failed | RuntimeError: out of memory |" in missing
    assert missing.count("| no probes |") == 2
    assert "Incomplete: 2 groups missing, 1 failed, 2 sparsity levels without probes" in md
    # no probes stored: every panel of Figure 6 says so instead of drawing
    runs = load_runs([partial])
    fig = PF.smoothness_figure(runs.probes, list(runs.order), F.colors(list(runs.order)))
    assert len(fig.axes) == 2
    assert all([t.get_text().endswith("not measured") for t in ax.texts] == [True] and not ax.lines
               for ax in fig.axes)
    assert "No claim could be judged" in md
    # 90 % sparse still has 3 points (16, 32, 64): fitted; the dense curve lost B = 8 only
    assert s.loc[s.sparsity == 0.9, "fit_b_crit"].notna().all()


def test_cli_report_of_a_curve_with_too_few_points(tmp_path, capsys):
    from experiments.cli.main import main

    run = make_store(tmp_path / "run", skip={(0.9, b) for b in (32, 64, 128, 256)}, probes=False)
    assert main(["report", str(run)]) == 0          # writes into the run folder by default
    assert str(run / "report.html") in capsys.readouterr().out
    assert all((run / name).exists() for name in OUTPUTS)
    md = (run / "report.md").read_text()
    assert "90 % sparse: 2 batch size(s) reached the goal; no scaling fit" in md
    assert summary(run).loc[lambda d: d.sparsity == 0.9, "fit_b_crit"].isna().all()


def test_study_with_nothing_stored_yet(tmp_path):
    everything = {(s, b) for s in TRUTH for b in (8, 16, 32, 64, 128, 256)}
    run = make_store(tmp_path / "run", skip=everything, probes=False)
    write_report([run])
    md = (run / "report.md").read_text()
    assert "Incomplete: 12 groups missing, 2 sparsity levels without probes" in md
    assert "dense: 0 batch size(s) reached the goal; no scaling fit" in md
    assert (summary(run).status == "missing").sum() == 12 and all((run / name).exists() for name in OUTPUTS)


def test_bad_input_names_the_argument(tmp_path):
    with pytest.raises(ReportError, match="run_dirs"):
        write_report([])
    with pytest.raises(StoreError, match="no results store"):
        write_report([tmp_path / "nothing"])


# ---------------------------------------------------------------------------------------------
# time to result on real hardware (a cost_model.json in the run folder)

# Known constants: 1 ms fixed, 2 µs per example, 0.5 ms per ring round, 1 ns per byte, 10 000
# float32 parameters; step times "measured" at k = 1, 2 only, so k = 4, 8 are extrapolated.
COST = CostModel(t_fixed=1e-3, t_example=2e-6, alpha=5e-4, beta=1e-9, n_params=10_000,
                 meta={"backend": "gloo", "device": "cpu", "workload": "teacher/mlp", "threads": 1})
COST_MEASUREMENTS = Measurements((StepTime(1, 8, 1.0e-3), StepTime(2, 8, 2.1e-3)), (), 10_000)
HARDWARE = "## Time to result on real hardware"


def md_table(md: str, title: str) -> list[dict[str, str]]:
    """The rows of the markdown table under ``### title`` as dicts (heading -> cell)."""
    lines = md.split(f"### {title}\n\n")[1].split("\n\n")[0].splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def expected_prediction(run_dir, sparsity: float):
    """theory.models.walltime on the store's steps: the median over the seeds that reached the goal,
    a half step rounded up (read with SQL, independent of the report's tables)."""
    with sqlite3.connect(Path(run_dir) / "results.sqlite") as conn:
        g = pd.read_sql_query("SELECT batch_size, steps_to_result FROM groups WHERE sparsity = ? "
                              "AND status = 'done' AND steps_to_result IS NOT NULL", conn,
                              params=(sparsity,))
    medians = g.groupby("batch_size")["steps_to_result"].median()
    steps = {int(b): int(math.ceil(s)) for b, s in medians.items()}
    return medians, steps, predict_time_to_result(steps, COST, (1, 2, 4, 8))


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    run = make_store(tmp_path_factory.mktemp("timed") / "run", seeds=(0, 1))
    save_cost_model(COST, run / "cost_model.json", COST_MEASUREMENTS)
    write_report([run])
    return run


def test_time_to_result_section_matches_theory_walltime(timed):
    md = (timed / "report.md").read_text()
    assert HARDWARE in md
    grid = md_table(md, "Predicted time to result on k workers: seconds (worker-seconds)")
    assert list(grid[0]) == ["series", "B", "steps", "k = 1", "k = 2", "k = 4 (extrapolated)",
                             "k = 8 (extrapolated)"]
    fastest = md_table(md, "Fastest batch size per number of workers k")
    for sparsity, series in ((0.0, "dense"), (0.9, "90 % sparse")):
        medians, steps, pred = expected_prediction(timed, sparsity)
        # medians over two seeds: some batch sizes need their half step rounded up
        assert (medians % 1 == 0.5).any()
        rows = [r for r in grid if r["series"] == series]
        assert [int(r["B"]) for r in rows] == sorted(steps) and len(rows) == 6
        for row in rows:
            b = int(row["B"])
            assert int(row["steps"]) == steps[b]
            for k, head in zip((1, 2, 4, 8), list(row)[3:]):
                time, worker_s = (float(v.strip("()")) for v in row[head].split())
                p = pred.at(b, k)
                assert time == pytest.approx(p.time, rel=1e-3)
                assert worker_s == pytest.approx(p.worker_seconds, rel=1e-3)
                # and the closed form of the cost model itself
                t = 1e-3 + 2e-6 * b / k + (k > 1) * (2 * (k - 1) * 5e-4 + 2 * (k - 1) / k * 1e-9 * 40_000)
                assert time == pytest.approx(steps[b] * t, rel=1e-3)
        best = [r for r in fastest if r["series"] == series]
        assert [(int(r["k"]), int(r["fastest B"])) for r in best] == [
            (p.workers, p.batch_size) for p in pred.best_by_workers()]
        for r, p in zip(best, pred.best_by_workers()):
            assert int(r["B/k"]) == p.per_worker_batch and int(r["steps"]) == p.steps
            assert float(r["step (ms)"]) == pytest.approx(p.step_time * 1e3, rel=1e-3)
            assert float(r["time to result (s)"]) == pytest.approx(p.time, rel=1e-3)
            assert float(r["worker-seconds"]) == pytest.approx(p.worker_seconds, rel=1e-3)
            assert r["extrapolated"] == ("yes" if p.workers > 2 else "no")
    section = md.split(HARDWARE)[1].split("\n## ")[0]
    assert "Step times were measured at k ∈ {1, 2}; k = 4, 8 are extrapolated by the ring formula." in section
    assert "t_fixed = 1 ms, t_example = 2 µs per example, α = 500 µs per ring round" in section
    assert "not on this study" not in section          # the cost model's workload is the study's
    html_text = (timed / "report.html").read_text()
    assert "<h2>Time to result on real hardware</h2>" in html_text
    assert "Fastest batch size per number of workers k" in html_text and "k = 8 (extrapolated)" in html_text


def test_time_to_result_csv_holds_every_prediction(timed):
    csv = pd.read_csv(timed / "time_to_result.csv")
    assert len(csv) == 2 * 6 * 4            # series x batch sizes x k (every B divisible by k)
    for sparsity in (0.0, 0.9):
        *_, pred = expected_prediction(timed, sparsity)
        rows = csv[csv.sparsity == sparsity].set_index(["batch_size", "workers"])
        for p in pred.points:
            row = rows.loc[(p.batch_size, p.workers)]
            assert row.steps == p.steps and row.per_worker_batch == p.per_worker_batch
            assert row.time_s == pytest.approx(p.time, rel=1e-5)
            assert row.worker_seconds == pytest.approx(p.worker_seconds, rel=1e-5)
            assert row.fastest == (pred.fastest(p.workers) == p)
            assert row.extrapolated == (p.workers > 2)
    assert set(csv.study) == {"synthetic"} and set(csv.optimizer) == {"sgd"}


def test_time_to_result_section_is_byte_deterministic(timed, tmp_path):
    write_report([timed], out=tmp_path)
    for name in ("report.md", "report.html", "summary.csv", "time_to_result.csv"):
        assert (timed / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_without_a_cost_model_the_report_says_how_to_make_one(full):
    md = (full / "report.md").read_text()
    section = md.split(HARDWARE)[1].split("\n## ")[0].strip()
    assert section == ("No cost model: run `sparsescale bench ddp --out RUN_DIR/cost_model.json` "
                       "and write the report again to predict time-to-result on k data-parallel workers.")
    assert "sparsescale bench ddp --out RUN_DIR/cost_model.json" in (full / "report.html").read_text()
    assert not (full / "time_to_result.csv").exists()


def test_hardware_view_per_run_and_bad_cost_model(tmp_path):
    """Combined runs: only the run with a cost model gets predictions; a cost model of another
    workload and one without measurements are stated; a malformed file names itself."""
    from experiments.report.analysis import points_table
    from experiments.measures.hardware.view import hardware_view
    from experiments.report.runs import load_runs

    sgd = make_store(tmp_path / "sgd", name="shallue", optimizer="sgd")
    mom = make_store(tmp_path / "momentum", name="shallue", optimizer="momentum", momentum_gain=2.0)
    other = CostModel(1e-3, 2e-6, 5e-4, 1e-9, 10_000, meta={"workload": "mnist1d/mlp"})
    save_cost_model(other, sgd)                   # a folder: written as cost_model.json
    runs = load_runs([sgd, mom])
    points = points_table(runs.groups, runs.trials, runs.planned, runs.order)
    part = hardware_view(runs.runs, runs.order, points)
    assert set(part.points.series) == {"shallue (sgd), dense", "shallue (sgd), 90 % sparse"}
    assert not part.points.extrapolated.any()     # no measurements: nothing known to be measured
    text = " ".join(part.paragraphs)
    assert "measured on mnist1d/mlp, not on this study's teacher/mlp" in text
    assert "stores no measurements" in text
    assert ("shallue (momentum): no cost model in its run folder; run `sparsescale bench ddp "
            "--out RUN_DIR/cost_model.json`") in text
    (sgd / "cost_model.json").write_text('{"format": "something else"}')
    with pytest.raises(CostModelError, match="cost_model.json.*'format'"):
        hardware_view(runs.runs, runs.order, points)


def test_the_steps_table_says_which_stop_rule_produced_its_trials_reached(full):
    md = (full / "report.md").read_text()
    steps = md.split("### Steps to result")[1].split("###")[0]
    assert ('Trials reached: synthetic (sgd): stop = "first": a group stops at the first '
            "evaluation where any trial meets the goal (Shallue et al.'s steps-to-result), so one "
            "trial reaches it by construction; diverged trials count toward the trials per "
            "group.") in steps
