"""The study's timing breakdown: phases of the invocation, summed task seconds per kind, training
per batch size."""

import json
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

import experiments
from experiments.run.timing import TIMING_FILE, PhaseClock, format_timing, task_seconds


def test_phase_clock_accumulates_wall_time(monkeypatch):
    now = iter([0.0, 1.5, 10.0, 12.0, 20.0, 20.25])
    monkeypatch.setattr("experiments.run.timing.time.perf_counter", lambda: next(now))
    clock = PhaseClock()
    for name in ("training", "training", "report"):
        with clock.phase(name):
            pass
    assert clock.phases == {"training": 3.5, "report": 0.25}


def test_study_records_and_prints_its_breakdown(tiny_toml, tmp_path, capsys):
    out = tmp_path / "run"
    experiments.run_study(tiny_toml, out=out, executor=ThreadPoolExecutor(1), report=False)
    printed = capsys.readouterr().out
    timing = json.loads((out / TIMING_FILE).read_text())
    assert set(timing["phases"]) == {"masks", "programs", "training"}
    assert all(v > 0 for v in timing["phases"].values())
    groups = experiments.load_results(out).groups
    rows = {r["batch_size"]: r for r in timing["training"]}
    assert sorted(rows) == [8, 32, 128]
    for b, r in rows.items():
        mine = groups[groups.batch_size == b]
        assert r["groups"] == len(mine) == 2
        assert r["trial_steps"] == int(mine.trial_steps.sum())
        assert r["seconds"] == pytest.approx(float(mine.wall_time.sum()))
        assert r["trial_steps_per_s"] == pytest.approx(r["trial_steps"] / r["seconds"])
        assert r["programs"] == sorted(set(mine.program))
        assert set(mine.program) <= {"fused", "batched"}   # the tiny study's MLP
    assert timing["tasks"]["training"] == {"tasks": 6, "unit": "group",
                                           "seconds": pytest.approx(float(groups.wall_time.sum()))}
    assert timing["tasks"]["probes"] == {"tasks": 0, "seconds": 0.0, "unit": "run",
                                         "share": "probe_share"}
    assert timing["tasks"]["branching"] == {"tasks": 0, "seconds": 0.0, "unit": "measurement"}
    assert timing["tasks"]["probe_share"] == 0.0
    assert format_timing(timing) in printed and "task seconds" in printed
    # a rerun trains nothing: no training phase, the same groups per batch size
    experiments.run_study(tiny_toml, out=out, executor=ThreadPoolExecutor(1), report=False,
                          quiet=True)
    again = json.loads((out / TIMING_FILE).read_text())
    assert "training" not in again["phases"] and again["training"] == timing["training"]
    assert capsys.readouterr().out == ""


def test_task_seconds_sum_each_kind_of_task_apart():
    nan = float("nan")
    groups = pd.DataFrame({"status": ["done", "done", "failed"], "wall_time": [2.0, 3.0, 7.0]})
    # two probed runs (one row per quantity and step, the run's seconds on each)
    probes = pd.DataFrame({"sparsity": [0.0, 0.0, 0.0, 0.9], "seed": [0, 0, 0, 0],
                           "batch_size": [8, 8, 64, 8], "seconds": [1.5, 1.5, 0.25, 0.5]})
    branching = pd.DataFrame({"sparsity": [0.0, 0.0, 0.9], "seed": [0, 0, 0],
                              "seconds": [4.0, 4.0, nan]})   # 0.9: written before the column
    tables = {"groups": groups, "probes": probes, "branching": branching,
              "stage_probes": pd.DataFrame(columns=["sparsity", "seed", "batch_size", "trial"])}
    tasks = task_seconds(tables.__getitem__)
    assert tasks["training"] == {"tasks": 2, "seconds": 5.0, "unit": "group"}   # failed left out
    assert tasks["probes"] == {"tasks": 3, "seconds": 2.25, "unit": "run", "share": "probe_share"}
    assert tasks["branching"] == {"tasks": 2, "seconds": 4.0, "unit": "measurement"}
    assert tasks["probe_share"] == pytest.approx(2.25 / 5.0)
    text = format_timing({"phases": {"training": 1.0}, "tasks": tasks, "training": []})
    assert ("training 5.0 s in 2 groups, branching 4.0 s in 2 measurements, "
            "probes 2.2 s in 3 runs (45 % of training)") in text
    # a store whose probes predate their seconds: unknown, not zero, and no share
    old = task_seconds({**tables, "probes": probes.assign(seconds=nan),
                        "branching": branching.iloc[:0]}.__getitem__)
    assert old["probes"]["seconds"] is None and old["probe_share"] is None
    assert old["branching"] == {"tasks": 0, "seconds": 0.0, "unit": "measurement"}
    assert "branching 0.0 s in 0 measurements, probes ? s in 3 runs" in format_timing(
        {"phases": {}, "tasks": old, "training": []})
