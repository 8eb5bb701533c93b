"""What the trainers are given is checked before anything is trained: a data set that is not a
``training.Dataset`` names the constructors that make one, a model that is not an ``nn.Module``
is refused, and the model's output shape is checked against the data on one example (each one
line; no training step runs)."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import training
from training import DataError, ModelError, RunConfig, Trial
from training.distributed.trainer import DistRun, train_env_rank
from training.models import check_output, expected_output
from training.reference import train_schedule_reference
from training.replay import replay_snapshots
from training.schedule_trials import train_schedule_trials

TRIAL = Trial(lr=0.1, momentum=0.9)
RUN = RunConfig(batch_size=8, max_steps=3)

# every trainer entry point, called with (model, dataset)
TRAINERS = {
    "train_reference": lambda m, d: training.train_reference(m, d, TRIAL, RUN),
    "train_schedule_reference": lambda m, d: train_schedule_reference(m, d, TRIAL, RUN),
    "train_trials": lambda m, d: training.train_trials(m, d, [TRIAL], RUN),
    "train_schedule_trials": lambda m, d: train_schedule_trials(m, d, [TRIAL], RUN),
    "train_distributed": lambda m, d: training.train_distributed(m, d, TRIAL, RUN, world_size=2),
    "train_env_rank": lambda m, d: train_env_rank(m, d, DistRun(TRIAL, RUN, 2)),
    "replay_snapshots": lambda m, d: replay_snapshots(m, d, TRIAL, RUN, [2]),
}


@pytest.fixture(scope="module")
def ten_classes():
    """Teacher data with 8 features and 10 classes."""
    return training.data.load("teacher", n=300, dim=8, num_classes=10, seed=1)


@pytest.fixture(scope="module")
def images():
    """40 random 1 x 28 x 28 images in 10 classes, made from tensors."""
    g = torch.Generator().manual_seed(0)
    return training.Dataset.from_tensors(torch.rand(40, 1, 28, 28, generator=g),
                                         torch.arange(40) % 10)


def bad_datasets(ds):
    """What users pass instead of a training.Dataset, and the type the message names."""
    pair = (ds.x_train, ds.y_train)
    return {"TensorDataset": TensorDataset(*pair), "DataLoader": DataLoader(TensorDataset(*pair)),
            "tuple": pair}


class Recorder:
    """Records the input shape of every forward call of a model, also those that raise (deep
    copies share the list)."""

    def __init__(self, model):
        self.shapes = []
        model.register_forward_pre_hook(lambda module, args: self.shapes.append(tuple(args[0].shape)))


def one_line_error(error, who, call, *words):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{who}: "), message
    for word in words:
        assert word in message, (word, message)
    return message


@pytest.mark.parametrize("who", TRAINERS)
@pytest.mark.parametrize("kind", ["TensorDataset", "DataLoader", "tuple"])
def test_a_trainer_refuses_what_is_not_a_dataset_naming_the_constructors(ten_classes, who, kind):
    net = training.models.build("linear", ten_classes)
    bad = bad_datasets(ten_classes)[kind]
    words = (["got DataLoader", "training.Dataset.from_torch(loader.dataset)"] if kind == "DataLoader"
             else [f"got {kind}", "training.Dataset.from_torch(", "Dataset.from_tensors(x, y)"])
    one_line_error(DataError, who, lambda: TRAINERS[who](net, bad),
                   "dataset must be a training.Dataset", *words)


@pytest.mark.parametrize("who", TRAINERS)
def test_a_trainer_refuses_a_model_that_is_not_a_module(ten_classes, who):
    one_line_error(ModelError, who, lambda: TRAINERS[who](ten_classes, ten_classes),
                   "model must be a torch.nn.Module, got Dataset")


@pytest.mark.parametrize("who", TRAINERS)
def test_seven_outputs_for_ten_classes_fail_on_one_example_before_training(ten_classes, who):
    net = nn.Sequential(nn.Linear(8, 7))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    seen = Recorder(net)
    one_line_error(ModelError, who, lambda: TRAINERS[who](net, ten_classes),
                   "model outputs [1, 7] for one example but the data set has 10 classes: "
                   "the last layer must have 10 outputs")
    assert seen.shapes == [(1, 8)]  # the check's one example, and no forward pass after it
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


@pytest.mark.parametrize("who", TRAINERS)
def test_a_wrong_input_width_names_the_input_shape(images, who):
    net = nn.Sequential(nn.Flatten(), nn.Linear(20, 10))  # built for 20 features
    seen = Recorder(net)
    one_line_error(ModelError, who, lambda: TRAINERS[who](net, images),
                   "model cannot take this data set's inputs of shape (1, 28, 28): ",
                   "mat1 and mat2 shapes cannot be multiplied (1x784 and 20x10)")
    assert seen.shapes == [(1, 1, 28, 28)]


def test_regression_outputs_must_match_the_targets():
    ds = training.data.load("linreg", n=50, dim=3)
    assert expected_output(ds) == (1,)
    check_output(training.models.build("linear", ds), ds, "who")  # Flatten1dOutput: [1]
    one_line_error(ModelError, "who", lambda: check_output(nn.Linear(3, 1), ds, "who"),
                   "model outputs [1, 1] for one example but the regression targets have shape "
                   "[1]: the model must output [1]", "training.models.Flatten1dOutput()")
    one_line_error(ModelError, "who", lambda: check_output(nn.Linear(3, 4), ds, "who"),
                   "model outputs [1, 4]", "must output [1], one value per example")


class PerToken(nn.Module):
    """A sequence model: [B, T] values in, [B, T, classes] logits out."""

    def __init__(self, classes):
        super().__init__()
        self.head = nn.Linear(1, classes)

    def forward(self, x):
        return self.head(x.unsqueeze(-1))


def test_per_token_outputs_are_the_target_shape_plus_classes():
    x, y = torch.randn(12, 5), torch.randint(0, 6, (12, 5))
    ds = training.Dataset("tokens", "classification", x[:8], y[:8], x[8:], y[8:], 6, (5,))
    assert expected_output(ds) == (1, 5, 6)
    check_output(PerToken(6), ds, "who")
    one_line_error(ModelError, "who", lambda: check_output(PerToken(4), ds, "who"),
                   "model outputs [1, 5, 4] for one example but the data set has 6 classes")
    one_line_error(ModelError, "who", lambda: check_output(nn.Linear(5, 6), ds, "who"),
                   "model outputs [1, 6] for one example but labels of shape [1, 5] with 6 "
                   "classes need [1, 5, 6]")


class Noisy(nn.Module):
    """Draws from the global RNG in its forward pass, and has a submodule left in eval mode."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(8, 10), nn.Dropout(0.5)

    def forward(self, x):
        return self.head(self.body(x)) + 0 * torch.randn(())


def test_the_check_runs_in_the_models_dtype_and_leaves_no_trace(ten_classes):
    net = Noisy().double().train()
    net.head.eval()
    self_train, head_train = net.training, net.head.training
    state = torch.get_rng_state()
    check_output(net, ten_classes, "who")  # float32 data through a float64 model
    assert torch.equal(torch.get_rng_state(), state)
    assert (net.training, net.head.training) == (self_train, head_train) == (True, False)


class TupleOut(nn.Module):
    def forward(self, x):
        return x, x


class ArgmaxOut(nn.Linear):
    def forward(self, x):
        return super().forward(x).argmax(-1, keepdim=True)


def test_outputs_that_are_not_float_tensors(ten_classes):
    one_line_error(ModelError, "who", lambda: check_output(TupleOut(), ten_classes, "who"),
                   "model returned a tuple, not a tensor")
    one_line_error(ModelError, "who", lambda: check_output(ArgmaxOut(8, 10), ten_classes, "who"),
                   "model outputs torch.int64; the losses need floating-point outputs")


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_train_trials_on_your_own_tensors_equals_the_registered_data(optimizer):
    """The registered teacher set's own tensors, through from_tensors with its validation split
    given, train to the same float64 result bit for bit."""
    teacher = training.data.load("teacher", n=300, dim=8, num_classes=3, seed=1)
    own = training.Dataset.from_tensors(teacher.x_train.numpy(), teacher.y_train.numpy(),
                                        x_val=teacher.x_val, y_val=teacher.y_val)
    net = training.models.build("mlp", teacher, hidden=[16], seed=0)
    trials = [Trial(lr=0.1, momentum=0.9), Trial(lr=0.3, momentum=0.5)]
    run = RunConfig(16, optimizer, max_steps=60, goal=0.3, seed=2, dtype=torch.float64,
                    eval_schedule=training.EvalSchedule(every=5), stop="never")
    a, b = (training.train_trials(net, d, trials, run) for d in (teacher, own))
    assert a.hit_step == b.hit_step and a.steps_run == b.steps_run == 60
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    for ca, cb in zip(a.curves, b.curves):
        assert np.array_equal(ca.metric, cb.metric) and np.array_equal(ca.train_loss, cb.train_loss)
