"""Branching in a study: the stored CBS(t) rows are branch_critical_batch of the best trial at the
smallest batch size that reached the goal, replayed from the study's own model, mask and data
order; reruns skip what is stored; ``sparsescale branch`` measures a stored study with overrides."""

import json

import pandas as pd
import pytest

import training
from experiments.cli import main as cli
from experiments.run.branching import branch_critical_batch
from experiments.run.workload import base_group
from experiments.run.workload import best_trial, stored_trial
from experiments.run.runner import run_study
from experiments.run.timing import TIMING_FILE
from experiments.spec.study import loads
from experiments.store.database import open_store
from experiments.store.results import load_results
from experiments.run.workload import Workload

from ..conftest import TINY

BRANCHED = TINY + ("\n[branching]\nenabled = true\ncheckpoints = 3\nk_max = 4\nwarmup_replicates = 3\n"
                   "warmup_examples = 3000\n")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("branched") / "run"
    run_study(loads(BRANCHED), out=out, workers=1, quiet=True, report=False)
    return out


def test_stored_rows_are_the_measurement_of_the_base_run(study):
    res = load_results(study)
    spec, b = res.spec, res.branching
    assert sorted(set(zip(b.sparsity, b.seed))) == [(0.0, 0), (0.5, 0)]
    for sparsity in (0.0, 0.5):
        group = base_group(res.groups, sparsity, 0, "smallest")
        rows = b[b.sparsity == sparsity]
        assert rows.step.tolist()[-1] == group.steps_to_result and len(rows) == 3
        assert (rows.batch_size == group.batch_size).all() and (rows.k_max == 4).all()
        # the same measurement, made here from the spec's pieces
        workload = Workload.of(spec)
        ds = workload.load_dataset()
        mask = workload.masks(ds, [(sparsity, 0)])[(sparsity, 0)]
        with open_store(study) as store:
            trial = best_trial(store, group.key)
        run = training.RunConfig(int(group.batch_size), spec.optimizer, max_steps=int(group.max_steps), seed=0,
                                 goal=training.Goal(spec.metric, spec.target, spec.strict),
                                 eval_schedule=spec.eval)
        want = branch_critical_batch(workload.build_model(ds, 0), ds, stored_trial(trial), run, mask=mask,
                                     trial_index=int(trial.trial), goal_step=int(group.steps_to_result),
                                     checkpoints=3, k_max=4)
        assert rows.critical_batch.tolist() == want.critical.critical_batch.tolist()
        assert rows.low.tolist() == want.critical.low.tolist() and rows.high.tolist() == want.critical.high.tolist()
        assert (rows.trial_steps == want.trial_steps).all()
    w = res.warmup
    assert set(w.kind) == {"warmup", "fixed"} and (w.examples_budget == 3000).all()
    assert w.groupby(["sparsity", "kind", "batch_size"]).size().eq(3).all()


def test_each_level_stores_its_seconds_and_timing_sums_them(study):
    b = load_results(study).branching
    levels = b.drop_duplicates(["sparsity", "seed"])
    assert len(levels) == 2 and (levels.seconds > 0).all()
    assert b.groupby(["sparsity", "seed"]).seconds.nunique().eq(1).all()
    tasks = json.loads((study / TIMING_FILE).read_text())["tasks"]
    assert tasks["branching"] == {"tasks": 2, "seconds": pytest.approx(levels.seconds.sum()),
                                  "unit": "measurement"}
    assert tasks["probes"]["tasks"] == 0   # the tiny study does not probe


def test_a_rerun_keeps_what_is_stored(study):
    before = load_results(study).branching
    run_study(loads(BRANCHED), out=study, workers=1, quiet=True, report=False)
    pd.testing.assert_frame_equal(load_results(study).branching, before)


def test_cli_branch_measures_a_stored_study_with_overrides(study, tmp_path, capsys):
    status = cli.main(["branch", str(study), "--k-max", "2", "--checkpoints", "4", "--seeds", "1",
                       "--no-warmup", "--redo", "--no-report", "--quiet"])
    out = capsys.readouterr().out
    assert status == 0 and out.count("CBS = ") == 8
    b = load_results(study).branching
    assert (b.k_max == 2).all() and (b.n_seeds == 1).all() and len(b) == 8
    assert (b.low == b.critical_batch).all()   # one seed: no interval
    assert load_results(study).warmup.empty
    # a bad override is one error line
    assert cli.main(["branch", str(study), "--k-max", "3", "--redo", "--no-report", "--quiet"]) == 2
    assert "k_max must be a power of two" in capsys.readouterr().err
