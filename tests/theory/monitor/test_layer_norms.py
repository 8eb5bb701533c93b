"""Per-example squared gradient norms of single layers (theory.monitor.layer_norms) against per-example
gradients from torch.func (vmap of grad), float64, to 1e-10 relative."""

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from theory import layer_norms
from theory.monitor.layer_norms import layer_sq_norms, outer_sq, unsupported

B = 6


def per_example_loss(out: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """A generic smooth loss of each example's output (its own row), so gradients are dense."""
    return (out * c).sin().flatten(1).sum(1) + out.flatten(1).square().sum(1) * 0.1


def reference(module: nn.Module, x: torch.Tensor, calls: int) -> torch.Tensor:
    """|g_i|^2 over the module's trainable parameters, one example at a time (vmap of grad)."""
    params = {k: v.detach() for k, v in module.named_parameters() if v.requires_grad}
    frozen = {k: v.detach() for k, v in module.named_parameters() if not v.requires_grad}
    gen = torch.Generator().manual_seed(1)
    c = torch.randn(module(x[:1]).shape[1:], generator=gen, dtype=torch.float64)

    def loss(p, xi):
        out = xi[None]
        for _ in range(calls):
            out = functional_call(module, {**p, **frozen}, (out,))
        return per_example_loss(out, c[None]).sum()

    grads = vmap(grad(loss), in_dims=(None, 0))(params, x)
    return sum(g.reshape(x.shape[0], -1).square().sum(1) for g in grads.values()), c


def hooked(module: nn.Module, x: torch.Tensor, calls: int, c: torch.Tensor) -> torch.Tensor:
    """layer_sq_norms from the module's captured inputs and output gradients of the summed
    loss (what the monitor's hooks capture)."""
    inputs, outs = [], []

    def capture(m, args, out):
        inputs.append(args[0])
        outs.append(out)

    h = module.register_forward_hook(capture)
    try:
        out = x
        for _ in range(calls):
            out = module(out)
    finally:
        h.remove()
    grads = torch.autograd.grad(per_example_loss(out, c[None]).sum(), outs)
    return layer_sq_norms(module, inputs, grads)


def tokens(*shape, vocab=5):
    return torch.randint(vocab, shape, generator=torch.Generator().manual_seed(2))


def floats(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def _bias_only():
    layer = nn.Linear(5, 4)
    layer.weight.requires_grad_(False)
    return layer


CASES = {
    "linear 2-d": (lambda: nn.Linear(5, 4), lambda: floats(B, 5), 1),
    "linear 3-d, materialized": (lambda: nn.Linear(5, 4), lambda: floats(B, 3, 5), 1),
    "linear 3-d, Gram": (lambda: nn.Linear(12, 12), lambda: floats(B, 2, 12), 1),
    "linear 4-d": (lambda: nn.Linear(5, 4), lambda: floats(B, 2, 3, 5), 1),
    "linear without bias": (lambda: nn.Linear(5, 4, bias=False), lambda: floats(B, 3, 5), 1),
    "linear without bias, Gram": (lambda: nn.Linear(12, 12, bias=False),
                                  lambda: floats(B, 2, 12), 1),
    "linear 2-d, only the bias trains": (_bias_only, lambda: floats(B, 5), 1),
    "linear called twice": (lambda: nn.Linear(4, 4), lambda: floats(B, 3, 4), 2),
    "conv1d": (lambda: nn.Conv1d(3, 4, 3), lambda: floats(B, 3, 9), 1),
    "conv1d stride, padding, dilation": (
        lambda: nn.Conv1d(3, 4, 3, stride=2, padding=2, dilation=2), lambda: floats(B, 3, 11), 1),
    "conv1d groups, circular": (lambda: nn.Conv1d(4, 6, 3, groups=2, padding=1,
                                                  padding_mode="circular"),
                                lambda: floats(B, 4, 9), 1),
    "conv1d same": (lambda: nn.Conv1d(3, 3, 4, padding="same"), lambda: floats(B, 3, 9), 2),
    "conv2d": (lambda: nn.Conv2d(2, 3, 3), lambda: floats(B, 2, 6, 5), 1),
    "conv2d stride, padding, groups": (
        lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 2), groups=2),
        lambda: floats(B, 4, 7, 6), 1),
    "conv2d same, reflect, no bias": (
        lambda: nn.Conv2d(2, 2, 3, padding="same", padding_mode="reflect", bias=False),
        lambda: floats(B, 2, 5, 5), 1),
    "embedding, repeated tokens": (lambda: nn.Embedding(5, 4), lambda: tokens(B, 7), 1),
    "embedding, one token": (lambda: nn.Embedding(5, 4), lambda: tokens(B), 1),
    "embedding, int32 tokens": (lambda: nn.Embedding(5, 4), lambda: tokens(B, 7).int(), 1),
    "embedding, padding_idx": (lambda: nn.Embedding(5, 4, padding_idx=0), lambda: tokens(B, 7), 1),
    "embedding, Gram": (lambda: nn.Embedding(20, 4, padding_idx=0), lambda: tokens(B, 7), 1),
    "embedding, long sequences": (lambda: nn.Embedding(150, 3, padding_idx=2),
                                  lambda: tokens(B, 70, vocab=9), 1),
    "layernorm 3-d": (lambda: nn.LayerNorm(4), lambda: floats(B, 3, 4), 1),
    "layernorm 2 normalized dims, no bias": (lambda: nn.LayerNorm((3, 4), bias=False),
                                             lambda: floats(B, 2, 3, 4), 1),
    "layernorm called twice": (lambda: nn.LayerNorm(4), lambda: floats(B, 4), 2),
    "rmsnorm": (lambda: nn.RMSNorm(4), lambda: floats(B, 3, 4), 1),
}


# padding='same' with an even kernel (asymmetric padding) warns that it copies the input
@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("case", list(CASES))
def test_hook_norms_equal_per_example_gradients(case):
    check_case(case)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("case", [c for c in CASES if c.startswith(("linear 3-d", "linear 4-d",
                                                                   "linear called", "conv"))])
def test_products_reduced_at_once_give_the_same_norms(case, monkeypatch):
    """Materialized products larger than REDUCE_AT are reduced to per-example norms at once."""
    monkeypatch.setattr(layer_norms, "REDUCE_AT", 0)
    check_case(case)


def check_case(case):
    make, data, calls = CASES[case]
    torch.manual_seed(0)
    module = make().double()
    with torch.no_grad():                    # non-trivial affine parameters of the norms
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = data()
    expected, c = reference(module, x, calls)
    got = hooked(module, x, calls, c)
    assert got.shape == (B,) and got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=0)


def test_frozen_weight_of_a_3d_linear_does_not_count():
    torch.manual_seed(0)
    module = nn.Linear(5, 4).double()
    module.weight.requires_grad_(False)
    x = floats(B, 3, 5)
    expected, c = reference(module, x, 1)
    torch.testing.assert_close(hooked(module, x, 1, c), expected, rtol=1e-10, atol=0)


def test_gram_and_materialized_forms_agree():
    d, a = floats(4, 5, 3), floats(4, 5, 7)
    gram = (torch.bmm(d, d.transpose(1, 2)) * torch.bmm(a, a.transpose(1, 2))).sum((1, 2))
    torch.testing.assert_close(outer_sq(d, a), gram, rtol=1e-12, atol=0)      # materialized
    d, a = floats(4, 2, 9), floats(4, 2, 9)
    full = torch.bmm(d.transpose(1, 2), a).square().sum((1, 2))
    torch.testing.assert_close(outer_sq(d, a), full, rtol=1e-12, atol=0)      # Gram


def test_unsupported_layers_are_named():
    assert unsupported(nn.Linear(2, 2)) is None
    assert unsupported(nn.BatchNorm1d(3)) == "BatchNorm1d"
    assert unsupported(nn.Conv3d(1, 1, 1)) == "Conv3d"
    assert "scale_grad_by_freq" in unsupported(nn.Embedding(3, 2, scale_grad_by_freq=True))
    assert unsupported(nn.MultiheadAttention(4, 2)) == "MultiheadAttention"
