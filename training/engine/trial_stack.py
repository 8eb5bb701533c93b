"""The state of trials trained together: one stack of a group of :func:`training.train_trials`.

A stack holds n trials' parameters stacked along dim 0 (``[n, *shape]``), their optimizer state
(momentum buffers, or Adam moments), masks and per-trial metaparameters as columns of n values,
what the trainer tracks per trial between evaluations (initial loss, loss sum, data order), and,
for the program that runs the module's own forward pass (``per_trial``), the module's state per
trial (:class:`ModuleState`: buffers such as BatchNorm's running statistics, and the generator
state of its random draws).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training import randomness
from training.config import ADAM_OPTIMIZERS, Trial
from training.errors import ConfigError
from training.engine.adam import AdamState
from training.engine.updates import StackUpdate
from training.lr_schedule import lr_factor
from training.masks import mask_
from training.order import trial_seed

Tensor = torch.Tensor


@dataclass
class ModuleState:
    """The module's own state in each trial of a stack: ``buffers`` in the order of
    ``named_buffers()``, stacked ``[n, *shape]`` (BatchNorm's running statistics and counts,
    updated in place by a training step's forward pass, read by evaluations), and ``rng``, each
    trial's generator state for the module's random draws (Dropout;
    :mod:`training.randomness`)."""

    buffers: list[Tensor]
    rng: list[Tensor] | None   # None: the model draws no random numbers

    def select(self, idx: Tensor) -> "ModuleState":
        rows = idx.tolist()
        return ModuleState([b.index_select(0, idx.to(b.device)) for b in self.buffers],
                           None if self.rng is None else [self.rng[r] for r in rows])

    def clone(self) -> "ModuleState":
        return ModuleState([b.clone() for b in self.buffers],
                           None if self.rng is None else list(self.rng))

    def rows(self, start: int, stop: int) -> "ModuleState":
        """Trials ``start`` .. ``stop - 1``: views of the buffers, the same generator states."""
        return ModuleState([b[start:stop] for b in self.buffers],
                           None if self.rng is None else self.rng[start:stop])

    @classmethod
    def initial(cls, model: nn.Module, seeds: list[int], device: str, dtype: torch.dtype,
                random: bool) -> "ModuleState":
        """``model``'s buffers repeated for every trial (floating ones cast to ``dtype``), and,
        for a ``random`` model, the generator states seeded by ``seeds``
        (:func:`training.randomness.randomness_seed`)."""
        buffers = [b.detach().to(device=device, dtype=dtype if b.is_floating_point() else b.dtype)
                   .unsqueeze(0).expand(len(seeds), *b.shape).clone()
                   for _, b in model.named_buffers()]
        return cls(buffers, [randomness.seeded_state(s, device) for s in seeds] if random
                   else None)


@dataclass
class TrialStack:
    """Mutable state of the trials trained together (one chunk of a group); ``ids`` are their
    positions in the group."""

    ids: list[int]
    params: list[Tensor]
    bufs: list[Tensor] | None  # momentum buffers (None for sgd, adam, adamw)
    masks: list[Tensor | None]
    lr: Tensor            # [n] float64 base learning rates
    mu: Tensor            # [n] momentum, model dtype
    decay: Tensor | None  # [n] float64 decay steps (inf: constant), None if all constant
    end: Tensor           # [n] float64 end factors
    init_loss: Tensor     # [n] float64 first mini-batch loss at initialisation
    loss_sum: Tensor      # [n] float64 mini-batch losses since the last evaluation
    seeds: list[int]
    perm: Tensor | None = None
    perm_epoch: int = -1
    adam: AdamState | None = None  # moments and metaparameters of adam / adamw
    module: ModuleState | None = None  # the module's buffers and generators (per_trial only)

    def select(self, rows: list[int]) -> "TrialStack":
        """The stack restricted to positions ``rows``."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.lr.device)

        def take(t):
            return None if t is None else t.index_select(0, idx.to(t.device))

        return TrialStack(
            ids=[self.ids[r] for r in rows], params=[take(p) for p in self.params],
            bufs=None if self.bufs is None else [take(b) for b in self.bufs],
            masks=[m if m is None or m.dim() < self.params[j].dim() else take(m)
                   for j, m in enumerate(self.masks)],
            lr=take(self.lr), mu=take(self.mu), decay=take(self.decay), end=take(self.end),
            init_loss=take(self.init_loss), loss_sum=take(self.loss_sum),
            seeds=[self.seeds[r] for r in rows], perm=take(self.perm), perm_epoch=self.perm_epoch,
            adam=None if self.adam is None else self.adam.select(idx),
            module=None if self.module is None else self.module.select(idx))

    def clone(self) -> "TrialStack":
        """A copy whose parameters and optimizer state can be advanced independently."""
        return TrialStack(
            ids=list(self.ids), params=[p.clone() for p in self.params],
            bufs=None if self.bufs is None else [b.clone() for b in self.bufs],
            masks=self.masks, lr=self.lr, mu=self.mu, decay=self.decay, end=self.end,
            init_loss=self.init_loss, loss_sum=self.loss_sum.clone(), seeds=self.seeds,
            perm=self.perm, perm_epoch=self.perm_epoch,
            adam=None if self.adam is None else self.adam.clone(),
            module=None if self.module is None else self.module.clone())

    def update(self, optimizer: str, step: int) -> StackUpdate:
        """Update ``step`` (0-based) of this stack: learning rates on their schedule."""
        lr = self.lr if self.decay is None else self.lr * lr_factor(step, self.decay, self.end)
        return StackUpdate(optimizer, step, lr, self.mu, self.masks, self.bufs, self.adam)


def check_init_params(init_params: Any, model: nn.Module, n_trials: int) -> dict[str, Tensor]:
    """``init_params`` as name -> ``[n_trials, *shape]`` floating-point tensor for exactly
    ``model``'s parameters ({} for None), else one :class:`ConfigError` line."""
    if init_params is None:
        return {}
    if not isinstance(init_params, Mapping):
        raise ConfigError(f"init_params must be a mapping name -> [N, *shape] tensor (one row "
                          f"per trial), got {type(init_params).__name__}")
    shapes = {k: tuple(p.shape) for k, p in model.named_parameters()}
    if set(init_params) != set(shapes):
        missing = sorted(set(shapes) - set(init_params))
        extra = sorted(set(init_params) - set(shapes))
        raise ConfigError(f"init_params must hold every parameter of the model and no other; "
                          f"missing {missing}, not parameters {extra}")
    out = {}
    for name, shape in shapes.items():
        t = init_params[name]
        if not isinstance(t, Tensor) or not t.is_floating_point() \
                or tuple(t.shape) != (n_trials, *shape):
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ConfigError(f"init_params[{name!r}] must be a floating-point tensor of shape "
                              f"{(n_trials, *shape)} (one row per trial), got {got}")
        out[name] = t.detach()
    return out


def make_stacks(model: nn.Module, trials: list[Trial], masks: dict[str, Tensor], seed: int,
                first_index: int, optimizer: str, chunk: int, device: str, dtype: torch.dtype,
                module_state: bool = False, random: bool = False,
                init_params: Mapping[str, Tensor] | None = None) -> list[TrialStack]:
    """``trials`` in stacks of at most ``chunk``, every trial starting from ``model``'s weights
    (or from its row of ``init_params``, name -> ``[N, *shape]``) with its mask applied; trial
    i's data seed is ``trial_seed(seed, first_index + i)``. With ``module_state``, every stack
    also holds :class:`ModuleState` (for a ``random`` model, trial i's generator seeded by
    ``randomness_seed(seed, first_index + i)``)."""
    names = [name for name, _ in model.named_parameters()]
    base = [p.detach().to(device=device, dtype=dtype) for _, p in model.named_parameters()]
    rows_of = [None if not init_params else init_params[name] for name in names]
    mask_list = [None if name not in masks else masks[name].to(device=device, dtype=dtype)
                 for name in names]
    stacks = []
    for start in range(0, len(trials), chunk):
        ids = list(range(start, min(start + chunk, len(trials))))
        n = len(ids)
        rows = torch.tensor(ids, device=device)
        m_st: list[Tensor | None] = [
            None if m is None else m if m.dim() == p.dim() else m.index_select(0, rows)
            for m, p in zip(mask_list, base)]
        params = [p.unsqueeze(0).expand(n, *p.shape).clone() if r is None else
                  r.index_select(0, rows.to(r.device)).to(device=device, dtype=dtype)
                  for p, r in zip(base, rows_of)]
        mask_(params, m_st)
        decays = [trials[i].decay_steps for i in ids]
        f64 = dict(dtype=torch.float64, device=device)
        stacks.append(TrialStack(
            ids=ids, params=params,
            bufs=None if optimizer in ("sgd", *ADAM_OPTIMIZERS) else [
                torch.zeros_like(p) for p in params],
            adam=AdamState.zeros(params, [trials[i] for i in ids], optimizer == "adamw")
            if optimizer in ADAM_OPTIMIZERS else None,
            masks=m_st, lr=torch.tensor([trials[i].lr for i in ids], **f64),
            mu=torch.tensor([trials[i].momentum for i in ids], dtype=dtype, device=device),
            decay=None if all(d is None for d in decays) else torch.tensor(
                [math.inf if d is None else float(d) for d in decays], **f64),
            end=torch.tensor([trials[i].end_factor for i in ids], **f64),
            init_loss=torch.zeros(n, **f64), loss_sum=torch.zeros(n, **f64),
            seeds=[trial_seed(seed, first_index + i) for i in ids],
            module=ModuleState.initial(
                model, [randomness.randomness_seed(seed, first_index + i) for i in ids], device,
                dtype, random) if module_state else None))
    return stacks
