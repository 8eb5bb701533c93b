"""The ``func`` program: N copies of any module, each with its own parameters, through
``torch.func``: vmap over ``grad_and_value(functional_call)`` (the per-model ensembling recipe of
the ``torch.func`` docs).

Parameters are stacked along a leading trial dimension (``[N, *shape]``) and so are inputs
(``[N, batch, ...]``); the loss is that of :mod:`training.goal`. Under ``bf16`` the forward pass
and the loss run in autocast (:mod:`training.device`); the gradients of the float32 parameters
come back in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from training.device import autocast
from training.engine.programs.base import Cell, Program
from training.engine.programs.common import widen
from training.engine.module_state import ModuleState
from training.goal import loss_fn

Tensor = torch.Tensor


class FuncProgram(Program):
    """Any module through ``torch.func``: vmap of grad_and_value of ``functional_call``."""

    def __init__(self, model: nn.Module, task: str,
                 loss: Callable[[Tensor, Tensor], Tensor] | None = None,
                 precision: str = "fp32"):
        self.model, self.task, self.precision = model, task, precision
        self.names = [name for name, _ in model.named_parameters()]
        self.buffers = dict(model.named_buffers())
        criterion = loss_fn(task, loss)

        def call(params: tuple[Tensor, ...], x: Tensor) -> Tensor:
            return torch.func.functional_call(model, ({**dict(zip(self.names, params)),
                                                       **self.buffers}), (x,))

        def loss(params, x, y):
            with autocast(precision, x.device):
                return criterion(call(params, x), y)

        self._call = call
        self._grad = torch.func.vmap(torch.func.grad_and_value(loss))

    def forward(self, params: Sequence[Tensor], x: Tensor, module: ModuleState | None = None
                ) -> Tensor:
        with autocast(self.precision, x.device):
            if x.stride(0) == 0:  # one input expanded over the trials
                out = torch.func.vmap(self._call, in_dims=(0, None))(tuple(params), x[0])
            else:
                out = torch.func.vmap(self._call)(tuple(params), x)
        return widen(out)

    def loss_and_grads(self, params: Sequence[Tensor], x: Tensor, y: Tensor,
                       module: ModuleState | None = None) -> tuple[Tensor, list[Tensor]]:
        grads, loss = self._grad(tuple(params), x, y)
        return loss, list(grads)

    def timed_trials(self, trials_per_stack: int) -> int:
        """vmap computes the whole stack at once, so its speed per trial depends on the stack:
        it is timed at the strategy's own stack size."""
        return trials_per_stack


def build(cell: Cell, examples_per_chunk: int, eval_chunk: int) -> FuncProgram:
    """The registry's builder (:mod:`training.engine.programs.registry`): any module, the data
    set's own loss included (whether ``torch.func`` can batch the model shows when it runs). It
    does not chunk."""
    return FuncProgram(cell.model, cell.task, cell.loss, cell.precision)
