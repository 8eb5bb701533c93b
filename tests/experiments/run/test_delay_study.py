"""A tiny study with a delay axis (delays [0, 2]), end to end: a group per (level, B, delay,
seed), each delayed group's steps those of training.train_trials with the delay, the delay-0
groups those of the study without the axis, and the report's delay section."""

import json

import training
from experiments.report.write import write_report
from experiments.run.workload import Workload
from experiments.spec.study import loads

from ..conftest import TINY, run_text

DELAYED = "delays = [0, 2]\n" + TINY.replace("sparsities = [0.0, 0.5]", "sparsities = [0.0]")


def test_a_delay_axis_trains_every_delay_and_keeps_the_synchronous_groups(tmp_path, monkeypatch):
    res = run_text(tmp_path, DELAYED, "delayed")
    g = res.groups
    assert sorted(zip(g.batch_size, g.delay)) == [(8, 0), (8, 2), (32, 0), (32, 2), (128, 0),
                                                  (128, 2)]
    assert (g.status == "done").all() and set(res.trials.delay) == {0, 2}
    assert g.steps_to_result.notna().all()
    # the stale gradient costs steps at the smallest batch (where the step is the largest)
    steps = g.set_index(["batch_size", "delay"])["steps_to_result"]
    assert steps[(8, 2)] > steps[(8, 0)]
    # one delayed group again, by hand: train_trials on its planned trials, each with delay 2
    spec = loads(DELAYED)
    row = g[(g.batch_size == 32) & (g.delay == 2)].iloc[0]
    cfg = json.loads(row.config_json)
    assert all(t["delay"] == 2 for t in cfg["trials"])
    workload = Workload.of(spec)
    ds = workload.load_dataset()
    run = training.RunConfig(32, spec.optimizer, max_steps=int(row.max_steps),
                             goal=training.Goal(**cfg["goal"]),
                             eval_schedule=training.EvalSchedule(**cfg["eval"]), seed=0)
    direct = training.train_trials(workload.build_model(ds, 0), ds, cfg["trials"], run)
    assert direct.steps_to_result == int(row.steps_to_result)
    # the synchronous groups are the study's without the axis: same keys, same steps
    (tmp_path / "plain").mkdir()
    plain = run_text(tmp_path / "plain", TINY.replace("sparsities = [0.0, 0.5]",
                                                      "sparsities = [0.0]"), "plain")
    sync = g[g.delay == 0].set_index("key")["steps_to_result"]
    assert sync.to_dict() == plain.groups.set_index("key")["steps_to_result"].to_dict()
    monkeypatch.setattr("experiments.measures.delay.view.N_BOOT", 5)
    write_report([tmp_path / "run"], out=tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Asynchronous updates: the gradient delay" in md
    assert "### Critical delay per batch size, measured and predicted" in md
