import subprocess
import sys
from pathlib import Path

import pytest
import torch

import training
from pruning import PruningError
from pruning.structured import StructuredReport, output_layer, prune_channels
from training.models import ResNet8, count_parameters


@pytest.fixture(scope="module")
def mnist1d():
    return training.data.load("mnist1d", num_samples=1000)


@pytest.mark.parametrize("model_name, fraction", [("mlp", 0.5), ("mlp", 0.1), ("cnn1d", 0.5)])
def test_hits_parameter_target_within_two_percent(mnist1d, model_name, fraction):
    net = training.models.build(model_name, mnist1d)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    small, rep = prune_channels(net, mnist1d.x_train[:8], fraction)
    assert isinstance(rep, StructuredReport)
    assert rep.params_before == count_parameters(net)
    assert rep.params_after == count_parameters(small)  # physically smaller
    assert abs(rep.params_after / rep.params_before / fraction - 1) <= 0.02
    assert rep.macs_after < rep.macs_before
    assert small(mnist1d.x_val[:3]).shape == (3, 10)
    assert output_layer(small).out_features == 10  # predictions untouched
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_pruned_model_still_trains(mnist1d):
    net = training.models.build("mlp", mnist1d)
    small, rep = prune_channels(net, mnist1d.x_train[:1], 0.5)
    res = training.train_reference(small, mnist1d, training.Trial(lr=0.1, momentum=0.9),
                                   training.RunConfig(64, max_steps=200))
    errors = res.curve.metric
    assert errors[-1] < errors[0] - 0.1 and errors[-1] < 0.7  # chance is 0.9


def test_residual_network(mnist1d):
    torch.manual_seed(0)
    net = ResNet8(3, 10, (8, 16, 16))
    x = torch.randn(2, 3, 8, 8)
    small, rep = prune_channels(net, x, 0.5)
    assert abs(rep.param_fraction / 0.5 - 1) <= 0.02
    assert small(x).shape == (2, 10)
    assert rep.to_dict()["macs_fraction"] == pytest.approx(rep.macs_after / rep.macs_before)


def test_ignored_layers_keep_their_channels(mnist1d):
    net = training.models.build("mlp", mnist1d)
    first = net[1]
    small, rep = prune_channels(net, mnist1d.x_train[:1], 0.6, ignored_layers=[first, net[5]])
    assert small[1].out_features == first.out_features  # kept whole
    assert small[3].out_features < net[3].out_features  # the budget came from the other layer
    assert abs(rep.param_fraction / 0.6 - 1) <= 0.02


def test_fraction_one_is_a_copy(mnist1d):
    net = training.models.build("mlp", mnist1d)
    small, rep = prune_channels(net, mnist1d.x_train[:1], 1.0)
    assert small is not net and rep.params_after == rep.params_before and rep.channel_ratio == 0


def test_bad_arguments(mnist1d):
    net = training.models.build("cnn1d", mnist1d, channels=4)
    x = mnist1d.x_train[:1]
    for bad in (0.0, 1.5, "half"):
        with pytest.raises(PruningError, match=r"param_fraction must be a number in \(0, 1\]"):
            prune_channels(net, x, bad)
    with pytest.raises(PruningError, match="example_input"):
        prune_channels(net, [1, 2], 0.5)
    with pytest.raises(PruningError, match="ignored_layers must be modules of the model"):
        prune_channels(net, x, 0.5, ignored_layers=[torch.nn.Linear(2, 2)])
    with pytest.raises(PruningError, match="cannot reach param_fraction 0.33 within 2%"):
        prune_channels(net, x, 0.33)  # 4 channels per layer: too coarse


def test_import_pruning_does_not_import_torch_pruning():
    """torch-pruning is imported where channel pruning uses it, not by ``import pruning``."""
    code = "import sys, pruning; print('torch_pruning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(training.__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"
