"""Probe points and probe batch sizes: the rules on hand-worked cases."""

import pytest

from theory import TheoryError
from theory.verdicts.probe_points import probe_batch_sizes, probe_steps


def test_probe_steps_are_evenly_spaced_over_the_whole_run():
    assert probe_steps(900) == (0, 100, 200, 300, 400, 500, 600, 700, 800, 900)
    assert probe_steps(1000, 5) == (0, 250, 500, 750, 1000)
    assert probe_steps(10, 4) == (0, 3, 7, 10)
    assert probe_steps(3, 10) == (0, 1, 2, 3)      # fewer distinct steps than points
    assert probe_steps(0, 10) == (0,) and probe_steps(50, 1) == (0,)


def test_probe_batch_sizes_default_rules():
    reached = [8, 16, 32, 64, 128, 256, 512]
    assert probe_batch_sizes(reached, b_crit=100.0) == (8, 128, 512)   # log-nearest: 128, not 64
    assert probe_batch_sizes(reached, b_crit=90.5) == (8, 64, 512)     # below sqrt(64 * 128)
    assert probe_batch_sizes(reached, b_crit=5000.0) == (8, 256, 512)  # nearest inner size: 256
    assert probe_batch_sizes(reached, b_crit=None) == (8, 64, 512)     # geometric middle
    assert probe_batch_sizes([64], b_crit=10.0) == (64,)


def test_probe_batch_sizes_configurable():
    reached = [16, 32, 64, 128]
    assert probe_batch_sizes(reached, 40.0, choose=["largest", 16]) == (16, 128)
    assert probe_batch_sizes(reached, 40.0, choose=["b_crit"]) == (32,)


@pytest.mark.parametrize("kwargs, match", [
    (dict(reached=[], b_crit=1.0), "reached is empty"),
    (dict(reached=[16, 32], b_crit=1.0, choose=[64]), "did not reach"),
    (dict(reached=[16, 32], b_crit=1.0, choose=["median"]), "allowed: smallest"),
    (dict(reached=[16, 32], b_crit=-1.0), "b_crit"),
])
def test_bad_choices_are_named(kwargs, match):
    with pytest.raises(TheoryError, match=match):
        probe_batch_sizes(**kwargs)
    with pytest.raises(TheoryError, match="horizon"):
        probe_steps(-1)


def test_stage_steps_from_a_start():
    from theory.verdicts.probe_points import stage_steps
    assert stage_steps(2000, 250, 1000) == (1000, 1250, 1500, 1750, 2000)
    assert stage_steps(2000, 300, 1000) == (1200, 1500, 1800)   # multiples of N only
    assert stage_steps(900, 250, 1000) == ()
    assert stage_steps(1000, 250) == (250, 500, 750, 1000)


def test_schedule_steps_is_a_deprecated_alias_of_stage_steps():
    import theory

    with pytest.warns(DeprecationWarning, match="'schedule_steps' is deprecated, use "
                                                "'stage_steps'"):
        assert theory.schedule_steps is theory.stage_steps
