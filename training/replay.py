"""Replay one trial of a run and keep its weights at given steps: the probes' replay.

:func:`replay_snapshots` returns the parameters and module buffers of trial ``trial_index`` of
a run after each of the given update counts, bit for bit those of
:func:`training.reference.train_schedule_reference` stopped there (tested against it). For the
SGD family (``sgd``, ``momentum``, ``nesterov``) on the CPU at one constant batch size it runs a lean copy
of that loop: the same data stream, learning rates, mask, train-mode forward and backward,
dropout generator and divergence test, with ``torch.optim.SGD``'s own arithmetic written out
(its single-tensor path, the one it takes on the CPU: ``buf = mu buf + g`` (``buf = g`` at the
first update), ``g = g + mu buf`` for Nesterov, ``w -= lr g``, dampening 0) instead of the
optimizer object, and no evaluations. What it saves is the optimizer's per-step machinery
(parameter groups, profiler records, state look-ups, gradient zeroing through the optimizer):
on the quickstart's dense MLP at B = 8 (one thread, loaded 2-core VM), against the ~30 resumed
reference runs the probes took before, 1.06 -> 0.75 ms of CPU a step. Adam-type runs, and runs
on another device than the CPU, go through the reference loop itself (its ``snapshots``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from training import randomness
from training.config import (
    ADAM_OPTIMIZERS, EvalSchedule, RunConfig, Trial, check_batch_size, check_optimizer, check_run,
)
from training.data import Dataset
from training.device import autocast, precision as arithmetic
from training.errors import ConfigError
from training.goal import is_diverged, loss_fn
from training.lr_schedule import lr_factor
from training.masks import apply_mask, mask_
from training.models import check_output
from training.order import trial_seed
from training.randomness import randomness_seed
from training.reference import train_schedule_reference
from training.state import DataPosition, DataStream


def replay_snapshots(model: nn.Module, dataset: Dataset, trial: Trial | Mapping[str, Any],
                     run: RunConfig, steps: Collection[int],
                     mask: Mapping[str, torch.Tensor] | None = None, trial_index: int = 0
                     ) -> tuple[dict[int, dict[str, torch.Tensor]], int | None]:
    """Parameters and module buffers by name after each of ``steps`` updates (sorted by step)
    of trial ``trial_index`` of the run ``trial``, ``run`` describe at ``run.batch_size`` from
    ``model``'s weights (``run.max_steps``, goal and stopping ignored): one run to the last step
    (module docstring), and the step at which the run diverged (a non-finite or exploding
    mini-batch loss, ``training.goal.is_diverged``; None when it did not): the snapshots of the
    steps after it are missing."""
    check_output(model, dataset, "replay_snapshots")
    check_run(run, "replay_snapshots")
    wanted = sorted({int(s) for s in steps})
    if not wanted or wanted[0] < 0:
        raise ConfigError(f"steps must be a non-empty collection of update counts >= 0, "
                          f"got {wanted}")
    run = replace(run, max_steps=wanted[-1], goal=None, stop="never",
                  eval_schedule=EvalSchedule(every=max(wanted[-1], 1)))
    # torch.optim.SGD takes its single-tensor path on the CPU only (foreach kernels on a GPU)
    if run.optimizer in ADAM_OPTIMIZERS or torch.device(run.device).type != "cpu":
        res = train_schedule_reference(model, dataset, trial, run, mask=mask,
                                       trial_index=trial_index, snapshots=wanted)
        saved, diverged = res.snapshots, res.result.diverged_step
    else:
        random = randomness.draws(model, dataset.x_train[:2])
        with (randomness.preserved(run.device) if random else contextlib.nullcontext(),
              arithmetic(run.precision, run.device)):
            saved, diverged = _sgd_replay(model, dataset, Trial.from_dict(trial), run, wanted,
                                          mask, trial_index, random)
    return {t: saved[t] for t in wanted if t in saved}, diverged


def _sgd_replay(model: nn.Module, dataset: Dataset, trial: Trial, run: RunConfig,
                wanted: list[int], mask: Mapping[str, torch.Tensor] | None, trial_index: int,
                random: bool) -> tuple[dict[int, dict[str, torch.Tensor]], int | None]:
    """The SGD-family loop of ``train_schedule_reference`` from step 0 at one batch size, line
    for line, with ``torch.optim.SGD.step`` written out; (snapshots, diverged step or None)."""
    check_optimizer(run.optimizer, [trial.momentum], [trial.weight_decay])
    batch_size = check_batch_size(run.batch_size, dataset.n_train)
    data = dataset.to(run.device, run.dtype)
    net = copy.deepcopy(model).to(device=run.device, dtype=run.dtype).train()
    masks = apply_mask(net, mask)
    params = dict(net.named_parameters())
    momentum = 0.0 if run.optimizer == "sgd" else trial.momentum
    nesterov = run.optimizer == "nesterov"
    buffers: dict[str, torch.Tensor] = {}
    stream = DataStream(trial_seed(run.seed, trial_index), data.n_train)
    criterion = loss_fn(dataset.task, dataset.loss)
    position = DataPosition()
    if random:
        randomness.set_state(randomness.seeded_state(randomness_seed(run.seed, trial_index),
                                                     run.device), run.device)
    with torch.no_grad():
        idx, _ = stream.batch(position, batch_size)
        net.eval()  # draws nothing, leaves the running statistics alone
        with autocast(run.precision, run.device):
            initial_loss = float(criterion(net(data.x_train[idx]), data.y_train[idx]))
        net.train()
    saved: dict[int, dict[str, torch.Tensor]] = {}
    kept = set(wanted)

    def snapshot(step: int) -> None:
        if step in kept:
            saved[step] = {k: v.detach().clone() for k, v in (*net.named_parameters(),
                                                               *net.named_buffers())}

    snapshot(0)
    for step in range(wanted[-1]):
        idx, position = stream.batch(position, batch_size)
        # the reference's product, times the constant schedule's lr scale (1)
        lr = trial.lr * lr_factor(step, trial.decay_steps, trial.end_factor) * 1.0
        for p in params.values():   # zero_grad(set_to_none=False)
            if p.grad is not None:
                p.grad.zero_()
        with autocast(run.precision, run.device):
            loss = criterion(net(data.x_train[idx]), data.y_train[idx])
        if is_diverged(float(loss.detach()), initial_loss):
            return saved, step
        loss.backward()
        mask_([params[name].grad for name in masks], list(masks.values()))
        with torch.no_grad():   # torch.optim.SGD's _single_tensor_sgd, weight decay 0
            for name, p in params.items():
                grad = p.grad
                if momentum != 0:
                    buf = buffers.get(name)
                    if buf is None:
                        buf = buffers[name] = grad.detach().clone()
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1)
                    grad = grad.add(buf, alpha=momentum) if nesterov else buf
                p.add_(grad, alpha=-lr)
        snapshot(step + 1)
    return saved, None
