"""The ``batched`` program: N copies of an ``nn.Sequential`` of Linear / Conv1d / ReLU / Flatten /
Unflatten layers (the ``mlp``, ``linear`` and ``cnn1d`` models) run as one computation.

Parameters are stacked along a leading trial dimension (``[N, *shape]``) and so are activations
(``[N, batch, *features]``). The forward pass is batched matmuls (``baddbmm``; convolutions as
im2col + ``bmm``) and the backward pass is written by hand, so a training step issues a few dozen
large kernels and builds no autograd graph. It is the eager fallback of the compiled kernel's
``fused`` program (:mod:`training.engine.programs.fused`), which runs the same layers.

Losses are those of :mod:`training.goal`: mean cross-entropy, or 1/2 mean squared error.

Precision (:mod:`training.device`): under ``bf16`` the forward and backward matmuls run in
autocast's bfloat16 (there is no autograd graph: the hand-written backward's products are
autocast's too, as autograd's would be), the loss and its gradient in float32, and the
gradients come back in the parameters' dtype, so the update reads float32 gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from training.device import autocast
from training.engine.programs.base import Cell, Program
from training.engine.programs.common import stacked_loss_and_grad, widen
from training.engine.module_state import ModuleState
from training.models import Flatten1dOutput

Tensor = torch.Tensor


# ----------------------------------------------------------------------------------------------
# hand-written layers: forward(params, x) -> (y, ctx); backward(params, ctx, dy, need_dx) ->
# (dx or None, parameter gradients)


class _Layer:
    n_params = 0

    def forward(self, p: Sequence[Tensor], x: Tensor) -> tuple[Tensor, object]:
        raise NotImplementedError

    def backward(self, p: Sequence[Tensor], ctx, dy: Tensor, need_dx: bool
                 ) -> tuple[Tensor | None, list[Tensor]]:
        raise NotImplementedError


@dataclass
class _Linear(_Layer):
    """y = x W^T + b per trial: W [N, out, in], x [N, B, in] (or [B, in] shared by all trials)."""

    bias: bool

    @property
    def n_params(self) -> int:  # type: ignore[override]
        return 2 if self.bias else 1

    def forward(self, p, x):
        w = p[0]
        if x.stride(0) == 0 and x.shape[0] > 1:
            # one input for every trial (evaluation): one GEMM against all trials' weights
            n, out_f, in_f = w.shape
            y = (x[0] @ w.reshape(n * out_f, in_f).T).view(x.shape[1], n, out_f).transpose(0, 1)
            return (y + p[1].unsqueeze(1) if self.bias else y), None
        if self.bias:
            return torch.baddbmm(p[1].unsqueeze(1), x, w.transpose(1, 2)), x
        return torch.bmm(x, w.transpose(1, 2)), x

    def backward(self, p, x, dy, need_dx):
        grads = [torch.bmm(dy.transpose(1, 2), x)]
        if self.bias:
            grads.append(dy.sum(1))
        return (torch.bmm(dy, p[0]) if need_dx else None), grads


class _ReLU(_Layer):
    def forward(self, p, x):
        y = torch.relu(x)
        return y, y

    def backward(self, p, y, dy, need_dx):
        return torch.ops.aten.threshold_backward(dy, y, 0), []


@dataclass
class _Reshape(_Layer):
    """Flatten / Unflatten / squeeze of the feature dims (the trial and batch dims are kept)."""

    fn: Callable[[Tensor], Tensor]

    def forward(self, p, x):
        return self.fn(x), x.shape

    def backward(self, p, shape, dy, need_dx):
        return dy.reshape(shape), []


@dataclass
class _Conv1d(_Layer):
    """Conv1d per trial as im2col + one batched matmul (trials are the matmul batch).

    Activations are logically [N, B, C, L] but stored channels-last ([N, B, L, C], returned as a
    transposed view): the patches are k strided slices of the padded input concatenated along
    channels (tap-major), and the matmul output needs no transpose. Measured on CPU: grouped
    convolutions over N channel groups were 3-10x slower, and ``F.pad`` / ``unfold`` on this
    layout 4x slower than a zero buffer and slices."""

    bias: bool
    stride: int
    padding: int
    taps: int   # the convolution's kernel_size (torch's name), as positions

    @property
    def n_params(self) -> int:  # type: ignore[override]
        return 2 if self.bias else 1

    def _taps(self, length_out: int) -> list[slice]:
        span = self.stride * (length_out - 1) + 1
        return [slice(j, j + span, self.stride) for j in range(self.taps)]

    def forward(self, p, x):
        w = p[0]
        n, c_out, c_in = w.shape[:3]
        batch, length = x.shape[1], x.shape[3]
        xc = x.new_zeros(n, batch, length + 2 * self.padding, c_in)
        xc[:, :, self.padding:self.padding + length] = x.transpose(2, 3)
        length_out = (xc.shape[2] - self.taps) // self.stride + 1
        cols = torch.cat([xc[:, :, t] for t in self._taps(length_out)], -1)
        cols = cols.view(n, batch * length_out, -1)  # [N, B * Lout, k * C_in]
        w2 = w.permute(0, 3, 2, 1).reshape(n, -1, c_out)  # [N, k * C_in, C_out], tap-major
        y = torch.baddbmm(p[1].unsqueeze(1), cols, w2) if self.bias else torch.bmm(cols, w2)
        return y.view(n, batch, length_out, c_out).transpose(2, 3), (cols, xc.shape)

    def backward(self, p, ctx, dy, need_dx):
        cols, padded_shape = ctx
        w = p[0]
        n, c_out, c_in = w.shape[:3]
        length_out = dy.shape[3]
        dyc = dy.transpose(2, 3).reshape(n, -1, c_out)  # [N, B * Lout, C_out]
        dw = torch.bmm(dyc.transpose(1, 2), cols).view(n, c_out, self.taps, c_in)
        grads = [dw.transpose(2, 3).contiguous()]
        if self.bias:
            grads.append(dyc.sum(1))
        if not need_dx:
            return None, grads
        # col2im: add every tap's patch gradient back onto the padded input
        dcols = torch.bmm(dyc, w.transpose(2, 3).reshape(n, c_out, -1)).view(
            n, dy.shape[1], length_out, self.taps, c_in)
        dxc = dcols.new_zeros(padded_shape)
        for j, t in enumerate(self._taps(length_out)):
            dxc[:, :, t] += dcols[:, :, :, j]
        length = padded_shape[2] - 2 * self.padding
        return dxc[:, :, self.padding:self.padding + length].transpose(2, 3), grads


def _shift_dim(d: int) -> int:
    # a module's dim d >= 1 (after its batch dim) is dim d + 1 in the stacked layout
    return d + 1 if d >= 0 else d


def _as_layer(m: nn.Module) -> _Layer | None:
    if isinstance(m, nn.Linear):
        return _Linear(m.bias is not None)
    if isinstance(m, nn.ReLU):
        return _ReLU()
    if (isinstance(m, nn.Conv1d) and m.padding_mode == "zeros" and isinstance(m.padding, tuple)
            and m.groups == 1 and m.dilation == (1,)):
        return _Conv1d(m.bias is not None, m.stride[0], m.padding[0], m.kernel_size[0])
    if isinstance(m, nn.Flatten) and m.start_dim >= 1:
        start, end = _shift_dim(m.start_dim), _shift_dim(m.end_dim)
        return _Reshape(lambda x: x.flatten(start, end))
    if isinstance(m, nn.Unflatten) and isinstance(m.dim, int) and m.dim >= 1:
        dim, sizes = _shift_dim(m.dim), tuple(m.unflattened_size)
        return _Reshape(lambda x: x.unflatten(dim, sizes))
    if isinstance(m, Flatten1dOutput):
        return _Reshape(lambda x: x.squeeze(-1))
    return None


# ----------------------------------------------------------------------------------------------
# the program


class BatchedProgram(Program):
    """Hand-batched forward and backward of an ``nn.Sequential`` of supported layers."""

    def __init__(self, layers: list[_Layer], task: str, precision: str = "fp32"):
        self.layers, self.task, self.precision = layers, task, precision

    @classmethod
    def try_build(cls, model: nn.Module, task: str, precision: str = "fp32"
                  ) -> "BatchedProgram | None":
        """The program for ``model``, or None if it has a layer (or buffer) this path lacks."""
        if not isinstance(model, nn.Sequential) or any(True for _ in model.buffers()):
            return None
        layers = [_as_layer(m) for m in model]
        if any(layer is None for layer in layers):
            return None
        if sum(layer.n_params for layer in layers) != len(list(model.parameters())):
            return None
        return cls(layers, task, precision)  # type: ignore[arg-type]

    def _split(self, params: Sequence[Tensor]) -> list[Sequence[Tensor]]:
        out, i = [], 0
        for layer in self.layers:
            out.append(params[i:i + layer.n_params])
            i += layer.n_params
        return out

    def forward(self, params: Sequence[Tensor], x: Tensor, module: ModuleState | None = None
                ) -> Tensor:
        """Outputs [N, B, ...] for inputs [N, B, ...]; an input shared by all trials is passed
        expanded (stride 0 on the trial dim) and then costs one GEMM in a Linear layer."""
        with autocast(self.precision, x.device):
            for layer, p in zip(self.layers, self._split(params)):
                x, _ = layer.forward(p, x)
        return widen(x)

    def loss_and_grads(self, params: Sequence[Tensor], x: Tensor, y: Tensor,
                       module: ModuleState | None = None) -> tuple[Tensor, list[Tensor]]:
        """Per-trial mini-batch loss [N] and gradients (one per parameter, stacked)."""
        with autocast(self.precision, x.device):
            loss, grads = self._loss_and_grads(params, x, y)
        if self.precision == "fp32":
            return loss, grads
        return loss, [g.to(p.dtype) for g, p in zip(grads, params)]

    def _loss_and_grads(self, params: Sequence[Tensor], x: Tensor, y: Tensor
                        ) -> tuple[Tensor, list[Tensor]]:
        split = self._split(params)
        ctxs = []
        for layer, p in zip(self.layers, split):
            x, ctx = layer.forward(p, x)
            ctxs.append(ctx)
        loss, dy = stacked_loss_and_grad(x, y, self.task)
        grads: list[Tensor] = []
        # the first parametrised layer needs no input gradient
        first = next(i for i, layer in enumerate(self.layers) if layer.n_params)
        for i in range(len(self.layers) - 1, first - 1, -1):
            dy, g = self.layers[i].backward(split[i], ctxs[i], dy, i > first)
            grads[:0] = g
        return loss, grads


def build(cell: Cell, examples_per_chunk: int, eval_chunk: int) -> BatchedProgram | None:
    """The registry's builder (:mod:`training.engine.programs.registry`): the batched program of
    ``cell``, or None for a model with a layer it lacks, or a data set with its own loss (the
    hand-written backward pass is that of the task's loss). It does not chunk."""
    if cell.loss is not None:
        return None
    return BatchedProgram.try_build(cell.model, cell.task, cell.precision)
