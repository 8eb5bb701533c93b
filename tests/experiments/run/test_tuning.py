"""The best point of each cell of a search (issue 47's tuning), on stored frames written by
hand: the fewest steps to the goal (ties: the lower trial), else the lowest final metric, never
a diverged trial or an unfinished group."""

import math

import pandas as pd
import pytest

from experiments.run.tuning import TuningError, best_points, search_spec
from experiments.spec.study import loads

from ..conftest import TINY

COLUMNS = ["group_key", "trial", "sparsity", "batch_size", "seed", "lr", "momentum",
           "decay_steps", "end_factor", "status", "hit_step", "final_metric", "beta1", "beta2",
           "eps", "weight_decay"]


def trial(key, i, s, b, lr, status, hit, final):
    return (key, i, s, b, 7, lr, 0.9, math.nan, 1.0, status, hit, final, *[math.nan] * 4)


def frames(rows, failed=()):
    trials = pd.DataFrame(rows, columns=COLUMNS)
    keys = sorted(set(trials.group_key))
    groups = pd.DataFrame({"key": keys, "status": ["failed" if k in failed else "done"
                                                  for k in keys]})
    return groups, trials


def test_fewest_steps_then_lowest_final_metric_never_diverged():
    groups, trials = frames([
        trial("a", 0, 0.0, 64, 0.01, "reached", 300, 0.1),
        trial("a", 1, 0.0, 64, 0.02, "reached", 200, 0.12),
        trial("a", 2, 0.0, 64, 0.03, "reached", 200, 0.09),     # tie at 200: trial 1 wins
        trial("a", 3, 0.0, 64, 0.04, "diverged", None, math.nan),
        trial("b", 0, 0.9, 64, 0.01, "not_reached", None, 0.2),
        trial("b", 1, 0.9, 64, 0.02, "not_reached", None, 0.15),  # none reached: lowest final
        trial("b", 2, 0.9, 64, 0.05, "diverged", None, math.nan),
        trial("c", 0, 0.9, 32, 0.5, "reached", 10, 0.1),        # a failed group: never
    ], failed=("c",))
    best = best_points(groups, trials)
    assert set(best) == {(0.0, 64), (0.9, 64)}
    assert best[(0.0, 64)] == {"lr": 0.02, "momentum": 0.9, "decay_steps": None,
                               "end_factor": 1.0}
    assert best[(0.9, 64)]["lr"] == 0.02


def test_a_cell_whose_every_trial_diverged_is_refused():
    groups, trials = frames([trial("a", 0, 0.9, 64, 1.0, "diverged", None, math.nan)])
    with pytest.raises(TuningError, match="sparsity 0.9, batch size 64: every trial"):
        best_points(groups, trials)


def test_the_search_spec_is_the_study_without_probes_at_the_tuning_seed():
    spec = loads(TINY.replace("seeds = [0]", "seeds = [0, 1]") + "\n[tuning]\npoints = 3\nseed = 9\n")
    s = search_spec(spec)
    assert (s.name, s.trials, s.seeds, s.tuning, s.subdir) == ("tiny-search", 3, (9,), None,
                                                               "search")
    assert not s.probes.enabled and s.stopping is None and s.hash != spec.hash
    with pytest.raises(TuningError, match="no \\[tuning\\] table"):
        search_spec(s)
