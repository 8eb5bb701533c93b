"""Models as plain ``torch.nn.Module`` objects, behind a registry.

``build(name, dataset, seed=0, init="torch", **options)``. Initialisation is PyTorch's default
for every layer (Linear / Conv: weights Kaiming-uniform with a = sqrt(5), i.e.
U(-1/sqrt(fan_in), 1/sqrt(fan_in)); biases U(-1/sqrt(fan_in), 1/sqrt(fan_in))), drawn from a
generator seeded by ``seed`` without touching the caller's global RNG state. ``init="lee"``:
Lee et al. (2021)'s initialization instead (TensorFlow's variance scaling, truncated normal,
fan-in, scale 1, for weights; zero biases), :mod:`training.initialization`, which states the rule
of each layer kind.

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

Any ``nn.Module`` of your own works too: :func:`check_output` is the check every trainer, probe
and ``pruning.prune`` makes of a model against its data set before anything is trained.
"""

from __future__ import annotations

import contextlib
from contextlib import contextmanager
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from training import randomness
from training.initialization import initialize
from training.dataset import Dataset, check_dataset
from training.errors import DataError, SparsescaleError


class ModelError(SparsescaleError, ValueError):
    """A model cannot be built for the given data set or options."""


Builder = Callable[..., nn.Module]
_REGISTRY: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator adding a model builder to the registry as ``name``: the way to add a named
    model to this process.

    The builder is called as ``fn(dataset, **options)``: ``dataset`` is the
    :class:`training.Dataset` the model trains on (read ``input_shape``, ``task`` and
    ``num_classes`` from it, or use :func:`output_size`), ``options`` are a study's
    ``[workload] model_options`` (JSON values). It must return a fresh ``torch.nn.Module`` whose
    parameters are drawn from torch's global generator, which :func:`build` seeds with the
    study's seed (so every replicate seed gives its own initialization, the same in every
    process). A study names it as ``[workload] model = "<name>"``.

    A registration lives in the process that made it: the worker processes of a study (the
    local pool, Dask) do not see one made in a notebook or a script. For a model of your own,
    name its factory by import path instead (``model = "mymodels:mlp"``, same signature; see
    :mod:`experiments.spec.factories`).
    """

    def add(fn: Builder) -> Builder:
        _REGISTRY[name] = fn
        return fn

    return add


def list_models() -> list[str]:
    """Names accepted by :func:`build`."""
    return sorted(_REGISTRY)


def output_size(dataset: Dataset) -> int:
    """Output units: one per class, or one for regression."""
    return dataset.num_classes if dataset.task == "classification" else 1


def build(name: str, dataset: Dataset, seed: int = 0, *, init: str = "torch",
          **options: Any) -> nn.Module:
    """Build model ``name`` for ``dataset`` (input shape and output size taken from it),
    initialized with ``seed`` by scheme ``init`` (``"torch"``: as the builder makes it;
    ``"lee"``: :func:`training.initialization.lee_init_`)."""
    check_dataset(dataset, "build")
    if name not in _REGISTRY:
        raise ModelError(f"unknown model {name!r}; allowed: {', '.join(list_models())}")
    with seeded(seed):
        try:
            model = _REGISTRY[name](dataset, **options)
        except TypeError as exc:
            raise ModelError(f"bad options for model {name!r}: {exc}") from None
    return initialize(model, init, seed)


# layers whose batching over examples needs a loop (no vmap rule), and cuDNN off for double backward
RECURRENT = (nn.RNNBase, nn.RNNCellBase)


@contextmanager
def evaluation(model: nn.Module) -> Iterator[None]:
    """The context the probes (``theory``) and the pruning criteria evaluate and differentiate
    ``model`` in: eval mode (BatchNorm's running statistics, no Dropout), the math attention
    backend and ``nn.MultiheadAttention``'s fused path off (the fused kernels have no second
    derivative) and, for a network with recurrent layers, cuDNN off; each module's mode and
    every setting restored on exit. The settings are torch's process-wide ones: evaluations in
    several threads of one process share them (a study probes in worker processes, one thread
    each)."""
    modes = [(m, m.training) for m in model.modules()]
    fastpath, cudnn = torch.backends.mha.get_fastpath_enabled(), torch.backends.cudnn.enabled
    try:
        model.eval()
        torch.backends.mha.set_fastpath_enabled(False)
        if any(isinstance(m, RECURRENT) for m, _ in modes):
            torch.backends.cudnn.enabled = False
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.cudnn.enabled = cudnn
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for m, mode in modes:
            m.training = mode

def check_model(model: object, who: str) -> nn.Module:
    """``model`` if it is an ``nn.Module``, else one :class:`ModelError` from ``who``."""
    if not isinstance(model, nn.Module):
        raise ModelError(f"{who}: model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def check_runnable(model: nn.Module) -> None:
    """Refuse, in one line naming the layer and what to do, a module no program can train as
    the plain loop would (so that nothing is trained and nothing is written). Not a module at
    all: left to :func:`training.models.check_output`, which names the type."""
    if not isinstance(model, nn.Module):
        return
    for name, m in model.named_modules():
        where = f"layer {name!r} ({type(m).__name__})" if name else type(m).__name__
        if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
            raise ModelError(f"{where} has uninitialized (lazy) parameters: call the model once "
                              f"on an example batch before training it")
        if isinstance(m, nn.SyncBatchNorm):
            raise ModelError(f"{where} needs a distributed process group: use nn.BatchNorm*d "
                              f"(each trial keeps its own running statistics)")
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise ModelError(f"parameter {frozen[0]!r} does not require grad ({len(frozen)} frozen "
                          f"in all): the trainers update every parameter; unfreeze them, or hold "
                          f"fixed tensors as buffers (register_buffer)")


def expected_output(dataset: Dataset) -> tuple[int, ...]:
    """The output shape the trainers' loss needs for ONE example (a batch of one):
    classification: the label's shape + (num_classes,), e.g. [1, 10] for labels [n], or
    [1, T, 256] for per-token labels [n, T]; regression: the target's shape, [1] for targets [n]
    (an output [B, 1] against targets [B] would broadcast the squared error to [B, B])."""
    target = tuple(dataset.y_train[:1].shape)
    return target + (dataset.num_classes,) if dataset.task == "classification" else target


def check_output(model: object, dataset: object, who: str) -> None:
    """Check, before anything is trained, that ``model`` (an ``nn.Module``) can run on
    ``dataset`` (a :class:`training.Dataset`, :func:`training.dataset.check_dataset`) and gives
    the output shape of :func:`expected_output`.

    ``model`` runs once, in eval mode under ``no_grad`` with the global RNG state restored after,
    on ``x_train[:1]`` cast to the model's dtype and device; each submodule's train/eval mode is
    restored. A forward pass that raises becomes one :class:`ModelError` naming the input shape
    and the error's first line; a wrong output shape one naming both shapes (``who``, the entry
    point, leads the line).
    """
    check_model(model, who)
    check_dataset(dataset, who)
    if dataset.n_train == 0:
        raise DataError(f"{who}: the data set has no training examples")
    x = dataset.x_train[:1]
    like = next((t for t in itertools.chain(model.parameters(), model.buffers())
                 if t.is_floating_point()), None)
    if like is not None:
        x = x.to(device=like.device, dtype=like.dtype)
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        # a forward pass that draws random numbers must not move the stream training uses
        with torch.no_grad(), randomness.preserved(x.device):
            out = model(x)
    except Exception as exc:  # the user's model may raise anything on inputs it cannot take
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{who}: model cannot take this data set's inputs of shape "
                         f"{dataset.input_shape}: {reason}") from None
    finally:
        for m, mode in modes:
            m.training = mode
    if not isinstance(out, torch.Tensor):
        raise ModelError(f"{who}: model returned a {type(out).__name__}, not a tensor; "
                         f"forward(x) must return the outputs as one tensor")
    if not out.is_floating_point():
        raise ModelError(f"{who}: model outputs {out.dtype}; the losses need floating-point "
                         f"outputs (logits or values)")
    if dataset.loss is None:
        _check_output_shape(tuple(out.shape), dataset, who)
    else:
        _check_own_loss(out, dataset, who)


def _check_own_loss(out: torch.Tensor, dataset: Dataset, who: str) -> None:
    """The data set's own loss takes the model's output for one example and gives one loss for
    it (the output's shape is the loss's business, not the task's)."""
    y = dataset.y_train[:1].to(out.device)
    try:
        with torch.no_grad():
            value = dataset.loss(out, y)
    except Exception as exc:  # the user's loss may raise anything
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{who}: the data set's loss cannot take the model's outputs "
                         f"{list(out.shape)} and targets {list(y.shape)}: {reason}") from None
    if not isinstance(value, torch.Tensor) or value.dim() < 1 or value.shape[0] != 1:
        got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ModelError(f"{who}: the data set's loss must return one loss per example (shape "
                         f"[B]); for one example it returned {got}")


def _check_output_shape(got: tuple[int, ...], dataset: Dataset, who: str) -> None:
    want = expected_output(dataset)
    if got == want:
        return
    if dataset.task == "classification":
        c = dataset.num_classes
        if got[:-1] == want[:-1]:
            raise ModelError(f"{who}: model outputs {list(got)} for one example but the data set "
                             f"has {c} classes: the last layer must have {c} outputs")
        raise ModelError(f"{who}: model outputs {list(got)} for one example but labels of shape "
                         f"{list(want[:-1])} with {c} classes need {list(want)}")
    hint = " (end the model with training.models.Flatten1dOutput())" if got == want + (1,) else ""
    raise ModelError(f"{who}: model outputs {list(got)} for one example but the regression "
                     f"targets have shape {list(want)}: the model must output {list(want)}, one "
                     f"value per example{hint}")
@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with torch's global CPU generator seeded by ``seed``, restored after.

    One body at a time: the generator is process-wide, so models built by concurrent threads (a
    thread pool running groups) each get their own seed's weights."""
    with randomness.preserved("cpu"):
        torch.manual_seed(seed)
        yield


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())


class Flatten1dOutput(nn.Module):
    """Squeeze a single regression output to shape [batch]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-1)


def plain_relu_mlp(model: nn.Module) -> list[nn.Linear] | None:
    """The Linear layers of ``model`` when it is ``nn.Sequential`` of an optional leading
    ``nn.Flatten()`` (default dims), then ``nn.Linear`` layers with bias and ``nn.ReLU`` between
    them, a Linear layer last (``mlp``, ``linear``), and no buffers; else None. The probes'
    replay (``training.replay``) and passes (``theory.mlp_passes``) write such a network's
    backward pass out."""
    if type(model) is not nn.Sequential or any(True for _ in model.buffers()):
        return None
    mods = list(model)
    if mods and type(mods[0]) is nn.Flatten and (mods[0].start_dim, mods[0].end_dim) == (1, -1):
        mods = mods[1:]
    linear, relu = mods[0::2], mods[1::2]
    if (len(mods) % 2 == 0 or any(type(m) is not nn.Linear or m.bias is None for m in linear)
            or any(type(m) is not nn.ReLU for m in relu)):
        return None
    return linear


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


def _conv_out(length: int, kernel: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - kernel) // stride + 1


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
def lee_cnn(dataset: Dataset) -> nn.Module:
    """Lee et al. (2021)'s Simple-CNN: two unpadded 5x5 convs (32, 64) each with ReLU and a 2x2
    max pool, then one Linear layer (no hidden dense layer, unlike Shallue's ``simple_cnn``)."""
    c, h, w = _image_shape("lee_cnn", dataset)
    oh, ow = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
    if oh < 1 or ow < 1:
        raise ModelError(f"lee_cnn needs images of at least 16x16, got {h}x{w}")
    return _head([
        nn.Conv2d(c, 32, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(64 * oh * ow, output_size(dataset)),
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


def activation_floats(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Floats one example's forward pass writes: every leaf module's output (all tensors of a
    tuple, e.g. a recurrent layer's), plus the im2col patches of convolutions. The pass runs in
    eval mode, so it neither updates running statistics nor draws random numbers."""
    total = 0

    def hook(module, inputs, output):
        nonlocal total
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        total += sum(t.numel() for t in outputs if isinstance(t, torch.Tensor))
        if isinstance(module, nn.modules.conv._ConvNd):
            total += output.numel() // module.out_channels * (
                module.in_channels // module.groups) * math.prod(module.kernel_size)

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    was_training = model.training
    try:
        with torch.no_grad():
            p = next(model.parameters())
            model.eval()
            model(torch.zeros(1, *input_shape, dtype=p.dtype, device=p.device))
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return total
