"""Study reports from small synthetic stores (no training): written through the store's public
writing API (``experiments.store.open_store`` / ``write_group`` / ``write_probes``)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import zlib

import numpy as np
import pytest

from experiments.spec import loads
from experiments.store import GroupRecord, ProbeRow, StudyInfo, TrialRow, open_store

SPEC_TOML = """
name = "{name}"
optimizer = "{optimizer}"
batch_sizes = {{min = 8, max = 256}}
sparsities = [0.0, 0.9]
trials = 6
seeds = {seeds}

[workload]
dataset = "teacher"
model = "mlp"

[goal]
metric = "error"
target = 0.2

[search]
lr = {{scale = "log", min = 1e-3, max = 10.0}}
momentum = {momentum}

[budget]
max_steps = 20000

[probes]
batch_size = 32
"""

# Ground truth of the synthetic curves: S(B) = S_min (1 + B_crit / B) per sparsity level.
TRUTH = {0.0: (100.0, 200.0), 0.9: (220.0, 100.0)}
NOISE = 0.03   # log-normal measurement noise of the synthetic steps


def spec_text(name="synthetic", optimizer="sgd", seeds=(0,), momentum="0.0"):
    return SPEC_TOML.format(name=name, optimizer=optimizer, seeds=list(seeds), momentum=momentum)


def noisy_steps(sparsity: float, batch_size: int, seed: int, momentum_gain: float = 1.0) -> int:
    """The true curve times a fixed pseudo-random factor exp(N(0, NOISE)) per group."""
    s_min, b_crit = TRUTH[sparsity]
    noise = np.random.default_rng([int(100 * sparsity), batch_size, seed]).normal(0.0, NOISE)
    return int(round(s_min * (1.0 + momentum_gain * b_crit / batch_size) * math.exp(noise)))


# Probes consistent with TRUTH under the bound S = c (2 L Delta / eps) (1 + 4 sigma^2 / (eps B)):
# B_simple = the true B_crit, tr(Sigma) proportional to it (so 4 sigma^2 / eps = B_crit at every
# level) and L proportional to S_min (same Delta). Values wobble along the trajectory by factors
# whose median is 1, so the medians the report uses are exactly these.
PROBES = {0.0: {"trace_sigma": 50.0, "b_simple": 200.0, "local_lipschitz": 2.0},
          0.9: {"trace_sigma": 25.0, "b_simple": 100.0, "local_lipschitz": 4.4}}


def probe_rows(sparsity: float) -> list[ProbeRow]:
    p = PROBES[sparsity]
    rows = []
    for phase, steps in (("init", (0,)), ("trajectory", (1, 10, 100))):
        for step, wobble in zip(steps, (0.8, 1.0, 1.25) if phase == "trajectory" else (1.0,)):
            values = {"trace_sigma": p["trace_sigma"], "b_simple": p["b_simple"] * wobble,
                      "g_sq": p["trace_sigma"] / (p["b_simple"] * wobble),
                      "b_noise": 0.8 * p["b_simple"] * wobble, "hessian_top": 1.5 * p["local_lipschitz"],
                      "loss": 2.3 / (1 + step / 50)}
            if phase == "trajectory":
                values["local_lipschitz"] = p["local_lipschitz"] / wobble
            rows += [ProbeRow(sparsity, phase, step, 32 if phase == "trajectory" else None, q, v)
                     for q, v in values.items()]
    return rows


def make_store(run_dir, *, name="synthetic", optimizer="sgd", seeds=(0,), skip=(), fail=(),
               unreached=(), probes=True, momentum_gain=1.0):
    """Write a synthetic study. ``skip``: (sparsity, B) groups left out (an interrupted run);
    ``fail``: groups stored as failed; ``unreached``: groups where no trial met the goal."""
    mom = "{scale = \"reverse-log\", min = 0.5, max = 0.99}" if optimizer != "sgd" else "0.0"
    spec = loads(spec_text(name, optimizer, seeds, mom))
    info = StudyInfo(spec.name, spec.toml, spec.hash, spec.to_json())
    rng = np.random.default_rng(zlib.crc32(f"{name}-{optimizer}".encode()))
    with open_store(run_dir, info) as store:
        for sparsity in spec.sparsities:
            for b in spec.batch_sizes:
                for seed in spec.seeds:
                    key = hashlib.sha256(f"{sparsity}-{b}-{seed}".encode()).hexdigest()[:16]
                    cfg = json.dumps({"sparsity": sparsity, "batch_size": b, "seed": seed})
                    if (sparsity, b) in skip:
                        continue
                    if (sparsity, b) in fail:
                        store.write_group(GroupRecord(key, sparsity, b, seed, "failed", None, None,
                                                      20000, 1.0, 0, cfg, (), "RuntimeError: out of memory"))
                        continue
                    reach = (sparsity, b) not in unreached
                    steps = noisy_steps(sparsity, b, seed, momentum_gain) if reach else None
                    trials = []
                    # the best learning rate grows with B (trial 0 sits at the edge of the lr range)
                    best = 0 if b == 8 else 1 + min(2, int(math.log2(b / 16)) // 2)
                    for t in range(spec.trials):
                        lr = float(1e-3 * 10 ** (4 * (t + 0.5) / spec.trials))
                        m = 0.0 if optimizer == "sgd" else float(1 - 0.5 * 0.02 ** (t / spec.trials))
                        status = "diverged" if lr > 3 else ("reached" if reach and t == best else "not_reached")
                        hit = steps if status == "reached" else None
                        final = 0.15 if status == "reached" else (math.nan if status == "diverged" else 0.4)
                        curve = tuple((s, 2.0 / (1 + s / 100), 0.9 / (1 + s / 500)) for s in (0, 100, 200))
                        trials.append(TrialRow(t, lr, m, None, 1.0, status, hit, final, curve))
                    store.write_group(GroupRecord(key, sparsity, b, seed, "done", steps,
                                                  best if reach else None,
                                                  20000, float(rng.uniform(1, 2)), 6 * (steps or 20000),
                                                  cfg, tuple(trials)))
            if probes:
                store.write_probes(sparsity, probe_rows(sparsity))
    return run_dir


# ---------------------------------------------------------------------------------------------
# shared reports (each report takes a few seconds: build each once per module)

import sqlite3  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from experiments.report import ReportError, write_report  # noqa: E402
from experiments.store import StoreError  # noqa: E402

FIGURES = ("fig1_steps", "fig2_normalized", "fig3_metaparameters", "fig4_trials", "fig5_probes", "fig6_nqm")
TABLES = ("Steps to result", "Scaling fits", "Predicted vs measured", "Sparse / dense step ratios",
          "Missing and failed", "Cost and versions", "What was fitted and what was predicted",
          "Theory formulas", "Study specs", "Findings")
OUTPUTS = ("report.html", "report.md", "summary.csv", *(f"figures/{f}.png" for f in FIGURES))


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    run = make_store(tmp_path_factory.mktemp("full") / "run", seeds=(0, 1))
    write_report([run])
    return run


@pytest.fixture(scope="module")
def combined(tmp_path_factory):
    base = tmp_path_factory.mktemp("combined")
    sgd = make_store(base / "sgd", name="shallue", optimizer="sgd")
    mom = make_store(base / "momentum", name="shallue", optimizer="momentum", momentum_gain=2.0)
    write_report([sgd, mom], out=base / "both")
    return base


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    run = make_store(tmp_path_factory.mktemp("partial") / "run", skip={(0.9, 128), (0.9, 256)},
                     fail={(0.0, 8)}, unreached={(0.9, 8)}, probes=False)
    write_report([run])
    return run


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
    code = f"from experiments.report import write_report; write_report([{str(partial)!r}], out={str(out)!r})"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).parents[2])
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
    table = md.split("### Predicted vs measured")[1].split("###")[0]
    assert "| 90 % sparse | critical batch B_crit (bound 4σ²/ε) | 100 |" in table
    assert "| dense | critical batch B_crit ≈ B_simple (noise scale) | 200 |" in table
    assert table.count("| yes |") == 4      # every prediction held (the synthetic truth is exact)
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
    # the momentum stores double B_crit but keep the probes: the noise-scale route fails there
    assert "(A prediction held when within a factor 1.5 of the measurement: 5 of 8 did.)" in md
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
    assert "not measured" in md or (partial / "figures" / "fig5_probes.png").exists()
    # 90 % sparse still has 3 points (16, 32, 64): fitted; the dense curve lost B = 8 only
    assert s.loc[s.sparsity == 0.9, "fit_b_crit"].notna().all()


def test_cli_report_of_a_curve_with_too_few_points(tmp_path, capsys):
    from experiments.cli import main

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

from theory.walltime import predict_time_to_result  # noqa: E402
from training.costmodel import (  # noqa: E402
    CostModel, CostModelError, Measurements, StepTime, save_cost_model,
)

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
    """theory.walltime on the store's steps: the median over the seeds that reached the goal,
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
    from experiments.findings import load_runs, points_table
    from experiments.hardware import hardware_view

    sgd = make_store(tmp_path / "sgd", name="shallue", optimizer="sgd")
    mom = make_store(tmp_path / "momentum", name="shallue", optimizer="momentum", momentum_gain=2.0)
    other = CostModel(1e-3, 2e-6, 5e-4, 1e-9, 10_000, meta={"workload": "mnist1d/mlp"})
    save_cost_model(other, sgd)                   # a folder: written as cost_model.json
    runs = load_runs([sgd, mom])
    part = hardware_view(runs, points_table(runs))
    assert set(part.points.series) == {"shallue (sgd), dense", "shallue (sgd), 90 % sparse"}
    assert not part.points.extrapolated.any()     # no measurements: nothing known to be measured
    text = " ".join(part.paragraphs)
    assert "measured on mnist1d/mlp, not on this study's teacher/mlp" in text
    assert "stores no measurements" in text
    assert ("shallue (momentum): no cost model in its run folder; run `sparsescale bench ddp "
            "--out RUN_DIR/cost_model.json`") in text
    (sgd / "cost_model.json").write_text('{"format": "something else"}')
    with pytest.raises(CostModelError, match="cost_model.json.*'format'"):
        hardware_view(runs, points_table(runs))


def test_nqm_panel_sets_sgd_momentum_and_preconditioning_side_by_side():
    from experiments.findings import NQM_OPTIMIZER, nqm_curves

    df = nqm_curves()
    assert list(dict.fromkeys(df["optimizer"])) == ["sgd", "momentum", "preconditioned"]
    first = df[df["batch_size"] == 1.0].set_index("optimizer")["steps"]
    # Zhang et al. 2019: preconditioning needs fewer steps than momentum, momentum than SGD at most
    assert first["preconditioned"] < 0.5 * first["momentum"] <= first["sgd"]
    assert NQM_OPTIMIZER["adamw"] == NQM_OPTIMIZER["adam"] == "preconditioned"
    df.loc[:, "steps"] = 0.0   # a caller's edit does not reach the cached curves
    assert nqm_curves()["steps"].min() > 0
