"""The plain reference trainer: one trial, ``torch.optim`` (SGD, Adam, AdamW), nothing clever.

It is the ground truth the vectorized trainer is tested against, so it stays a textbook loop:
index a mini-batch, forward, backward, (mask the gradient), ``optimizer.step()``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn

from .data import Dataset
from .goal import Goal, as_goal, goal_metric, is_diverged, loss_fn, metric_value
from .order import BatchOrder, trial_seed
from .results import Curve, ReferenceResult
from .schedules import (ADAM_OPTIMIZERS, ConfigError, EvalSchedule, Trial, check_optimizer,
                        lr_factor)


def make_sgd(params: Iterable[nn.Parameter], optimizer: str, lr: float, momentum: float
             ) -> torch.optim.SGD:
    """``torch.optim.SGD`` for ``sgd`` / ``momentum`` (heavy ball) / ``nesterov``, dampening 0:
    momentum: a = mu a + g, w -= lr a; Nesterov: a = mu a + g, w -= lr (g + mu a)."""
    check_optimizer(optimizer)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=optimizer == "nesterov")


def make_optimizer(params: Iterable[nn.Parameter], optimizer: str, trial: Trial
                   ) -> torch.optim.Optimizer:
    """The ``torch.optim`` optimizer of ``trial``: :func:`make_sgd` for the SGD family, else
    ``torch.optim.Adam`` (L2 weight decay) or ``AdamW`` (decoupled) with the trial's lr,
    (beta1, beta2), eps and weight_decay."""
    if optimizer not in ADAM_OPTIMIZERS:
        return make_sgd(params, optimizer, trial.lr, trial.momentum)
    cls = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=trial.lr, betas=(trial.beta1, trial.beta2), eps=trial.eps,
               weight_decay=trial.weight_decay)


def check_mask(model: nn.Module, mask: Mapping[str, torch.Tensor] | None,
               trials: int | None = None) -> dict[str, torch.Tensor]:
    """Validate a name -> 0/1 tensor mapping against ``model``'s parameters: every entry is
    shaped like its parameter or, when ``trials`` is given, ``[trials, *shape]`` (one mask per
    trial)."""
    if mask is None:
        return {}
    if not isinstance(mask, Mapping):
        raise ConfigError(f"masks must be a mapping name -> 0/1 tensor, got {type(mask).__name__}")
    params = dict(model.named_parameters())
    out = {}
    for name, m in mask.items():
        if name not in params:
            raise ConfigError(f"mask entry {name!r} is not a parameter of the model; "
                              f"parameters: {', '.join(params)}")
        m = torch.as_tensor(m)
        shape = tuple(params[name].shape)
        allowed = [shape] if trials is None else [shape, (trials, *shape)]
        if tuple(m.shape) not in allowed:
            per_trial = "" if trials is None else f" (shared) or {allowed[1]} (one per trial)"
            raise ConfigError(f"mask entry {name!r} has shape {tuple(m.shape)}; allowed: "
                              f"{shape}{per_trial}")
        if not bool(((m == 0) | (m == 1)).all()):
            raise ConfigError(f"mask entry {name!r} must contain only 0 and 1")
        out[name] = m
    return out


@torch.no_grad()
def zero_masked(net: nn.Module, mask: Mapping[str, torch.Tensor] | None,
                device: str | torch.device, dtype: torch.dtype
                ) -> tuple[dict[str, torch.Tensor], dict[str, nn.Parameter]]:
    """Check ``mask`` against ``net`` (:func:`check_mask`) and zero its masked weights in place.
    Returns the masks on ``device`` / ``dtype`` and ``net``'s parameters by name: a training loop
    masks every step's gradient with them."""
    masks = {k: v.to(device=device, dtype=dtype) for k, v in check_mask(net, mask).items()}
    params = dict(net.named_parameters())
    for name, m in masks.items():
        params[name].mul_(m)
    return masks, params


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


def train_reference(model: nn.Module, dataset: Dataset, batch_size: int, lr: float,
                    momentum: float = 0.0, optimizer: str = "momentum", steps: int = 500,
                    seed: int = 0, trial_index: int = 0, decay_steps: int | None = None,
                    end_factor: float = 1.0, target: Goal | float | None = None,
                    eval_schedule: EvalSchedule | None = None, stop_at_goal: bool = True,
                    mask: Mapping[str, torch.Tensor] | None = None,
                    dtype: torch.dtype = torch.float32, device: str = "cpu",
                    beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                    weight_decay: float = 0.0) -> ReferenceResult:
    """Train a copy of ``model`` for up to ``steps`` updates with ``torch.optim.SGD`` (optimizers
    ``sgd``, ``momentum``, ``nesterov``) or ``torch.optim.Adam`` / ``AdamW`` (``adam``,
    ``adamw``: ``beta1``, ``beta2``, ``eps``, ``weight_decay``; :func:`make_optimizer`).

    Mini-batches follow :class:`training.order.BatchOrder` with data seed
    ``trial_seed(seed, trial_index)``, exactly as trial ``trial_index`` of
    ``train_trials(..., seed=seed)``. The learning rate at update t is
    ``lr * lr_factor(t, decay_steps, end_factor)``. Masked weights are zeroed at the start and
    their gradients zeroed before every step, so weights and momentum (Adam: moment) buffers
    stay exactly zero.
    The goal is evaluated on the validation split at ``eval_schedule`` steps; with
    ``stop_at_goal`` the run ends at the first evaluation that meets it. A non-finite or exploding
    mini-batch loss (``training.goal.is_diverged``) ends the run and flags it diverged.
    """
    trial = Trial(lr=lr, momentum=momentum, decay_steps=decay_steps, end_factor=end_factor,
                  beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    check_optimizer(optimizer, [trial.momentum], [trial.weight_decay])
    if steps < 0:
        raise ConfigError(f"steps must be >= 0, got {steps}")
    goal = as_goal(target, dataset.task)
    metric = goal_metric(goal, dataset.task)
    data = dataset.to(device, dtype)
    net = copy.deepcopy(model).to(device=device, dtype=dtype).train()
    masks, params = zero_masked(net, mask, device, dtype)
    opt = make_optimizer(net.parameters(), optimizer, trial)
    order = BatchOrder(trial_seed(seed, trial_index), data.n_train, batch_size)
    criterion = loss_fn(dataset.task)
    evals = set((eval_schedule or EvalSchedule()).steps(steps))

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
    while step < steps and not (hit is not None and stop_at_goal):
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
        for name, m in masks.items():
            params[name].grad.mul_(m)
        opt.step()
        step += 1
        losses.append(value)
        if step in evals and record(step) and hit is None:
            hit = step

    return ReferenceResult(
        steps_to_result=hit, diverged=diverged_step is not None, diverged_step=diverged_step,
        steps_run=step, curve=Curve.from_rows(rows),
        state={k: v.detach().clone() for k, v in net.named_parameters()})
