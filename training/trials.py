"""The vectorized multi-trial trainer: N metaparameter points trained as one computation.

``train_trials`` stacks N copies of the model's parameters (``[N, *shape]``) and advances all of
them with one batched forward / backward / update per step (:mod:`training.stacked`). Each trial
keeps everything that makes it a trial of its own: its learning rate, momentum and schedule, its
mask, and its data order, ``BatchOrder(trial_seed(run.seed, i), n_train, run.batch_size)``.
Nothing in a step mixes trials, so trial i follows the same trajectory as
``train_reference(..., trial_index=i)`` whatever other trials share its group.

Steps-to-result (Shallue et al., 2019): the smallest step at which any non-diverged trial meets
the goal on the validation split. The goal is evaluated on ``run.eval_schedule``; at the first
evaluation where a trial meets it, that trial is replayed from the previous evaluation (from a
snapshot of its weights and momentum or Adam moments) with an evaluation after every step, so
its hit step is exact to the step. A trial whose metric dips below the target and back up
between two scheduled evaluations is not seen, as with any evaluation schedule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from . import legacy
from .adam import AdamState, per_trial
from .config import (ADAM_OPTIMIZERS, RunConfig, Trial, check_batch_size, check_index,
                     check_optimizer, check_trials)
from .data import Dataset
from .errors import ConfigError
from .goal import DIVERGENCE_FACTOR, Goal, as_goal, goal_metric, metric_value
from .masks import check_mask, mask_
from .order import epoch_permutation, trial_seed
from .results import Curve
from .resume import DataOrigin, check_data_seeds, check_start, end_state, load_stack
from .schedules import lr_factor
from .stacked import (FuncProgram, SequentialProgram, activation_floats, build_program,
                      default_chunk, stacked_loss_and_grad)
from .state import TrainState

Tensor = torch.Tensor
# Validation examples times trials per evaluation forward pass: bounds the activation memory.
EVAL_BUDGET = 1 << 16


@dataclass(frozen=True)
class TrialsResult:
    """Outcome of :func:`train_trials` for a group of N trials.

    ``steps_to_result``: Shallue et al.'s steps-to-result of the group, the smallest step at which
    a non-diverged trial met the goal, exact to the step thanks to the replay (None if no trial
    met it). ``best``: index of that trial (ties: lowest index), ``best_trial`` its
    metaparameters. Per trial: ``status`` in {"reached", "not_reached", "diverged"},
    ``hit_step`` (exact first step meeting the goal, or None), ``diverged_step`` (the update whose
    mini-batch loss was non-finite or exploded; the weights are those before it),
    ``steps_taken`` (updates applied), ``curves`` (scheduled evaluations, see
    :class:`training.results.Curve`). ``steps_run``: steps the group ran. ``params``: final
    parameters stacked by name, ``[N, *shape]`` (:meth:`state` gives one trial's).
    ``end_state`` (with ``return_state=True``): the :class:`training.state.TrainState` after
    ``steps_run`` updates of the trials ``end_trials`` (those that ran to the end: not diverged,
    not stopped at their own hit), to resume or branch from; else None.
    """

    steps_to_result: int | None
    best: int | None
    best_trial: Trial | None
    status: list[str]
    hit_step: list[int | None]
    diverged_step: list[int | None]
    steps_taken: list[int]
    curves: list[Curve]
    steps_run: int
    trials: list[Trial]
    params: dict[str, Tensor] = field(repr=False)
    end_state: TrainState | None = field(default=None, repr=False)
    end_trials: tuple[int, ...] = ()

    def state(self, i: int) -> dict[str, Tensor]:
        """Final parameters of trial ``i`` by name."""
        return {name: p[i] for name, p in self.params.items()}


# ----------------------------------------------------------------------------------------------
# a stack of trials trained together


@dataclass
class _Stack:
    """Mutable state of the trials trained together (one chunk of a group)."""

    ids: list[int]
    params: list[Tensor]
    bufs: list[Tensor] | None
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
    adam: AdamState | None = None  # moments and metaparameters of adam / adamw (bufs is None)

    def select(self, rows: list[int]) -> "_Stack":
        """The stack restricted to positions ``rows``."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.lr.device)

        def take(t):
            return None if t is None else t.index_select(0, idx.to(t.device))

        return _Stack(
            ids=[self.ids[r] for r in rows], params=[take(p) for p in self.params],
            bufs=None if self.bufs is None else [take(b) for b in self.bufs],
            masks=[m if m is None or m.dim() < self.params[j].dim() else take(m)
                   for j, m in enumerate(self.masks)],
            lr=take(self.lr), mu=take(self.mu), decay=take(self.decay), end=take(self.end),
            init_loss=take(self.init_loss), loss_sum=take(self.loss_sum),
            seeds=[self.seeds[r] for r in rows], perm=take(self.perm), perm_epoch=self.perm_epoch,
            adam=None if self.adam is None else self.adam.select(idx))

    def clone(self) -> "_Stack":
        return _Stack(
            ids=list(self.ids), params=[p.clone() for p in self.params],
            bufs=None if self.bufs is None else [b.clone() for b in self.bufs],
            masks=self.masks, lr=self.lr, mu=self.mu, decay=self.decay, end=self.end,
            init_loss=self.init_loss, loss_sum=self.loss_sum.clone(), seeds=self.seeds,
            perm=self.perm, perm_epoch=self.perm_epoch,
            adam=None if self.adam is None else self.adam.clone())


@dataclass
class _Runner:
    """What every step of every stack of one group shares."""

    program: SequentialProgram | FuncProgram
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    task: str
    metric: str
    batch_size: int
    optimizer: str
    dtype: torch.dtype
    origin: DataOrigin = DataOrigin()   # where the data order starts (training.resume)

    def batch_indices(self, st: _Stack, step: int) -> Tensor:
        """[n, B] indices: batch ``step`` of every trial's own data order (training.order)."""
        n = self.x_train.shape[0]
        epoch, offset = self.origin.locate(step, self.batch_size, n)
        if st.perm_epoch != epoch:
            st.perm = torch.stack([epoch_permutation(s, epoch, n) for s in st.seeds]).to(
                self.x_train.device)
            st.perm_epoch = epoch
        return st.perm[:, offset:offset + self.batch_size]

    def initial_loss(self, st: _Stack) -> Tensor:
        idx = self.batch_indices(st, 0)
        out = self.program.forward(st.params, self.x_train[idx])
        return stacked_loss_and_grad(out, self.y_train[idx], self.task)[0].double()

    def step(self, st: _Stack, step: int) -> tuple[_Stack, list[tuple[int, list[Tensor]]]]:
        """Apply update ``step`` (0-based) to every trial of ``st``.

        A trial whose mini-batch loss is non-finite or above DIVERGENCE_FACTOR times its initial
        loss (training.goal.is_diverged) takes no update: it leaves the stack and is returned as
        (id, parameters before the update). Update rules (torch.optim.SGD, dampening 0):
        sgd: w -= lr g; momentum: a = mu a + g, w -= lr a; nesterov: a = mu a + g,
        w -= lr (g + mu a); adam / adamw: :meth:`training.adam.AdamState.step`. Masked entries
        of g are zeroed first, so masked weights and momentum (or moment) buffers stay zero.
        """
        idx = self.batch_indices(st, step)
        loss, grads = self.program.loss_and_grads(st.params, self.x_train[idx], self.y_train[idx])
        loss = loss.double()
        # training.goal.is_diverged: not finite, or above DIVERGENCE_FACTOR * initial loss
        bad = ~(loss <= DIVERGENCE_FACTOR * st.init_loss.clamp(min=1e-12))
        dropped: list[tuple[int, list[Tensor]]] = []
        if bool(bad.any()):
            rows = bad.nonzero().flatten().tolist()
            dropped = [(st.ids[r], [p[r].clone() for p in st.params]) for r in rows]
            keep = (~bad).nonzero().flatten().tolist()
            st = st.select(keep)
            if not keep:
                return st, dropped
            sel = torch.tensor(keep, device=loss.device)
            loss = loss[sel]
            grads = [g.index_select(0, sel) for g in grads]
        st.loss_sum += loss
        mask_(grads, st.masks)
        lr = st.lr if st.decay is None else st.lr * lr_factor(step, st.decay, st.end)
        if st.adam is not None:
            st.adam.step(st.params, grads, lr, step)
            return st, dropped
        neg_lr = lr.neg().to(self.dtype)
        steps = [per_trial(neg_lr, p) for p in st.params]
        if st.bufs is None:
            torch._foreach_addcmul_(st.params, grads, steps)
            return st, dropped
        mus = [per_trial(st.mu, p) for p in st.params]
        if self.optimizer == "nesterov":
            st.bufs = torch._foreach_addcmul(grads, st.bufs, mus)
            torch._foreach_addcmul_(grads, st.bufs, mus)
            torch._foreach_addcmul_(st.params, grads, steps)
        else:
            # a = g + mu a written over g, which becomes the buffer: one pass instead of two
            torch._foreach_addcmul_(grads, st.bufs, mus)
            st.bufs = grads
            torch._foreach_addcmul_(st.params, st.bufs, steps)
        return st, dropped

    @torch.no_grad()
    def evaluate(self, st: _Stack) -> Tensor:
        """Goal metric of every trial on the validation split, [n] float64."""
        n = len(st.ids)
        chunk = max(1, EVAL_BUDGET // n)
        total = torch.zeros(n, dtype=torch.float64, device=self.x_val.device)
        for i in range(0, self.x_val.shape[0], chunk):
            x = self.x_val[i:i + chunk]
            out = self.program.forward(st.params, x.unsqueeze(0).expand(n, *x.shape))
            value = metric_value(self.metric, out, self.y_val[i:i + chunk], self.task)
            total += value.double() * x.shape[0]
        return total / self.x_val.shape[0]


# ----------------------------------------------------------------------------------------------
# the trainer


def _make_stacks(model: nn.Module, trials: list[Trial], masks: dict[str, Tensor], seed: int,
                 first_index: int, optimizer: str, chunk: int, device: str, dtype: torch.dtype
                 ) -> list[_Stack]:
    names = [name for name, _ in model.named_parameters()]
    base = [p.detach().to(device=device, dtype=dtype) for _, p in model.named_parameters()]
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
        params = [p.unsqueeze(0).expand(n, *p.shape).clone() for p in base]
        mask_(params, m_st)
        decays = [trials[i].decay_steps for i in ids]
        f64 = dict(dtype=torch.float64, device=device)
        stacks.append(_Stack(
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
            seeds=[trial_seed(seed, first_index + i) for i in ids]))
    return stacks


@legacy.accepts_old_form(legacy.trials_args, "train_trials(model, dataset, trials, run)")
def train_trials(model: nn.Module, dataset: Dataset, trials: Sequence[Trial | Mapping[str, Any]],
                 run: RunConfig, *, masks: Mapping[str, Tensor] | None = None,
                 trials_per_chunk: int | None = None, first_index: int = 0,
                 start: TrainState | None = None, data_seeds: Sequence[int] | None = None,
                 return_state: bool = False) -> TrialsResult:
    """Train N trials of ``model`` on ``dataset`` together; see the module docstring.

    ``trials``: metaparameter points (``Trial`` or dicts for ``Trial.from_dict``); every trial
    starts from ``model``'s weights. ``run``: batch size, optimizer (the update rules of
    ``torch.optim.SGD``, or of ``torch.optim.Adam`` / ``AdamW`` for ``adam`` / ``adamw``), goal,
    step budget, evaluation schedule, data seed, dtype and device (:class:`training.RunConfig`). ``run.stop``: ``"first"`` ends the group at the first
    evaluation where any trial meets the goal; ``"all"`` trains each trial to its own first hit,
    divergence or the budget; ``"never"`` trains every trial to divergence or the budget and
    records each one's first hit.
    ``masks``: name -> 0/1 tensor shaped like the parameter (all trials) or ``[N, *shape]`` (one
    per trial), see :mod:`training.masks`.
    ``trials_per_chunk``: trials stacked per computation (default
    :func:`training.stacked.default_chunk`, by measurement); chunks advance in lockstep between evaluations, so results do not depend on it.
    ``first_index``: trial k of the list is trial ``first_index + k`` of the group (its data
    seed is ``trial_seed(run.seed, first_index + k)``), so a group can be split across calls.
    ``data_seeds``: each trial's data seed instead (e.g. branches sharing a base run's order).
    ``start``: a :class:`training.state.TrainState` (one trial, shared by all, or N) to resume
    from: weights, momentum buffers or Adam moments, step (lr schedule, Adam's bias
    corrections), divergence reference and data position are the state's; ``run.max_steps``
    counts from the run's beginning and evaluations resume after ``start.step``
    (:mod:`training.resume`). ``return_state``: put the final state in ``end_state``.
    The keyword form of earlier releases is accepted with a DeprecationWarning
    (:mod:`training.legacy`). A process that trains many groups should call
    :func:`training.process.setup_training_process` once (the ``sparsescale`` command and its
    worker pools do).
    """
    trial_list = check_trials(trials)
    check_optimizer(run.optimizer, [t.momentum for t in trial_list],
                    [t.weight_decay for t in trial_list])
    batch_size = check_batch_size(run.batch_size, dataset.n_train)
    chunk = trials_per_chunk if trials_per_chunk is not None else default_chunk(
        batch_size, activation_floats(model, dataset.input_shape))
    if chunk < 1:
        raise ConfigError(f"trials_per_chunk must be >= 1, got {trials_per_chunk}")
    n = len(trial_list)
    mask_map = check_mask(masks, model, trials=n)
    goal = as_goal(run.goal, dataset.task)
    metric = goal_metric(goal, dataset.task)
    first_index = check_index(first_index, "first_index")
    start = check_start(start, model, run.optimizer, n, run.max_steps)
    seeds = check_data_seeds(data_seeds, n)
    origin = DataOrigin.of(start)
    data = dataset.to(run.device, run.dtype)
    runner = _Runner(build_program(model, dataset.task), data.x_train, data.y_train, data.x_val,
                     data.y_val, dataset.task, metric, batch_size, run.optimizer, run.dtype, origin)
    stacks = _make_stacks(model, trial_list, mask_map, run.seed, first_index, run.optimizer,
                          chunk, run.device, run.dtype)
    names = [name for name, _ in model.named_parameters()]
    for st in stacks:
        if seeds is not None:
            st.seeds = [seeds[i] for i in st.ids]
        if start is None:
            st.init_loss = runner.initial_loss(st)
        else:
            load_stack(st, start, names)

    rows: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
    hit: list[int | None] = [None] * n
    diverged: list[int | None] = [None] * n
    taken = [0] * n
    final: dict[int, list[Tensor]] = {}

    def finish(st: _Stack, r: int, step: int) -> None:
        final[st.ids[r]] = [p[r].clone() for p in st.params]
        taken[st.ids[r]] = step

    def record(st: _Stack, step: int, gap: int) -> list[int]:
        """Evaluate at ``step``, append curve rows; positions of trials meeting the goal for the
        first time (only ``stop="never"`` keeps training a trial that met it)."""
        value = runner.evaluate(st).tolist()
        train = (st.init_loss if step == 0 else st.loss_sum / gap).tolist()
        st.loss_sum.zero_()
        for r, i in enumerate(st.ids):
            rows[i].append((step, train[r], value[r]))
        return [r for r, v in enumerate(value)
                if goal is not None and hit[st.ids[r]] is None and goal.met(v)]

    # from a start state: the evaluations after it, the first replay from the state itself
    schedule = [s for s in run.eval_schedule.steps(run.max_steps) if start is None or s > start.step]
    prev = steps_run = origin.step
    snapshots: list[_Stack] = [] if start is None else [st.clone() for st in stacks]
    for j, e in enumerate(schedule):
        if e > prev:
            for k, st in enumerate(stacks):
                for s in range(prev, e):
                    if not st.ids:
                        break
                    st, dropped = runner.step(st, s)
                    for i, p in dropped:
                        diverged[i], final[i], taken[i] = s, p, s
                stacks[k] = st
            steps_run = e
        stop_now = False
        for k, st in enumerate(stacks):
            met = record(st, e, e - prev) if st.ids else []
            if not met:
                continue
            for i, h in _replay(runner, snapshots[k] if e > 0 else None, [st.ids[r] for r in met],
                                prev, e, goal).items():
                hit[i] = h
            stop_now = run.stop == "first"
            if run.stop == "all":
                for r in met:
                    finish(st, r, e)
                stacks[k] = st.select([r for r in range(len(st.ids)) if r not in met])
        stacks = [st for st in stacks if st.ids]
        if stop_now or not stacks:
            break
        # the replay of the next interval starts from here (not needed for a one-step interval)
        nxt = schedule[j + 1] if j + 1 < len(schedule) else e
        snapshots = [st.clone() if nxt - e > 1 else st for st in stacks]
        prev = e
    for st in stacks:
        for r in range(len(st.ids)):
            finish(st, r, steps_run)
    result = _result(model, trial_list, rows, hit, diverged, taken, final, steps_run)
    if not return_state:
        return result
    state, ids = end_state(stacks, names, steps_run, origin, batch_size, dataset.n_train)
    return replace(result, end_state=state, end_trials=ids)


def _replay(runner: _Runner, snapshot: _Stack | None, ids: list[int], start: int, end: int,
            goal: Goal) -> dict[int, int]:
    """Exact hit steps in (start, end] of trials ``ids``, which meet the goal at ``end``: rerun
    them from the snapshot at ``start`` evaluating after every step."""
    if snapshot is None or end - start == 1:
        return {i: end for i in ids}
    st = snapshot.clone().select([snapshot.ids.index(i) for i in ids])
    found: dict[int, int] = {}
    for s in range(start, end - 1):
        st, _ = runner.step(st, s)  # a trial diverging here cannot (it did not in the run)
        if not st.ids:
            break
        met = [r for r, v in enumerate(runner.evaluate(st).tolist()) if goal.met(v)]
        for r in met:
            found[st.ids[r]] = s + 1
        if met:
            st = st.select([r for r in range(len(st.ids)) if r not in met])
        if not st.ids:
            break
    # a trial not seen earlier first met the goal at ``end`` itself
    return {i: found.get(i, end) for i in ids}


def _result(model: nn.Module, trials: list[Trial], rows, hit, diverged, taken, final,
            steps_run: int) -> TrialsResult:
    n = len(trials)
    status = ["diverged" if diverged[i] is not None else "reached" if hit[i] is not None
              else "not_reached" for i in range(n)]
    reached = [i for i in range(n) if status[i] == "reached"]
    best = min(reached, key=lambda i: (hit[i], i)) if reached else None
    curves = [Curve.from_rows(rs) for rs in rows]
    names = [name for name, _ in model.named_parameters()]
    params = {name: torch.stack([final[i][j] for i in range(n)]) for j, name in enumerate(names)}
    return TrialsResult(
        steps_to_result=None if best is None else hit[best], best=best,
        best_trial=None if best is None else trials[best], status=status, hit_step=list(hit),
        diverged_step=list(diverged), steps_taken=list(taken), curves=curves,
        steps_run=steps_run, trials=trials, params=params)
