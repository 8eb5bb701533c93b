"""The bundled models, registered by name (:mod:`training.models.registry`).

``build(name, dataset, seed=0, init="torch", **options)``. Initialisation is PyTorch's default
for every layer (Linear / Conv: weights Kaiming-uniform with a = sqrt(5), i.e.
U(-1/sqrt(fan_in), 1/sqrt(fan_in)); biases U(-1/sqrt(fan_in), 1/sqrt(fan_in))), drawn from a
generator seeded by ``seed`` without touching the caller's global RNG state. ``init="lee"``:
Lee et al. (2021)'s initialization instead (TensorFlow's variance scaling, truncated normal,
fan-in, scale 1, for weights; zero biases), :mod:`training.models.initialization`, which states
the rule of each layer kind.

- ``mlp``: flatten -> Linear/ReLU per hidden width (default 100-100) -> Linear; the MNIST-1D
  baseline (Greydanus 2020).
- ``cnn1d``: the MNIST-1D convolutional baseline: Conv1d(1, 25, 5, stride 2, pad 1) -> ReLU ->
  Conv1d(25, 25, 3, 2, 1) -> ReLU -> Conv1d(25, 25, 3, 2, 1) -> ReLU -> flatten -> Linear.
- ``simple_cnn``: Shallue et al. (2019)'s Simple CNN: 5x5 conv (same padding) -> ReLU -> 2x2 max
  pool, twice, then a dense ReLU layer and the output; widths ``base`` (32, 64, 1024),
  ``narrow`` (16, 32, 512), ``wide`` (64, 128, 2048). Images only.
- ``lee_cnn``: Lee et al. (2021)'s "Simple-CNN", from their released code: 5x5 conv 32 (no
  padding) -> ReLU -> 2x2 max pool -> 5x5 conv 64 (no padding) -> ReLU -> 2x2 max pool -> flatten
  -> Linear; 62,346 weights on 28x28x1 with 10 classes (Linear 1024 -> 10). Images only.
  ``bias=False``: the same layers without biases (62,240 weights), the dense network of the
  bias control (issue 47): under ``init="lee"`` its weights are the biased network's of the
  same seed, as Lee's initialization draws no bias.
- ``resnet8``: ResNet-8 without batch norm (Lee et al. 2021; Shallue et al. 2019): 3x3 conv 16,
  three stages of one basic block (16, 32, 64 channels, stride 1, 2, 2, 1x1 projection shortcuts
  where the shape changes), global average pool, Linear. Images only.
- ``linear``: one Linear layer (logistic regression, or linear regression with one output).
- ``transformer_lm``: a decoder-only, pre-LayerNorm transformer over byte (token) indices
  (Radford et al. 2019's GPT-2 layout): token and learned position embeddings, ``layers``
  blocks of causal self-attention and a GELU MLP, a final LayerNorm and a Linear to one logit per
  token value at every position, outputs ``[B, T, num_classes]`` for per-token labels
  ``[B, T]`` (the ``python_source`` data set). Its initialization is GPT-2's, not PyTorch's
  default (below).

Any ``nn.Module`` of your own works too: :func:`training.models.checks.check_output` is the check
every trainer, probe and ``pruning.prune`` makes of a model against its data set before anything
is trained.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from training.data.dataset import Dataset
from training.errors import ModelError
from training.models.registry import output_size, register


class Flatten1dOutput(nn.Module):
    """Squeeze a single regression output to shape [batch]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-1)


def _head(layers: list[nn.Module], dataset: Dataset) -> nn.Sequential:
    if dataset.task == "regression":
        layers.append(Flatten1dOutput())
    return nn.Sequential(*layers)


@register("mlp")
def mlp(dataset: Dataset, hidden: tuple[int, ...] | list[int] = (100, 100)) -> nn.Module:
    """ReLU MLP with the ``hidden`` widths, the MNIST-1D baseline (Greydanus 2020)."""
    d_in = math.prod(dataset.input_shape)
    layers: list[nn.Module] = [nn.Flatten()]
    for width in hidden:
        layers += [nn.Linear(d_in, int(width)), nn.ReLU()]
        d_in = int(width)
    layers.append(nn.Linear(d_in, output_size(dataset)))
    return _head(layers, dataset)


@register("linear")
def linear(dataset: Dataset) -> nn.Module:
    """One Linear layer on the flattened input (logistic or linear regression)."""
    return _head([nn.Flatten(), nn.Linear(math.prod(dataset.input_shape), output_size(dataset))],
                 dataset)


def _conv_out(length: int, size: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - size) // stride + 1


@register("cnn1d")
def cnn1d(dataset: Dataset, channels: int = 25) -> nn.Module:
    """The MNIST-1D convolutional baseline (Greydanus 2020), ``channels`` per conv layer."""
    if len(dataset.input_shape) != 1:
        raise ModelError(f"cnn1d needs 1-D inputs (length,), got input shape {dataset.input_shape}")
    length = dataset.input_shape[0]
    for k in (5, 3, 3):
        length = _conv_out(length, k, 2, 1)
    if length < 1:
        raise ModelError(f"cnn1d: input length {dataset.input_shape[0]} is too short")
    return _head([
        nn.Unflatten(1, (1, dataset.input_shape[0])),
        nn.Conv1d(1, channels, 5, stride=2, padding=1), nn.ReLU(),
        nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(channels * length, output_size(dataset)),
    ], dataset)


SIMPLE_CNN_WIDTHS = {"narrow": (16, 32, 512), "base": (32, 64, 1024), "wide": (64, 128, 2048)}


def _image_shape(name: str, dataset: Dataset) -> tuple[int, int, int]:
    if len(dataset.input_shape) != 3:
        raise ModelError(f"{name} needs image inputs (channels, height, width), "
                         f"got input shape {dataset.input_shape}")
    return dataset.input_shape  # type: ignore[return-value]


@register("simple_cnn")
def simple_cnn(dataset: Dataset, width: str = "base") -> nn.Module:
    """Shallue et al. (2019)'s Simple CNN at ``width`` (one of SIMPLE_CNN_WIDTHS)."""
    if width not in SIMPLE_CNN_WIDTHS:
        raise ModelError(f"simple_cnn width {width!r}; allowed: {', '.join(SIMPLE_CNN_WIDTHS)}")
    c, h, w = _image_shape("simple_cnn", dataset)
    c1, c2, dense = SIMPLE_CNN_WIDTHS[width]
    flat = c2 * (h // 4) * (w // 4)
    return _head([
        nn.Conv2d(c, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(flat, dense), nn.ReLU(), nn.Linear(dense, output_size(dataset)),
    ], dataset)


@register("lee_cnn")
def lee_cnn(dataset: Dataset, bias: bool = True) -> nn.Module:
    """Lee et al. (2021)'s Simple-CNN: two unpadded 5x5 convs (32, 64) each with ReLU and a 2x2
    max pool, then one Linear layer (no hidden dense layer, unlike Shallue's ``simple_cnn``);
    ``bias=False``: every layer without its bias (the bias control of Lee's stage)."""
    if not isinstance(bias, bool):
        raise ModelError(f"lee_cnn: bias must be true or false, got {bias!r}")
    c, h, w = _image_shape("lee_cnn", dataset)
    oh, ow = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
    if oh < 1 or ow < 1:
        raise ModelError(f"lee_cnn needs images of at least 16x16, got {h}x{w}")
    return _head([
        nn.Conv2d(c, 32, 5, bias=bias), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(32, 64, 5, bias=bias), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(64 * oh * ow, output_size(dataset), bias=bias),
    ], dataset)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention written with plain tensor operations (no fused kernel),
    so that ``torch.func.vmap`` over trials or examples and double backward (the probes'
    Hessian-vector products) apply to it: softmax(q k^T / sqrt(d) masked to j <= i) v per head,
    then an output projection. The causal mask is built per call (no buffer: the trainers keep
    buffers per trial)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class TransformerBlock(nn.Module):
    """Pre-LayerNorm residual block: x + attn(LN(x)), then + MLP(LN(x)) with a GELU."""

    def __init__(self, width: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(),
                                 nn.Linear(mlp_ratio * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TransformerLM(nn.Module):
    """Decoder-only pre-LayerNorm transformer over token indices given as float values (a data
    set's inputs are float32): ``[B, T]`` -> logits ``[B, T, vocab]``, position i seeing
    tokens 0..i only."""

    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int,
                 mlp_ratio: int):
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(TransformerBlock(width, heads, mlp_ratio)
                                      for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        # GPT-2's initialization (Radford et al. 2019): N(0, 0.02) weights and embeddings, zero
        # biases, the residual projections scaled by 1 / sqrt(2 layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "mlp.2.weight")) \
                    else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = x.long()
        h = self.token(idx) + self.position.weight[: idx.shape[-1]]
        return self.head(self.norm(self.blocks(h)))


@register("transformer_lm")
def transformer_lm(dataset: Dataset, layers: int = 2, width: int = 64, heads: int = 4,
                   context: int | None = None, mlp_ratio: int = 4) -> nn.Module:
    """A byte-level (token-level) language model, :class:`TransformerLM`: ``layers`` blocks of
    ``heads``-head causal self-attention over ``width`` channels and a ``mlp_ratio * width``
    GELU MLP; learned positions for up to ``context`` tokens (default: the data set's window
    length). Needs per-token classification data: inputs ``[n, T]`` of token values in
    [0, num_classes), labels ``[n, T]`` (``python_source``). With the defaults on
    ``python_source`` (context 64): embeddings 16,384 + 4,096, two blocks of 49,984, final LayerNorm 128 and output
    16,640: 137,216 weights."""
    if dataset.task != "classification" or len(dataset.input_shape) != 1 \
            or tuple(dataset.y_train.shape[1:]) != tuple(dataset.input_shape):
        raise ModelError(f"transformer_lm needs per-token classification data (inputs [n, T] of "
                         f"token values, labels [n, T], e.g. python_source), got a "
                         f"{dataset.task} set with inputs {list(dataset.input_shape)} and labels "
                         f"{list(dataset.y_train.shape[1:])} per example")
    length = dataset.input_shape[0]
    context = length if context is None else context
    for key, value in (("layers", layers), ("width", width), ("heads", heads),
                       ("context", context), ("mlp_ratio", mlp_ratio)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"transformer_lm {key} must be an integer >= 1, got {value!r}")
    if width % heads:
        raise ModelError(f"transformer_lm width {width} is not a multiple of heads {heads}")
    if context < length:
        raise ModelError(f"transformer_lm context {context} is shorter than the data set's "
                         f"windows of {length} tokens")
    return TransformerLM(dataset.num_classes, context, width, layers, heads, mlp_ratio)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a ReLU between, identity or 1x1-projection shortcut, no batch norm."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1)
        self.shortcut = (nn.Conv2d(c_in, c_out, 1, stride=stride)
                         if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(torch.relu(self.conv1(x)))
        return torch.relu(out + self.shortcut(x))


class ResNet8(nn.Module):
    """Stem conv, three :class:`BasicBlock` stages, global average pool, Linear (no batch norm)."""

    def __init__(self, c_in: int, classes: int, widths: tuple[int, int, int] = (16, 32, 64)):
        super().__init__()
        self.stem = nn.Conv2d(c_in, widths[0], 3, padding=1)
        self.stages = nn.Sequential(
            BasicBlock(widths[0], widths[0], 1),
            BasicBlock(widths[0], widths[1], 2),
            BasicBlock(widths[1], widths[2], 2),
        )
        self.fc = nn.Linear(widths[2], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(torch.relu(self.stem(x)))
        return self.fc(x.mean(dim=(2, 3)))


@register("resnet8")
def resnet8(dataset: Dataset, widths: tuple[int, int, int] | list[int] = (16, 32, 64)) -> nn.Module:
    """ResNet-8 without batch norm (Lee et al. 2021), stage widths ``widths``."""
    c, _, _ = _image_shape("resnet8", dataset)
    if dataset.task != "classification":
        raise ModelError("resnet8 supports classification data sets only")
    return ResNet8(c, dataset.num_classes, tuple(int(w) for w in widths))
