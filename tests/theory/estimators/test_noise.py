"""Gradient noise against closed forms computed independently with numpy (linear regression) and
against a plain per-example autograd loop (MLP)."""

import numpy as np
import pytest
import torch

import training
from theory import NoiseStream, TheoryError, gradient_noise, two_batch_estimates, two_batch_noise
from training.data import Dataset


def linreg_closed_form(ds, net, mask=None):
    """Per-example gradients of 0.5 (w.x + b - y)^2 in numpy: g_i = r_i [x_i, 1]; with a weight
    mask, w is replaced by w*m and only kept coordinates are returned."""
    sd = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    (wname, w), (_, b) = [(k, v) for k, v in sd.items()]
    m = np.ones_like(w) if mask is None else mask[wname].double().numpy()
    x = ds.x_train.double().numpy()
    y = ds.y_train.double().numpy()
    r = x @ (w * m).reshape(-1) + b[0] - y
    xt = np.hstack([x, np.ones((x.shape[0], 1))])
    kept = np.append(m.reshape(-1) != 0, True)
    g = (r[:, None] * xt)[:, kept]
    h = (xt.T @ xt / x.shape[0])[np.ix_(kept, kept)]
    mean = g.mean(0)
    d = g - mean
    sigma = d.T @ d / x.shape[0]  # divide by n, as the library
    return dict(g=g, g_sq=mean @ mean, trace_sigma=np.trace(sigma),
                b_simple=np.trace(sigma) / (mean @ mean),
                b_noise=np.trace(h @ sigma) / (mean @ h @ mean), loss=0.5 * np.mean(r ** 2))


def rel(a, b):
    return abs(a - b) / abs(b)


@pytest.fixture(scope="module")
def linreg():
    ds = training.data.load("linreg")
    return ds, training.models.build("linear", ds)


def test_linreg_matches_closed_form(linreg):
    ds, net = linreg
    exact = linreg_closed_form(ds, net)
    est = gradient_noise(net, ds, hessian_examples=None)
    for key in ("g_sq", "trace_sigma", "b_simple", "b_noise", "loss"):
        assert rel(getattr(est, key), exact[key]) < 1e-4, key
    assert est.n == ds.n_train and est.n_params == 11 and est.hessian_examples == ds.n_train


def test_linreg_mask_restricts_to_kept_weights(linreg):
    ds, net = linreg
    mask = {"1.weight": (torch.arange(10) % 3 != 0).float().reshape(1, 10)}
    exact = linreg_closed_form(ds, net, mask)
    est = gradient_noise(net, ds, mask=mask, hessian_examples=None, chunk=37)
    for key in ("g_sq", "trace_sigma", "b_simple", "b_noise", "loss"):
        assert rel(getattr(est, key), exact[key]) < 1e-4, key
    assert est.n_params == 7


def test_b_noise_equals_b_simple_when_hessian_is_identity():
    # whitened inputs: mean x = 0 and x^T x / n = I, so H = [[I, 0], [0, 1]] = I
    n, dim = 200, 5
    rng = np.random.default_rng(3)
    a = np.hstack([np.ones((n, 1)), rng.standard_normal((n, dim))])
    q, _ = np.linalg.qr(a)
    x = torch.tensor(q[:, 1:] * np.sqrt(n))
    y = torch.tensor(rng.standard_normal(n))
    ds = Dataset("whitened", "regression", x, y, x[:2], y[:2], 0, (dim,))
    net = training.models.build("linear", ds, seed=1)
    est = gradient_noise(net, ds, hessian_examples=None)
    assert rel(est.b_noise, est.b_simple) < 1e-10
    assert rel(est.g_h_g, est.g_sq) < 1e-10


def test_mlp_matches_per_example_autograd_loop_and_dense_hessian():
    ds = training.data.load("teacher", n=60, dim=5, num_classes=3)
    net = training.models.build("mlp", ds, hidden=(7,)).double()
    x, y = ds.x_train.double(), ds.y_train
    grads = []
    for xi, yi in zip(x, y):
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(xi[None]), yi[None]).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    g = torch.stack(grads)
    mean = g.mean(0)
    d = g - mean
    names = [n for n, _ in net.named_parameters()]
    shapes = [p.shape for p in net.parameters()]

    def loss_of(w):
        pieces = torch.split(w, [s.numel() for s in shapes])
        params = {n: q.view(s) for n, q, s in zip(names, pieces, shapes)}
        return torch.nn.functional.cross_entropy(torch.func.functional_call(net, params, (x,)), y)

    w = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    h = torch.autograd.functional.hessian(loss_of, w)
    exact_b_noise = float(torch.trace(h @ d.T @ d) / g.shape[0] / (mean @ h @ mean))

    est = gradient_noise(net.float(), ds, chunk=5, hessian_examples=None)
    assert rel(est.g_sq, float(mean @ mean)) < 1e-8
    assert rel(est.trace_sigma, float(d.pow(2).sum(1).mean())) < 1e-8
    assert rel(est.b_noise, exact_b_noise) < 1e-8
    skipped = gradient_noise(net, ds, hessian_examples=0)
    assert np.isnan(skipped.b_noise) and skipped.hessian_examples == 0


def test_sampled_trace_h_sigma_is_unbiased(linreg):
    ds, net = linreg
    exact = gradient_noise(net, ds, hessian_examples=None).trace_h_sigma
    samples = [gradient_noise(net, ds, hessian_examples=40, seed=s).trace_h_sigma
               for s in range(40)]
    assert len(set(samples)) > 30  # the seed changes the sample
    stderr = np.std(samples) / np.sqrt(len(samples))
    assert abs(np.mean(samples) - exact) < 4 * stderr


def test_examples_subset_is_exact_on_that_subset(linreg):
    ds, net = linreg
    idx = torch.arange(0, 800, 4)
    sub = Dataset("sub", "regression", ds.x_train[idx], ds.y_train[idx], ds.x_val, ds.y_val, 0, (10,))
    a = gradient_noise(net, ds, examples=idx, hessian_examples=0)
    b = gradient_noise(net, sub, hessian_examples=0)
    assert (a.n, a.population, b.population) == (200, 800, 200)
    assert rel(a.finite.trace_sigma, b.trace_sigma) < 1e-12 and rel(a.finite.g_sq, b.g_sq) < 1e-12
    # corrected to the 800-example split: |m|^2 - (1 - n/N) s^2/n and (N-1)/N s^2
    s2 = b.trace_sigma * 200 / 199
    assert a.g_sq == pytest.approx(b.g_sq - (1 - 200 / 800) * s2 / 200, rel=1e-12)
    assert a.trace_sigma == pytest.approx(799 / 800 * s2, rel=1e-12)
    assert a.b_simple == pytest.approx(a.trace_sigma / a.g_sq, rel=1e-12)
    assert b.g_sq_se == b.trace_sigma_se == b.b_simple_se == 0.0  # the whole split: exact
    assert a.g_sq_se > 0 and a.trace_sigma_se > 0 and a.b_simple_se > 0
    c = gradient_noise(net, ds, examples=100, seed=1, hessian_examples=0)
    assert c.n == 100 and c.trace_sigma != a.trace_sigma


def exact_batch_draws(g, b_small, b_big, draws, seed):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, g.shape[0], size=(draws, b_big))  # with replacement
    big = g[idx].mean(1)
    small = g[idx[:, :b_small]].mean(1)
    return (small ** 2).sum(1), (big ** 2).sum(1)


def test_two_batch_estimators_average_to_exact(linreg):
    ds, net = linreg
    exact = linreg_closed_form(ds, net)
    small, big = exact_batch_draws(exact["g"], 4, 64, 2000, seed=0)
    est = two_batch_estimates(small, big, 4, 64)
    assert est.g_sq.shape == (2000,)
    assert rel(est.g_sq.mean(), exact["g_sq"]) < 0.03
    assert rel(est.trace_sigma.mean(), exact["trace_sigma"]) < 0.03
    stream = NoiseStream(4, 64).update(small, big)
    assert rel(stream.b_simple, exact["b_simple"]) < 0.03
    # ratio of averages, not average of ratios
    assert stream.b_simple == pytest.approx(est.trace_sigma.mean() / est.g_sq.mean(), rel=1e-12)


def test_two_batch_estimators_are_unbiased_by_enumeration():
    # per-example gradients 1, 1, 1, -1 in 1-D: the expectation over every equally likely draw
    g = np.array([[1.0], [1.0], [1.0], [-1.0]])
    g_mean = g.mean(0)
    trace = float(((g - g_mean) ** 2).sum(1).mean())
    # all ordered pairs drawn with replacement, small batch = first element
    pairs = [(i, j) for i in range(4) for j in range(4)]
    small = np.array([(g[i] ** 2).sum() for i, _ in pairs])
    big = np.array([(((g[i] + g[j]) / 2) ** 2).sum() for i, j in pairs])
    est = two_batch_estimates(small, big, 1, 2)
    assert est.g_sq.mean() == pytest.approx(float(g_mean @ g_mean), abs=1e-12)
    assert est.trace_sigma.mean() == pytest.approx(trace, abs=1e-12)


def test_two_batch_noise_from_model(linreg):
    ds, net = linreg
    exact = linreg_closed_form(ds, net)
    stream = two_batch_noise(net, ds, 4, 64, draws=2000, seed=0)
    assert stream.weight == 2000
    assert rel(stream.g_sq, exact["g_sq"]) < 0.03
    assert rel(stream.trace_sigma, exact["trace_sigma"]) < 0.03


def test_noise_stream_averages():
    small, big = np.array([5.0, 3.0, 4.0]), np.array([2.0, 1.0, 1.5])
    est = two_batch_estimates(small, big, 2, 8)
    plain = NoiseStream(2, 8).update(small[:1], big[:1]).update(small[1:], big[1:])
    assert plain.g_sq == pytest.approx(est.g_sq.mean()) and plain.trace_sigma == pytest.approx(
        est.trace_sigma.mean())
    ema = NoiseStream(2, 8, decay=0.5)
    for s, b in zip(small, big):
        ema = ema.update(float(s), float(b))
    w = np.array([0.25, 0.5, 1.0])
    assert ema.g_sq == pytest.approx(w @ est.g_sq / w.sum())
    assert NoiseStream(2, 8, decay=0.5).update(small, big).trace_sigma == pytest.approx(ema.trace_sigma)


def test_bad_input_names_the_argument(linreg):
    ds, net = linreg
    with pytest.raises(TheoryError, match="b_big"):
        two_batch_estimates(1.0, 1.0, 8, 8)
    with pytest.raises(TheoryError, match="decay"):
        NoiseStream(1, 2, decay=0.0)
    with pytest.raises(TheoryError, match="no updates"):
        NoiseStream(1, 2).g_sq
    with pytest.raises(TheoryError, match="hessian_examples"):
        gradient_noise(net, ds, hessian_examples=-1)
    with pytest.raises(TheoryError, match="examples"):
        gradient_noise(net, ds, examples=10_000)
    with pytest.raises(TheoryError, match="chunk"):
        gradient_noise(net, ds, chunk=0)
    with pytest.raises(TheoryError, match="split"):
        gradient_noise(net, ds, split="holdout")
    with pytest.raises(ValueError, match="not a parameter"):
        gradient_noise(net, ds, mask={"nope": torch.ones(1)})


def per_example_gradients(net, x, y):
    """Per-example gradients by a plain autograd loop, one backward pass per example."""
    grads = []
    for xi, yi in zip(x, y):
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(xi[None]), yi[None]).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    return torch.stack(grads)


def test_finite_set_statistics_of_a_sample_match_per_example_autograd():
    ds = training.data.load("teacher", n=300, dim=5, num_classes=3)
    net = training.models.build("mlp", ds, hidden=(7,), seed=1).double()
    idx = torch.randperm(ds.n_train, generator=torch.Generator().manual_seed(2))[:64]
    g = per_example_gradients(net, ds.x_train.double()[idx], ds.y_train[idx])
    mean = g.mean(0)
    est = gradient_noise(net, ds, examples=idx, hessian_examples=0)
    assert rel(est.finite.g_sq, float(mean @ mean)) < 1e-10
    assert rel(est.finite.trace_sigma, float((g - mean).pow(2).sum(1).mean())) < 1e-10
    assert rel(est.finite.b_simple, est.finite.trace_sigma / est.finite.g_sq) < 1e-12
    assert est.population == ds.n_train and est.n == 64


def subsample_means(net, ds, n, draws):
    """Mean over ``draws`` seeded ``n``-example subsamples of the split estimates and of the
    finite-set statistics."""
    ests = [gradient_noise(net, ds, examples=n, seed=s, hessian_examples=0) for s in range(draws)]
    g = np.array([e.g_sq for e in ests])
    t = np.array([e.trace_sigma for e in ests])
    return g, t, np.array([e.finite.g_sq for e in ests]), np.array([e.finite.b_simple for e in ests])


def test_unbiased_on_subsamples_small_mlp():
    ds = training.data.load("teacher", n=1200, dim=8, num_classes=3, hidden=16)
    net = training.models.build("mlp", ds, hidden=(16,), seed=0)
    full = gradient_noise(net, ds, hessian_examples=0)
    g, t, finite_g, finite_b = subsample_means(net, ds, 64, 100)
    for values, exact in ((g, full.g_sq), (t, full.trace_sigma)):
        assert abs(values.mean() - exact) < 3.5 * values.std() / 10
    assert t.mean() / g.mean() == pytest.approx(full.b_simple, rel=0.1)
    # the sample's own statistics miss: |m|^2 too high, B_simple too low
    assert finite_g.mean() > 1.3 * full.g_sq and finite_b.mean() < 0.8 * full.b_simple


def test_unbiased_on_subsamples_mnist1d_mlp():
    """The MNIST-1D MLP at initialization, 100 seeded 512-example subsamples of the 7,200-example
    training split (a few seconds with per-example gradient norms)."""
    ds = training.data.load("mnist1d", num_samples=10000)
    net = training.models.build("mlp", ds, seed=0)
    full = gradient_noise(net, ds, hessian_examples=0)
    g, t, finite_g, finite_b = subsample_means(net, ds, 512, 100)
    assert g.mean() == pytest.approx(full.g_sq, rel=0.05)
    assert t.mean() == pytest.approx(full.trace_sigma, rel=0.03)
    assert t.mean() / g.mean() == pytest.approx(full.b_simple, rel=0.05)
    assert finite_g.mean() > 1.3 * full.g_sq and finite_b.mean() < 0.8 * full.b_simple


def test_two_batch_noise_on_a_pool_estimates_the_split(linreg):
    ds, net = linreg
    exact = linreg_closed_form(ds, net)
    streams = [two_batch_noise(net, ds, 4, 32, draws=200, examples=100, seed=s) for s in range(60)]
    assert streams[0].pool == 100 and streams[0].population == ds.n_train
    g = np.array([s.g_sq for s in streams])
    t = np.array([s.trace_sigma for s in streams])
    assert abs(g.mean() - exact["g_sq"]) < 4 * g.std() / np.sqrt(len(g))
    assert abs(t.mean() - exact["trace_sigma"]) < 4 * t.std() / np.sqrt(len(t))
    whole = two_batch_noise(net, ds, 4, 32, draws=10, seed=0)
    assert whole.pool is None and whole.g_sq == whole.finite_g_sq


def test_noise_stream_pool_correction_and_standard_errors():
    small, big = np.array([5.0, 3.0, 4.0, 6.0]), np.array([2.0, 1.0, 1.5, 2.5])
    est = two_batch_estimates(small, big, 2, 8)
    plain = NoiseStream(2, 8).update(small, big)
    k = len(small)
    assert plain.g_sq_se == pytest.approx(est.g_sq.std(ddof=1) / np.sqrt(k))
    assert plain.trace_sigma_se == pytest.approx(est.trace_sigma.std(ddof=1) / np.sqrt(k))
    cov = np.cov(est.g_sq, est.trace_sigma)[0, 1] / k
    r = plain.b_simple
    delta = np.sqrt(plain.trace_sigma_se**2 + r**2 * plain.g_sq_se**2 - 2 * r * cov) / plain.g_sq
    assert plain.b_simple_se == pytest.approx(delta)
    pooled = NoiseStream(2, 8, pool=50, population=500).update(small, big)
    bias, scale = (1 - 50 / 500) / 49, 499 / 500 * 50 / 49
    assert pooled.finite_g_sq == pytest.approx(plain.g_sq)
    assert pooled.g_sq == pytest.approx(plain.g_sq - bias * plain.trace_sigma)
    assert pooled.trace_sigma == pytest.approx(scale * plain.trace_sigma)
    assert pooled.trace_sigma_se == pytest.approx(scale * plain.trace_sigma_se)
    # EMA: weighted variance of the mean with reliability weights
    w = np.array([0.125, 0.25, 0.5, 1.0])
    ema = NoiseStream(2, 8, decay=0.5).update(small, big)
    x = est.g_sq
    mean = w @ x / w.sum()
    var = (w @ (x - mean) ** 2) / (w.sum() - (w @ w) / w.sum())
    assert ema.g_sq_se == pytest.approx(np.sqrt(var * (w @ w)) / w.sum())
    assert np.isnan(NoiseStream(2, 8).update(5.0, 2.0).g_sq_se)
    with pytest.raises(TheoryError, match="pool"):
        NoiseStream(2, 8, pool=50)
    with pytest.raises(TheoryError, match="distinct"):
        gradient_noise(training.models.build("linear", training.data.load("linreg")),
                       training.data.load("linreg"), examples=[1, 1, 2])
