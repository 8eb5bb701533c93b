"""The joint pass of a plain ReLU MLP (theory.estimators.mlp_passes) against float64 autograd loops over
single examples: gradients at many points, per-example gradient moments and losses, with a mask
that leaves some layers dense; and which networks it takes."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import training
from theory import TheoryError
from theory.estimators.functional import flat_loss
from theory.estimators.mlp_passes import mlp_pass, plain_mlp
from theory.estimators.sampling import GroupMoments


@pytest.fixture(scope="module")
def data():
    return training.data.load("teacher", n=90, dim=5, num_classes=4, seed=3)


def two_hidden(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 6), nn.ReLU(),
                         nn.Linear(6, 4))


def per_example_gradients(net, theta, fl, x, y):
    """Float64 autograd, one example at a time, over kept coordinates."""
    out = []
    for xi, yi in zip(x, y):
        t = theta.double().clone().requires_grad_(True)
        params = fl.params(t)
        h = xi[None].double()
        for i in (1, 3, 5):
            h = F.linear(h, params[f"{i}.weight"].double(), params[f"{i}.bias"].double())
            h = torch.relu(h) if i < 5 else h
        out.append(torch.autograd.grad(F.cross_entropy(h, yi[None]), t)[0])
    return torch.stack(out)


@pytest.mark.parametrize("masked", [False, True])
def test_gradients_moments_and_losses_match_float64_loops(data, masked):
    net = two_hidden()
    # a mask on the first and last weights only: the middle layer takes the dense shortcut
    mask = {"1.weight": (torch.rand(7, 5, generator=torch.Generator().manual_seed(1)) > 0.4).float(),
            "5.weight": (torch.rand(4, 6, generator=torch.Generator().manual_seed(2)) > 0.3).float()
            } if masked else None
    fl = flat_loss(net, data, mask=mask, dtype=torch.float64)
    gen = torch.Generator().manual_seed(4)
    thetas = fl.theta + 0.3 * torch.randn(5, fl.dim, generator=gen, dtype=torch.float64)
    res = mlp_pass(fl, thetas, k=2, chunk=32)   # 72 training examples: chunks of 32, 32, 8
    x, y = fl.x, fl.y
    for p, theta in enumerate(thetas):
        g = per_example_gradients(net, theta, fl, x, y)
        assert torch.allclose(res.gradients[p], g.mean(0), rtol=1e-10, atol=1e-13), p
        if p < 2:
            count, mean, m2 = GroupMoments.of_parts([res.parts[p]]).total()
            assert count == len(x) and [c for c, _, _ in res.parts[p]] == [32, 32, 8]
            assert torch.allclose(mean, g.mean(0), rtol=1e-10, atol=1e-13)
            assert m2 == pytest.approx(float((g - g.mean(0)).square().sum()), rel=1e-10)
            with torch.no_grad():
                t = fl.params(theta)
                h = x.double()
                for i in (1, 3, 5):
                    h = F.linear(h, t[f"{i}.weight"], t[f"{i}.bias"])
                    h = torch.relu(h) if i < 5 else h
                loss = F.cross_entropy(h, y, reduction="sum")
            assert sum(res.losses[p]) == pytest.approx(float(loss), rel=1e-12)
    assert len(res.parts) == len(res.losses) == 2


def test_float32_agrees_with_float64_to_rounding(data):
    net = two_hidden(1)
    fl32 = flat_loss(net, data, dtype=torch.float32)
    fl64 = flat_loss(net, data, dtype=torch.float64)
    thetas = fl64.theta + 0.1 * torch.randn(3, fl64.dim, generator=torch.Generator().manual_seed(0),
                                            dtype=torch.float64)
    a, b = mlp_pass(fl32, thetas.float(), k=1), mlp_pass(fl64, thetas, k=1)
    assert torch.allclose(a.gradients.double(), b.gradients, rtol=1e-5, atol=1e-7)
    assert GroupMoments.of_parts([a.parts[0]]).total()[2] == pytest.approx(
        GroupMoments.of_parts([b.parts[0]]).total()[2], rel=1e-5)


def test_which_networks_it_takes(data):
    def fl(net):
        return flat_loss(net, data, dtype=torch.float32)
    assert plain_mlp(fl(two_hidden())) is not None
    assert plain_mlp(fl(training.models.build("mlp", data, hidden=[3], seed=0))) is not None
    torch.manual_seed(0)
    refused = [
        nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4)),                # not ReLU
        nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 4, bias=False)),    # no bias
        nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.ReLU(), nn.Linear(7, 4)),
        nn.Sequential(nn.Linear(5, 4), nn.ReLU()),                                 # ends in ReLU
        nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Dropout(0.1), nn.Linear(7, 4)),
    ]
    for net in refused:
        assert plain_mlp(fl(net)) is None, net
    with pytest.raises(TheoryError, match="plain ReLU MLP"):
        mlp_pass(fl(refused[0]), fl(refused[0]).theta[None])


@pytest.mark.parametrize("masked", [False, True])
def test_r_operator_hessian_matches_the_autograd_hessian(data, masked):
    """mlp_hessian's products, one row and many rows at once, against FlatLoss.hessian's
    reverse-over-reverse products and a dense float64 autograd Hessian."""
    from theory.estimators.mlp_passes import mlp_hessian

    net = two_hidden(2)
    mask = {"3.weight": (torch.rand(6, 7, generator=torch.Generator().manual_seed(5)) > 0.5).float()
            } if masked else None
    fl = flat_loss(net, data, mask=mask, dtype=torch.float64)
    v = torch.randn(5, fl.dim, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    mine, ref = mlp_hessian(fl), fl.hessian()
    assert torch.allclose(mine(v), ref(v), rtol=1e-10, atol=1e-13)
    assert torch.allclose(mine(v[2]), ref(v[2]), rtol=1e-10, atol=1e-13)
    dense = torch.autograd.functional.hessian(lambda t: fl.batch_loss(t, fl.x, fl.y), fl.theta)
    assert torch.allclose(mine(v), v @ dense, rtol=1e-10, atol=1e-13)
    with pytest.raises(TheoryError, match="v must have shape"):
        mine(v[:, :3])
