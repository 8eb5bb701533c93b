"""training.config: the run configuration every trainer takes, validated field by field."""

import numpy as np
import pytest
import torch

from training import ConfigError, RunConfig, Trial
from training.config import check_trials


@pytest.mark.parametrize("kwargs, match", [
    (dict(stop="some"), "stop 'some'; allowed: first, all, never"),
    (dict(optimizer="adagrad"),
     "unknown optimizer 'adagrad'; allowed: sgd, momentum, nesterov, adam, adamw"),
    (dict(batch_size=0), "batch_size must be an integer >= 1"),
    (dict(batch_size=2.5), "batch_size must be an integer >= 1"),
    (dict(max_steps=-1), "max_steps must be an integer >= 0"),
    (dict(goal=float("nan")), "goal must be a training.Goal, a finite target or None"),
    (dict(goal="0.3"), "goal must be"),
    (dict(eval_schedule=100), "eval_schedule must be a training.EvalSchedule"),
    (dict(seed=-1), "seed must be an integer >= 0"),
    (dict(dtype=torch.int64), "dtype must be a floating-point torch dtype"),
    (dict(device="gpu0"), "device 'gpu0' is not a torch device"),
])
def test_run_config_names_the_bad_field(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(**{"batch_size": 8, **kwargs})


def test_run_config_holds_plain_ints():
    run = RunConfig(np.int64(32), max_steps=np.int32(10), seed=np.uint8(3))
    assert (run.batch_size, run.max_steps, run.seed) == (32, 10, 3)
    assert all(type(v) is int for v in (run.batch_size, run.max_steps, run.seed))
    assert run == RunConfig(32, max_steps=10, seed=3)


def test_run_config_defaults():
    run = RunConfig(64)
    assert (run.optimizer, run.max_steps, run.goal, run.stop, run.seed) == (
        "momentum", 1000, None, "first", 0)
    assert run.eval_schedule.steps(250) == [0, 100, 200, 250]
    assert (run.dtype, run.device) == (torch.float32, "cpu")


def test_trials_are_a_non_empty_list_of_trials_or_dicts():
    assert check_trials([{"lr": 0.1}, Trial(lr=0.2, momentum=0.5)]) == [
        Trial(lr=0.1), Trial(lr=0.2, momentum=0.5)]
    for bad in ([], {"lr": 0.1}, Trial(lr=0.1), "lr"):
        with pytest.raises(ConfigError, match="trials must be a non-empty list"):
            check_trials(bad)
    with pytest.raises(ConfigError, match="a trial must be a training.Trial or a mapping"):
        check_trials([0.1])
