import math

import pytest
import torch

import training
from training.data import Dataset
from training.models import ModelError, build, count_parameters, list_models


def image_dataset(shape, classes=10, n=6):
    x = torch.randn(n, *shape)
    y = torch.randint(0, classes, (n,))
    return Dataset("fake", "classification", x, y, x, y, classes, tuple(shape))


MNIST1D = Dataset("fake1d", "classification", torch.randn(6, 40), torch.zeros(6, dtype=torch.long),
                  torch.randn(6, 40), torch.zeros(6, dtype=torch.long), 10, (40,))


@pytest.mark.parametrize("name, ds, options, params", [
    ("mlp", MNIST1D, {}, 40 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10),            # 15210
    ("mlp", MNIST1D, {"hidden": [32]}, 40 * 32 + 32 + 32 * 10 + 10),
    ("cnn1d", MNIST1D, {}, (1 * 25 * 5 + 25) + 2 * (25 * 25 * 3 + 25) + (25 * 5 * 10 + 10)),  # 5210
    ("linear", MNIST1D, {}, 40 * 10 + 10),
    ("simple_cnn", image_dataset((1, 28, 28)), {},
     (25 * 32 + 32) + (32 * 25 * 64 + 64) + (64 * 7 * 7 * 1024 + 1024) + (1024 * 10 + 10)),  # 3274634
    ("simple_cnn", image_dataset((1, 28, 28)), {"width": "narrow"},
     (25 * 16 + 16) + (16 * 25 * 32 + 32) + (32 * 7 * 7 * 512 + 512) + (512 * 10 + 10)),
    ("simple_cnn", image_dataset((1, 28, 28)), {"width": "wide"},
     (25 * 64 + 64) + (64 * 25 * 128 + 128) + (128 * 7 * 7 * 2048 + 2048) + (2048 * 10 + 10)),
    ("resnet8", image_dataset((3, 32, 32)), {}, 77706),
    # Lee et al. (2021)'s Simple-CNN: 5x5 convs without padding, 28 -> 24 -> 12 -> 8 -> 4
    ("lee_cnn", image_dataset((1, 28, 28)), {},
     (25 * 32 + 32) + (32 * 25 * 64 + 64) + (64 * 4 * 4 * 10 + 10)),                    # 62346
])
def test_parameter_counts_and_output_shapes(name, ds, options, params):
    net = build(name, ds, **options)
    assert count_parameters(net) == params
    assert net(ds.x_train).shape == (ds.x_train.shape[0], ds.num_classes)


def test_resnet8_parameter_count_by_layer():
    net = build("resnet8", image_dataset((3, 32, 32)))
    conv = lambda ci, co, k: ci * co * k * k + co  # noqa: E731
    expected = (conv(3, 16, 3) + 2 * conv(16, 16, 3) + conv(16, 32, 3) + conv(32, 32, 3) + conv(16, 32, 1)
                + conv(32, 64, 3) + conv(64, 64, 3) + conv(32, 64, 1) + 64 * 10 + 10)
    assert count_parameters(net) == expected == 77706
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())


def test_simple_cnn_widths_are_shallues():
    """Shallue et al. (2019)'s Simple CNN widths: (conv 1, conv 2, dense) channels/units."""
    assert training.models.SIMPLE_CNN_WIDTHS == {
        "narrow": (16, 32, 512), "base": (32, 64, 1024), "wide": (64, 128, 2048)}
    assert count_parameters(build("simple_cnn", image_dataset((1, 28, 28)))) == 3_274_634


def test_lee_cnn_is_lees_layer_list():
    """62,346 weights on 28x28x1 with 10 classes, and the forward pass of a hand-built
    nn.Sequential of Lee et al.'s layer list holding the same weights."""
    from torch import nn

    ds = image_dataset((1, 28, 28), n=5)
    net = build("lee_cnn", ds, seed=3)
    assert count_parameters(net) == 62_346
    ref = nn.Sequential(
        nn.Conv2d(1, 32, kernel_size=5, padding=0), nn.ReLU(), nn.MaxPool2d(kernel_size=2),
        nn.Conv2d(32, 64, kernel_size=5, padding=0), nn.ReLU(), nn.MaxPool2d(kernel_size=2),
        nn.Flatten(), nn.Linear(1024, 10))
    with torch.no_grad():
        for mine, theirs in zip((net[0], net[3], net[7]), (ref[0], ref[3], ref[7])):
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
    assert [type(m) for m in net] == [type(m) for m in ref]
    x = torch.randn(5, 1, 28, 28, dtype=torch.float64)
    torch.testing.assert_close(net.double()(x), ref.double()(x), rtol=0, atol=0)
    with pytest.raises(ModelError, match="lee_cnn needs images of at least 16x16"):
        build("lee_cnn", image_dataset((1, 12, 12)))


def test_regression_output_is_flat():
    ds = training.data.load("linreg", n=50, dim=3)
    for name in ("linear", "mlp"):
        assert build(name, ds)(ds.x_train).shape == (ds.n_train,)


def test_seeded_init_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    a = build("mlp", MNIST1D, seed=1)
    assert torch.equal(torch.rand(3), expected)
    b = build("mlp", MNIST1D, seed=1)
    c = build("mlp", MNIST1D, seed=2)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_default_init_bounds():
    # PyTorch default: weights and biases within 1/sqrt(fan_in)
    net = build("mlp", MNIST1D)
    first = net[1]
    bound = 1 / 40 ** 0.5
    assert float(first.weight.detach().abs().max()) <= bound and float(first.bias.detach().abs().max()) <= bound
    assert float(first.weight.detach().abs().max()) > 0.9 * bound


@pytest.mark.parametrize("call, message", [
    (lambda: build("vgg", MNIST1D), "unknown model 'vgg'; allowed: cnn1d, lee_cnn, linear, mlp, resnet8, simple_cnn, transformer_lm"),
    (lambda: build("simple_cnn", MNIST1D), r"simple_cnn needs image inputs"),
    (lambda: build("cnn1d", image_dataset((1, 28, 28))), r"cnn1d needs 1-D inputs"),
    (lambda: build("simple_cnn", image_dataset((1, 28, 28)), width="huge"), "width 'huge'; allowed"),
    (lambda: build("mlp", MNIST1D, depth=3), "bad options for model 'mlp'"),
])
def test_bad_models(call, message):
    with pytest.raises(ModelError, match=message):
        call()


def test_list_models():
    assert list_models() == ["cnn1d", "lee_cnn", "linear", "mlp", "resnet8", "simple_cnn", "transformer_lm"]


# ---------------------------------------------------------------------------------------------
# transformer_lm


def token_dataset(n=6, t=10, vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n, t), generator=g)
    return Dataset("tokens", "classification", x.float(), x.roll(-1, 1), x.float(),
                   x.roll(-1, 1), vocab, (t,))


def test_transformer_lm_shape_and_parameter_count():
    ds = token_dataset(t=64)
    net = build("transformer_lm", ds)          # 2 layers, width 64, 4 heads, MLP ratio 4
    block = 2 * 64 + (64 * 192 + 192) + (64 * 64 + 64) + 2 * 64 + (64 * 256 + 256) + (256 * 64 + 64)
    assert count_parameters(net) == 256 * 64 + 64 * 64 + 2 * block + 2 * 64 + (64 * 256 + 256) \
        == 137_216
    assert net(ds.x_train).shape == (6, 64, 256)
    wide = build("transformer_lm", ds, layers=3, width=32, heads=2, mlp_ratio=2, context=128)
    assert wide(ds.x_train[:2, :20]).shape == (2, 20, 256)   # shorter windows than the context
    assert len(wide.blocks) == 3 and wide.position.weight.shape == (128, 32)
    training.models.check_output(net, ds, "test")


def test_transformer_lm_is_causal():
    """Changing a later token never changes the logits at earlier positions (and does change
    those at and after it)."""
    ds = token_dataset()
    net = build("transformer_lm", ds, layers=2, width=16, heads=2).double()
    x = ds.x_train[:3].double()
    base = net(x)
    for j in (0, 4, 9):
        changed = x.clone()
        changed[:, j] = (changed[:, j] + 17) % 256
        out = net(changed)
        torch.testing.assert_close(out[:, :j], base[:, :j], rtol=0, atol=0)
        assert not torch.allclose(out[:, j:], base[:, j:])


def test_transformer_lm_attention_equals_torch_sdpa():
    """The written-out attention is torch's causal scaled dot-product attention."""
    ds = token_dataset()
    net = build("transformer_lm", ds, layers=1, width=16, heads=4).double()
    attn = net.blocks[0].attn
    h = torch.randn(3, 10, 16, dtype=torch.float64)
    q, k, v = attn.qkv(h).split(16, -1)
    q, k, v = (z.reshape(3, 10, 4, 4).transpose(1, 2) for z in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attn(h), attn.proj(ref.transpose(1, 2).reshape(3, 10, 16)))


@pytest.mark.parametrize("call, message", [
    (lambda: build("transformer_lm", image_dataset((1, 28, 28))), "needs per-token classification"),
    (lambda: build("transformer_lm", token_dataset(), width=30, heads=4),
     "width 30 is not a multiple of heads 4"),
    (lambda: build("transformer_lm", token_dataset(t=10), context=8),
     "context 8 is shorter than the data set's windows of 10 tokens"),
    (lambda: build("transformer_lm", token_dataset(), layers=0), "layers must be an integer >= 1"),
])
def test_transformer_lm_bad_options(call, message):
    with pytest.raises(ModelError, match=message):
        call()


def test_transformer_lm_learns_python_source():
    """A few AdamW steps on a slice of the standard library lower the validation loss (mean
    per-byte cross-entropy) well below its initial value, ln 256 = 5.55 nats."""
    ds = training.data.load("python_source", context=16, max_train_windows=512,
                            max_val_windows=128)
    net = build("transformer_lm", ds, layers=1, width=32, heads=2)
    run = training.RunConfig(32, "adamw", max_steps=60, goal=training.Goal("loss", 0.0),
                             eval_schedule=training.EvalSchedule(every=60), stop="never")
    res = training.train_trials(net, ds, [training.Trial(lr=1e-2, weight_decay=0.01)], run)
    first, last = res.curves[0].metric[0], res.curves[0].metric[-1]
    assert abs(first - math.log(256)) < 0.1 and last < 3.6


def test_plain_relu_mlp_names_the_linear_layers_of_plain_mlps_only():
    """The structure the probes' written-out passes need: Flatten (default dims), Linear with
    bias, ReLU between, Linear last, no buffers."""
    from torch import nn

    from training.models import plain_relu_mlp

    ds = training.data.load("teacher", n=40, dim=5, num_classes=3, seed=0)
    net = training.models.build("mlp", ds, hidden=[4, 6], seed=0)
    assert plain_relu_mlp(net) == [net[1], net[3], net[5]]
    assert plain_relu_mlp(training.models.build("linear", ds)) is not None
    for other in (nn.Sequential(nn.Flatten(0), nn.Linear(5, 3)),
                  nn.Sequential(nn.Linear(5, 4), nn.GELU(), nn.Linear(4, 3)),
                  nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3, bias=False)),
                  nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3)),
                  nn.Sequential(nn.Linear(5, 4), nn.ReLU()),
                  nn.Linear(5, 3)):
        assert plain_relu_mlp(other) is None, other
