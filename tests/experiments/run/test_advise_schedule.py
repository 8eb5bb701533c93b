"""``advise --schedule`` on the teacher data: the CBS warmup and goodput against the recommended
fixed batch size over 5 replicates; the fixed B's replicate 0 is the base trial at that B with the
rule-scaled lr; the recommendation is the policy whose time-ratio interval lies below 1."""

from dataclasses import replace

import pytest

import training
from experiments.cli import main as cli
from experiments.run.advise import advise
from experiments.run.advise_schedule import schedule_advice
from experiments.run.workload import Workload
from experiments.spec.study import loads
from theory.estimators.branching import lr_scale

from ..conftest import TINY

SPEC = loads(TINY)


@pytest.fixture(scope="module")
def both():
    advice = advise(SPEC, k_max=8, quiet=True)
    return advice, schedule_advice(SPEC, advice, replicates=5)


def test_schedules_against_the_recommended_fixed_batch(both):
    advice, sa = both
    t = sa.table.set_index("policy")
    assert set(t.index) == {"best fixed", "cbs_warmup", "goodput"} and (t.replicates == 5).all()
    assert sa.fixed >= advice.base_batch and sa.fixed & (sa.fixed - 1) == 0
    assert sa.schedules["best fixed"] == [[0, sa.fixed, 1.0]]
    assert sa.schedules["cbs_warmup"][0][1] == advice.base_batch
    winners = t[t.verdict == "beats"]
    assert sa.recommended == (None if winners.empty else winners.ratio.idxmin())
    assert ("recommended schedule" in sa.summary()) == (sa.recommended is not None)
    # the fixed B's replicate 0: the base trial at that batch size, lr by the rule, to its goal
    workload = Workload.of(SPEC)
    ds = workload.load_dataset()
    run = training.RunConfig(sa.fixed, SPEC.optimizer, max_steps=SPEC.budget.steps(sa.fixed), seed=0,
                             goal=training.Goal(SPEC.metric, SPEC.target, SPEC.strict),
                             eval_schedule=SPEC.eval, stop="all")
    trial = replace(advice.trial, lr=advice.trial.lr * lr_scale(sa.fixed // advice.base_batch,
                                                                 SPEC.optimizer))
    res = training.train_trials(workload.build_model(ds, 0), ds, [trial], run,
                                first_index=advice.trial_index)
    fixed_steps = t.loc["best fixed"]
    assert res.hit_step[0] is not None and fixed_steps.reached == 5


def test_cli_flag(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY)
    assert cli.main(["advise", str(spec), "--k-max", "4", "--schedule", "5", "--quiet",
                     "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "fixed B =" in out and ("recommended schedule" in out or "no schedule" in out)
