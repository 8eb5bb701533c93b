"""The stacks of :func:`training.train_trials`: a group's trials in stacks of at most a
strategy's size, each trial's weights, mask, optimizer state, data seed and (for delayed
trials) queue of past weights stacked along dim 0, as the step loop
(:mod:`training.engine.loop`) advances them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from training import randomness
from training.config import ADAM_OPTIMIZERS, Trial
from training.delay import DelayQueue
from training.engine.adam import AdamState
from training.engine.module_state import ModuleState
from training.engine.updates import StackUpdate
from training.goal import DIVERGENCE_FACTOR
from training.masks import mask_
from training.schedules.lr_schedule import lr_factor
from training.schedules.order import trial_seed

Tensor = torch.Tensor


@dataclass
class TrialStack:
    """The trials trained together (one stack of a group; ``ids``, their positions in it): their
    parameters stacked along dim 0 (``[n, *shape]``), optimizer state (momentum buffers, or
    Adam moments), masks and metaparameters as columns of n values, what the loop tracks per
    trial between evaluations (initial loss, loss sum, data order) and, for a program that
    ``takes_module_state``, the module's state per trial."""

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
    delay: DelayQueue | None = None  # past weights of delayed trials (None: no trial delayed)

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
            module=None if self.module is None else self.module.select(idx),
            delay=None if self.delay is None else self.delay.select(idx))

    def clone(self) -> "TrialStack":
        """A copy whose parameters and optimizer state can be advanced independently."""
        return replace(self, ids=list(self.ids), params=[p.clone() for p in self.params],
                       bufs=None if self.bufs is None else [b.clone() for b in self.bufs],
                       loss_sum=self.loss_sum.clone(),
                       adam=None if self.adam is None else self.adam.clone(),
                       module=None if self.module is None else self.module.clone(),
                       delay=None if self.delay is None else self.delay.clone())

    def row(self, r: int, copy: bool = True) -> list[Tensor]:
        """Position ``r``'s parameters, then its module buffers (if the stack keeps them)."""
        rows = [p[r] for p in self.params] + ([] if self.module is None else
                                              [b[r] for b in self.module.buffers])
        return [t.clone() for t in rows] if copy else rows

    def limit(self) -> Tensor:
        """Every trial's divergence limit [n] (training.goal.is_diverged: not finite, or above
        DIVERGENCE_FACTOR times the initial loss)."""
        return DIVERGENCE_FACTOR * self.init_loss.clamp(min=1e-12)

    def update(self, optimizer: str, step: int) -> StackUpdate:
        """Update ``step`` (0-based) of this stack: learning rates on their schedule."""
        lr = self.lr if self.decay is None else self.lr * lr_factor(step, self.decay, self.end)
        return StackUpdate(optimizer, step, lr, self.mu, self.masks, self.bufs, self.adam)


def make_stacks(model: nn.Module, trials: list[Trial], masks: dict[str, Tensor], seed: int,
                first_index: int, optimizer: str, chunk: int, device: str, dtype: torch.dtype,
                module_state: bool = False, random: bool = False,
                init_params: Mapping[str, Tensor] | None = None,
                data_seeds: Sequence[int] | None = None) -> list[TrialStack]:
    """``trials`` in stacks of at most ``chunk``, every trial starting from ``model``'s weights
    (or from its row of ``init_params``, name -> ``[N, *shape]``) with its mask applied; trial
    i's data seed is ``trial_seed(seed, first_index + i)`` (or ``data_seeds[i]``). With
    ``module_state``, every stack also holds :class:`ModuleState` (for a ``random`` model, trial
    i's generator seeded by ``randomness_seed(seed, first_index + i)``). Trials with a delay
    (:mod:`training.delay`) stack apart from those without, with a :class:`DelayQueue`: an
    undelayed trial takes the same step whatever trials its group holds."""
    names = [name for name, _ in model.named_parameters()]
    base = [p.detach().to(device=device, dtype=dtype) for _, p in model.named_parameters()]
    rows_of = [None if not init_params else init_params[name] for name in names]
    mask_list = [None if name not in masks else masks[name].to(device=device, dtype=dtype)
                 for name in names]
    stacks = []
    kinds = [[i for i, t in enumerate(trials) if not t.delay],
             [i for i, t in enumerate(trials) if t.delay]]
    for ids in (kind[a:a + chunk] for kind in kinds for a in range(0, len(kind), chunk)):
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
        seeds = [trial_seed(seed, first_index + i) if data_seeds is None else data_seeds[i]
                 for i in ids]
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
            seeds=seeds,
            module=ModuleState.initial(
                model, [randomness.randomness_seed(seed, first_index + i) for i in ids], device,
                dtype, random) if module_state else None,
            delay=DelayQueue.start(params, [trials[i] for i in ids], seeds)))
    return stacks
