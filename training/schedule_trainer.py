"""The plain reference loop with a batch-size schedule, resumable from a :class:`TrainState`.

It is :func:`training.train_reference` (``torch.optim.SGD``, one trial) with two additions: the
mini-batch size and an lr factor follow a piecewise-constant
:class:`training.batch_schedule.BatchSchedule` (e.g. Merrill et al. 2025's batch-size warmup),
read from the data stream of :mod:`training.state`; and the run can start from a saved state and
returns its final one, so branches of a checkpoint continue the base run exactly. With one
constant batch size it takes the same mini-batches and the same steps as ``train_reference``, bit
for bit (tested in float64), so once the trainer refactor lands ``train_reference`` can become this
loop with ``BatchSchedule.constant(batch_size)`` and the update loop they both hold lives here alone.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .batch_schedule import BatchSchedule
from .data import Dataset
from .goal import Goal, as_goal, goal_metric, is_diverged, loss_fn
from .order import trial_seed
from .reference import evaluate, make_sgd, zero_masked
from .results import Curve, ReferenceResult
from .schedules import ConfigError, EvalSchedule, Trial, check_optimizer, lr_factor
from .state import DataPosition, DataStream, TrainState


@dataclass(frozen=True)
class ScheduleResult:
    """``result``: as :func:`training.train_reference`'s (steps count from 0, not from the start
    state); ``state``: where the run stopped, to resume or branch from; ``examples``: training
    examples consumed by this call."""

    result: ReferenceResult
    state: TrainState
    examples: int


def train_schedule_reference(model: nn.Module, dataset: Dataset, schedule: BatchSchedule, lr: float,
                             momentum: float = 0.0, optimizer: str = "momentum", steps: int = 500,
                             seed: int = 0, trial_index: int = 0, decay_steps: int | None = None,
                             end_factor: float = 1.0, target: Goal | float | None = None,
                             eval_schedule: EvalSchedule | None = None, stop_at_goal: bool = True,
                             mask: Mapping[str, torch.Tensor] | None = None, start: TrainState | None = None,
                             dtype: torch.dtype = torch.float32, device: str = "cpu") -> ScheduleResult:
    """Train a copy of ``model`` until update ``steps`` (counted from the run's beginning).

    Update t uses ``schedule.at(t).batch_size`` examples from the data stream of
    ``trial_seed(seed, trial_index)`` and learning rate ``lr * lr_factor(t, decay_steps,
    end_factor) * schedule.at(t).lr_scale``. From ``start`` (one trial), the weights, momentum
    buffers, step, data position and divergence reference are the state's, and evaluations
    resume after ``start.step`` (the saving run recorded the earlier ones). Masks, evaluations,
    stopping and divergence as in :func:`training.train_reference`.
    """
    if not isinstance(schedule, BatchSchedule):
        raise ConfigError(f"schedule must be a BatchSchedule, got {type(schedule).__name__}")
    trial = Trial(lr=lr, momentum=momentum, decay_steps=decay_steps, end_factor=end_factor)
    check_optimizer(optimizer, [trial.momentum])
    goal = as_goal(target, dataset.task)
    metric = goal_metric(goal, dataset.task)
    data = dataset.to(device, dtype)
    net = copy.deepcopy(model).to(device=device, dtype=dtype).train()
    stream = DataStream(trial_seed(seed, trial_index), data.n_train)
    criterion = loss_fn(dataset.task)
    if start is not None:
        _load(net, start)
    masks, params = zero_masked(net, mask, device, dtype)
    opt = make_sgd(net.parameters(), optimizer, trial.lr, trial.momentum)
    if start is not None:
        for name, buf in start.buffers.items():
            opt.state[params[name]]["momentum_buffer"] = buf[0].to(device=device, dtype=dtype).clone()
    step = 0 if start is None else start.step
    if steps < step:
        raise ConfigError(f"steps ({steps}) must be >= the start state's step ({step})")
    position = DataPosition() if start is None else start.position
    if start is None:
        with torch.no_grad():
            idx, _ = stream.batch(position, schedule.at(0).batch_size)
            initial_loss = float(criterion(net(data.x_train[idx]), data.y_train[idx]))
        losses: list[float] = [initial_loss]
    else:
        initial_loss, losses = start.initial_loss[0], []
    evals = {s for s in (eval_schedule or EvalSchedule()).steps(steps) if start is None or s > step}

    rows: list[tuple[int, float, float]] = []
    hit = diverged_step = None
    examples = 0

    def record(k: int) -> bool:
        value = evaluate(net, data.x_val, data.y_val, metric, dataset.task)
        rows.append((k, float(np.mean(losses)), value))
        losses.clear()
        return bool(goal is not None and goal.met(value))

    if step in evals and record(step):
        hit = step
    while step < steps and not (hit is not None and stop_at_goal):
        segment = schedule.at(step)
        idx, after = stream.batch(position, segment.batch_size)
        for group in opt.param_groups:
            group["lr"] = trial.lr * lr_factor(step, trial.decay_steps, trial.end_factor) * segment.lr_scale
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
        step, position, examples = step + 1, after, examples + len(idx)
        losses.append(value)
        if step in evals and record(step) and hit is None:
            hit = step

    weights = {k: v.detach().clone() for k, v in net.named_parameters()}
    buffers = {k: opt.state[p]["momentum_buffer"].detach().clone()[None]
               for k, p in params.items() if opt.state[p].get("momentum_buffer") is not None}
    result = ReferenceResult(steps_to_result=hit, diverged=diverged_step is not None, diverged_step=diverged_step,
                             steps_run=step, curve=Curve.from_rows(rows), state=weights)
    state = TrainState({k: v[None] for k, v in weights.items()}, buffers, step, position, (initial_loss,))
    return ScheduleResult(result=result, state=state, examples=examples)


@torch.no_grad()
def _load(net: nn.Module, start: TrainState) -> None:
    """Copy the single trial of ``start`` into ``net``'s parameters."""
    if start.n_trials != 1:
        raise ConfigError(f"the reference loop resumes one trial; start has {start.n_trials} (use start.trial(i))")
    start.check_model(net)
    for name, p in net.named_parameters():
        p.copy_(start.params[name][0])
