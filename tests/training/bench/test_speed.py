"""The trainer benchmark's cell (``training.bench.speed.bench``) on fake trainers and a fake
clock: the median-of-rounds ratio, the rates of the median round, the range, the interleaving
order; and the table's columns. No wall-clock time is asserted."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from training.bench import speed
from training.bench.measure import StepTimer
from training.bench.speed import Row, format_table
from training.data.dataset import Dataset


@pytest.fixture
def cell():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 4, generator=g), torch.randint(0, 2, (100,), generator=g)
    return nn.Linear(4, 2), Dataset("tiny", "classification", x[:80], y[:80], x[80:], y[80:], 2,
                                    (4,))


def fake_trainers(monkeypatch, per_step):
    """Replace both trainers with step loops that advance a fake clock by ``per_step[name][k]``
    a step in their k-th call (the warm-up's runs included), inside the timer they are given,
    plus once-per-run costs outside it; returns the clock and the calls as (name, steps)."""
    now, calls = [0.0], []

    def loop(name, steps, timer):
        k = sum(1 for c in calls if c[0] == name)
        calls.append((name, steps))
        now[0] += 100.0   # setup, evaluations: never in a rate
        with timer:
            now[0] += steps * per_step[name][min(k, len(per_step[name]) - 1)]
        now[0] += 100.0

    def plain_loop(net, ds, batch_size, steps, optimizer, device, precision, timer):
        loop("plain", steps, timer)
        return 0.0

    def vectorized(net, ds, batch_size, n_trials, steps, optimizer, device, precision, timer):
        loop(optimizer, steps, timer)
        return SimpleNamespace(program="fused", program_choice="ruled")

    monkeypatch.setattr(speed, "plain_loop", plain_loop)
    monkeypatch.setattr(speed, "vectorized", vectorized)
    monkeypatch.setitem(speed.CLOCKS, "fake", lambda: now[0])
    return calls


def test_a_cell_reports_the_median_rounds_ratio_its_rates_and_the_range(monkeypatch, cell):
    net, ds = cell
    # plain: 1/128 s a step (a slow second round); vectorized, 4 trials: 1/64 s a step of all
    # four (a slow third round), so the rounds' ratios are 2.0 / 4.0 / 1.0 (binary fractions:
    # exact sums on the fake clock)
    p, q = 1 / 128, 1 / 64
    calls = fake_trainers(monkeypatch, {"plain": [p, p, p, 2 * p, p],
                                        "momentum": [q, q, q, q, 2 * q]})
    row = speed.bench("linear", 8, 4, ds, peak=100.0, seconds=3.0, clock="fake", net=net)
    # warm-up of each, then plain, vectorized, plain, vectorized, ...
    assert calls[:4] == [("plain", 1), ("plain", 64), ("momentum", 1), ("momentum", 32)]
    assert calls[4:] == [("plain", 128), ("momentum", 64)] * 3
    assert row.ratio_rounds == pytest.approx((2.0, 4.0, 1.0))
    assert row.ratio == pytest.approx(2.0) and row.ratio_range == pytest.approx((1.0, 4.0))
    # the rates are those of the median round (the first), not a mix of rounds
    assert row.plain_steps_per_s == pytest.approx(128.0)
    assert row.trial_steps_per_s == pytest.approx(256.0)
    flops = 8 * (6 * 4 * 2 - 2 * 4 * 2)   # one Linear layer: no input gradient
    assert row.gflops == pytest.approx(256.0 * flops / 1e9)
    assert (row.program, row.choice, row.slowdown) == ("fused", "ruled", None)
    assert "| 2.00x | 1.00-4.00x |" in format_table([row])


def test_another_optimizer_runs_beside_momentum_in_every_round(monkeypatch, cell):
    net, ds = cell
    p, q = 1 / 128, 1 / 64
    calls = fake_trainers(monkeypatch, {"plain": [p], "adam": [q, q, q, 2 * q, q],
                                        "momentum": [p]})
    row = speed.bench("linear", 8, 4, ds, peak=100.0, seconds=3.0, clock="fake",
                      optimizer="adam", net=net)
    assert calls[6:] == [("plain", 128), ("adam", 64), ("momentum", 128)] * 3
    # adam's second round ran at half speed: slowdowns 2 / 4 / 2, ratios 2 / 1 / 2
    assert row.slowdown_rounds == pytest.approx((2.0, 4.0, 2.0)) and row.slowdown == 2.0
    assert row.ratio_rounds == pytest.approx((2.0, 1.0, 2.0)) and row.ratio == pytest.approx(2.0)
    assert row.momentum_trial_steps_per_s == pytest.approx(512.0)


def test_rounds_is_the_number_of_ratios(monkeypatch, cell):
    net, ds = cell
    fake_trainers(monkeypatch, {"plain": [1 / 128], "momentum": [1 / 64]})
    row = speed.bench("linear", 8, 4, ds, peak=100.0, seconds=5.0, clock="fake", net=net,
                      rounds=5)
    assert row.ratio_rounds == pytest.approx((2.0,) * 5)


class Ticking(nn.Module):
    """A linear model that advances a fake clock one unit each forward pass, and 1000 units
    when it is copied (the plain loop's copy of the model, outside its loop)."""

    def __init__(self, now):
        super().__init__()
        self.lin, self.now = nn.Linear(4, 2), now

    def forward(self, x):
        self.now[0] += 1.0
        return self.lin(x)

    def __deepcopy__(self, memo):
        self.now[0] += 1000.0
        new = Ticking(self.now)
        new.load_state_dict(self.state_dict())
        return new


def test_the_plain_loops_timer_holds_its_steps_only(cell):
    _, ds = cell
    now = [0.0]
    timer = StepTimer(lambda: now[0])
    loss = speed.plain_loop(Ticking(now), ds, 8, 25, timer=timer)
    # 25 steps over 10 batches an epoch: three epochs' loaders, one forward a step
    assert timer.seconds == 25.0 and timer.loops == 1 and now[0] == 1025.0
    assert 0 < loss < 10


def test_the_vectorized_trainers_timer_holds_its_step_loops_only(monkeypatch, mnist1d_small):
    """With the clock advanced 1000 units by each evaluation and one unit by each batch a stack
    draws, the timer holds the steps' units only: the evaluations at start and end, and the
    first batch drawn for the initial losses, are outside it."""
    from training import models
    from training.engine.loop import Runner

    now = [0.0]
    evaluate, batch_indices = Runner.evaluate, Runner.batch_indices

    def slow_evaluate(self, st):
        now[0] += 1000.0
        return evaluate(self, st)

    def counted(self, st, step):
        now[0] += 1.0
        return batch_indices(self, st, step)

    monkeypatch.setattr(Runner, "evaluate", slow_evaluate)
    monkeypatch.setattr(Runner, "batch_indices", counted)
    net = models.build("mlp", mnist1d_small, seed=0)
    timer = StepTimer(lambda: now[0])
    res = speed.vectorized(net, mnist1d_small, 8, 2, 12, trials_per_stack=2, timer=timer)
    assert res.steps_run == 12 and timer.seconds == 12.0
    assert now[0] == 2 * 1000.0 + 12 + 1   # two evaluations, 12 steps, the initial losses' batch


def test_format_table_columns():
    row = Row("mlp", 8, 32, 1000.0, 25000.0, 50.0, 200.0, "fused", 512.4, choice="ruled",
              ratio_rounds=(22.0, 25.0, 31.5))
    head, rule, line = format_table([row]).splitlines()
    assert head == ("| model | B | trials | program | chosen | plain loop steps/s | vectorized "
                    "trial-steps/s | median ratio | ratio range | GFLOP/s | % of peak | peak "
                    "RSS MiB |")
    assert rule.count("---") == 12
    assert line == ("| mlp | 8 | 32 | fused | ruled | 1e+03 | 2.5e+04 | 25.0x | 22.0-31.5x | "
                    "50.0 | 25 % | 512 |")
    # a row without rounds (made by hand) has its one ratio as its range
    assert "| 25.0x | 25.0-25.0x |" in format_table([Row("mlp", 8, 32, 1000.0, 25000.0, 50.0,
                                                          200.0)])
    # below 10x two decimals: a cell at 0.96x of the loop must not read as 1.0x
    slow = Row("gru", 4096, 32, 3.12, 3.0, 24.2, 184.0, "plain", 2242.0, choice="measured",
               ratio_rounds=(0.96, 0.91, 1.19))
    assert "| 0.96x | 0.91-1.19x |" in format_table([slow])
