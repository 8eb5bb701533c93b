"""The probes check what they are given before computing anything: a data set that is not a
``training.Dataset`` names the constructors that make one, a model whose output does not fit the
data fails on one example (one line each)."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import training
from theory import (
    gradient_noise, hessian_top_eigenvalues, hessian_trace, local_lipschitz, probe_trajectory,
    two_batch_noise,
)
from theory.estimators.functional import flat_loss, select_examples
from theory.verdicts.trajectory import replay_states
from training import DataError, ModelError, RunConfig, Trial

RUN = RunConfig(batch_size=8, max_steps=2)

# every probe that takes a (model, data set)
PROBES = {
    "gradient_noise": lambda m, d: gradient_noise(m, d),
    "two_batch_noise": lambda m, d: two_batch_noise(m, d, 2, 4, draws=2),
    "hessian_top_eigenvalues": lambda m, d: hessian_top_eigenvalues(m, d),
    "hessian_trace": lambda m, d: hessian_trace(m, d, matvecs=3),
    "local_lipschitz": lambda m, d: local_lipschitz(m, d, m.state_dict(), m.state_dict()),
    "flat_loss": lambda m, d: flat_loss(m, d),
    "replay_states": lambda m, d: replay_states(m, d, Trial(lr=0.1), RUN, [1]),
    "probe_trajectory": lambda m, d: probe_trajectory(m, d, Trial(lr=0.1), RUN, [0], 2),
}


@pytest.fixture(scope="module")
def ten_classes():
    return training.data.load("teacher", n=100, dim=6, num_classes=10, seed=0)


@pytest.mark.parametrize("who", PROBES)
@pytest.mark.parametrize("kind", ["TensorDataset", "tuple"])
def test_a_probe_refuses_what_is_not_a_dataset_naming_the_constructors(ten_classes, who, kind):
    net = training.models.build("linear", ten_classes)
    pair = (ten_classes.x_train, ten_classes.y_train)
    bad = TensorDataset(*pair) if kind == "TensorDataset" else pair
    with pytest.raises(DataError) as info:
        PROBES[who](net, bad)
    assert str(info.value) == (f"{who}: dataset must be a training.Dataset, got {kind}; build one "
                               f"with training.Dataset.from_torch(...) or "
                               f"training.Dataset.from_tensors(x, y)")


def test_select_examples_refuses_a_tuple():
    with pytest.raises(DataError, match="select_examples: dataset must be a training.Dataset, "
                                        "got tuple"):
        select_examples((torch.zeros(3, 2), torch.zeros(3)))


@pytest.mark.parametrize("who", PROBES)
def test_a_probe_checks_the_output_shape_on_one_example(ten_classes, who):
    net = nn.Linear(6, 7)
    calls = []
    net.register_forward_pre_hook(lambda module, args: calls.append(tuple(args[0].shape)))
    with pytest.raises(ModelError) as info:
        PROBES[who](net, ten_classes)
    assert str(info.value) == (f"{who}: model outputs [1, 7] for one example but the data set has "
                               f"10 classes: the last layer must have 10 outputs")
    assert calls == [(1, 6)]


def test_gradient_noise_on_your_own_tensors_equals_the_registered_data():
    """The registered linreg set's tensors through from_tensors (validation given) give the same
    float64 estimates, bit for bit."""
    ds = training.data.load("linreg", n=120, dim=4, noise=0.3, seed=1)
    own = training.Dataset.from_tensors(ds.x_train, ds.y_train, x_val=ds.x_val, y_val=ds.y_val)
    assert own.task == "regression"
    net = training.models.build("linear", ds, seed=3)
    a, b = gradient_noise(net, ds), gradient_noise(net, own)
    assert (a.g_sq, a.trace_sigma, a.b_noise) == (b.g_sq, b.trace_sigma, b.b_noise)
