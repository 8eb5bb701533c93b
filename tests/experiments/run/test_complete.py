"""Shallue et al.'s trial count: a group with complete_trials trains replacements for diverged
trials until `trials` of them completed, and its outcome is the one a single call with every
drawn point gives."""

from dataclasses import dataclass, replace

import numpy as np
import pytest

import experiments
import training
from experiments.run.complete import train_group
from training.results import Curve

from ..conftest import TINY, run_text

EVERY = 10


@dataclass
class Fake:
    """What train_trials returns, for points whose fate is fixed: ``hit`` (the step the goal
    is met) or ``diverge`` (the update that blows up), evaluated every 10 steps."""

    status: list
    hit_step: list
    diverged_step: list
    steps_taken: list
    curves: list
    steps_run: int
    steps_to_result: int | None
    program: str = "fake"


def fake_train(model, dataset, points, run, masks=None, first_index=0, init_params=None,
               program=None):
    hits = [p.get("hit") for p in points]
    dies = [p.get("diverge") for p in points]
    stop = run.max_steps
    for e in range(EVERY, run.max_steps + 1, EVERY):
        if run.stop == "first" and any(h is not None and h <= e and (d is None or d >= h)
                                       for h, d in zip(hits, dies)):
            stop = e
            break
    status, hit, died, taken = [], [], [], []
    for h, d in zip(hits, dies):
        if d is not None and d < stop and (h is None or d < h):
            status.append("diverged"), hit.append(None), died.append(d), taken.append(d)
        elif h is not None and h <= stop:
            status.append("reached"), hit.append(h), died.append(None), taken.append(stop)
        else:
            status.append("not_reached"), hit.append(None), died.append(None), taken.append(stop)
    steps = np.arange(0, stop + 1, EVERY)
    curves = [Curve(steps, np.ones(len(steps)), np.ones(len(steps))) for _ in points]
    reached = [h for h in hit if h is not None]
    return Fake(status, hit, died, taken, curves, stop, min(reached) if reached else None)


RUN = training.RunConfig(8, "momentum", max_steps=100, eval_schedule=training.EvalSchedule(every=EVERY))


def test_diverged_trials_are_replaced_and_the_group_reads_its_final_stop():
    points = [{"diverge": 5}, {"diverge": 30}, {"hit": 47}, {}]
    reserve = [{"hit": 22}, {"diverge": 3}, {}, {"hit": 1}]
    out = train_group(None, None, points, RUN, complete=True, reserve=reserve, train=fake_train)
    # round 1 stops at 50 (trial 2 hits 47) with 2 complete; round 2 (2 points, budget 50)
    # stops at 30 (reserve 0 hits 22); at that stop trial 1's divergence (update 30) never
    # happened and trial 2's hit is too late: 4 complete, no third round
    assert out.rounds == 2 and len(out.points) == 6
    assert out.status == ("diverged", "not_reached", "not_reached", "not_reached", "reached",
                          "diverged")
    assert (out.steps_to_result, out.best) == (22, 4) and out.complete == 4
    assert out.hit_step == (None, None, None, None, 22, None)
    assert all(c.step[-1] <= 30 for c in out.curves) and max(out.steps_taken) == 30


def test_without_complete_trials_the_group_is_one_call():
    points = [{"diverge": 5}, {"hit": 47}]
    out = train_group(None, None, points, RUN, reserve=[{"hit": 1}], train=fake_train)
    assert out.rounds == 1 and out.status == ("diverged", "reached") and out.steps_to_result == 47


def test_under_stop_all_replacements_train_the_whole_budget_and_the_reserve_can_run_out():
    points = [{"diverge": 5}, {"hit": 47}, {"hit": 90}]
    reserve = [{"diverge": 7}, {"diverge": 9}]
    out = train_group(None, None, points, replace(RUN, stop="all"), complete=True,
                      reserve=reserve, train=fake_train)
    assert out.rounds == 3 and out.complete == 2   # the reserve is spent: 2 of 3 complete
    assert out.status == ("diverged", "reached", "reached", "diverged", "diverged")
    assert (out.steps_to_result, out.best) == (47, 1)


COMPLETE = (TINY.replace("seeds = [0]", "seeds = [0]\ncomplete_trials = true")
            .replace("batch_sizes = [8, 32, 128]", "batch_sizes = [8, 32]")
            .replace("sparsities = [0.0, 0.5]", "sparsities = [0.0]")
            .replace("min = 0.01, max = 1.0", "min = 0.03, max = 300.0"))   # some diverge


def test_a_study_counts_complete_trials_as_one_call_with_every_drawn_point(tmp_path):
    res = run_text(tmp_path, COMPLETE, "complete")
    spec = experiments.load_spec(tmp_path / "complete.toml")
    assert spec.complete_trials and "complete_trials" in spec.to_json()
    plans = {p.key: p for p in experiments.plan(spec)}
    grew = 0
    for g in res.groups.itertuples(index=False):
        t = res.trials[res.trials.group_key == g.key].sort_values("trial")
        plan = plans[g.key]
        drawn = list(plan.trials) + list(plan.reserve[:len(t) - spec.trials])
        # the points stored are the Sobol sequence's first len(t), in order
        assert t.lr.tolist() == pytest.approx([p["lr"] for p in drawn])
        complete = (t.status != "diverged").sum()
        assert complete == spec.trials or len(t) == 2 * spec.trials
        grew += len(t) > spec.trials
        ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
        net = training.models.build("mlp", ds, seed=0, hidden=[16])
        one = training.train_trials(net, ds, drawn, training.RunConfig(
            int(g.batch_size), "momentum", max_steps=int(g.max_steps),
            goal=training.Goal("error", 0.3), eval_schedule=training.EvalSchedule(every=10)))
        assert t.status.tolist() == one.status
        assert g.steps_to_result == one.steps_to_result
    assert grew, "no group had a diverged trial to replace: widen the learning-rate range"


def test_complete_trials_refuse_per_trial_initializations():
    """A replacement trial has no initialization of its own: refused, never trained on the
    first trial's."""
    with pytest.raises(training.ConfigError, match="replacement trial"):
        train_group(None, None, [{}], RUN, complete=True, init_params={"w": None},
                    train=fake_train)
