"""The measured program choice (training.engine.choice): the fastest candidate wins, on a fake
clock; the cache spares the second call its measurement and a changed module measures again;
the trainer's result does not depend on the choice nor on measuring (float64, the plain loop's
values), and the real trials' generator and state are untouched; trials spread over threads
compute what one thread computes."""

import json
from dataclasses import replace

import pytest
import torch
from torch import nn

import training
from training import EvalSchedule, RunConfig, Trial
from training.engine import choice
from training.engine.strategy import Strategy, candidate_strategies

F64 = torch.float64


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_candidates(seconds):
    """Plans whose one step advances the fake clock by ``seconds[name]`` per trial (2 trials)."""
    return [Strategy(name, 2, 8, program=object()) for name in seconds]


def timer(clock, seconds, calls):
    def time_step(plan):
        calls.append(plan.name)

        def step():
            clock.now += 2 * seconds[plan.name]
            return 2
        return step
    return time_step


def test_the_fastest_candidate_wins_and_is_cached(tmp_path):
    clock, calls = FakeClock(), []
    seconds = {"per_trial": 3e-3, "plain": 5e-3, "func": 1e-3}
    path = tmp_path / "choices.json"
    plan, measured = choice.choose(fake_candidates(seconds), "k1", timer(clock, seconds, calls),
                                   path, clock)
    assert (plan.name, plan.choice) == ("func", "measured")
    assert measured == pytest.approx(seconds)
    assert calls == ["per_trial", "plain", "func"]
    assert json.loads(path.read_text())["k1"]["program"] == "func"
    # the second call reads the cache: nothing is timed
    plan, measured = choice.choose(fake_candidates(seconds), "k1", timer(clock, seconds, calls),
                                   path, clock)
    assert (plan.name, measured, len(calls)) == ("func", {}, 3)
    # another key (another module structure) is measured, and both stay cached
    slow_func = {**seconds, "func": 9e-3}
    plan, measured = choice.choose(fake_candidates(slow_func), "k2",
                                   timer(clock, slow_func, calls), path, clock)
    assert plan.name == "per_trial" and len(calls) == 6
    assert set(json.loads(path.read_text())) == {"k1", "k2"}


def test_a_failing_candidate_is_dropped_and_a_corrupt_cache_remeasured(tmp_path):
    clock, calls = FakeClock(), []
    seconds = {"per_trial": 3e-3, "func": 1e-3}

    def time_step(plan):
        if plan.name == "func":
            raise RuntimeError("no batching rule")
        return timer(clock, seconds, calls)(plan)

    path = tmp_path / "choices.json"
    path.write_text("{not json")
    plan, measured = choice.choose(fake_candidates(seconds), "k", time_step, path, clock)
    assert plan.name == "per_trial" and list(measured) == ["per_trial"]


def test_setting_rejects_an_unknown_value(monkeypatch):
    monkeypatch.setenv("SPARSESCALE_CHOICE", "fastest")
    with pytest.raises(training.ConfigError, match="SPARSESCALE_CHOICE='fastest'; allowed"):
        choice.setting()


class SmallCNN(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, width, 3), nn.Linear(width * 3 * 3, 3)

    def forward(self, x):
        return self.fc(torch.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))


def images(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
    return training.Dataset("images", "classification", x[:64], y[:64], x[64:], y[64:], 3,
                            (1, 8, 8))


TRIALS = [Trial(lr=0.05, momentum=0.9), Trial(lr=0.1, momentum=0.5)]
RUN = RunConfig(8, max_steps=10, dtype=F64, eval_schedule=EvalSchedule(every=5))


def test_the_trainer_measures_once_per_structure_and_trains_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSESCALE_CACHE", str(tmp_path))
    monkeypatch.setenv("SPARSESCALE_CHOICE", "measure")
    timed = []
    real = choice.measure
    monkeypatch.setattr(choice, "measure", lambda plan, *a, **k: timed.append(plan.name)
                        or real(plan, *a, **k))
    ds = images()
    torch.manual_seed(1)
    net = SmallCNN()
    names = [p.name for p in candidate_strategies(net, ds.task, ds.input_shape, 8, 2, F64)]
    assert set(names) == {"per_trial", "plain", "func"}
    before = torch.get_rng_state()
    res = training.train_trials(net, ds, TRIALS, RUN)
    assert torch.equal(torch.get_rng_state(), before)
    assert res.program_choice == "measured" and res.program in names
    assert sorted(timed) == sorted(names)
    again = training.train_trials(net, ds, TRIALS, RUN)   # cached: nothing timed
    assert len(timed) == len(names) and again.program == res.program
    assert all(torch.equal(res.params[k], again.params[k]) for k in res.params)
    # every candidate gives the same trials as the measured run (float64 rounding)
    for name in names:
        monkeypatch.setenv("SPARSESCALE_CHOICE", name)
        other = training.train_trials(net, ds, TRIALS, RUN)
        assert other.program == name
        for k in res.params:
            torch.testing.assert_close(other.params[k], res.params[k], rtol=1e-12, atol=1e-14)
        assert [c.metric.tolist() for c in other.curves] == [c.metric.tolist()
                                                              for c in res.curves]
    monkeypatch.setenv("SPARSESCALE_CHOICE", "measure")
    torch.manual_seed(1)
    training.train_trials(SmallCNN(width=5), ds, TRIALS, RUN)   # another structure: measured
    assert len(timed) == 2 * len(names)
    assert len(json.loads((tmp_path / choice.CACHE_NAME).read_text())) == 2


def test_trials_spread_over_threads_equal_one_thread(monkeypatch):
    """Two trials side by side, one thread each, bit for bit the one-thread run."""
    monkeypatch.setenv("SPARSESCALE_CHOICE", "per_trial")
    ds = images()
    torch.manual_seed(1)
    net = SmallCNN()
    trials = TRIALS * 2
    one = training.train_trials(net, ds, trials, RUN)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = training.train_trials(net, ds, trials, RUN)
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    assert all(torch.equal(one.params[k], two.params[k]) for k in one.params)
    assert [c.metric.tolist() for c in one.curves] == [c.metric.tolist() for c in two.curves]


def test_a_run_resumed_from_a_state_measures_from_its_own_first_update(tmp_path, monkeypatch):
    """A branch resumes from a checkpoint at a new batch size (a cell not yet measured): the
    candidates are timed on the batches of the run's own updates, not of update 0, which a
    resumed data order does not hold (it gave an empty batch and no gradients). The measured
    run equals the same resumed run with its program forced."""
    monkeypatch.setenv("SPARSESCALE_CACHE", str(tmp_path))
    monkeypatch.setenv("SPARSESCALE_CHOICE", "measure")
    ds = images()
    torch.manual_seed(1)
    net = SmallCNN()
    state = training.train_trials(net, ds, TRIALS[:1], replace(RUN, max_steps=7),
                                  return_state=True).end_state
    resumed = replace(RUN, batch_size=16, max_steps=9)
    res = training.train_trials(net, ds, TRIALS, resumed, start=state)
    assert res.program_choice == "measured"
    monkeypatch.setenv("SPARSESCALE_CHOICE", res.program)
    forced = training.train_trials(net, ds, TRIALS, resumed, start=state)
    for k in res.params:
        assert torch.equal(forced.params[k], res.params[k])
