"""The study's timing breakdown: phases of the invocation, training per batch size."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import experiments
from experiments.run.timing import TIMING_FILE, PhaseClock, format_timing


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
    assert set(timing["phases"]) == {"masks", "training"}
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
        assert r["kernels"] == sorted(set(mine.kernel))
        assert set(mine.kernel) <= {"fused", "batched"}   # the tiny study's MLP
    assert format_timing(timing) in printed
    # a rerun trains nothing: no training phase, the same groups per batch size
    experiments.run_study(tiny_toml, out=out, executor=ThreadPoolExecutor(1), report=False,
                          quiet=True)
    again = json.loads((out / TIMING_FILE).read_text())
    assert "training" not in again["phases"] and again["training"] == timing["training"]
    assert capsys.readouterr().out == ""
