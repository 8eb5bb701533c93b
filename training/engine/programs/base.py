"""What a program is: the :class:`Program` protocol with its optional abilities declared, and the
:class:`Cell` a program is built for.

A program computes a training step for a stack of trials whose parameters are stacked
``[N, *shape]``. Every program subclasses :class:`Program`, so an ability it lacks reads as the
default declared here: the trainer asks a program what it can do, never probes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import nn

from training.delay import DelaySteps
from training.engine.module_state import ModuleState
from training.engine.updates import StackUpdate
from training.models.features import Features

Tensor = torch.Tensor


@dataclass(frozen=True, eq=False)  # a module inside: no field-wise ==
class Cell:
    """One (model, batch size, optimizer) combination ``train_trials`` trains, with what decides
    its program: the task, one example's ``input_shape``, the trial count, dtype, device, the
    data set's own per-example ``loss`` (or None), whether a training step draws random numbers
    (``training.randomness.draws``), the precision (:data:`training.device.PRECISIONS`) and
    what the rules read of the model (``features``, taken when the cell is made)."""

    model: nn.Module
    task: str
    input_shape: tuple[int, ...]
    batch_size: int
    n_trials: int
    dtype: torch.dtype = torch.float32
    device: str | torch.device = "cpu"
    optimizer: str = "momentum"
    loss: Callable[[Tensor, Tensor], Tensor] | None = None
    random: bool = False
    precision: str = "fp32"
    features: Features | None = None

    @property
    def itemsize(self) -> int:
        """Bytes of one value in the cell's dtype."""
        return torch.empty((), dtype=self.dtype).element_size()


class Program(Protocol):
    """What the trainer needs of a stack's program: ``forward`` and ``loss_and_grads`` always;
    the rest are abilities, each declared here with the value of a program that lacks it."""

    #: the trainer keeps each stack's :class:`~training.engine.module_state.ModuleState`
    #: (per-trial buffers and generators) and hands it to the program as ``module``
    takes_module_state: ClassVar[bool] = False
    #: :meth:`train_steps` takes many steps in one call (the loop hands it a budget's worth)
    takes_many_steps: ClassVar[bool] = False
    #: :meth:`train_step` / :meth:`train_steps` take delayed gradients (``delayed``, a
    #: :class:`training.delay.DelaySteps`); else the loop runs a stack of delayed trials through
    #: :meth:`loss_and_grads` at their past weights and applies the update itself
    takes_delays: ClassVar[bool] = False

    def forward(self, params: Sequence[Tensor], x: Tensor, module: ModuleState | None = None
                ) -> Tensor:
        """Outputs [N, B, ...] for inputs [N, B, ...] (or one input expanded over the trials,
        stride 0 on the trial dim)."""
        ...

    def loss_and_grads(self, params: Sequence[Tensor], x: Tensor, y: Tensor,
                       module: ModuleState | None = None) -> tuple[Tensor, list[Tensor]]:
        """Per-trial mini-batch loss [N] and gradients, one per parameter, stacked."""
        ...

    def updates_in_step(self, optimizer: str, device: str | torch.device) -> bool:
        """Whether :meth:`train_step` applies ``optimizer``'s update itself on ``device``;
        else the loop applies it after :meth:`loss_and_grads`."""
        return False

    def train_step(self, params: Sequence[Tensor], x_train: Tensor, y_train: Tensor,
                   idx: Tensor, update: StackUpdate, limit: Tensor,
                   module: ModuleState | None = None, delayed: DelaySteps | None = None
                   ) -> Tensor:
        """One step of every trial on its batch ``x_train[idx[i]]`` (``idx`` [N, B]): the losses
        [N], with ``update`` applied in place to the trials whose loss is at most ``limit``
        (``delayed``: as :meth:`train_steps`'). Only where :meth:`updates_in_step`."""
        raise NotImplementedError(f"{type(self).__name__} does not update inside its step")

    def train_steps(self, params: Sequence[Tensor], x_train: Tensor, y_train: Tensor,
                    idx: Tensor, updates: Sequence[StackUpdate], limit: Tensor,
                    delayed: DelaySteps | None = None) -> tuple[Tensor, Tensor]:
        """``len(updates)`` steps in one call (``idx`` [K, N, B]): the losses [K, N] and the
        updates each trial took [N]; ``delayed``: where the gradients are taken (only where
        :attr:`takes_delays`). Only where :attr:`takes_many_steps`."""
        raise NotImplementedError(f"{type(self).__name__} takes one step a call")

    def timed_trials(self, trials_per_stack: int) -> int:
        """Trials in the scratch stack that times this program
        (:mod:`training.engine.choice`): two per thread, enough to keep every thread busy
        where a program spreads trials over threads and runs them one after another."""
        return max(2, 2 * torch.get_num_threads())


#: How a program is made for a cell: ``build(cell, examples_per_chunk, eval_chunk)``, None where
#: the program cannot run the cell (examples per chunk in a training step; in a forward pass).
Builder = Callable[[Cell, int, int], "Program | None"]
