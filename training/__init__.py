"""sparsescale.training: data sets, models, run configurations, masks and the trainers.

Public API::

    ds = training.data.load("mnist1d", seed=0)    # or your own data:
    # ds = training.Dataset.from_tensors(x, y)  /  training.Dataset.from_torch(torch_dataset)
    net = training.models.build("mlp", ds)
    trial = training.Trial(lr=0.1, momentum=0.9)
    run = training.RunConfig(batch_size=64, max_steps=500)
    training.train_reference(net, ds, trial, run)
    training.train_trials(net, ds, [trial, training.Trial(lr=0.3, momentum=0.9)], run)
"""

from training import config, data, device, distributed, goal, masks, models, processes, schedules
from training.schedules import lr_schedule, order
from training.config import EvalSchedule, RunConfig, Trial
from training.data import DataError, DataIOError, Dataset
from training.distributed import train_distributed
from training.errors import ConfigError, SparsescaleError, SparsescaleIOError, SparsescaleWarning
from training.goal import Goal
from training.masks import MaskError
from training.models import ModelError
from training.reference import train_reference
from training.results import Curve, ReferenceResult
from training.trials import TrialsResult, Watch, choose_program, train_trials

__all__ = [
    "config", "data", "device", "distributed", "goal", "lr_schedule", "masks", "models", "order",
    "processes", "schedules",
    "EvalSchedule", "RunConfig", "Trial", "DataError", "DataIOError", "Dataset", "ConfigError",
    "SparsescaleError", "SparsescaleIOError", "SparsescaleWarning", "Goal", "MaskError",
    "ModelError", "train_reference", "Curve", "ReferenceResult", "TrialsResult", "Watch",
    "train_trials",
    "choose_program", "train_distributed",
]
