"""The plain reference trainer: one trial, ``torch.optim`` (SGD, Adam, AdamW), nothing clever.

It is the ground truth the vectorized trainer is tested against, so it stays a textbook loop:
index a mini-batch, forward, backward, (mask the gradient), ``optimizer.step()``. One loop,
:func:`train_schedule_reference`, serves two entry points:

- :func:`train_reference`: one constant batch size (``run.batch_size``), from the model's weights;
- :func:`train_schedule_reference`: the mini-batch size and an lr factor follow a
  piecewise-constant :class:`training.schedules.batch_schedule.BatchSchedule` (e.g. Merrill et al. 2025's
  batch-size warmup), and the run can start from a :class:`training.state.TrainState` and returns
  its final one, so branches of a checkpoint continue the base run exactly.

Mini-batches come from :class:`training.state.DataStream`, which for one constant batch size
takes exactly :class:`training.schedules.order.BatchOrder`'s batches (the batches of ``train_trials`` and
``train_distributed``).

``run.precision`` (:mod:`training.device`): the forward passes and losses run under
``training.device.autocast`` (bfloat16 for ``bf16``), the backward pass and ``optimizer.step()``
outside it, on float32 parameters, gradients and optimizer state: torch's own recipe.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from training.schedules.batch_schedule import BatchSchedule
from training.config import (
    ADAM_OPTIMIZERS, RunConfig, Trial, check_batch_size, check_index, check_optimizer, check_run,
)
from training.delay import refuse
from training.data import Dataset
from training.models import check_output
from training.errors import ConfigError
from training.goal import as_goal, goal_metric, is_diverged, loss_fn, metric_value
from training.masks import apply_mask, mask_
from training import randomness
from training.device import autocast, precision as arithmetic
from training.schedules.order import trial_seed
from training.randomness import randomness_seed
from training.results import Curve, ReferenceResult, ScheduleResult
from training.schedules.lr_schedule import lr_factor
from training.state import DataPosition, DataStream, TrainState


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


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, metric: str, task: str,
             chunk: int = 4096, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
             precision: str = "fp32") -> float:
    """Goal metric of ``model`` on (x, y), computed in chunks (mean over all examples);
    ``loss``: the data set's own per-example loss, if it has one; ``precision``: that of the
    forward pass (the metric itself is computed in float32 or the model's dtype)."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, x.shape[0], chunk):
        with autocast(precision, x.device):
            out = model(x[i:i + chunk])
        out = out.float() if out.dtype in (torch.bfloat16, torch.float16) else out
        total += float(metric_value(metric, out, y[i:i + chunk], task, loss)) * out.shape[0]
    model.train(was_training)
    return total / x.shape[0]


def train_reference(model: nn.Module, dataset: Dataset, trial: Trial | Mapping[str, Any],
                    run: RunConfig, *, mask: Mapping[str, torch.Tensor] | None = None,
                    trial_index: int = 0) -> ReferenceResult:
    """Train a copy of ``model`` for up to ``run.max_steps`` updates with ``torch.optim.SGD``
    (optimizers ``sgd``, ``momentum``, ``nesterov``) or ``torch.optim.Adam`` / ``AdamW``
    (``adam``, ``adamw``: the trial's beta1, beta2, eps and weight_decay; :func:`make_optimizer`).

    Mini-batches follow :class:`training.schedules.order.BatchOrder` with data seed
    ``trial_seed(run.seed, trial_index)``, exactly as trial ``trial_index`` of
    ``train_trials(..., run)``. The learning rate at update t is
    ``trial.lr * lr_factor(t, trial.decay_steps, trial.end_factor)``. Masked weights are zeroed
    at the start and their gradients before every step (:mod:`training.masks`), so weights and
    momentum (Adam: moment) buffers stay exactly zero. The goal is evaluated on the validation split at
    ``run.eval_schedule`` steps; the run ends at the first evaluation that meets it unless
    ``run.stop == "never"`` (one trial: ``"first"`` and ``"all"`` agree). A non-finite or
    exploding mini-batch loss (``training.goal.is_diverged``) ends the run and flags it diverged.
    It is :func:`train_schedule_reference` with the constant schedule
    ``run.batch_size``, from the model's weights.
    """
    check_run(run, "train_reference")
    check_output(model, dataset, "train_reference")
    return train_schedule_reference(model, dataset, trial, run, mask=mask,
                                    trial_index=trial_index).result


def train_schedule_reference(model: nn.Module, dataset: Dataset, trial: Trial | Mapping[str, Any],
                             run: RunConfig, *, schedule: BatchSchedule | None = None,
                             mask: Mapping[str, torch.Tensor] | None = None,
                             start: TrainState | None = None, trial_index: int = 0,
                             snapshots: Collection[int] = ()
                             ) -> ScheduleResult:
    """:func:`train_reference` following a batch-size ``schedule``, optionally from ``start``.

    Update t uses ``schedule.at(t).batch_size`` examples of the data stream of
    ``trial_seed(run.seed, trial_index)`` and learning rate
    ``trial.lr * lr_factor(t, trial.decay_steps, trial.end_factor) * schedule.at(t).lr_scale``;
    the schedule's batch sizes take the place of ``run.batch_size``, which is the batch size only
    when ``schedule`` is None (``BatchSchedule.constant(run.batch_size)``). ``run.max_steps``
    counts updates from the run's beginning, not from ``start``. From ``start`` (one trial:
    ``state.trial(i)``), the weights, optimizer buffers, step, data position and divergence
    reference are the state's, and evaluations resume after ``start.step`` (the saving run
    recorded the earlier ones). Masks, evaluations, stopping and divergence as in
    :func:`train_reference`. The result's ``examples`` are the training examples this call used.
    For ``adam`` / ``adamw`` the state's ``buffers`` and ``moments`` are Adam's m and v and its
    ``step`` Adam's step count; a state resumes only a run of its own optimizer family.

    Modules with batch statistics or random draws: the steps run in train mode (BatchNorm
    normalizes with the batch's statistics and updates its running ones; Dropout draws from the
    generator seeded ``randomness_seed(run.seed, trial_index)``, :mod:`training.randomness`, or
    the start state's), the evaluations and the first mini-batch loss (the divergence reference)
    in eval mode. The result carries the final buffers; the caller's generator state is left as
    it was.

    ``snapshots``: update counts (in [the start step, ``run.max_steps``]) after which the
    parameters and module buffers are copied into the result's ``snapshots``; one run snapshots
    a whole trajectory (the probes' replay) bit for bit as runs stopped and resumed at each
    of those steps would, without their setup and evaluations.
    """
    check_output(model, dataset, "train_schedule_reference")
    check_run(run, "train_schedule_reference")
    random = randomness.draws(model, dataset.x_train[:2])
    with (randomness.preserved(run.device) if random else contextlib.nullcontext(),
          arithmetic(run.precision, run.device)):
        return _train_schedule_reference(model, dataset, trial, run, schedule, mask, start,
                                         trial_index, random, snapshots)


def _train_schedule_reference(model: nn.Module, dataset: Dataset,
                              trial: Trial | Mapping[str, Any], run: RunConfig,
                              schedule: BatchSchedule | None,
                              mask: Mapping[str, torch.Tensor] | None, start: TrainState | None,
                              trial_index: int, random: bool,
                              snapshots: Collection[int] = ()) -> ScheduleResult:
    trial = Trial.from_dict(trial)
    refuse([trial], "the plain reference loop",
           "it is the synchronous torch.optim loop the vectorized trainer is tested against")
    check_optimizer(run.optimizer, [trial.momentum], [trial.weight_decay])
    if schedule is None:
        schedule = BatchSchedule.constant(check_batch_size(run.batch_size, dataset.n_train))
    elif not isinstance(schedule, BatchSchedule):
        raise ConfigError(f"schedule must be a training.schedules.batch_schedule.BatchSchedule or None, "
                          f"got {type(schedule).__name__}")
    else:
        for segment in schedule.segments:
            check_batch_size(segment.batch_size, dataset.n_train)
    check_index(trial_index, "trial_index")
    if start is not None and not isinstance(start, TrainState):
        raise ConfigError(f"start must be a training.state.TrainState or None, "
                          f"got {type(start).__name__}")
    step = 0 if start is None else start.step
    if run.max_steps < step:
        raise ConfigError(f"max_steps ({run.max_steps}) must be >= the start state's step ({step})")
    wanted = {int(s) for s in snapshots}
    if any(not step <= s <= run.max_steps for s in wanted):
        raise ConfigError(f"snapshots must be update counts in [{step}, {run.max_steps}] (the start "
                          f"step to max_steps), got {sorted(wanted)}")
    goal = as_goal(run.goal, dataset.task)
    metric = goal_metric(goal, dataset.task)
    data = dataset.to(run.device, run.dtype)
    net = copy.deepcopy(model).to(device=run.device, dtype=run.dtype).train()
    if start is not None:
        _load(net, start)
    masks = apply_mask(net, mask)
    params = dict(net.named_parameters())
    opt = make_optimizer(net.parameters(), run.optimizer, trial)
    if start is not None:
        _resume_optimizer(opt, params, start, run)
    stream = DataStream(trial_seed(run.seed, trial_index), data.n_train)
    criterion = loss_fn(dataset.task, dataset.loss)
    evals = {s for s in run.eval_schedule.steps(run.max_steps) if start is None or s > step}
    stop_at_goal = run.stop != "never"

    # This loop and training.distributed.trainer.train_rank mirror each other line for line on purpose
    # (the snapshots aside: only the probes' replay takes them):
    # each stays a readable textbook loop (the ground truth, and its data-parallel twin) instead
    # of sharing a callback-driven skeleton that neither reader could check at a glance.
    rows: list[tuple[int, float, float]] = []
    position = DataPosition() if start is None else start.position
    if random:
        randomness.set_state(
            start.rng_states[0] if start is not None and start.rng_states
            else randomness.seeded_state(randomness_seed(run.seed, trial_index), run.device),
            run.device)
    if start is None:
        with torch.no_grad():
            idx, _ = stream.batch(position, schedule.at(0).batch_size)
            net.eval()  # draws nothing, leaves the running statistics alone
            with autocast(run.precision, run.device):
                initial_loss = float(criterion(net(data.x_train[idx]), data.y_train[idx]))
            net.train()
        losses: list[float] = [initial_loss]
    else:
        initial_loss, losses = start.initial_loss[0], []
    hit = diverged_step = None
    examples = 0
    saved: dict[int, dict[str, torch.Tensor]] = {}

    def snapshot() -> None:
        if step in wanted:
            saved[step] = {k: v.detach().clone() for k, v in (*net.named_parameters(),
                                                               *net.named_buffers())}

    def record(k: int) -> bool:
        value = evaluate(net, data.x_val, data.y_val, metric, dataset.task, loss=dataset.loss,
                         precision=run.precision)
        rows.append((k, float(np.mean(losses)), value))
        losses.clear()
        return bool(goal is not None and goal.met(value))

    snapshot()
    if step in evals and record(step):
        hit = step
    while step < run.max_steps and not (hit is not None and stop_at_goal):
        segment = schedule.at(step)
        idx, after = stream.batch(position, segment.batch_size)
        for group in opt.param_groups:
            group["lr"] = (trial.lr * lr_factor(step, trial.decay_steps, trial.end_factor)
                           * segment.lr_scale)
        opt.zero_grad(set_to_none=False)
        with autocast(run.precision, run.device):
            loss = criterion(net(data.x_train[idx]), data.y_train[idx])
        value = float(loss.detach())
        if is_diverged(value, initial_loss):
            diverged_step = step
            break
        loss.backward()
        mask_([params[name].grad for name in masks], list(masks.values()))
        opt.step()
        step, position, examples = step + 1, after, examples + len(idx)
        losses.append(value)
        snapshot()
        if step in evals and record(step) and hit is None:
            hit = step

    weights = {k: v.detach().clone() for k, v in net.named_parameters()}
    first, second = _STATE_KEYS[run.optimizer in ADAM_OPTIMIZERS]
    buffers, moments = _saved(opt, params, first), _saved(opt, params, second)
    model_buffers = {k: v.detach().clone() for k, v in net.named_buffers()}
    result = ReferenceResult(
        steps_to_result=hit, diverged=diverged_step is not None, diverged_step=diverged_step,
        steps_run=step, curve=Curve.from_rows(rows), state=weights, buffers=model_buffers)
    state = TrainState({k: v[None] for k, v in weights.items()}, buffers, step, position,
                       (initial_loss,), moments, {k: v[None] for k, v in model_buffers.items()},
                       (randomness.get_state(run.device),) if random else ())
    return ScheduleResult(result=result, state=state, examples=examples, snapshots=saved)


# torch.optim's per-parameter state a TrainState's buffers and moments hold, by Adam-type or not
_STATE_KEYS = {False: ("momentum_buffer", None), True: ("exp_avg", "exp_avg_sq")}


def _saved(opt: torch.optim.Optimizer, params: Mapping[str, nn.Parameter], key: str | None
           ) -> dict[str, torch.Tensor]:
    """``opt``'s state ``key`` of every parameter that has it, as ``[1, *shape]`` copies."""
    return {} if key is None else {k: opt.state[p][key].detach().clone()[None]
                                   for k, p in params.items() if opt.state[p].get(key) is not None}


def _resume_optimizer(opt: torch.optim.Optimizer, params: Mapping[str, nn.Parameter],
                      start: TrainState, run: RunConfig) -> None:
    """Put ``start``'s momentum buffers, or Adam's moments and step count, into ``opt``; a state
    of the other optimizer family raises ConfigError."""
    start.check_optimizer(run.optimizer)
    adam = run.optimizer in ADAM_OPTIMIZERS
    first, second = _STATE_KEYS[adam]
    for name, buf in start.buffers.items():
        state = opt.state[params[name]]
        state[first] = buf[0].to(run.device, run.dtype).clone()
        if adam:   # torch.optim.Adam's own state: a float step count (CPU) and the moments
            state[second] = start.moments[name][0].to(run.device, run.dtype).clone()
            state["step"] = torch.tensor(float(start.step))


@torch.no_grad()
def _load(net: nn.Module, start: TrainState) -> None:
    """Copy the single trial of ``start`` into ``net``'s parameters."""
    if start.n_trials != 1:
        raise ConfigError(f"the reference loop resumes one trial; start has {start.n_trials} "
                          f"(use start.trial(i))")
    start.check_model(net)
    for name, p in net.named_parameters():
        p.copy_(start.params[name][0])
    for name, b in net.named_buffers():
        if name in start.model_buffers:
            b.copy_(start.model_buffers[name][0])
