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
reference runs the probes took before, 1.06 -> 0.75 ms of CPU a step. A plain ReLU MLP (the
quickstart's) also gets its backward pass written out, the aten operations autograd runs on the
same operands (:func:`_mlp_replay`), and the update as three ``torch._foreach_*`` calls: still
bit for bit, 0.68 -> 0.33 ms a step (docs/benchmarks/log.md#probe-mlp-passes). Adam-type runs,
and runs on another device than the CPU, go through the reference loop itself (its
``snapshots``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from training import randomness
from training.config import (
    ADAM_OPTIMIZERS, EvalSchedule, RunConfig, Trial, check_batch_size, check_optimizer, check_run,
)
from training.data import Dataset
from training.delay import refuse
from training.device import autocast, precision as arithmetic
from training.errors import ConfigError
from training.goal import classification_loss, is_diverged, loss_fn
from training.schedules.lr_schedule import lr_factor
from training.masks import apply_mask, mask_
from training.models import check_output, plain_relu_mlp
from training.schedules.order import trial_seed
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
    refuse([Trial.from_dict(trial)], "replay_snapshots (the probes' replay)",
           "it replays the synchronous reference loop")
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
    layers = _plain_mlp(net, criterion, run, data.x_train)
    if layers is not None:
        names = {id(p): name for name, p in params.items()}
        return _mlp_replay(layers, data, stream, position, batch_size, trial, wanted[-1],
                           initial_loss, [masks.get(names[id(p)]) for m in layers
                                          for p in (m.weight, m.bias)],
                           momentum, nesterov, snapshot, saved)
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


def _plain_mlp(net: nn.Module, criterion: object, run: RunConfig, x: torch.Tensor
               ) -> list[nn.Linear] | None:
    """``training.models.plain_relu_mlp(net)`` when it is trained on 2-d inputs with the
    cross-entropy of ``training.goal.classification_loss`` without autocast; else None."""
    if criterion is not classification_loss or run.precision == "bf16" or x.dim() != 2:
        return None
    return plain_relu_mlp(net)


def _mlp_replay(layers: list[nn.Linear], data: Dataset, stream: DataStream,
                position: DataPosition, batch_size: int, trial: Trial, last: int,
                initial_loss: float, masks: list[torch.Tensor | None],
                momentum: float, nesterov: bool, snapshot: Callable[[int], None],
                saved: dict[int, dict[str, torch.Tensor]]
                ) -> tuple[dict[int, dict[str, torch.Tensor]], int | None]:
    """The loop of :func:`_sgd_replay` for a plain ReLU MLP (:func:`_plain_mlp`) with the
    backward pass written out: the aten operations autograd runs for ``F.linear`` (``addmm``),
    ``relu`` and ``cross_entropy`` (``log_softmax`` + ``nll_loss``), on the same operands in
    the same layouts (derivatives.yaml's ``mm_mat1_backward`` / ``mm_mat2_backward`` for a
    row-major input and a transposed weight), so every gradient, and every weight, is bit for
    bit the autograd loop's (tested). Why: at B = 8 a step of the quickstart's MLP is 0.66
    MFLOP, and autograd's engine, gradient accumulation and ``torch.optim``'s per-parameter
    Python were most of its 0.7 ms; here the update is three ``torch._foreach_*`` calls, which
    on the CPU run the same per-tensor kernels as ``torch.optim.SGD``'s single-tensor path."""
    weights = [m.weight for m in layers]
    biases = [m.bias for m in layers]
    params = [t for m in layers for t in (m.weight, m.bias)]   # named_parameters() order
    buffers: list[torch.Tensor] = []
    x_all, y_all = data.x_train, data.y_train
    mean = 1   # at::Reduction::Mean
    # mul_ by a Python float casts it to the tensor's dtype on every call (a third of the
    # update's time); a 0-dim tensor of that dtype holds the same factor once
    mu = torch.tensor(momentum, dtype=weights[0].dtype)
    one = None
    with torch.no_grad():
        for step in range(last):
            idx, position = stream.batch(position, batch_size)
            lr = trial.lr * lr_factor(step, trial.decay_steps, trial.end_factor) * 1.0
            acts = [x_all[idx]]
            for k, (w, b) in enumerate(zip(weights, biases)):
                z = torch.addmm(b, acts[-1], w.t())
                acts.append(z if k == len(weights) - 1 else torch.relu(z))
            y = y_all[idx]
            logp = torch._log_softmax(acts[-1], 1, False)
            loss, total = torch.ops.aten.nll_loss_forward(logp, y, None, mean, -100)
            if is_diverged(float(loss), initial_loss):
                return saved, step
            one = torch.ones_like(loss) if one is None else one
            grad = torch.ops.aten.nll_loss_backward(one, logp, y, None, mean,
                                                    -100, total)
            grad = torch._log_softmax_backward_data(grad, logp, 1, logp.dtype)
            grads: list[torch.Tensor] = []
            for k in range(len(weights) - 1, -1, -1):
                grads[:0] = [torch.mm(grad.t(), acts[k]), grad.sum(0)]
                if k > 0:
                    grad = torch.ops.aten.threshold_backward(torch.mm(grad, weights[k]),
                                                             acts[k], 0)
            mask_(grads, masks)
            if momentum != 0:
                if not buffers:
                    buffers = [g.clone() for g in grads]
                else:
                    torch._foreach_mul_(buffers, mu)
                    torch._foreach_add_(buffers, grads)
                grads = torch._foreach_add(grads, buffers, alpha=momentum) if nesterov else buffers
            torch._foreach_add_(params, grads, alpha=-lr)
            snapshot(step + 1)
    return saved, None

