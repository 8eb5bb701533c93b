"""The plain reference trainer: one trial, ``torch.optim.SGD``, nothing clever.

It is the ground truth the vectorized trainer is tested against, so it stays a textbook loop:
index a mini-batch, forward, backward, (mask the gradient), ``optimizer.step()``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from . import legacy
from .config import RunConfig, Trial, check_batch_size, check_index, check_optimizer
from .data import Dataset
from .goal import as_goal, goal_metric, is_diverged, loss_fn, metric_value
from .masks import apply_mask, mask_
from .order import BatchOrder, trial_seed
from .results import Curve, ReferenceResult
from .schedules import lr_factor


def make_sgd(params: Iterable[nn.Parameter], optimizer: str, lr: float, momentum: float
             ) -> torch.optim.SGD:
    """``torch.optim.SGD`` for ``sgd`` / ``momentum`` (heavy ball) / ``nesterov``, dampening 0:
    momentum: a = mu a + g, w -= lr a; Nesterov: a = mu a + g, w -= lr (g + mu a)."""
    check_optimizer(optimizer)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=optimizer == "nesterov")


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, metric: str, task: str,
             chunk: int = 4096) -> float:
    """Goal metric of ``model`` on (x, y), computed in chunks (mean over all examples)."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, x.shape[0], chunk):
        out = model(x[i:i + chunk])
        total += float(metric_value(metric, out, y[i:i + chunk], task)) * out.shape[0]
    model.train(was_training)
    return total / x.shape[0]


@legacy.accepts_old_form(legacy.reference_args, "train_reference(model, dataset, trial, run)")
def train_reference(model: nn.Module, dataset: Dataset, trial: Trial | Mapping[str, Any],
                    run: RunConfig, *, mask: Mapping[str, torch.Tensor] | None = None,
                    trial_index: int = 0) -> ReferenceResult:
    """Train a copy of ``model`` for up to ``run.max_steps`` updates with ``torch.optim.SGD``.

    Mini-batches follow :class:`training.order.BatchOrder` with data seed
    ``trial_seed(run.seed, trial_index)``, exactly as trial ``trial_index`` of
    ``train_trials(..., run)``. The learning rate at update t is
    ``trial.lr * lr_factor(t, trial.decay_steps, trial.end_factor)``. Masked weights are zeroed
    at the start and their gradients before every step (:mod:`training.masks`), so weights and
    momentum buffers stay exactly zero. The goal is evaluated on the validation split at
    ``run.eval_schedule`` steps; the run ends at the first evaluation that meets it unless
    ``run.stop == "never"`` (one trial: ``"first"`` and ``"all"`` agree). A non-finite or
    exploding mini-batch loss (``training.goal.is_diverged``) ends the run and flags it diverged.
    The keyword form of earlier releases is accepted with a DeprecationWarning
    (:mod:`training.legacy`).
    """
    trial = Trial.from_dict(trial)
    check_optimizer(run.optimizer, [trial.momentum])
    batch_size = check_batch_size(run.batch_size, dataset.n_train)
    check_index(trial_index, "trial_index")
    goal = as_goal(run.goal, dataset.task)
    metric = goal_metric(goal, dataset.task)
    data = dataset.to(run.device, run.dtype)
    net = copy.deepcopy(model).to(device=run.device, dtype=run.dtype).train()
    masks = apply_mask(net, mask)
    params = dict(net.named_parameters())
    opt = make_sgd(net.parameters(), run.optimizer, trial.lr, trial.momentum)
    order = BatchOrder(trial_seed(run.seed, trial_index), data.n_train, batch_size)
    criterion = loss_fn(dataset.task)
    evals = set(run.eval_schedule.steps(run.max_steps))
    stop_at_goal = run.stop != "never"

    # This loop and training.distributed.train_rank mirror each other line for line on purpose:
    # each stays a readable textbook loop (the ground truth, and its data-parallel twin) instead
    # of sharing a callback-driven skeleton that neither reader could check at a glance.
    rows: list[tuple[int, float, float]] = []
    with torch.no_grad():
        idx = order.batch(0)
        initial_loss = float(criterion(net(data.x_train[idx]), data.y_train[idx]))
    losses: list[float] = [initial_loss]
    hit = diverged_step = None
    step = 0

    def record(k: int) -> bool:
        value = evaluate(net, data.x_val, data.y_val, metric, dataset.task)
        rows.append((k, float(np.mean(losses)), value))
        losses.clear()
        return bool(goal is not None and goal.met(value))

    if 0 in evals and record(0):
        hit = 0
    while step < run.max_steps and not (hit is not None and stop_at_goal):
        idx = order.batch(step)
        for group in opt.param_groups:
            group["lr"] = trial.lr * lr_factor(step, trial.decay_steps, trial.end_factor)
        opt.zero_grad(set_to_none=False)
        loss = criterion(net(data.x_train[idx]), data.y_train[idx])
        value = float(loss.detach())
        if is_diverged(value, initial_loss):
            diverged_step = step
            break
        loss.backward()
        mask_([params[name].grad for name in masks], list(masks.values()))
        opt.step()
        step += 1
        losses.append(value)
        if step in evals and record(step) and hit is None:
            hit = step

    return ReferenceResult(
        steps_to_result=hit, diverged=diverged_step is not None, diverged_step=diverged_step,
        steps_run=step, curve=Curve.from_rows(rows),
        state={k: v.detach().clone() for k, v in net.named_parameters()})
