"""L at Lee et al.'s stage taken inside the run: the same numbers as the replay path (float64,
to 1e-10), every trial that did not diverge measured up to its own end, the whole-split check at
every level, and the spec's rules for it."""

import pytest
import torch

import pruning
import theory
import training
from experiments.measures.stage.inside import FULL, InsideL, InsidePlan, inside_plan, run_end
from experiments.spec.study import SpecError, loads

from ..conftest import TINY, run_text

EVERY, START, BUDGET, SAMPLE = 4, 8, 40, 150
IN_RUN = (TINY.replace("batch_sizes = [8, 32, 128]", "batch_sizes = [8, 16]")
          .replace("target = 0.3", "target = 0.15")
          .replace("max = 200", f"max = {BUDGET}")
          .replace("min = 0.01, max = 1.0", "min = 0.003, max = 0.03")
          .replace("seeds = [0]", 'seeds = [0]\nstop = "all"')
          .replace("enabled = false",
                   'enabled = true\nbatch_sizes = ["smallest"]\npoints = 3\naverage = 2\n'
                   f"hessian_examples = 4\nlanczos = 5\nlipschitz_every = {EVERY}\n"
                   f"lipschitz_start = {START}\nlipschitz_examples = {SAMPLE}\n"
                   "lipschitz_in_run = true\nexamples = 200"))


@pytest.fixture(scope="module")
def tiny():
    ds = training.data.load("teacher", n=300, dim=6, num_classes=3, hidden=8)
    net = training.models.build("mlp", ds, seed=0, hidden=[8]).double()
    mask = pruning.prune(net, "snip", 0.5, dataset=ds, seed=0)
    return ds, net, mask


def test_L_inside_the_run_equals_the_replays_in_float64(tiny):
    ds, net, mask = tiny
    trials = [training.Trial(lr=0.05, momentum=0.9), training.Trial(lr=0.1, momentum=0.5)]
    run = training.RunConfig(16, "momentum", max_steps=BUDGET, seed=0, dtype=torch.float64)
    steps = theory.stage_steps(BUDGET, EVERY, START)
    assert steps[0] == START and steps[-1] == BUDGET
    inside = InsideL(InsidePlan(steps, SAMPLE, check=True, dtype=torch.float64), net, ds,
                     lambda trial: mask)
    training.train_trials(net, ds, trials, run, masks=mask, watch=inside.watch())
    for i, trial in enumerate(trials):
        for examples, quantity, at in ((SAMPLE, "local_lipschitz", steps), (None, FULL, steps[:1])):
            replay = theory.probe_trajectory(
                net, ds, trial, run, at, BUDGET, mask=mask, trial_index=i,
                quantities=("local_lipschitz",), lipschitz_update="into",
                lipschitz_examples=examples, lipschitz_seed=0, dtype=torch.float64)
            for t, value in zip(replay.step, replay.value):
                if quantity == FULL and i:
                    assert (i, t, FULL) not in inside.values   # the check: trial 0 only
                    continue
                assert inside.values[(i, int(t), quantity)] == pytest.approx(value, rel=1e-10)
    # a trial's rows end at its run's end; a trial without an end (diverged) has none
    rows = inside.rows(0.5, 0, 16, {0: 20})
    assert {r.trial for r in rows} == {0} and max(r.step for r in rows) == 20
    assert {r.examples for r in rows if r.quantity == FULL} == {None}


def test_run_end():
    curve = training.Curve.from_rows([(0, 1.0, 0.5), (10, 0.5, 0.3), (20, 0.4, 0.2)])
    assert run_end("reached", 13, curve) == 13
    assert run_end("not_reached", None, curve) == 20
    assert run_end("diverged", None, curve) is None


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    return run_text(tmp_path_factory.mktemp("inside"), IN_RUN, "inside")


def test_a_study_measures_every_run_of_its_probed_groups_in_the_run(staged):
    s, t, g = staged.stage_probes, staged.trials, staged.groups
    # L only (the noise at Lee's stage is the replay's), at the smallest batch size
    assert set(s.quantity) == {"local_lipschitz", FULL} and set(s.batch_size) == {8}
    for group in g[g.batch_size == 8].itertuples():
        mine = t[t.group_key == group.key]
        kept = mine[mine.status != "diverged"]
        rows = s[(s.sparsity == group.sparsity) & (s.quantity == "local_lipschitz")]
        assert sorted(set(rows.trial)) == sorted(kept.trial)
        for row in kept.itertuples():
            end = int(row.hit_step) if row.status == "reached" else BUDGET
            run = rows[rows.trial == row.trial]
            assert sorted(run.step) == list(range(START, end + 1, EVERY))
            assert set(run.horizon) == {end} and set(run.examples) == {SAMPLE}
            assert (run.seconds > 0).all()
    # the whole split's L at the first point of trial 0 of EVERY level
    full = s[s.quantity == FULL]
    assert sorted(full.sparsity) == [0.0, 0.5] and set(full.step) == {START}
    assert set(full.trial) == {0} and full.examples.isna().all()
    # the probes along [0, H] are still replayed, for the best trial
    assert len(staged.probes) and set(staged.probes.batch_size) == {8}


def test_the_plan_of_a_group():
    spec = loads(IN_RUN)
    plan = inside_plan(spec, 0.5, 8, 0, BUDGET)
    assert plan.steps == tuple(range(START, BUDGET + 1, EVERY)) and plan.examples == SAMPLE
    assert plan.check and spec.probes.lipschitz_check == (0.0, 0.5)
    assert inside_plan(spec, 0.5, 16, 0, BUDGET) is None          # not a probed batch size
    assert inside_plan(spec, 0.5, 8, 0, BUDGET, delay=2) is None   # a delayed group
    assert inside_plan(spec, 0.5, 8, 0, START - 1) is None          # no point before the end


@pytest.mark.parametrize("edit, key, word", [
    (("lipschitz_in_run = true", "lipschitz_in_run = true\nlipschitz_trials = 2"),
     "probes.lipschitz_trials", "not used with lipschitz_in_run"),
    (('batch_sizes = ["smallest"]', 'batch_sizes = ["b_crit"]'), "probes.batch_sizes",
     "known only once the sweep is trained"),
    (("lipschitz_in_run = true", "lipschitz_in_run = true\nlipschitz_check = [0.0]"),
     "probes.lipschitz_check", "lacks 0.5"),
    (("lipschitz_in_run = true", "lipschitz_in_run = 1"), "probes.lipschitz_in_run",
     "true or false"),
    (("lipschitz_every = 4\n", ""), "probes.lipschitz_in_run", "only used with"),
])
def test_bad_keys(edit, key, word):
    with pytest.raises(SpecError) as err:
        loads(IN_RUN.replace(*edit))
    lines = [p for p in err.value.problems if p.startswith(f"{key}:")]
    assert lines and word in lines[0], err.value.problems


def test_in_the_hash_only_when_set():
    on, off = loads(IN_RUN), loads(IN_RUN.replace("lipschitz_in_run = true\n", ""))
    assert "lipschitz_in_run" in on.to_json() and "lipschitz_in_run" not in off.to_json()
    assert on.hash != off.hash
