"""The probes on the byte-level language model (``transformer_lm``, per-token labels): gradient
noise against per-example gradients of a plain autograd loop (an example's loss: its mean
per-token cross-entropy), and the Hessian-vector products and lambda_max (double backward
through the written-out attention) against the dense Hessian."""

import pytest
import torch
from torch.func import functional_call

import training
from theory import gradient_noise, lanczos_top
from theory.estimators.functional import flat_loss

F64 = torch.float64


@pytest.fixture(scope="module")
def lm():
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, 12, (14, 5), generator=g)
    ds = training.Dataset("tokens", "classification", w[:10, :-1].float(), w[:10, 1:],
                          w[10:, :-1].float(), w[10:, 1:], 12, (4,))
    net = training.models.build("transformer_lm", ds, seed=2, layers=1, width=8, heads=2,
                                mlp_ratio=2).double()
    return net, ds


def example_loss(net, params, x, y):
    logits = functional_call(net, params, (x[None].double(),))[0]
    return -torch.log_softmax(logits, -1).gather(-1, y[:, None]).mean()


def test_gradient_noise_is_that_of_the_mean_token_loss_per_example(lm):
    net, ds = lm
    grads = []
    for x, y in zip(ds.x_train, ds.y_train):
        net.zero_grad()
        example_loss(net, dict(net.named_parameters()), x, y).backward()
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    g = torch.stack(grads)
    mean = g.mean(0)
    est = gradient_noise(net, ds, hessian_examples=0)
    # the full training split: |G|^2 of its mean gradient, tr(Sigma) of its own spread
    assert est.g_sq == pytest.approx(float(mean @ mean), rel=1e-8)
    assert est.trace_sigma == pytest.approx(float(((g - mean) ** 2).sum() / g.shape[0]), rel=1e-8)


def test_hessian_products_and_lambda_max_match_the_dense_hessian(lm):
    net, ds = lm
    names = [n for n, _ in net.named_parameters()]
    shapes = [p.shape for p in net.parameters()]
    theta0 = torch.cat([p.detach().flatten() for p in net.parameters()])

    def mean_loss(theta):
        params = dict(zip(names, (t.view(s) for t, s in zip(
            theta.split([s.numel() for s in shapes]), shapes))))
        logits = functional_call(net, params, (ds.x_train.double(),))
        return -torch.log_softmax(logits, -1).gather(-1, ds.y_train[..., None]).mean()

    dense = torch.autograd.functional.hessian(mean_loss, theta0, vectorize=True)
    fl = flat_loss(net, ds)
    v = torch.randn(theta0.numel(), dtype=F64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(fl.hvp(v), dense @ v, rtol=1e-8, atol=1e-10)
    top = float(torch.linalg.eigvalsh(dense)[-1])
    assert lanczos_top(fl, iterations=80) == pytest.approx(top, rel=1e-6)
