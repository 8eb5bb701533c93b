"""The policy interface and the built-in policies against closed forms: goodput's argmax, the lr
rules, the minimum-gain rule, CBS warmup's steps, Seesaw's cuts; the registry's names and import
paths."""

import math
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest

from theory import TheoryError
from theory.policies import (
    POLICIES, CBSWarmup, Fixed, Goodput, LinearTime, NoiseRamp, Seesaw, Setting, Signal,
    efficiency, hold_unless_gain, make_policy, predicted_gain, rate, scale_lr,
)


def goodput(b, b_simple, t0, t1, b0=1):
    """Pollux's goodput written out: throughput B / t(B) times (B_simple + B0) / (B_simple + B)."""
    return b / (t0 + t1 * b) * (b_simple + b0) / (b_simple + b)


@pytest.mark.parametrize("b_simple,t0,t1", [(64.0, 1.0, 1 / 64), (100.0, 2.0, 0.5), (5.0, 1e-3, 1.0),
                                            (1e4, 1.0, 1e-6)])
def test_goodput_picks_the_argmax_of_throughput_times_efficiency(b_simple, t0, t1):
    grid = [2**i for i in range(13)]
    want = grid[int(np.argmax([goodput(b, b_simple, t0, t1) for b in grid]))]
    assert Goodput(max_batch=4096, step_time=LinearTime(t0, t1)).best(b_simple) == want


def test_goodput_continuous_optimum_is_sqrt_b_simple_t0_over_t1():
    # B* = sqrt(B_simple t0 / t1) = sqrt(64 * 1 * 64) = 64, a power of two
    assert Goodput(step_time=LinearTime(1.0, 1 / 64)).best(64.0) == 64
    # no time model: every step costs the same, goodput rises with B to the grid's top
    assert Goodput(max_batch=512).best(64.0) == 512


def test_efficiency_and_rate_closed_forms():
    assert efficiency(30.0, 10, base_batch=2) == pytest.approx(32 / 40)
    assert rate(30.0, 10) == pytest.approx(1 / (1 + 3.0))
    t = LinearTime(1.0, 0.1)
    assert rate(30.0, 10, t) == pytest.approx(1 / (4.0 * 2.0))
    assert predicted_gain(30.0, 10, 30, t) == pytest.approx((1 / (2 * 4.0)) / (1 / (4 * 2.0)) - 1)


def test_lr_rules():
    assert scale_lr(0.1, 16, 64, "linear") == pytest.approx(0.4)
    assert scale_lr(0.1, 16, 64, "sqrt") == pytest.approx(0.2)
    assert scale_lr(0.1, 16, 64, "none") == 0.1
    # AdaScale's gain ratio r(B) = (1 + B_simple / B0) / (1 + B_simple / B), B0 cancelling
    assert scale_lr(0.1, 16, 64, "adascale", 32.0) == pytest.approx(0.1 * 3.0 / 1.5)
    assert scale_lr(0.1, 16, 64, "adascale", 1e12) == pytest.approx(0.4)   # noise dominates
    assert scale_lr(0.1, 16, 64, "adascale", -5.0) == pytest.approx(0.1)   # no noise
    with pytest.raises(TheoryError, match="needs the measured noise scale"):
        scale_lr(0.1, 16, 64, "adascale")
    with pytest.raises(TheoryError, match="allowed: linear, sqrt, adascale, none"):
        scale_lr(0.1, 16, 64, "cubic")


def test_min_gain_rule_holds_small_gains():
    now, sig = Setting(32, 0.1), Signal(100, 3200, b_simple=64.0)
    gain = predicted_gain(64.0, 32, 64)           # (1 + 2) / (1 + 1) - 1 = 0.5 in steps
    assert gain == pytest.approx(0.5)
    assert hold_unless_gain(64, now, sig, rule="linear", min_gain=0.6) is now
    assert hold_unless_gain(64, now, sig, rule="linear", min_gain=0.4) == Setting(64, 0.2)


def test_goodput_decides_with_min_gain_and_part():
    t = LinearTime(1.0, 1 / 64)
    sig = Signal(10, 160, b_simple=1.0, parts={"<preconditioned>": 64.0})
    now = Setting(32, 0.1)
    gain = rate(64.0, 64, t) / rate(64.0, 32, t) - 1
    moved = Goodput(step_time=t, part="<preconditioned>", min_gain=0.0).decide(sig, now)
    assert moved == Setting(64, 0.1 * (1 + 2.0) / (1 + 1.0))
    assert Goodput(step_time=t, part="<preconditioned>", min_gain=gain + 1e-9).decide(sig, now) is now
    with pytest.raises(TheoryError, match="no part '<norm layers>'"):
        Goodput(part="<norm layers>").decide(sig, now)
    assert Goodput().decide(Signal(10, 160), now) is now   # no reading: no move


def test_noise_ramp_follows_the_noise_scale_and_never_decreases():
    ramp = NoiseRamp(min_batch=8, max_batch=256, min_gain=0.0, lr_rule="sqrt")
    assert ramp.target(90.0) == 64 and ramp.target(100.0) == 128 and ramp.target(1e6) == 256
    assert ramp.target(1.0) == 8
    assert ramp.decide(Signal(1, 1, b_simple=100.0), Setting(16, 0.1)) == Setting(128, 0.1 * math.sqrt(8))
    assert ramp.decide(Signal(1, 1, b_simple=10.0), Setting(64, 0.1)) == Setting(64, 0.1)


def test_cbs_warmup_follows_the_branching_critical_batch():
    w = CBSWarmup(examples=(0, 100, 200), critical_batch=(10.0, 40.0, 300.0), min_batch=8, max_batch=256)
    assert [w.batch_at(e) for e in (0, 99, 150, 250)] == [8, 8, 32, 256]
    assert w.decide(Signal(5, 150), Setting(8, 0.1)) == Setting(32, 0.4)
    assert w.decide(Signal(5, 150), Setting(32, 0.4)) == Setting(32, 0.4)
    crit = types.SimpleNamespace(examples=np.array([0, 64]), critical_batch=np.array([16.0, 64.0]),
                                 base_batch=16)
    a = CBSWarmup.of(crit, "adam")
    assert (a.lr_rule, a.min_batch, a.batch_at(70)) == ("sqrt", 16, 64)


def test_seesaw_doubles_b_and_divides_lr_by_sqrt2_at_each_cut():
    s = Seesaw(milestones=(100, 200))
    assert s.decide(Signal(5, 90), Setting(16, 0.1)) == Setting(16, 0.1)
    assert s.decide(Signal(5, 150, previous_examples=90), Setting(16, 0.1)) == Setting(32, 0.1 / math.sqrt(2))
    both = s.decide(Signal(5, 250, previous_examples=90), Setting(16, 0.1))
    assert both.batch_size == 64 and both.lr == pytest.approx(0.05)
    capped = Seesaw(milestones=(100, 200), max_batch=32).decide(Signal(5, 250), Setting(16, 0.1))
    assert capped.batch_size == 32 and capped.lr == pytest.approx(0.1 / math.sqrt(2) / 2)


def test_fixed_keeps_the_setting():
    now = Setting(64, 0.3)
    assert Fixed().decide(Signal(1, 64, b_simple=1e6), now) is now


def test_registry_names_paths_and_errors(monkeypatch):
    assert set(POLICIES.names()) >= {"fixed", "goodput", "noise_ramp", "cbs_warmup", "seesaw"}
    assert make_policy("goodput", {"max_batch": 64}) == Goodput(max_batch=64)
    with pytest.raises(TheoryError, match="did you mean 'goodput'"):
        make_policy("goodptu")
    with pytest.raises(TheoryError, match=r"unknown option\(s\) \['cap'\]; allowed: min_batch"):
        make_policy("goodput", {"cap": 3})

    mod = types.ModuleType("my_policies")

    @dataclass(frozen=True)
    class Halve:
        floor: int = 1

        def decide(self, signal, current):
            return Setting(max(self.floor, current.batch_size // 2), current.lr)

    def double(signal, current):
        return Setting(current.batch_size * 2, current.lr)

    mod.Halve, mod.double = Halve, double
    monkeypatch.setitem(sys.modules, "my_policies", mod)
    assert make_policy("my_policies:Halve", {"floor": 4}).decide(Signal(0, 0), Setting(6, 1.0)) == Setting(4, 1.0)
    assert make_policy("my_policies:double").decide(Signal(0, 0), Setting(6, 1.0)) == Setting(12, 1.0)
    assert make_policy(Halve, {"floor": 2}) == Halve(2)
    with pytest.raises(TheoryError, match="has no attribute 'nope'"):
        make_policy("my_policies:nope")
    with pytest.raises(TheoryError, match="cannot import"):
        make_policy("no_such_module_xyz:P")
    with POLICIES.preserved():
        with pytest.raises(TheoryError, match="already registered"):
            POLICIES.add("fixed", Halve)
