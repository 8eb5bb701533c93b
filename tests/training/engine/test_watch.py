"""A watch hands the trainer's own weights out during the run: at each watched step t, every
trial still training with its weights after t - 1 and t updates, equal to the plain reference
loop's (float64); the trials train as they would without it, a diverged trial leaves it, and the
replay of a hit never calls it."""

import pytest
import torch

import training
from training.errors import ConfigError

STEPS = (1, 5, 6, 17)


@pytest.fixture(scope="module")
def setup():
    ds = training.data.load("teacher", n=300, dim=6, num_classes=3, hidden=8)
    net = training.models.build("mlp", ds, seed=0, hidden=[8]).double()
    trials = [training.Trial(lr=0.05, momentum=0.9), training.Trial(lr=0.2, momentum=0.5)]
    run = training.RunConfig(16, "momentum", max_steps=20, seed=3, dtype=torch.float64,
                             eval_schedule=training.EvalSchedule(every=4))
    return ds, net, trials, run


def _watched(ds, net, trials, run, steps=STEPS, **kw):
    seen = []

    def callback(t, ids, before, after):
        seen.append((t, list(ids), {k: v.clone() for k, v in before.items()},
                     {k: v.clone() for k, v in after.items()}))

    res = training.train_trials(net, ds, trials, run, watch=training.Watch(steps, callback), **kw)
    return res, seen


def test_the_weights_handed_out_are_the_reference_loops(setup):
    ds, net, trials, run = setup
    res, seen = _watched(ds, net, trials, run)
    plain = training.train_trials(net, ds, trials, run)
    assert [t for t, *_ in seen] == list(STEPS) and all(ids == [0, 1] for _, ids, *_ in seen)
    for name, p in plain.params.items():       # the watch changes nothing the trials compute
        assert torch.equal(res.params[name], p)
    assert [c.metric.tolist() for c in res.curves] == [c.metric.tolist() for c in plain.curves]
    for i, trial in enumerate(trials):
        ref = training.reference.train_schedule_reference(
            net, ds, trial, training.RunConfig(16, "momentum", max_steps=max(STEPS), seed=3,
                                               dtype=torch.float64),
            trial_index=i, snapshots=sorted({s for t in STEPS for s in (t - 1, t)}))
        for t, _, before, after in seen:
            for name in plain.params:
                assert torch.allclose(before[name][i], ref.snapshots[t - 1][name].double(),
                                      rtol=0, atol=1e-12)
                assert torch.allclose(after[name][i], ref.snapshots[t][name].double(),
                                      rtol=0, atol=1e-12)


def test_a_trial_that_diverged_leaves_the_watch(setup):
    ds, net, trials, run = setup
    blowing = trials + [training.Trial(lr=1e4, momentum=0.9)]
    res, seen = _watched(ds, net, blowing, run)
    gone = res.diverged_step[2]
    assert gone is not None
    for t, ids, before, after in seen:
        assert ids == ([0, 1, 2] if t <= gone else [0, 1])
        assert all(v.shape[0] == len(ids) for v in (*before.values(), *after.values()))


def test_a_hit_replay_does_not_call_it(setup):
    """A trial meeting the goal at an evaluation is replayed from the one before, step by step:
    the watch still sees each step once per trial."""
    ds, net, trials, run = setup
    plain = training.train_trials(net, ds, trials, run)
    # trial 0 first meets this target at its e-th evaluation (after step 0)
    metric, at = plain.curves[0].metric.tolist(), plain.curves[0].step.tolist()
    e = next(k for k in range(1, len(metric)) if metric[k] < min(metric[:k]))
    goal_run = training.RunConfig(16, "momentum", max_steps=20, seed=3, dtype=torch.float64,
                                  eval_schedule=training.EvalSchedule(every=4), stop="all",
                                  goal=training.Goal("error", metric[e], strict=False))
    res, seen = _watched(ds, net, trials, goal_run, steps=range(1, 21))
    assert at[e - 1] < res.hit_step[0] <= at[e]
    pairs = [(t, i) for t, ids, *_ in seen for i in ids]
    assert len(pairs) == len(set(pairs))
    # trial 0 trained to the evaluation that saw it meet the goal, then left the stack
    assert max(t for t, i in pairs if i == 0) == at[e]


@pytest.mark.parametrize("steps", [(0, 4), (2.5,)])
def test_bad_steps(setup, steps):
    ds, net, trials, run = setup
    with pytest.raises(ConfigError, match="watch steps"):
        training.train_trials(net, ds, trials, run,
                              watch=training.Watch(steps, lambda *a: None))
