"""sparsescale.training: data sets, models, run configurations, masks and the trainers.

Public API::

    ds = training.data.load("mnist1d", seed=0)
    net = training.models.build("mlp", ds)
    trial = training.Trial(lr=0.1, momentum=0.9)
    run = training.RunConfig(batch_size=64, max_steps=500)
    training.train_reference(net, ds, trial, run)
    training.train_trials(net, ds, [trial, training.Trial(lr=0.3, momentum=0.9)], run)
"""

from . import config, costmodel, data, goal, masks, models, order, process, schedules
from .config import EvalSchedule, RunConfig, Trial
from .data import DataError, Dataset
from .errors import ConfigError, SparsescaleError
from .goal import Goal
from .masks import MaskError
from .models import ModelError
from .reference import train_reference
from .results import Curve, ReferenceResult
from .trials import TrialsResult, train_trials

__all__ = [
    "config", "costmodel", "data", "goal", "masks", "models", "order", "process", "schedules",
    "EvalSchedule", "RunConfig", "Trial", "DataError", "Dataset", "ConfigError",
    "SparsescaleError", "Goal", "MaskError", "ModelError", "train_reference", "Curve",
    "ReferenceResult", "TrialsResult", "train_trials",
]
