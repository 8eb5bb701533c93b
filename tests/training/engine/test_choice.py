"""The measured program choice (training.engine.choice): on a fake clock, a candidate replaces
the rules' default only when faster by the margin over interleaved rounds; the cache spares the second call its measurement and a changed module measures again;
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


def test_a_near_tie_keeps_the_default_and_a_clear_winner_replaces_it(tmp_path):
    """The case that flipped with the load: plain 0.210 against the rules' per_trial 0.218 ms a
    trial-step (3.7 % faster) keeps per_trial; 12 % faster (0.192) replaces it."""
    clock = FakeClock()
    tie = {"per_trial": 0.218e-3, "plain": 0.210e-3}
    plan, measured = choice.choose(fake_candidates(tie), "tie", timer(clock, tie, []),
                                   tmp_path / "c.json", clock)
    assert plan.name == "per_trial" and measured == pytest.approx(tie)
    clear = {"per_trial": 0.218e-3, "plain": 0.192e-3}
    plan, _ = choice.choose(fake_candidates(clear), "clear", timer(clock, clear, []),
                            tmp_path / "c.json", clock)
    assert plan.name == "plain"
    assert 0.192 / 0.218 < 1 - choice.MARGIN < 0.210 / 0.218


def test_a_burst_of_other_work_falls_on_every_candidate_of_its_round(tmp_path):
    """Interleaved rounds: a burst that makes one round 5x slower for whatever runs in it
    (another job on the machine) slows the default and the candidate alike, so their median
    ratio, and the choice, stay those of the quiet rounds."""
    clock, seconds, rounds = FakeClock(), {"per_trial": 1e-3, "plain": 0.95e-3}, []

    def time_step(plan):
        def step():
            rounds.append(plan.name)
            burst = 5.0 if 3 <= len(rounds) <= 4 else 1.0   # round 1 (after the untimed steps)
            clock.now += 2 * seconds[plan.name] * burst
            return 2
        return step

    plan, measured = choice.choose(fake_candidates(seconds), "k", time_step, tmp_path / "c.json",
                                   clock)
    assert rounds[:4] == ["per_trial", "plain", "per_trial", "plain"]   # untimed, then round 1
    assert plan.name == "per_trial" and measured == pytest.approx(seconds)
    times = choice.measure_rounds(fake_candidates(seconds), timer(clock, seconds, []), clock)
    assert len(times["plain"]) == choice.ROUNDS   # the fake steps take no time: every round


def test_a_hopeless_candidate_is_timed_once_and_an_old_cache_entry_measured_again(tmp_path):
    clock, calls = FakeClock(), []
    seconds = {"per_trial": 1e-3, "func": 9e-3}
    times = choice.measure_rounds(fake_candidates(seconds), timer(clock, seconds, calls), clock)
    assert len(times["func"]) == 1 and len(times["per_trial"]) == choice.ROUNDS
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"k": {"program": "func"}}))   # written before the margin
    plan, measured = choice.choose(fake_candidates(seconds), "k", timer(clock, seconds, calls),
                                   path, clock)
    assert plan.name == "per_trial" and measured
    assert json.loads(path.read_text())["k"]["version"] == choice.CACHE_VERSION


def test_setting_rejects_an_unknown_value(monkeypatch):
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "fastest")
    with pytest.raises(training.ConfigError, match="SPARSESCALE_PROGRAM_CHOICE='fastest'; allowed"):
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
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "measure")
    timed = []
    real = choice.measure_rounds
    monkeypatch.setattr(choice, "measure_rounds", lambda plans, *a, **k: timed.extend(
        p.name for p in plans) or real(plans, *a, **k))
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
        monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", name)
        other = training.train_trials(net, ds, TRIALS, RUN)
        assert other.program == name
        for k in res.params:
            torch.testing.assert_close(other.params[k], res.params[k], rtol=1e-12, atol=1e-14)
        assert [c.metric.tolist() for c in other.curves] == [c.metric.tolist()
                                                              for c in res.curves]
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "measure")
    torch.manual_seed(1)
    training.train_trials(SmallCNN(width=5), ds, TRIALS, RUN)   # another structure: measured
    assert len(timed) == 2 * len(names)
    assert len(json.loads((tmp_path / choice.CACHE_NAME).read_text())) == 2


@pytest.mark.parametrize("kernels", ["1", "0"])
def test_trials_spread_over_threads_equal_one_thread(monkeypatch, kernels):
    """Two trials side by side, one thread each, bit for bit the one-thread run; also with the
    eager update (kernels off), whose in-place writes of one trial's rows once failed the other
    thread's backward (a shared version counter) about half the time."""
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "per_trial")
    monkeypatch.setenv("SPARSESCALE_KERNELS", kernels)
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
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", "measure")
    ds = images()
    torch.manual_seed(1)
    net = SmallCNN()
    state = training.train_trials(net, ds, TRIALS[:1], replace(RUN, max_steps=7),
                                  return_state=True).end_state
    resumed = replace(RUN, batch_size=16, max_steps=9)
    res = training.train_trials(net, ds, TRIALS, resumed, start=state)
    assert res.program_choice == "measured"
    monkeypatch.setenv("SPARSESCALE_PROGRAM_CHOICE", res.program)
    forced = training.train_trials(net, ds, TRIALS, resumed, start=state)
    for k in res.params:
        assert torch.equal(forced.params[k], res.params[k])
