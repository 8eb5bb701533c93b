"""Curvature probes against dense Hessians from ``torch.autograd.functional.hessian`` of a loss
written by hand from the flat parameter vector, and against numpy closed forms (linear regression)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import training
from theory import (
    TheoryError, hessian_top_eigenvalues, hessian_trace, lanczos_top, local_lipschitz,
)
from theory.estimators.curvature import LEE_GAMMAS
from theory.estimators.curvature import dense_hessian as flat_dense_hessian
from theory.estimators.functional import flat_loss, parameter_vector


@pytest.fixture(scope="module")
def tiny():
    """A 5-12-3 ReLU MLP (111 parameters) on 150 teacher examples."""
    ds = training.data.load("teacher", n=150, dim=5, num_classes=3)
    return ds, training.models.build("mlp", ds, hidden=(12,), seed=2)


def mlp_loss(w, x, y, hidden=12):
    """Mean cross-entropy of Linear(5, hidden) -> ReLU -> Linear(hidden, 3) from a flat vector in
    named_parameters() order (weight, bias, weight, bias), written without the model."""
    d_in = x.shape[1]
    sizes = [hidden * d_in, hidden, 3 * hidden, 3]
    w1, b1, w2, b2 = torch.split(w, sizes)
    h = torch.relu(x @ w1.view(hidden, d_in).T + b1)
    return F.cross_entropy(h @ w2.view(3, hidden).T + b2, y)


def dense_hessian(ds, net, mask_vec=None):
    w = parameter_vector(net).double()
    if mask_vec is not None:
        w = w * mask_vec
    x, y = ds.x_train.double(), ds.y_train
    return torch.autograd.functional.hessian(lambda v: mlp_loss(v, x, y), w)


def random_mask(net, keep, seed):
    gen = torch.Generator().manual_seed(seed)
    return {n: (torch.rand(p.shape, generator=gen) < keep).float()
            for n, p in net.named_parameters() if n.endswith("weight")}


def mask_vector(net, mask):
    return torch.cat([mask.get(n, torch.ones_like(p)).reshape(-1).double()
                      for n, p in net.named_parameters()])


def linreg_design(ds):
    x = ds.x_train.double().numpy()
    xt = np.hstack([x, np.ones((x.shape[0], 1))])
    return xt.T @ xt / x.shape[0]


def test_hvp_matches_dense_hessian_and_chunking(tiny):
    ds, net = tiny
    h = dense_hessian(ds, net)
    v = torch.randn(2, h.shape[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for chunk in (None, 7):
        fl = flat_loss(net, ds, chunk=chunk)
        assert torch.allclose(fl.hvp(v), v @ h, rtol=1e-9, atol=1e-12)
        assert torch.allclose(fl.hvp(v[0]), h @ v[0], rtol=1e-9, atol=1e-12)


def test_lanczos_top3_matches_dense_eigvalsh(tiny):
    ds, net = tiny
    exact = torch.linalg.eigvalsh(dense_hessian(ds, net)).numpy()[::-1][:3]
    lanczos = hessian_top_eigenvalues(net, ds, k=3)
    np.testing.assert_allclose(lanczos, exact, rtol=1e-3)


def test_lanczos_with_mask_matches_restricted_hessian(tiny):
    ds, net = tiny
    mask = random_mask(net, 0.5, seed=1)
    mvec = mask_vector(net, mask)
    kept = torch.nonzero(mvec).reshape(-1)
    h = dense_hessian(ds, net, mvec)[kept][:, kept]
    exact = torch.linalg.eigvalsh(h).numpy()[::-1][:3]
    values, vectors = hessian_top_eigenvalues(net, ds, k=3, mask=mask, return_eigenvectors=True)
    np.testing.assert_allclose(values, exact, rtol=1e-3)
    assert vectors.shape == (kept.numel(), 3)
    residual = h.numpy() @ vectors - vectors * values
    assert np.abs(residual).max() < 1e-6
    # the unmasked spectrum is a different one
    assert not np.allclose(values, hessian_top_eigenvalues(net, ds, k=3), rtol=1e-3)


def test_small_dimension_uses_exact_dense_path():
    ds = training.data.load("linreg")
    net = training.models.build("linear", ds)
    exact = np.linalg.eigvalsh(linreg_design(ds))[::-1]
    np.testing.assert_allclose(hessian_top_eigenvalues(net, ds, k=11), exact, rtol=1e-10)
    lm = hessian_top_eigenvalues(net, ds, k=2, which="LM")
    np.testing.assert_allclose(lm, exact[:2], rtol=1e-10)


def test_hutchinson_trace_close_to_exact():
    ds = training.data.load("linreg")
    net = training.models.build("linear", ds)
    exact = np.trace(linreg_design(ds))
    est = hessian_trace(net, ds, method="hutchinson", matvecs=400, seed=0)
    assert est.matvecs == 400 and est.stderr > 0
    assert abs(est.value - exact) < 4 * est.stderr
    assert abs(est.value - exact) / exact < 0.02


def test_hutch_plus_plus_exact_when_sketch_spans_space(tiny):
    ds, net = tiny
    h = dense_hessian(ds, net)
    dim = h.shape[0]
    est = hessian_trace(net, ds, method="hutch++", matvecs=3 * dim)
    assert est.value == pytest.approx(float(torch.trace(h)), rel=1e-8)
    mask = random_mask(net, 0.3, seed=4)
    mvec = mask_vector(net, mask)
    kept = torch.nonzero(mvec).reshape(-1)
    exact = float(torch.trace(dense_hessian(ds, net, mvec)[kept][:, kept]))
    est = hessian_trace(net, ds, mask=mask, method="hutch++", matvecs=3 * kept.numel())
    assert est.value == pytest.approx(exact, rel=1e-8)


def test_local_lipschitz_on_quadratic_is_curvature_along_step():
    ds = training.data.load("linreg")
    net = training.models.build("linear", ds)
    h = linreg_design(ds)
    gen = torch.Generator().manual_seed(5)
    w_prev = {k: v + torch.randn(v.shape, generator=gen) for k, v in net.state_dict().items()}
    step = torch.randn(11, generator=gen, dtype=torch.float64)
    w_next = parameter_vector(net, w_prev).double() + step
    d = step.numpy()
    expected = np.linalg.norm(h @ d) / np.linalg.norm(d)
    est = local_lipschitz(net, ds, w_prev, w_next)
    assert est.gammas == pytest.approx([0.1 * i for i in range(1, 10)])
    np.testing.assert_allclose(est.ratios, expected, rtol=1e-8)
    assert float(est) == pytest.approx(expected, rel=1e-8)
    # along an eigenvector the constant is that eigenvalue
    values, vectors = np.linalg.eigh(h)
    flat_prev = parameter_vector(net, w_prev).double()
    along = local_lipschitz(net, ds, flat_prev, flat_prev + torch.tensor(vectors[:, -1]))
    assert along.value == pytest.approx(values[-1], rel=1e-8)


def test_local_lipschitz_with_mask_uses_restricted_hessian():
    ds = training.data.load("linreg")
    net = training.models.build("linear", ds)
    mask = {"1.weight": (torch.arange(10) % 2 == 0).float().reshape(1, 10)}
    kept = np.append(np.arange(10) % 2 == 0, True)
    h = linreg_design(ds)[np.ix_(kept, kept)]
    w_prev = parameter_vector(net).double()
    step = torch.randn(11, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    d = step.numpy()[kept]  # pruned coordinates of the step are ignored
    est = local_lipschitz(net, ds, w_prev, w_prev + step, mask=mask)
    assert est.value == pytest.approx(np.linalg.norm(h @ d) / np.linalg.norm(d), rel=1e-8)


def test_local_lipschitz_on_mlp_follows_lee_et_al(tiny):
    ds, net = tiny
    x, y = ds.x_train.double(), ds.y_train
    w_prev = parameter_vector(net).double()
    w_next = w_prev - 0.5 * torch.func.grad(mlp_loss)(w_prev, x, y)
    grad_at = lambda w: torch.func.grad(mlp_loss)(w, x, y)
    gammas = (0.25, 0.5, 1.0)
    expected = [float((grad_at((1 - g) * w_prev + g * w_next) - grad_at(w_prev)).norm()
                      / (g * (w_next - w_prev)).norm()) for g in gammas]
    est = local_lipschitz(net, ds, w_prev, w_next, gammas=gammas, chunk=40)
    np.testing.assert_allclose(est.ratios, expected, rtol=1e-9)
    assert est.value == pytest.approx(max(expected), rel=1e-12)
    again = local_lipschitz(net, ds, w_prev, w_next, gammas=gammas, grad_prev=grad_at(w_prev))
    np.testing.assert_allclose(again.ratios, expected, rtol=1e-9)


def test_bad_input_names_the_argument(tiny):
    ds, net = tiny
    w = parameter_vector(net)
    with pytest.raises(TheoryError, match="step is zero"):
        local_lipschitz(net, ds, w, w.clone())
    with pytest.raises(TheoryError, match="gammas"):
        local_lipschitz(net, ds, w, w + 1, gammas=(0.0, 0.5))
    with pytest.raises(TheoryError, match="length"):
        local_lipschitz(net, ds, w, w[:-1])
    with pytest.raises(TheoryError, match="lacks"):
        local_lipschitz(net, ds, {}, w)
    with pytest.raises(TheoryError, match="grad_prev"):
        local_lipschitz(net, ds, w, w + 1, grad_prev=torch.zeros(3))
    with pytest.raises(TheoryError, match="which"):
        hessian_top_eigenvalues(net, ds, which="SA")
    with pytest.raises(TheoryError, match="did not converge"):
        hessian_top_eigenvalues(net, ds, k=3, tol=1e-15, maxiter=1)
    with pytest.raises(TheoryError, match="k must be"):
        hessian_top_eigenvalues(net, ds, k=10_000)
    with pytest.raises(TheoryError, match="method"):
        hessian_trace(net, ds, method="exact")
    with pytest.raises(TheoryError, match="every parameter"):
        hessian_trace(net, ds, mask={n: torch.zeros_like(p) for n, p in net.named_parameters()})


def test_lanczos_top_converges_to_the_dense_top_eigenvalue():
    ds = training.data.load("teacher", n=120, dim=4, num_classes=3)
    net = training.models.build("mlp", ds, hidden=(6,), seed=2)
    fl = flat_loss(net, ds, dtype=torch.float64)
    exact = float(torch.linalg.eigvalsh(flat_dense_hessian(fl))[-1])
    assert lanczos_top(fl, iterations=fl.dim) == pytest.approx(exact, rel=1e-9)
    few = lanczos_top(fl, iterations=5)
    assert few <= exact * (1 + 1e-12) and few == pytest.approx(exact, rel=0.2)


def _old_local_lipschitz(net, ds, w_prev, w_next, gammas, dtype):
    """The implementation before the gammas were batched: one full-split gradient at a time."""
    fl = flat_loss(net, ds, dtype=dtype, weights=w_prev)
    step = fl.restrict(w_next.to(dtype)) - fl.theta
    g_prev = fl.gradient(fl.theta)
    return [float((fl.gradient(fl.theta + g * step) - g_prev).norm()) / (g * float(step.norm()))
            for g in gammas]


class _BatchNormCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(1, 3, 3), torch.nn.BatchNorm2d(3)
        self.fc = torch.nn.Linear(3 * 3 * 3, 3)

    def forward(self, x):
        return self.fc(torch.max_pool2d(torch.relu(self.bn(self.conv(x))), 2).flatten(1))


class _GRU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru, self.fc = torch.nn.GRU(3, 5, batch_first=True), torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.fc(self.gru(x)[0][:, -1])


def _user_data(shape, n=120):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, *shape, generator=g), torch.randint(0, 3, (n,), generator=g)
    return training.Dataset("user", "classification", x[:90], y[:90], x[90:], y[90:], 3, shape)


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("kind", ["mlp", "batchnorm_cnn", "gru"])
def test_batched_gammas_give_the_values_of_one_gradient_at_a_time(tiny, kind, dtype, rtol):
    """Lee's L with every gamma's gradient in one pass (FlatLoss.gradients) equals the loop of
    single gradients it replaced, within float32 rounding (BatchNorm in eval mode; a recurrent
    network takes the loop)."""
    if kind == "mlp":
        ds, net = tiny
    else:
        torch.manual_seed(0)
        ds = _user_data((1, 8, 8) if kind == "batchnorm_cnn" else (6, 3))
        net = _BatchNormCNN() if kind == "batchnorm_cnn" else _GRU()
        net.train()(ds.x_train[:16])   # running statistics away from their initial values
    w_prev = parameter_vector(net).double()
    w_next = w_prev + 0.05 * torch.randn(w_prev.shape, generator=torch.Generator().manual_seed(1),
                                         dtype=torch.float64)
    want = _old_local_lipschitz(net, ds, w_prev, w_next, LEE_GAMMAS, dtype)
    got = local_lipschitz(net, ds, w_prev, w_next, dtype=dtype)
    np.testing.assert_allclose(got.ratios, want, rtol=rtol)
    assert got.gammas == LEE_GAMMAS and min(want) > 0
    fl = flat_loss(net, ds, dtype=dtype, chunk=32)
    points = torch.stack([fl.theta * s for s in (1.0, 0.5, 2.0)])
    for row, point in zip(fl.gradients(points), points):
        torch.testing.assert_close(row, fl.gradient(point), rtol=rtol * 10, atol=rtol * 1e-3)
