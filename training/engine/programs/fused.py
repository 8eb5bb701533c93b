"""The fused training step of stacked ``nn.Sequential`` models (``mlp``, ``linear``, ``cnn1d``).

:class:`FusedProgram` computes the same per-trial mini-batch losses and gradients as
:class:`training.engine.programs.batched.BatchedProgram`, in one call of the compiled kernel
``csrc/fused_sequential.cpp`` (:mod:`training.engine.compiled_kernel`) instead of a few dozen batched kernels:

- each trial's mini-batch is gathered and processed in chunks of ``examples_per_chunk``
  examples, forward, loss and backward back to back, so a chunk's activations and im2col
  patches stay in the core's L2 cache (a batched kernel over all trials streams them through
  memory instead); with :meth:`FusedProgram.train_steps` the trial's update (the SGD rules, Adam
  or AdamW) follows at once, on gradients still in cache, and the trial takes its next steps
  before the next trial starts, its weights and optimizer state still in cache;
- im2col is fused into the chunk (patches built right before their GEMM, in a thread-local
  buffer) and so is col2im (the patch gradient added onto the input gradient right after its
  GEMM); activations of convolutions are channels-last;
- trials are spread over torch's intra-op threads, each GEMM is one single-threaded BLAS call on
  in-cache operands, and no Python runs between the steps of one call.

Evaluation runs the same chunked forward pass, reading validation inputs shared by all trials
in place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from training.delay import DelaySteps
from training.engine import compiled_kernel as kernels
from training.engine.programs.base import Cell, Program
from training.engine.module_state import ModuleState
from training.engine.updates import StackUpdate
from training.models import Flatten1dOutput

Tensor = torch.Tensor

# layer kinds and the ten int64 fields of one layer, as csrc/layers.h reads them
LINEAR, CONV1D, RELU, TRANSPOSE = range(4)
# their codes in csrc/fused_sequential.cpp
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")


def _layer(kind: int, a: int = 0, b: int = 0, k: int = 0, stride: int = 0, pad: int = 0,
           lin: int = 0, lout: int = 0, bias: bool = False, param: int = 0) -> list[int]:
    return [kind, a, b, k, stride, pad, lin, lout, int(bias), param]


def encode(model: nn.Module, input_shape: Sequence[int]) -> list[int] | None:
    """The kernel's layer encoding of ``model`` for inputs of ``input_shape``, or None when a
    layer is outside its scope (then the eager program runs).

    Tracks each activation's logical shape (per example, as the module sees it) and its storage:
    convolutions keep [length, channels] (channels-last); TRANSPOSE layers convert to and from
    the channel-major order that Flatten / Unflatten / Linear assume."""
    if not isinstance(model, nn.Sequential):
        return None
    shape, channels_last = tuple(int(s) for s in input_shape), False
    flat_of: tuple[int, int] | None = None  # (C, L) of a flattened channels-last activation
    out: list[int] = []
    param = 0

    def standard() -> None:
        nonlocal channels_last, flat_of
        stored = flat_of or (shape if channels_last else None)
        if stored and min(stored) > 1:
            out.extend(_layer(TRANSPOSE, stored[1], stored[0]))  # stored [L, C] -> [C, L]
        channels_last, flat_of = False, None

    for m in model:
        if isinstance(m, nn.ReLU):
            out.extend(_layer(RELU, math.prod(shape)))
        elif isinstance(m, nn.Linear):
            if len(shape) != 1 or shape[0] != m.in_features:
                return None
            # a flattened channels-last input: the kernel permutes the weight, not the input
            c, length = flat_of if flat_of and min(flat_of) > 1 else (0, 0)
            flat_of = None
            bias = m.bias is not None
            out.extend(_layer(LINEAR, m.in_features, m.out_features, c, 0, 0, length, 0, bias,
                              param))
            param += 1 + bias
            shape = (m.out_features,)
        elif isinstance(m, nn.Conv1d):
            if (m.padding_mode != "zeros" or not isinstance(m.padding, tuple) or m.groups != 1
                    or m.dilation != (1,) or len(shape) != 2 or shape[0] != m.in_channels):
                return None
            if not channels_last and min(shape) > 1:
                out.extend(_layer(TRANSPOSE, shape[0], shape[1]))  # [C, L] -> stored [L, C]
            channels_last = True
            (k,), (stride,), (pad,) = m.kernel_size, m.stride, m.padding
            lout = (shape[1] + 2 * pad - k) // stride + 1
            bias = m.bias is not None
            out.extend(_layer(CONV1D, m.in_channels, m.out_channels, k, stride, pad, shape[1],
                              lout, bias, param))
            param += 1 + bias
            shape = (m.out_channels, lout)
        elif isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1:
            if channels_last:
                flat_of, channels_last = shape, False
            shape = (math.prod(shape),)
        elif isinstance(m, nn.Unflatten) and m.dim in (1, -1) and len(shape) == 1:
            standard()
            shape = tuple(int(s) for s in m.unflattened_size)
        elif isinstance(m, Flatten1dOutput) and shape == (1,):
            pass
        else:
            return None
    standard()
    # the loss needs one row of outputs per example
    if param != len(list(model.parameters())) or not out or len(shape) != 1:
        return None
    return out


@dataclass
class FusedProgram(Program):
    """The program of the fused kernel (see module docstring), for the models of
    ``BatchedProgram`` with Linear / Conv1d / ReLU layers."""

    takes_many_steps = True
    takes_delays = True

    encoding: list[int]
    kernel: object
    examples_per_chunk: int  # in a training step
    eval_chunk: int          # in a forward pass (evaluation: not bound by the batch size)
    squeeze: bool  # the model ends with Flatten1dOutput: outputs [N, B], not [N, B, 1]

    def forward(self, params: Sequence[Tensor], x: Tensor, module: ModuleState | None = None
                ) -> Tensor:
        """Outputs [N, B, ...] for inputs [N, B, ...], or for one input expanded over the trials
        (stride 0 on the trial dim), which the kernel then reads once per trial in place."""
        shared = x.stride(0) == 0
        out = self.kernel.forward(list(params), x[0] if shared else x, self.encoding,
                                  self.eval_chunk, shared)
        return out.squeeze(-1) if self.squeeze else out

    def loss_and_grads(self, params: Sequence[Tensor], x: Tensor, y: Tensor,
                       module: ModuleState | None = None) -> tuple[Tensor, list[Tensor]]:
        """Per-trial mini-batch loss [N] and gradients, as ``BatchedProgram``'s."""
        out = self.kernel.loss_and_grads(list(params), x, y, self.encoding,
                                         self.examples_per_chunk)
        return out[0], out[1:]

    def updates_in_step(self, optimizer: str, device: str | torch.device) -> bool:
        """Whether :meth:`train_step` applies ``optimizer``'s update inside the kernel: every
        optimizer of :data:`training.config.OPTIMIZERS` (see :mod:`training.engine.strategy`)."""
        return optimizer in OPTIMIZERS

    def train_steps(self, params: Sequence[Tensor], x_train: Tensor, y_train: Tensor,
                    idx: Tensor, updates: Sequence[StackUpdate], limit: Tensor,
                    delayed: DelaySteps | None = None) -> tuple[Tensor, Tensor]:
        """K = ``len(updates)`` consecutive steps of every trial, step k on the batch
        ``x_train[idx[k, i]]`` (``idx`` [K, N, B]) with ``updates[k]`` (masked gradient, then the
        rule of torch.optim.SGD with per-trial lr and mu, or of Adam / AdamW with per-trial lr,
        betas, eps and weight decay, on the moments of ``update.adam``), in place. A trial stops
        at the first step whose loss exceeds its ``limit`` (float64 [N]): that step and the
        later ones leave its parameters and optimizer state alone. Returns the losses [K, N]
        (NaN after a trial's last step) and the updates each trial took [N] (int64: K, or the
        step where it stopped).

        Each trial runs its K steps before the next trial starts, so its weights and optimizer
        state stay in the core's L2 cache across them (the MLP's 180 KB with momentum; 32
        trials' do not fit in a 2 MiB L2); each update runs right after its backward pass, on
        gradients still in cache.

        ``delayed`` (:class:`training.delay.DelaySteps`): step k of trial i takes its gradient
        at the weights in ring slot ``read[k, i]``, and its weights after the update are copied
        into slot ``write[k]`` right away, still in cache: the queue costs one in-cache copy of
        the weights a trial-step."""
        update = updates[0]
        ring, read, write = ((delayed.ring, delayed.read, delayed.write) if delayed else
                             ([], _NO_SLOTS, _NO_SLOTS))
        first, second = update.kernel_state()
        return tuple(self.kernel.train_steps(
            list(params), first, second, list(update.masks), x_train, y_train, idx,
            self.encoding, self.examples_per_chunk, torch.stack([u.lr for u in updates]),
            update.mu, _NO_HYPER if update.adam is None else update.adam.hyper, update.step,
            OPTIMIZERS.index(update.optimizer), limit, ring, read, write))

    def train_step(self, params: Sequence[Tensor], x_train: Tensor, y_train: Tensor,
                   idx: Tensor, update: StackUpdate, limit: Tensor,
                   module: ModuleState | None = None, delayed: DelaySteps | None = None
                   ) -> Tensor:
        """One step of :meth:`train_steps` (batch ``x_train[idx[i]]`` of trial i, ``idx``
        [N, B]): the losses [N]; trials whose loss exceeds ``limit`` keep their state."""
        return self.train_steps(params, x_train, y_train, idx.unsqueeze(0), [update], limit,
                                delayed)[0][0]


_NO_HYPER = torch.empty(0, dtype=torch.float64)  # the SGD rules read no Adam metaparameters
_NO_SLOTS = torch.empty(0, dtype=torch.long)     # no delayed gradients


def working_set(encoding: Sequence[int], input_size: int) -> int:
    """Values one example keeps in the kernel's buffers during a chunk: its input, every
    layer's output (a ReLU works in place), the im2col patches, two activation gradients."""
    total, widest = input_size, input_size
    for i in range(0, len(encoding), 10):
        kind, a, b, k, _, _, _, lout = encoding[i:i + 8]
        size = b * lout if kind == CONV1D else b if kind == LINEAR else 0
        if kind == TRANSPOSE:
            size = a * b
        total += size + (lout * k * a if kind == CONV1D else 0)
        widest = max(widest, size)
    return total + 2 * widest


def values_per_example(model: nn.Module, input_shape: Sequence[int]) -> int | None:
    """:func:`working_set` of ``model``'s encoding (values one example keeps in the kernel's
    buffers), or None for a model outside the kernel's scope (:func:`encode`)."""
    encoding = encode(model, input_shape)
    return None if encoding is None else working_set(encoding, math.prod(input_shape))


def try_build(model: nn.Module, input_shape: Sequence[int], dtype: torch.dtype,
              device: str | torch.device, examples_per_chunk: int, eval_chunk: int
              ) -> FusedProgram | None:
    """The fused program for ``model``, or None (kernel disabled or not built, not on the CPU,
    a dtype other than float32 / float64, or a layer outside the kernel's scope)."""
    if torch.device(device).type != "cpu" or dtype not in (torch.float32, torch.float64):
        return None
    encoding = encode(model, input_shape)
    if encoding is None or any(True for _ in model.buffers()):
        return None
    kernel = kernels.fused_sequential()
    if kernel is None:
        return None
    return FusedProgram(encoding, kernel, examples_per_chunk, eval_chunk,
                        isinstance(model[-1], Flatten1dOutput))


def build(cell: Cell, examples_per_chunk: int, eval_chunk: int) -> FusedProgram | None:
    """The registry's builder (:mod:`training.engine.programs.registry`): the fused program of
    ``cell``, or None (see :func:`try_build`; a data set's own loss, which the kernel does not
    compute, rules it out too)."""
    if cell.loss is not None:
        return None
    return try_build(cell.model, cell.input_shape, cell.dtype, cell.device, examples_per_chunk,
                     eval_chunk)
