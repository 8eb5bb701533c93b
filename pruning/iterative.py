"""Pruning in rounds with the exponential schedule, and iterative magnitude pruning (IMP).

Round r = 0 .. R-1 keeps density^((r+1)/R) of the prunable weights (Tanaka et al. 2020's
exponential schedule; the last round hits the requested sparsity exactly). Each round scores the
network with the previous round's mask applied (pruned weights are zero) and never revives a
pruned weight: its score is -inf. One round is the one-shot criterion. With ``revive=True``
(FORCE, de Jorge et al. 2021) every round starts again from the original weights times the
current mask and ranks ALL weights, so a pruned weight can come back.

IMP (Frankle & Carbin 2019, weight rewinding to initialization): each round trains the masked
network from the initial weights with ``train_fn(model, mask) -> trained model``, then keeps the
largest |w| of the trained weights; the next round starts again from the initial weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import torch
from torch import nn

from training.config import RunConfig, Trial
from training.data import Dataset
from training.masks import apply_mask
from training.reference import train_reference

from pruning.errors import PruningError
from pruning.mask import Mask
from pruning.select import top_k_mask

# work model, its prunable parameters, current 0/1 mask -> keep-priority scores
ScoreFn = Callable[[nn.Module, Mapping[str, nn.Parameter], Mapping[str, torch.Tensor]],
                   Mapping[str, torch.Tensor]]
TrainFn = Callable[[nn.Module, Mask], nn.Module]

# Default IMP training run per round (a short heavy-ball run of training.train_reference).
IMP_STEPS = 200
IMP_BATCH = 64
IMP_LR = 0.1
IMP_MOMENTUM = 0.9


def round_sparsities(sparsity: float, rounds: int) -> list[float]:
    """Sparsity after each round: 1 - (1 - sparsity)^((r+1)/rounds); the last is ``sparsity``."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise PruningError(f"rounds must be an integer >= 1, got {rounds!r}")
    density = 1.0 - sparsity
    return [1.0 - density ** ((r + 1) / rounds) for r in range(rounds - 1)] + [sparsity]


def prune_in_rounds(work: nn.Module, params: Mapping[str, nn.Parameter], score_fn: ScoreFn,
                    sparsity: float, rounds: int, scope: str,
                    revive: bool = False) -> dict[str, torch.Tensor]:
    """Run the schedule on ``work`` (modified: pruned weights are zeroed in place) and return the
    final name -> 0/1 mask. ``revive``: rank every weight each round, pruned ones included, on
    the original weights times the current mask (FORCE) instead of excluding pruned weights."""
    original = {k: p.detach().clone() for k, p in params.items()} if revive else None
    current = {k: torch.ones(p.shape) for k, p in params.items()}
    for s in round_sparsities(sparsity, rounds):
        if revive:
            with torch.no_grad():
                for k, p in params.items():
                    p.copy_(original[k])
        apply_mask(params, current)
        scores = {k: v.detach().cpu().to(torch.float64)
                  for k, v in score_fn(work, params, current).items()}
        if not revive:
            scores = {k: torch.where(current[k] > 0, v, torch.tensor(float("-inf"),
                                                                     dtype=torch.float64))
                      for k, v in scores.items()}
        current = top_k_mask(scores, s, scope)
    return current


def default_train_fn(dataset: Dataset, seed: int = 0, steps: int = IMP_STEPS,
                     batch_size: int = IMP_BATCH, lr: float = IMP_LR,
                     momentum: float = IMP_MOMENTUM) -> TrainFn:
    """IMP's default training run: ``training.train_reference`` with heavy-ball momentum
    (defaults: 200 steps, batch 64, lr 0.1, momentum 0.9, data seed ``seed``), masked."""
    trial = Trial(lr=lr, momentum=momentum)
    run = RunConfig(batch_size=min(batch_size, dataset.n_train), optimizer="momentum",
                    max_steps=steps, seed=seed)

    def train(model: nn.Module, mask: Mask) -> nn.Module:
        result = train_reference(model, dataset, trial, run, mask=mask)
        trained = copy.deepcopy(model)
        trained.load_state_dict(result.state, strict=False)
        return trained

    return train


def imp_score_fn(train_fn: TrainFn) -> ScoreFn:
    """IMP round scores: |w| after ``train_fn`` trains a copy of the rewound, masked network."""
    def score(work: nn.Module, params: Mapping[str, nn.Parameter],
              current: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        trained = train_fn(copy.deepcopy(work), Mask(current, {"criterion": "imp-round"}))
        if not isinstance(trained, nn.Module):
            raise PruningError(f"imp train_fn must return the trained nn.Module, "
                            f"got {type(trained).__name__}")
        trained_params = dict(trained.named_parameters())
        missing = [k for k in params if k not in trained_params]
        if missing:
            raise PruningError(f"imp train_fn returned a model without parameters {missing}")
        return {k: trained_params[k].detach().abs() for k in params}

    return score
