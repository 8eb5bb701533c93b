"""The probes on networks with batch normalization, dropout, attention and recurrent layers,
against independent ground truth in float64: per-example gradients from a plain loop of
``torch.autograd.grad`` on an eval-mode copy of the model (the probes' definition, module
docstring of ``theory.estimators.functional``), and a dense Hessian of an attention network's loss written
by hand; and the probes leave the model, its buffers and the random number generator as they
were."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import training
from theory import (
    TheoryError, gradient_noise, hessian_top_eigenvalues, hessian_trace, lanczos_top,
    local_lipschitz, two_batch_noise,
)
from theory.estimators.functional import flat_loss, parameter_vector, probe_definition
from theory.verdicts.trajectory import probe_trajectory

from ...probe_models import (
    BUILDERS, CLASSES, TinyAttention, build, dataset, eval_copy, loop_gradients, moments,
)

MODELS = sorted(BUILDERS)


@pytest.mark.parametrize("name", MODELS)
def test_noise_equals_per_example_autograd_of_the_eval_mode_network(name):
    model, ds = build(name)
    exact_g_sq, exact_trace = moments(loop_gradients(model, ds.x_train, ds.y_train))
    est = gradient_noise(model, ds, hessian_examples=0)
    assert est.n == ds.n_train and est.g_sq_se == 0.0
    assert est.g_sq == pytest.approx(exact_g_sq, rel=1e-8)
    assert est.trace_sigma == pytest.approx(exact_trace, rel=1e-8)
    assert est.b_simple == pytest.approx(exact_trace / exact_g_sq, rel=1e-8)
    with torch.no_grad():
        assert est.loss == pytest.approx(float(F.cross_entropy(eval_copy(model)(ds.x_train),
                                                               ds.y_train)), rel=1e-12)


def attention_loss(w, x, y, d=4):
    """Mean cross-entropy of TinyAttention from a flat vector in named_parameters() order,
    attention written out: softmax(q k^T / sqrt(d)) v, one head, no dropout (eval mode)."""
    wi, bi, wo, bo, wh, bh = torch.split(w, [3 * d * d, 3 * d, d * d, d, 3 * d, 3])
    q, k, v = (x @ wi.view(3 * d, d).T + bi).split(d, dim=-1)
    a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1)
    out = (a @ v) @ wo.view(d, d).T + bo
    return F.cross_entropy(out.mean(1) @ wh.view(3, d).T + bh, y)


@pytest.fixture(scope="module")
def attention():
    """TinyAttention (95 parameters, above the dense limit: Lanczos runs) on 12 sequences of
    3 tokens, with its dense Hessian and per-example gradients from the hand-written loss."""
    torch.manual_seed(4)
    model = TinyAttention().double().train()
    ds = dataset("sequence", n=12, seq=3, features=4, seed=4)
    w = parameter_vector(model).double()
    x, y = ds.x_train, ds.y_train
    h = torch.autograd.functional.hessian(lambda v: attention_loss(v, x, y), w)
    g = torch.stack([_grad(lambda v: attention_loss(v, xi[None], yi[None]), w)
                     for xi, yi in zip(x, y)])
    return model, ds, w, 0.5 * (h + h.T), g


def _grad(f, w):
    """grad f(w) by autograd."""
    w = w.detach().clone().requires_grad_(True)
    return torch.autograd.grad(f(w), w)[0]


def test_attention_lambda_max_and_trace_match_the_dense_hessian(attention):
    model, ds, _, h, _ = attention
    exact = torch.linalg.eigvalsh(h).flip(0)
    assert h.shape == (95, 95)
    top = hessian_top_eigenvalues(model, ds, k=3)
    np.testing.assert_allclose(top, exact[:3].numpy(), rtol=1e-9)
    assert lanczos_top(flat_loss(model, ds), 95) == pytest.approx(float(exact[0]), rel=1e-9)
    trace = hessian_trace(model, ds, method="hutch++", matvecs=3 * 95)
    assert trace.value == pytest.approx(float(torch.trace(h)), rel=1e-9)


def test_attention_noise_and_b_noise_match_hand_written_attention(attention):
    model, ds, _, h, g = attention
    mean = g.mean(0)
    d = g - mean
    est = gradient_noise(model, ds, hessian_examples=None)
    assert est.g_sq == pytest.approx(float(mean @ mean), rel=1e-9)
    assert est.trace_sigma == pytest.approx(float(d.pow(2).sum(1).mean()), rel=1e-9)
    assert est.g_h_g == pytest.approx(float(mean @ h @ mean), rel=1e-9)
    assert est.trace_h_sigma == pytest.approx(float(torch.trace(h @ d.T @ d)) / len(g), rel=1e-9)


def test_attention_local_lipschitz_is_lee_et_al_on_hand_written_attention(attention):
    model, ds, w, _, _ = attention
    step = 0.05 * torch.randn(w.shape, generator=torch.Generator().manual_seed(1), dtype=w.dtype)
    lee = local_lipschitz(model, ds, w, w + step)
    grad0 = _grad(lambda v: attention_loss(v, ds.x_train, ds.y_train), w)
    expect = [float((_grad(lambda v: attention_loss(v, ds.x_train, ds.y_train), w + gamma * step)
                     - grad0).norm()) / (gamma * float(step.norm())) for gamma in lee.gammas]
    np.testing.assert_allclose(lee.ratios, expect, rtol=1e-9)


def test_local_lipschitz_on_a_batchnorm_cnn_uses_its_running_statistics():
    """Lee et al.'s ratios from full-set gradients of eval-mode copies at the interpolated
    weights: the running statistics stay the model's (buffers are not parameters)."""
    model, ds = build("batchnorm_cnn")
    w = parameter_vector(model).double()
    step = 0.1 * torch.randn(w.shape, generator=torch.Generator().manual_seed(2), dtype=w.dtype)
    lee = local_lipschitz(model, ds, w, w + step, gammas=(0.25, 0.5, 1.0))

    def full_gradient(flat):
        net = eval_copy(model, flat)
        loss = F.cross_entropy(net(ds.x_train), ds.y_train)
        return torch.cat([q.reshape(-1) for q in torch.autograd.grad(loss, list(net.parameters()))])

    g0 = full_gradient(w)
    expect = [float((full_gradient(w + gamma * step) - g0).norm()) / (gamma * float(step.norm()))
              for gamma in (0.25, 0.5, 1.0)]
    np.testing.assert_allclose(lee.ratios, expect, rtol=1e-9)
    assert lee.value == pytest.approx(max(expect), rel=1e-9)


def torch_settings():
    """The process-wide settings the probes' evaluation context changes while it runs."""
    return (torch.backends.mha.get_fastpath_enabled(), torch.backends.cudnn.enabled,
            torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
            torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())


def snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {n: m.training for n, m in model.named_modules()}, torch.get_rng_state(),
            torch_settings())


def assert_unchanged(model, before):
    state, modes, rng, settings = before
    after = model.state_dict()
    assert after.keys() == state.keys()
    for k, v in state.items():
        assert torch.equal(after[k], v), k
    assert {n: m.training for n, m in model.named_modules()} == modes
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch_settings() == settings


@pytest.mark.parametrize("name", MODELS)
def test_every_probe_runs_is_deterministic_and_leaves_the_model_as_it_was(name):
    model, ds = build(name)
    before = snapshot(model)
    noise = gradient_noise(model, ds, examples=20, hessian_examples=4)
    again = gradient_noise(model, ds, examples=20, hessian_examples=4)
    w = parameter_vector(model)
    two_batch = two_batch_noise(model, ds, 2, 6, draws=4)
    values = {
        "noise": noise,
        "lambda_max": hessian_top_eigenvalues(model, ds, k=1, tol=1e-4),
        "lanczos": lanczos_top(flat_loss(model, ds), 8),
        "trace": hessian_trace(model, ds, method="hutchinson", matvecs=4).value,
        "lee": local_lipschitz(model, ds, w, w + 1e-2 * torch.ones_like(w), gammas=(0.5, 1.0)).value,
        # its |G|^2 estimate may be negative on 4 draws (B_simple then inf): the two parts
        "two_batch": [two_batch.g_sq, two_batch.trace_sigma],
    }
    assert noise == again
    assert all(math.isfinite(v) for v in (noise.g_sq, noise.trace_sigma, noise.b_simple,
                                          noise.b_noise, noise.loss))
    assert all(np.all(np.isfinite(v)) for k, v in values.items() if k != "noise"), values
    assert_unchanged(model, before)


def test_probe_definition_names_the_layers_eval_mode_changes():
    bn = probe_definition(build("batchnorm_cnn")[0])
    assert "eval mode" in bn and "McCandlish" in bn
    assert "2 batch-normalization layers use running statistics" in bn
    assert "1 dropout layer is the identity" in bn
    # the encoder layer's three nn.Dropout and its attention's own dropout
    assert "4 dropout layers are the identity" in probe_definition(build("transformer")[0])
    plain = probe_definition(nn.Sequential(nn.Linear(2, 2)))
    assert "no batch-normalization or dropout layer" in plain


class EvalNoise(nn.Module):
    """Adds noise whatever the mode: a random eval-mode loss, outside the probes' definition."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.fc(x.flatten(1) + 0.1 * torch.randn_like(x.flatten(1)))



def test_networks_outside_the_definition_are_refused_in_one_line():
    ds = dataset("image")
    no_stats = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2, track_running_stats=False),
                             nn.Flatten(), nn.Linear(72, 3)).double()
    with pytest.raises(TheoryError, match=r"'1' \(BatchNorm2d\) has no running statistics"):
        gradient_noise(no_stats, ds)
    noisy = EvalNoise().double()
    rng = torch.get_rng_state()
    with pytest.raises(TheoryError, match="draws random numbers in eval mode"):
        hessian_trace(noisy, ds)
    assert torch.equal(torch.get_rng_state(), rng)
    assert noisy.training


@pytest.mark.parametrize("name", ["batchnorm_cnn", "transformer", "gru"])
def test_trajectory_probes_run_and_start_from_the_model(name):
    """probe_trajectory replays the run (train mode, as trained) and probes in eval mode; at
    step 0 its |G|^2 and tr(Sigma) are the initial model's."""
    model, ds = build(name)
    before = snapshot(model)[:2]
    rows = probe_trajectory(model, ds, training.Trial(lr=0.05), training.RunConfig(batch_size=6,
                            optimizer="sgd", seed=1), [0, 2], 3, average=1, lanczos=4,
                            hessian_examples=3, dtype=torch.float64)
    assert np.all(np.isfinite(rows.value))
    table = rows.set_index(["step", "quantity"]).value
    g_sq, trace = moments(loop_gradients(model, ds.x_train, ds.y_train))
    assert table[(0, "g_sq")] == pytest.approx(g_sq, rel=1e-8)
    assert table[(0, "trace_sigma")] == pytest.approx(trace, rel=1e-8)
    state, modes = before
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert {n: m.training for n, m in model.named_modules()} == modes


def test_a_state_dicts_running_statistics_are_the_ones_probed():
    """local_lipschitz from state dicts: w_prev's running statistics (not the model's) are held
    along the step, as if the model held them."""
    model, ds = build("batchnorm_cnn")
    prev = {k: v.clone() for k, v in model.state_dict().items()}
    prev["1.running_mean"] += 0.5
    prev["1.running_var"] *= 2.0
    step = {k: 0.05 * torch.ones_like(v) for k, v in model.named_parameters()}
    nxt = {k: v + step[k] if k in step else v for k, v in prev.items()}
    loaded = copy.deepcopy(model)
    loaded.load_state_dict(prev)
    flat = parameter_vector(loaded)
    got = local_lipschitz(model, ds, prev, nxt, gammas=(0.5, 1.0))
    want = local_lipschitz(loaded, ds, flat, parameter_vector(loaded, nxt), gammas=(0.5, 1.0))
    assert got.ratios == pytest.approx(want.ratios, rel=1e-12)
    own = local_lipschitz(model, ds, flat, parameter_vector(loaded, nxt), gammas=(0.5, 1.0))
    assert own.value != pytest.approx(got.value, rel=1e-3)
