"""Per-example gradient moments from norms (fully connected networks) against materialized
per-example gradients (torch.func), and the networks the shortcut must refuse."""

import numpy as np
import pytest
import torch
from torch import nn

import training
from theory.estimators.example_norms import chunk_moments, weighted_layers
from theory.estimators.functional import flat_loss
from theory.estimators.noise import gradient_group_moments
from theory.estimators.sampling import GroupMoments


@pytest.fixture(scope="module")
def teacher():
    return training.data.load("teacher", n=300)


def materialized(fl, groups):
    """Moments of ``groups`` contiguous groups (the library's bounds) from per-example gradients
    (the ground truth)."""
    bounds = np.linspace(0, fl.n, groups + 1).round().astype(int)
    return GroupMoments.of_chunks([list(fl.per_example_gradients(x=fl.x[lo:hi], y=fl.y[lo:hi]))
                                   for lo, hi in zip(bounds[:-1], bounds[1:])])


def assert_same(got, want):
    assert got.counts.tolist() == want.counts.tolist()
    torch.testing.assert_close(got.means, want.means, rtol=1e-10, atol=1e-14)
    assert got.m2 == pytest.approx(want.m2, rel=1e-10)


def test_mlp_moments_match_per_example_gradients_with_a_mask(teacher):
    net = training.models.build("mlp", teacher, hidden=(16, 8))
    torch.manual_seed(3)
    mask = {n: (torch.rand_like(p) > 0.5).float() for n, p in net.named_parameters()}
    fl = flat_loss(net, teacher, mask=mask)
    assert weighted_layers(net) is not None
    # uneven chunks inside uneven groups: the pairwise merge must be exact too
    assert_same(gradient_group_moments(fl, chunk=17, groups=7), materialized(fl, 7))


def test_dropout_networks_take_the_shortcut_in_eval_mode(teacher):
    """Dropout is the identity in the eval mode the probes define, so a dropout MLP left in
    train mode gets its moments from norms, equal to the materialized eval-mode gradients."""
    torch.manual_seed(5)
    d = teacher.x_train.shape[1]
    net = nn.Sequential(nn.Linear(d, 12), nn.ReLU(), nn.Dropout(0.5), nn.Linear(12, 4)).double()
    fl = flat_loss(net, teacher)
    assert weighted_layers(net) is not None and chunk_moments(fl, fl.x, fl.y) is not None
    assert_same(gradient_group_moments(fl, chunk=40, groups=5), materialized(fl, 5))
    assert net.training


def test_one_chunk_gives_count_mean_and_sum_of_squared_deviations(teacher):
    net = training.models.build("mlp", teacher, hidden=(12,))
    fl = flat_loss(net, teacher)
    g = torch.cat(list(fl.per_example_gradients()))
    count, mean, m2 = chunk_moments(fl, fl.x, fl.y)
    assert count == teacher.n_train
    torch.testing.assert_close(mean, g.mean(0), rtol=1e-10, atol=1e-14)
    assert m2 == pytest.approx(float((g - g.mean(0)).pow(2).sum()), rel=1e-10)


def test_cnn1d_moments_match_per_example_gradients_with_a_mask():
    ds = training.data.load("mnist1d", num_samples=600)
    net = training.models.build("cnn1d", ds, channels=4)
    torch.manual_seed(4)
    mask = {n: (torch.rand_like(p) > 0.3).float() for n, p in net.named_parameters()}
    fl = flat_loss(net, ds, mask=mask)
    assert sorted(type(m).__name__ for m in weighted_layers(net).values()) == ["Conv1d"] * 3 + ["Linear"]
    assert_same(gradient_group_moments(fl, chunk=64, groups=3), materialized(fl, 3))


def test_dilated_strided_padded_conv1d(teacher):
    torch.manual_seed(2)
    d = teacher.x_train.shape[1]
    net = nn.Sequential(nn.Unflatten(1, (1, d)), nn.Conv1d(1, 3, 3, stride=2, padding=2, dilation=2),
                        nn.Tanh(), nn.Flatten(), nn.LazyLinear(4)).double()
    net(teacher.x_train[:2].double())
    assert weighted_layers(net) is not None
    fl = flat_loss(net, teacher)
    assert_same(gradient_group_moments(fl, groups=2), materialized(fl, 2))


def test_regression_on_the_library_linear_model():
    ds = training.data.load("linreg")
    fl = flat_loss(training.models.build("linear", ds), ds)
    assert_same(gradient_group_moments(fl, groups=3), materialized(fl, 3))


def test_a_bare_linear_module(teacher):
    torch.manual_seed(1)
    fl = flat_loss(nn.Linear(teacher.x_train.shape[1], 4), teacher)
    assert weighted_layers(fl.model) == {"": fl.model}
    assert_same(gradient_group_moments(fl, groups=2), materialized(fl, 2))


class Shared(nn.Module):
    """One Linear applied twice: its per-example gradient is a sum of two outer products."""

    def __init__(self, d):
        super().__init__()
        self.layer = nn.Linear(d, d)
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        return self.head(torch.relu(self.layer(torch.relu(self.layer(x)))))


class Sequence(nn.Module):
    """A Linear over a sequence axis: each example's gradient sums over positions."""

    def __init__(self, d):
        super().__init__()
        self.layer = nn.Linear(d // 4, 4)

    def forward(self, x):
        return self.layer(x.reshape(x.shape[0], 4, -1)).mean(1)


@pytest.mark.parametrize("make", [
    lambda d: Shared(d),
    lambda d: Sequence(d),
    lambda d: nn.Sequential(nn.Linear(d, 8), nn.BatchNorm1d(8), nn.Linear(8, 4)).eval(),
    lambda d: nn.Sequential(nn.Unflatten(1, (1, 1, d)), nn.Conv2d(1, 2, (1, 3)), nn.Flatten(),
                            nn.Linear(2 * (d - 2), 4)),
    lambda d: nn.Sequential(nn.Unflatten(1, (2, d // 2)), nn.Conv1d(2, 2, 3, groups=2),
                            nn.Flatten(), nn.Linear(2 * (d // 2 - 2), 4)),
    lambda d: nn.Sequential(nn.Unflatten(1, (1, d)), nn.Conv1d(1, 2, 3, padding="same"),
                            nn.Flatten(), nn.Linear(2 * d, 4)),
], ids=["shared", "sequence", "batchnorm", "conv2d", "grouped", "same-padding"])
def test_other_networks_fall_back_to_per_example_gradients(teacher, make):
    torch.manual_seed(0)
    net = make(teacher.x_train.shape[1]).double()
    fl = flat_loss(net, teacher)
    assert chunk_moments(fl, fl.x[:10], fl.y[:10]) is None
    assert_same(gradient_group_moments(fl, groups=4), materialized(fl, 4))
