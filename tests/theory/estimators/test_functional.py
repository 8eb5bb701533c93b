"""``FlatLoss.hessian`` (reverse-over-reverse products on retained gradient graphs) against the dense
Hessian of a loss written by hand from the flat parameter vector (``torch.autograd.functional``)."""

import pytest
import torch
import torch.nn.functional as F

import training
from theory import TheoryError
from theory import functional
from theory.estimators.functional import flat_loss, parameter_vector

HIDDEN = 6


@pytest.fixture(scope="module")
def small():
    """A 4-6-3 ReLU MLP (51 parameters) on 40 teacher examples, and its dense float64 Hessian."""
    ds = training.data.load("teacher", n=40, dim=4, num_classes=3)
    net = training.models.build("mlp", ds, hidden=(HIDDEN,), seed=1)
    x, y = ds.x_train.double(), ds.y_train

    def loss(w):
        w1, b1, w2, b2 = torch.split(w, [HIDDEN * 4, HIDDEN, 3 * HIDDEN, 3])
        h = torch.relu(x @ w1.view(HIDDEN, 4).T + b1)
        return F.cross_entropy(h @ w2.view(3, HIDDEN).T + b2, y)

    return ds, net, loss


def rows(dim, m, seed=0):
    return torch.randn(m, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("retained", [10_000, 10, 0])
def test_hessian_operator_matches_dense_with_retained_and_rebuilt_chunks(small, monkeypatch, retained):
    # chunk 7 over 40 examples: 6 chunks; 10 retains one chunk and rebuilds five, 0 rebuilds all but
    # the first (always retained so memory stays one chunk)
    ds, net, loss = small
    monkeypatch.setattr(functional, "RETAINED_EXAMPLES", retained)
    h = torch.autograd.functional.hessian(loss, parameter_vector(net).double())
    hess = flat_loss(net, ds, chunk=7).hessian()
    v = rows(h.shape[0], 3)
    for _ in range(2):   # a second pass over the same retained graphs gives the same products
        assert torch.allclose(hess(v), v @ h, rtol=1e-9, atol=1e-12)
        assert torch.allclose(hess(v[1]), h @ v[1], rtol=1e-9, atol=1e-12)


def test_hessian_operator_masked_and_at_given_theta(small):
    ds, net, loss = small
    gen = torch.Generator().manual_seed(3)
    mask = {n: (torch.rand(p.shape, generator=gen) < 0.5).float()
            for n, p in net.named_parameters() if n.endswith("weight")}
    fl = flat_loss(net, ds, mask=mask)
    kept = fl.kept
    theta = fl.theta + 0.1 * rows(fl.dim, 1, seed=4)[0]
    h = torch.autograd.functional.hessian(loss, fl.embed(theta))[kept][:, kept]
    v = rows(fl.dim, 2, seed=5)
    with torch.no_grad():   # products still differentiate inside a no_grad block
        assert torch.allclose(fl.hessian(theta)(v), v @ h, rtol=1e-9, atol=1e-12)
        assert torch.allclose(fl.hvp(v[0], theta), h @ v[0], rtol=1e-9, atol=1e-12)


def test_hessian_operator_rejects_wrong_shape(small):
    ds, net, _ = small
    fl = flat_loss(net, ds)
    with pytest.raises(TheoryError, match=r"v must have shape \(51,\)"):
        fl.hessian()(torch.zeros(50, dtype=torch.float64))
    with pytest.raises(TheoryError, match="v must have shape"):
        fl.hvp(torch.zeros(2, 2, 51, dtype=torch.float64))
