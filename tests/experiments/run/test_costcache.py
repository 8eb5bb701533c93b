"""This machine's DDP cost model for a study: measured once per machine and workload, cached,
copied into the run folder so the study report shows time-to-result."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from experiments.cli import main as cli
from experiments.run import costcache
from experiments.run.costcache import cache_path, ensure_cost_model, measure_cost_model
from experiments.run.workload import Workload
from training.distributed import costmodel

WORKLOAD = Workload("teacher", "mlp", dataset_options={"n": 600, "dim": 8, "num_classes": 3, "hidden": 16},
                    model_options={"hidden": [16]})
# a cost model with known constants: t(B, k) = 1 ms + 2 us B / k (+ ring all-reduce)
KNOWN = costmodel.CostModel(t_fixed=1e-3, t_example=2e-6, alpha=5e-5, beta=1e-9, n_params=100,
                            bytes_per_param=4, meta={"workload": "teacher/mlp"})
MEAS = costmodel.Measurements((costmodel.StepTime(1, 32, KNOWN.step_time(32, 1)),
                               costmodel.StepTime(1, 256, KNOWN.step_time(256, 1))), (), 100)


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """Cache under tmp_path; measure_cost_model replaced by one returning KNOWN, counting calls."""
    monkeypatch.setenv("SPARSESCALE_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake(workload, protocol=costcache.QUICK_PROTOCOL):
        calls.append(workload)
        return KNOWN, MEAS

    monkeypatch.setattr(costcache, "measure_cost_model", fake)
    return calls


def test_measured_once_per_machine_and_workload_then_copied(measured, tmp_path):
    (tmp_path / "a").mkdir()
    a = ensure_cost_model(tmp_path / "a", WORKLOAD, quiet=True)
    (tmp_path / "b").mkdir()
    b = ensure_cost_model(tmp_path / "b", WORKLOAD, quiet=True)
    assert len(measured) == 1 and a.read_text() == b.read_text() == cache_path(WORKLOAD).read_text()
    assert costmodel.load_cost_model(b) == KNOWN
    assert costmodel.load_measurements(b) == MEAS
    other = replace(WORKLOAD, model_options={"hidden": [32]})
    (tmp_path / "c").mkdir()
    ensure_cost_model(tmp_path / "c", other, quiet=True)
    assert len(measured) == 2 and cache_path(other) != cache_path(WORKLOAD)


def test_the_cache_key_names_host_cpu_torch_and_workload(monkeypatch):
    key = costcache.machine_key(WORKLOAD)
    assert set(key) == {"host", "cpu", "cpu_count", "torch", "workload"}
    before = cache_path(WORKLOAD)
    monkeypatch.setattr(costcache.platform, "node", lambda: "another-host")
    assert cache_path(WORKLOAD) != before and cache_path(WORKLOAD).name.startswith("teacher-mlp-")


def test_a_cost_model_already_in_the_run_folder_is_kept(measured, tmp_path):
    (tmp_path / "run").mkdir()
    mine = costmodel.save_cost_model(KNOWN, tmp_path / "run" / "cost_model.json")
    text = mine.read_text()
    assert ensure_cost_model(tmp_path / "run", WORKLOAD, quiet=True) == mine
    assert mine.read_text() == text and measured == []


def test_a_failed_measurement_warns_and_the_study_stands(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SPARSESCALE_CACHE", str(tmp_path / "cache"))

    def broken(workload, protocol=costcache.QUICK_PROTOCOL):
        raise RuntimeError("no free port\nmore detail")

    monkeypatch.setattr(costcache, "measure_cost_model", broken)
    (tmp_path / "run").mkdir()
    assert ensure_cost_model(tmp_path / "run", WORKLOAD, quiet=True) is None
    err = capsys.readouterr().err
    assert err == ("warning: cost model not measured (RuntimeError: no free port); the report has "
                   "no time-to-result\n")
    assert not (tmp_path / "run" / "cost_model.json").exists() and not cache_path(WORKLOAD).exists()


def test_study_report_shows_time_to_result_without_a_second_command(measured, tiny_toml, tmp_path):
    assert cli.main(["study", str(tiny_toml), "--out", str(tmp_path / "run"), "--workers", "1",
                     "--quiet"]) == 0
    assert json.loads((tmp_path / "run" / "cost_model.json").read_text())["t_fixed"] == 1e-3
    page = (tmp_path / "run" / "report.md").read_text()
    assert "Predicted time to result on k workers" in page and "No cost model" not in page
    assert (tmp_path / "run" / "time_to_result.csv").exists() and len(measured) == 1


def test_no_cost_model_skips_it(measured, tiny_toml, tmp_path):
    assert cli.main(["study", str(tiny_toml), "--out", str(tmp_path / "run"), "--workers", "1",
                     "--quiet", "--no-cost-model", "--no-report"]) == 0
    assert not (tmp_path / "run" / "cost_model.json").exists() and measured == []


@pytest.mark.slow
def test_real_measurement_fits_positive_constants():
    fit, meas = measure_cost_model(WORKLOAD)
    assert fit.t_fixed > 0 and fit.t_example >= 0 and fit.n_params == meas.n_params
    assert {s.per_worker_batch for s in meas.steps} == set(costcache.QUICK_PROTOCOL.per_worker_batches)
