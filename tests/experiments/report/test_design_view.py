"""The stopping rule applied to stored paired runs: the per-pair statistic is the difference of
each run's mean log L over the common steps, look k takes the first k rounds of seeds, and the
study stops at the first look whose t crosses its corrected boundary, never at an earlier peek."""

import math

import numpy as np
import pandas as pd
import pytest

from theory.verdicts.sequential import boundary_constants, look

from experiments.report.design_view import looks, paired_differences, stopping_lines
from experiments.spec.tables.stopping import Stopping

SEEDS = (0, 1, 2, 3)
STEPS = (1000, 1250, 1500)


def schedule(gain, rng, seeds=SEEDS, trials=3):
    """L at Lee's stage: both levels share each run's effect; the sparse one is ``gain`` x."""
    rows = []
    for seed in seeds:
        for trial in range(trials):
            run = rng.normal(0, 0.5)
            for s, factor in ((0.0, 1.0), (0.9, gain)):
                for step in (500, *STEPS):
                    rows.append((s, seed, 32, trial, step, 3000, "local_lipschitz",
                                 factor * math.exp(run + rng.normal(0, 0.05)), 2000, 1.0))
    return pd.DataFrame(rows, columns=["sparsity", "seed", "batch_size", "trial", "step",
                                       "horizon", "quantity", "value", "examples", "seconds"])


RULE = Stopping("group_sequential", "local_lipschitz", 0.9, 0.0, 0.01, 0.05, 2, "pocock")


def test_differences_are_the_run_means_of_log_l():
    t = schedule(1.3, np.random.default_rng(0))
    d = paired_differences(t, RULE, SEEDS[:1])
    logs = t[t.step >= 1000].assign(log=lambda f: np.log(f.value))
    want = [logs[(logs.sparsity == 0.9) & (logs.seed == 0) & (logs.trial == i)].log.mean()
            - logs[(logs.sparsity == 0.0) & (logs.seed == 0) & (logs.trial == i)].log.mean()
            for i in range(3)]
    assert d == pytest.approx(want)


def test_a_clear_effect_stops_at_the_first_look():
    t = schedule(1.3, np.random.default_rng(1))
    first = looks(t, RULE, SEEDS)
    assert len(first) == 1 and first[0].stop and first[0].why == "crossed"
    d = paired_differences(t, RULE, SEEDS[:2])
    assert first[0] == look(d, 1, 2, "pocock", 0.05, math.log1p(0.01))
    assert first[0].boundary == pytest.approx(boundary_constants("pocock", 2, 0.05)[0])
    lines = stopping_lines(t, RULE, SEEDS)
    assert lines[0].startswith("Stopping rule, declared in the spec before the data: group "
                               "sequential, 2 looks with pocock")
    assert "Look 1 of 2: 6 pairs" in lines[1] and lines[1].endswith("stop (crossed).")


def test_no_effect_goes_on_to_the_last_look():
    t = schedule(1.0, np.random.default_rng(2))
    taken = looks(t, RULE, SEEDS)
    assert [x.stop for x in taken] == [False, True] and taken[-1].why == "last look"
    # with only the first round stored, the rule says the study needs its next round
    lines = stopping_lines(t[t.seed < 2], RULE, SEEDS)
    assert lines[-1] == "The rule has not stopped: the study needs its next round."
