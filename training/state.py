"""A training state to resume from: weights, optimizer buffers, step and data-order position.

A run is a function of its state and of what comes after it, so a trainer that starts from a
:class:`TrainState` continues exactly as the run that saved it: same weights, momentum buffers
(or Adam's moments), lr-schedule step, position in the data order and divergence reference. Tensors are stacked with
a leading trial dimension ``[N, *shape]``, as ``train_trials`` stacks its trials; the reference
loop uses N = 1. Branches of a checkpoint (Merrill et al. 2025) all start from one state.

Data order under a changing batch size: a position is (epoch, offset) into the epoch's
permutation (:func:`training.schedules.order.epoch_permutation`). A batch of b examples takes
``perm[offset:offset + b]``; when fewer than b remain, they are dropped and the next epoch
starts. For a constant b this is exactly :class:`training.schedules.order.BatchOrder`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from training.config import ADAM_OPTIMIZERS
from training.errors import ConfigError
from training.schedules.order import epoch_permutation


@dataclass(frozen=True)
class DataPosition:
    """Next unread example: ``offset`` into the permutation of ``epoch``."""

    epoch: int = 0
    offset: int = 0


class DataStream:
    """One trial's training examples in order (data seed ``seed``, ``n`` training examples)."""

    def __init__(self, seed: int, n: int):
        self.seed, self.n = int(seed), int(n)
        self._epoch, self._perm = -1, None

    def batch(self, position: DataPosition, batch_size: int) -> tuple[torch.Tensor, DataPosition]:
        """Indices of the next ``batch_size`` examples from ``position``, and the position after."""
        if not 1 <= batch_size <= self.n:
            raise ConfigError(f"batch size must be in [1, {self.n}] (training set size), got {batch_size!r}")
        epoch, offset = position.epoch, position.offset
        if offset + batch_size > self.n:
            epoch, offset = epoch + 1, 0
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, epoch_permutation(self.seed, epoch, self.n)
        return self._perm[offset:offset + batch_size], DataPosition(epoch, offset + batch_size)


@dataclass(frozen=True, eq=False)
class TrainState:
    """``params`` / ``buffers`` (momentum buffers, or Adam's first moments m; empty for plain SGD
    or before the first update) / ``moments`` (Adam's second moments v; empty for the SGD
    family): name -> ``[N, *shape]``; ``step``: updates taken (also Adam's bias-correction step);
    ``position``: next example of the data order; ``initial_loss``: per trial, the loss the
    divergence test compares with; ``model_buffers``: the module's own buffers per trial
    (BatchNorm's running statistics), name -> ``[N, *shape]``, empty for a module without state;
    ``rng_states``: per trial, the state of the generator the module's random draws (Dropout)
    come from (:mod:`training.randomness`), empty when the run kept none. Trainers copy the
    tensors on entry, so a state can seed any number of runs."""

    params: Mapping[str, torch.Tensor]
    buffers: Mapping[str, torch.Tensor]
    step: int
    position: DataPosition
    initial_loss: tuple[float, ...]
    moments: Mapping[str, torch.Tensor] = field(default_factory=dict)
    model_buffers: Mapping[str, torch.Tensor] = field(default_factory=dict)
    rng_states: tuple[torch.Tensor, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.initial_loss)
        if n < 1 or not all(isinstance(v, float) and math.isfinite(v) for v in self.initial_loss):
            raise ConfigError(f"TrainState initial_loss must be one finite float per trial, got {self.initial_loss!r}")
        if len(self.rng_states) not in (0, n):
            raise ConfigError(f"TrainState rng_states must hold one generator state per trial "
                              f"({n}) or none, got {len(self.rng_states)}")
        for kind in ("params", "buffers", "moments", "model_buffers"):
            for name, t in getattr(self, kind).items():
                if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != n:
                    raise ConfigError(f"TrainState {kind}[{name!r}] must be a tensor [{n}, ...] (one per trial)")
        for kind in ("buffers", "moments"):
            extra = sorted(set(getattr(self, kind)) - set(self.params))
            if extra:
                raise ConfigError(f"TrainState {kind} {extra} have no parameter")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ConfigError(f"TrainState step must be an integer >= 0, got {self.step!r}")

    @property
    def n_trials(self) -> int:
        return len(self.initial_loss)

    def trial(self, i: int) -> "TrainState":
        """Trial ``i`` alone (N = 1)."""
        if not 0 <= i < self.n_trials:
            raise ConfigError(f"trial index must be in [0, {self.n_trials}), got {i}")
        return TrainState({k: v[i:i + 1] for k, v in self.params.items()},
                          {k: v[i:i + 1] for k, v in self.buffers.items()},
                          self.step, self.position, (self.initial_loss[i],),
                          {k: v[i:i + 1] for k, v in self.moments.items()},
                          {k: v[i:i + 1] for k, v in self.model_buffers.items()},
                          self.rng_states[i:i + 1])

    def check_optimizer(self, optimizer: str) -> None:
        """The state resumes a run of ``optimizer``'s family: Adam-type states hold Adam's moments
        (buffers and moments of the same parameters, none only before the first update), SGD-type
        states none."""
        if optimizer in ADAM_OPTIMIZERS:
            if set(self.moments) != set(self.buffers) or (self.step and not self.moments):
                raise ConfigError(f"optimizer {optimizer!r} resumes from a TrainState with Adam's "
                                  f"moments (buffers and moments of the same parameters); start has none")
        elif self.moments:
            raise ConfigError(f"start holds Adam's moments; optimizer {optimizer!r} cannot resume "
                              f"from it")

    def check_model(self, model: nn.Module) -> None:
        """The state's parameters are exactly ``model``'s, by name and shape."""
        shapes = {k: tuple(v.shape) for k, v in model.named_parameters()}
        if set(shapes) != set(self.params):
            raise ConfigError(f"TrainState parameters {sorted(self.params)} do not match the model's {sorted(shapes)}")
        for k, v in self.params.items():
            if tuple(v.shape[1:]) != shapes[k]:
                raise ConfigError(f"TrainState params[{k!r}] has shape {tuple(v.shape[1:])}; the model's is {shapes[k]}")
        names = [k for k, _ in model.named_buffers()]
        if self.model_buffers and set(self.model_buffers) != set(names):
            raise ConfigError(f"TrainState model_buffers {sorted(self.model_buffers)} do not match "
                              f"the model's buffers {sorted(names)}")


def model_at(model: nn.Module, state: TrainState, trial: int = 0, *,
             device: torch.device | str | None = None,
             dtype: torch.dtype | None = None) -> nn.Module:
    """A copy of ``model`` (moved to ``device`` and ``dtype`` first, where given) holding trial
    ``trial`` of ``state``: its weights and its module buffers (BatchNorm's running statistics)."""
    net = copy.deepcopy(model)
    if device is not None or dtype is not None:
        net = net.to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(state.params[name][trial])
        for name, b in net.named_buffers():
            if name in state.model_buffers:
                b.copy_(state.model_buffers[name][trial])
    return net
