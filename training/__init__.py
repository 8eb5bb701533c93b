"""sparsescale.training: data sets, models, schedules and the trainers.

Public API::

    ds = training.data.load("mnist1d", seed=0)
    net = training.models.build("mlp", ds)
    training.train_reference(net, ds, batch_size=64, lr=0.1, momentum=0.9, steps=500)
"""

from . import data, goal, models, order, schedules
from . import costmodel
from .errors import SparsescaleError
from .data import Dataset, DataError
from .goal import Goal
from .models import ModelError
from .reference import train_reference
from .results import Curve, ReferenceResult
from .schedules import ConfigError, EvalSchedule, Trial
from .trials import TrialsResult, train_trials

__all__ = [
    "data", "goal", "models", "order", "schedules", "Dataset", "DataError", "Goal", "ModelError",
    "train_reference", "Curve", "ReferenceResult", "ConfigError", "EvalSchedule", "Trial",
    "train_trials", "TrialsResult",
    "costmodel", "SparsescaleError",
]
