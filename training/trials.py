"""The vectorized multi-trial trainer: N metaparameter points trained as one computation.

``train_trials`` stacks N copies of the model's parameters (``[N, *shape]``) and advances them
with one program per step, chosen for each (model, batch size) cell by
:func:`training.engine.cell_plan.plan_cell`: a compiled kernel, trials one after another through oneDNN,
or batched kernels over the stack (:mod:`training.engine.batched`, :mod:`training.engine.func`). Each trial
keeps everything that makes it a trial of its own: its learning rate, momentum and schedule, its
mask, and its data order, ``BatchOrder(trial_seed(run.seed, i), n_train, run.batch_size)``.
Nothing in a step mixes trials, so trial i follows the same trajectory as
``train_reference(..., trial_index=i)`` whatever other trials share its group.

Modules with batch statistics or random draws (BatchNorm, Dropout) train as the plain loop trains
them: each trial keeps its own buffers (running statistics) and draws from its own generator
(:mod:`training.randomness`); training steps run in train mode, evaluations and the first
mini-batch loss (the divergence reference) in eval mode.

Steps-to-result (Shallue et al., 2019): the smallest step at which any non-diverged trial meets
the goal on the validation split. The goal is evaluated on ``run.eval_schedule``; at the first
evaluation where a trial meets it, that trial is replayed from the previous evaluation (from a
snapshot of its weights and momentum or Adam moments) with an evaluation after every step, so
its hit step is exact to the step. A trial whose metric dips below the target and back up
between two scheduled evaluations is not seen, as with any evaluation schedule.

Device and precision (``run.device``, ``run.precision``; :mod:`training.device`): the stacks, the
data set and every step live on ``run.device`` (a data set already there is not copied); the
precision's TF32 flags hold for the whole call and each program autocasts its forward passes
and losses (the compiled kernel, float32 C++ on the CPU, never gets a ``bf16`` or CUDA cell).
The step loop reads values back to the host at evaluations and, for the eager programs, once a
step to drop diverged trials before their update (docs/guide/gpu.md lists every such read).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from training.engine import choice
from training.engine.cell_plan import (
    CellPlan, Program, candidate_plans, named_plan, plan_cell,
)
from training.config import (
    RunConfig, Trial, check_batch_size, check_index, check_optimizer, check_run, check_trials,
)
from training.data import Dataset
from training.models import check_output, check_runnable
from training.errors import ConfigError
from training.goal import DIVERGENCE_FACTOR, Goal, as_goal, goal_metric, metric_value
from training.masks import check_mask
from training.order import epoch_permutation
from training.results import Curve
from training.engine.resume import DataOrigin, check_data_seeds, check_start, end_state, load_stack
from training.engine.batched import stacked_loss_and_grad
from training.state import TrainState
from training.engine.trial_stack import ModuleState, TrialStack, check_init_params, make_stacks
from training import device, randomness

Tensor = torch.Tensor
# Validation examples times trials per evaluation forward pass: bounds the activation memory.
EVAL_BUDGET = 1 << 16
# Bytes of inputs gathered at once for the first mini-batch loss: resnet8's batch of 4096 CIFAR
# images is 50 MB a trial, so gathering 32 trials' at once took 1.6 GB.
GATHER_BUDGET = 64 << 20
# Bytes of batch indices ([K, N, B] int64) handed to one call of a program that takes K steps
# at once (training.engine.fused.FusedProgram.train_steps): 32 trials at B = 4096 take 1 MB a
# step, so such a call covers 16 steps; at B = 64, up to 1,024.
INDEX_BUDGET = 16 << 20


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
    :class:`training.results.Curve`). ``steps_run``: steps the group ran. ``program``: the
    program that computed the steps (one of :data:`training.engine.cell_plan.PROGRAMS`; ``batched`` where
    the compiled kernel could not be built; under a batch-size schedule, those of its segments,
    comma-separated). ``params``: final parameters stacked by name,
    ``[N, *shape]`` (:meth:`state` gives one trial's); ``buffers``: the module's final buffers
    stacked the same way (BatchNorm's running statistics; empty for the programs that run
    modules without state). ``program_choice``: how the program was chosen, "ruled" (the cell
    plan's rules), "measured" (timed on this machine, :mod:`training.engine.choice`), "forced"
    (``SPARSESCALE_PROGRAM_CHOICE=<program>``) or "given" (``train_trials(program=...)``).
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
    program: str
    params: dict[str, Tensor] = field(repr=False)
    end_state: TrainState | None = field(default=None, repr=False)
    end_trials: tuple[int, ...] = ()
    buffers: dict[str, Tensor] = field(default_factory=dict, repr=False)
    program_choice: str = "ruled"

    def state(self, i: int) -> dict[str, Tensor]:
        """Final parameters of trial ``i`` by name."""
        return {name: p[i] for name, p in self.params.items()}


@dataclass
class _Runner:
    """What every step of every stack of one group shares."""

    program: Program
    update_in_step: bool  # the program's train_step applies the update (training.engine.cell_plan)
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    task: str
    metric: str
    batch_size: int
    optimizer: str
    dtype: torch.dtype
    origin: DataOrigin = DataOrigin()   # where the data order starts (training.engine.resume)
    loss: Callable[[Tensor, Tensor], Tensor] | None = None  # the data set's own, per example
    # entered around each stack's updates from one evaluation to the next (train_trials)
    step_timer: contextlib.AbstractContextManager = field(default_factory=contextlib.nullcontext)

    def batch_indices(self, st: TrialStack, step: int) -> Tensor:
        """[n, B] indices: batch ``step`` of every trial's own data order (training.order)."""
        n = self.x_train.shape[0]
        epoch, offset = self.origin.locate(step, self.batch_size, n)
        if st.perm_epoch != epoch:
            st.perm = torch.stack([epoch_permutation(s, epoch, n) for s in st.seeds]).to(
                self.x_train.device)
            st.perm_epoch = epoch
        return st.perm[:, offset:offset + self.batch_size]

    @staticmethod
    def module(st: TrialStack, rows: slice | None = None) -> dict[str, ModuleState]:
        """The keyword giving a program that runs the module's own forward pass the stack's
        module state (of trials ``rows``), or none."""
        if st.module is None:
            return {}
        return {"module": st.module if rows is None else st.module.rows(rows.start, rows.stop)}

    def gather(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs [n, B, ...] and targets [n, B] (per-token: [n, B, T]) of the rows ``idx``
        [n, B] of the training split (``index_select``: 5x faster than advanced indexing for
        this gather)."""
        flat = idx.reshape(-1)
        return (self.x_train.index_select(0, flat).view(*idx.shape, *self.x_train.shape[1:]),
                self.y_train.index_select(0, flat).view(*idx.shape, *self.y_train.shape[1:]))

    def batch(self, st: TrialStack, step: int) -> tuple[Tensor, Tensor]:
        """Inputs [n, B, ...] and targets [n, B] of batch ``step`` of every trial."""
        return self.gather(self.batch_indices(st, step))

    def initial_loss(self, st: TrialStack) -> Tensor:
        """Every trial's first mini-batch loss at its initial weights, [n] float64, computed a
        few trials at a time so that their gathered inputs stay within GATHER_BUDGET."""
        idx = self.batch_indices(st, 0)
        per_trial = idx.shape[1] * self.x_train[0].numel() * self.x_train.element_size()
        step = max(1, GATHER_BUDGET // max(per_trial, 1))
        losses = []
        for a in range(0, idx.shape[0], step):
            x, y = self.gather(idx[a:a + step])
            out = self.program.forward([p[a:a + step] for p in st.params], x,
                                       **self.module(st, slice(a, a + step)))
            losses.append(stacked_loss_and_grad(out, y, self.task)[0] if self.loss is None else
                          torch.stack([self.loss(o, t).mean() for o, t in zip(out, y)]))
        return torch.cat(losses).double()

    def steps(self, st: TrialStack, start: int, end: int
              ) -> tuple[TrialStack, list[tuple[int, int, list[Tensor]]]]:
        """Apply updates ``start`` .. ``end - 1`` (0-based) to every trial of ``st``.

        A trial whose mini-batch loss is non-finite or above DIVERGENCE_FACTOR times its initial
        loss (training.goal.is_diverged) takes no update: it leaves the stack and is returned as
        (step, id, parameters before that step's update). The update is
        :class:`training.engine.updates.StackUpdate` (torch.optim.SGD's rules, or Adam / AdamW's),
        applied inside the program's train_steps / train_step or after its loss_and_grads;
        masked entries of g are zeroed first, so masked weights and momentum (or moment)
        buffers stay zero. A program with ``train_steps`` takes up to INDEX_BUDGET's worth of
        steps a call; the others one step a call (:meth:`step`).
        """
        dropped: list[tuple[int, int, list[Tensor]]] = []
        if not (self.update_in_step and hasattr(self.program, "train_steps")):
            for s in range(start, end):
                if not st.ids:
                    break
                st, out = self.step(st, s)
                dropped += [(s, i, p) for i, p in out]
            return st, dropped
        s = start
        while s < end and st.ids:
            k = min(end - s, max(1, INDEX_BUDGET // (8 * len(st.ids) * self.batch_size)))
            idx = torch.stack([self.batch_indices(st, t) for t in range(s, s + k)])
            loss, taken = self.program.train_steps(
                st.params, self.x_train, self.y_train, idx,
                [st.update(self.optimizer, t) for t in range(s, s + k)], self.limit(st))
            taken = taken.tolist()
            keep = [r for r, t in enumerate(taken) if t == k]
            if len(keep) < len(taken):
                dropped += [(s + t, st.ids[r], _trial_tensors(st, r))
                            for r, t in enumerate(taken) if t < k]
                st = st.select(keep)
            # one step after the other in float64, as a step a call adds its losses
            for row in loss.double()[:, keep]:
                st.loss_sum += row
            s += k
        return st, dropped

    def step(self, st: TrialStack, step: int
             ) -> tuple[TrialStack, list[tuple[int, list[Tensor]]]]:
        """Apply update ``step`` (0-based) to every trial of ``st`` (see :meth:`steps`); its
        diverged trials are returned as (id, parameters before the update)."""
        limit = self.limit(st)
        grads = None
        if self.update_in_step:  # the update runs inside, for the trials within their limit
            loss = self.program.train_step(st.params, self.x_train, self.y_train,
                                           self.batch_indices(st, step),
                                           st.update(self.optimizer, step), limit,
                                           **self.module(st))
        else:
            loss, grads = self.program.loss_and_grads(st.params, *self.batch(st, step),
                                                      **self.module(st))
        loss = loss.double()
        bad = ~(loss <= limit)
        dropped: list[tuple[int, list[Tensor]]] = []
        if bool(bad.any()):
            rows = bad.nonzero().flatten().tolist()
            dropped = [(st.ids[r], _trial_tensors(st, r)) for r in rows]
            keep = (~bad).nonzero().flatten().tolist()
            st = st.select(keep)
            if not keep:
                return st, dropped
            sel = torch.tensor(keep, device=loss.device)
            loss = loss[sel]
            grads = None if grads is None else [g.index_select(0, sel) for g in grads]
        st.loss_sum += loss
        if grads is not None:
            st.update(self.optimizer, step).apply_(st.params, grads)
        return st, dropped

    @staticmethod
    def limit(st: TrialStack) -> Tensor:
        """Every trial's divergence limit [n] (training.goal.is_diverged: not finite, or above
        DIVERGENCE_FACTOR times the initial loss)."""
        return DIVERGENCE_FACTOR * st.init_loss.clamp(min=1e-12)

    @torch.no_grad()
    def evaluate(self, st: TrialStack) -> Tensor:
        """Goal metric of every trial on the validation split, [n] float64."""
        n = len(st.ids)
        chunk = max(1, EVAL_BUDGET // n)
        total = torch.zeros(n, dtype=torch.float64, device=self.x_val.device)
        for i in range(0, self.x_val.shape[0], chunk):
            x = self.x_val[i:i + chunk]
            out = self.program.forward(st.params, x.unsqueeze(0).expand(n, *x.shape),
                                       **self.module(st))
            y = self.y_val[i:i + chunk]
            value = (metric_value(self.metric, out, y, self.task) if self.loss is None else
                     torch.stack([metric_value(self.metric, o, y, self.task, self.loss)
                                  for o in out]))
            total += value.double() * x.shape[0]
        return total / self.x_val.shape[0]


# ----------------------------------------------------------------------------------------------
# the trainer


def train_trials(model: nn.Module, dataset: Dataset, trials: Sequence[Trial | Mapping[str, Any]],
                 run: RunConfig, *, masks: Mapping[str, Tensor] | None = None,
                 trials_per_chunk: int | None = None, first_index: int = 0,
                 start: TrainState | None = None, data_seeds: Sequence[int] | None = None,
                 return_state: bool = False,
                 step_timer: contextlib.AbstractContextManager | None = None,
                 init_params: Mapping[str, Tensor] | None = None,
                 program: str | None = None) -> TrialsResult:
    """Train N trials of ``model`` on ``dataset`` together; see the module docstring.

    ``trials``: metaparameter points (``Trial`` or dicts for ``Trial.from_dict``); every trial
    starts from ``model``'s weights, or with ``init_params`` (name -> ``[N, *shape]`` for
    every parameter) trial i from row i (each trial its own initialization, as Lee et al.
    2021's runs; the module's buffers are still ``model``'s). ``run``: batch size, optimizer
    (the update rules of ``torch.optim.SGD``, or of ``torch.optim.Adam`` / ``AdamW`` for
    ``adam`` / ``adamw``), goal,
    step budget, evaluation schedule, data seed, dtype and device
    (:class:`training.RunConfig`). ``run.stop``: ``"first"`` ends the group at the first
    evaluation where any trial meets the goal; ``"all"`` trains each trial to its own first hit,
    divergence or the budget; ``"never"`` trains every trial to divergence or the budget and
    records each one's first hit.
    ``masks``: name -> 0/1 tensor shaped like the parameter (all trials) or ``[N, *shape]`` (one
    per trial), see :mod:`training.masks`.
    ``trials_per_chunk``: trials stacked per computation (default: the cell plan of
    :func:`training.engine.cell_plan.plan_cell`, which also picks the program computing a stack's step);
    between two evaluations the stacks run one after another, and nothing in a step mixes
    trials, so results do not depend on it.
    ``first_index``: trial k of the list is trial ``first_index + k`` of the group (its data
    seed is ``trial_seed(run.seed, first_index + k)``), so a group can be split across calls.
    ``data_seeds``: each trial's data seed instead (e.g. branches sharing a base run's order).
    ``start``: a :class:`training.state.TrainState` (one trial, shared by all, or N) to resume
    from: weights, momentum buffers or Adam moments, step (lr schedule, Adam's bias
    corrections), divergence reference and data position are the state's; ``run.max_steps``
    counts from the run's beginning and evaluations resume after ``start.step``
    (:mod:`training.engine.resume`). ``return_state``: put the final state in ``end_state``.
    ``step_timer``: a reusable context manager entered around each stack's updates from one
    evaluation to the next (data order, batch gathers, the program's steps, divergence checks,
    updates), never around setup, the program choice, evaluations or replays: how the benchmark
    times the steps alone (:class:`training.bench.measure.StepTimer`).
    ``program``: the program to run (one of :data:`training.engine.cell_plan.PROGRAMS`)
    instead of choosing one (``TrialsResult.program_choice`` is then ``"given"``): what a study
    passes for a cell whose program its store recorded; a program that cannot run the cell here
    (``fused`` without the compiled kernel, ``func`` for a model ``torch.func`` cannot batch)
    raises :class:`ConfigError`. ``"rules"`` or ``"measure"``: choose under that setting
    instead of ``SPARSESCALE_PROGRAM_CHOICE``'s (:mod:`training.engine.choice`). None: the
    environment's setting (:func:`choose_program` says what it chooses), within
    :func:`given_programs` the program it gives for the batch size.
    A process that trains many groups should call
    :func:`training.process.setup_training_process` once (the ``sparsescale`` command and its
    worker pools do). The caller's generator state is left as it was.
    """
    with _checked(model, dataset, run, "train_trials") as random:
        return _train_trials(model, dataset, trials, run, masks, trials_per_chunk, first_index,
                             start, data_seeds, return_state, random, step_timer, program,
                             init_params=init_params)


def choose_program(model: nn.Module, dataset: Dataset,
                   trials: Sequence[Trial | Mapping[str, Any]], run: RunConfig, *,
                   masks: Mapping[str, Tensor] | None = None, first_index: int = 0,
                   program_choice: str | None = None) -> tuple[str, str]:
    """The program :func:`train_trials` would run for these arguments, and how it was chosen
    (``"ruled"``, ``"measured"`` or ``"forced"``), without training: the rules, or the timed
    candidates of :mod:`training.engine.choice` (its cache), under ``program_choice``
    ("measure", "rules" or a program's name; None: ``SPARSESCALE_PROGRAM_CHOICE``). A study
    calls it once per cell, records the answer, and trains every group of the cell with it
    (``train_trials(program=...)``)."""
    setting = None if program_choice is None else choice.check_setting(program_choice,
                                                                       "program_choice")
    with _checked(model, dataset, run, "choose_program") as random, \
            _setting(setting):
        plan = _train_trials(model, dataset, trials, run, masks, None, first_index, None, None,
                             False, random, None, None, plan_only=True)
    return plan.name, plan.choice


# (programs by batch size, the program or setting for any other batch size) of given_programs
_GIVEN: contextvars.ContextVar[tuple[Mapping[int, str], str | None] | None] = \
    contextvars.ContextVar("given_programs", default=None)


@contextlib.contextmanager
def given_programs(programs: Mapping[int, str], otherwise: str | None = "rules"
                   ) -> Iterator[None]:
    """Within the block (this thread or task), :func:`train_trials` called without
    ``program`` runs ``programs[batch_size]`` where the mapping holds the batch size, and
    ``otherwise`` elsewhere (a program, "rules", "measure", or None: the environment's
    setting). A study's branching runs under its store's recorded programs: a base run trains
    as its group did, and a branch at a batch size the sweep did not train takes the rules'
    program, chosen the same way on every machine and every rerun."""
    token = _GIVEN.set((dict(programs), otherwise))
    try:
        yield
    finally:
        _GIVEN.reset(token)


@contextlib.contextmanager
def _setting(value: str | None) -> Iterator[None]:
    """``value`` (a program choice) as the setting of every batch size within the block."""
    if value is None:
        yield
        return
    with given_programs({}, value):
        yield


@contextlib.contextmanager
def _checked(model: nn.Module, dataset: Dataset, run: RunConfig, caller: str
             ) -> Iterator[bool]:
    """The checks of a trainer's arguments; within: the run's precision, and whether the model
    draws random numbers (the process-wide generator is then preserved around the block)."""
    check_run(run, caller)
    check_runnable(model)   # before a forward pass, which would materialize lazy parameters
    check_output(model, dataset, caller)
    random = randomness.draws(model, dataset.x_train[:2])
    # the process-wide generator is only ever touched (under its lock) for a model that draws
    with (randomness.preserved(run.device) if random else contextlib.nullcontext(),
          device.precision(run.precision, run.device)):
        yield random


def _train_trials(model: nn.Module, dataset: Dataset, trials: Sequence[Trial | Mapping[str, Any]],
                  run: RunConfig, masks: Mapping[str, Tensor] | None,
                  trials_per_chunk: int | None, first_index: int, start: TrainState | None,
                  data_seeds: Sequence[int] | None, return_state: bool, random: bool,
                  step_timer: contextlib.AbstractContextManager | None, program: str | None,
                  plan_only: bool = False,
                  init_params: Mapping[str, Tensor] | None = None) -> TrialsResult | CellPlan:
    trial_list = check_trials(trials)
    check_optimizer(run.optimizer, [t.momentum for t in trial_list],
                    [t.weight_decay for t in trial_list])
    batch_size = check_batch_size(run.batch_size, dataset.n_train)
    if trials_per_chunk is not None and trials_per_chunk < 1:
        raise ConfigError(f"trials_per_chunk must be >= 1, got {trials_per_chunk}")
    n = len(trial_list)
    mask_map = check_mask(masks, model, trials=n)
    goal = as_goal(run.goal, dataset.task)
    metric = goal_metric(goal, dataset.task)
    first_index = check_index(first_index, "first_index")
    start = check_start(start, model, run.optimizer, n, run.max_steps)
    seeds = check_data_seeds(data_seeds, n)
    inits = check_init_params(init_params, model, n)
    if inits and start is not None:
        raise ConfigError("init_params and start exclude each other (a start state holds the "
                          "weights); allowed: one of them")
    origin = DataOrigin.of(start)
    data = dataset.to(run.device, run.dtype)
    runner = _Runner(None, False, data.x_train, data.y_train, data.x_val,
                     data.y_val, dataset.task, metric, batch_size, run.optimizer, run.dtype,
                     origin, dataset.loss, step_timer or contextlib.nullcontext())
    plan = _plan(model, dataset, trial_list, run, batch_size, random, mask_map, first_index,
                 runner, program)
    if plan_only:   # choose_program: the same checks and the same plan, then no training
        return plan
    runner.program, runner.update_in_step = plan.program, plan.update_in_step
    chunk = trials_per_chunk if trials_per_chunk is not None else plan.trials_per_stack
    stacks = make_stacks(model, trial_list, mask_map, run.seed, first_index, run.optimizer,
                         chunk, run.device, run.dtype,
                         getattr(plan.program, "takes_module_state", False), random, inits)
    names = [name for name, _ in model.named_parameters()]
    buffer_names = [name for name, _ in model.named_buffers()]
    for st in stacks:
        if seeds is not None:
            st.seeds = [seeds[i] for i in st.ids]
        if start is None:
            st.init_loss = runner.initial_loss(st)
        else:
            load_stack(st, start, names, buffer_names)

    rows: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
    hit: list[int | None] = [None] * n
    diverged: list[int | None] = [None] * n
    taken = [0] * n
    final: dict[int, list[Tensor]] = {}

    def finish(st: TrialStack, r: int, step: int, copy: bool = True) -> None:
        final[st.ids[r]] = _trial_tensors(st, r, copy)
        taken[st.ids[r]] = step

    def record(st: TrialStack, step: int, gap: int) -> list[int]:
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
    schedule = [s for s in run.eval_schedule.steps(run.max_steps)
                if start is None or s > start.step]
    prev = steps_run = origin.step
    for e in schedule:
        stop_now = False
        for k, st in enumerate(stacks):
            # stack after stack, so that only one stack's replay snapshot is alive at a time
            st, dropped, met, hits = _advance(runner, st, prev, e, goal, record)
            stacks[k] = st
            for s, i, p in dropped:
                diverged[i], final[i], taken[i] = s, p, s
            if not met:
                continue
            for i, h in hits.items():
                hit[i] = h
            stop_now = run.stop == "first"
            if run.stop == "all":
                for r in met:
                    finish(st, r, e)
                stacks[k] = st.select([r for r in range(len(st.ids)) if r not in met])
        steps_run = e
        stacks = [st for st in stacks if st.ids]
        if stop_now or not stacks:
            break
        prev = e
    # _result's stack is the only copy of the final weights (simple_cnn: 420 MB for 32 trials)
    for st in stacks:
        for r in range(len(st.ids)):
            finish(st, r, steps_run, copy=False)
        if not return_state:  # nor are the optimizer states needed: free them before that copy
            st.bufs = st.adam = None
    result = replace(_result(model, trial_list, rows, hit, diverged, taken, final, steps_run,
                             plan.name), program_choice=plan.choice)
    if not return_state:
        return result
    state, ids = end_state(stacks, names, steps_run, origin, batch_size, dataset.n_train,
                           buffer_names)
    return replace(result, end_state=state, end_trials=ids)


def _plan(model: nn.Module, dataset: Dataset, trials: list[Trial], run: RunConfig,
          batch_size: int, random: bool, masks: dict[str, Tensor], first_index: int,
          runner: _Runner, program: str | None = None) -> CellPlan:
    """The cell's plan: ``program``'s if it names one (or :func:`given_programs`' for the batch
    size); else, under ``program`` or the environment's setting, the rules' where they cover the
    cell, else the candidate measured on a scratch copy of the first trials
    (:mod:`training.engine.choice`)."""
    args = (model, dataset.task, dataset.input_shape, batch_size, len(trials), run.dtype,
            run.device)
    options = dict(optimizer=run.optimizer, loss=dataset.loss, random=random,
                   precision=run.precision)
    given, setting = _GIVEN.get(), None
    if program is None and given is not None:
        program = given[0].get(batch_size)
        setting = given[1] if program is None else None   # a setting, even a program's name
    if program is not None and program not in choice.SETTINGS:
        return replace(named_plan(program, *args, **options), choice="given")
    setting = program or setting or choice.setting()
    candidates = [] if setting == "rules" else candidate_plans(*args, **options)
    if not candidates:
        return plan_cell(*args, **options)
    if setting != "measure":
        return next((replace(c, choice="forced") for c in candidates if c.name == setting),
                    candidates[0])
    key = choice.cell_key(model, dataset.input_shape, batch_size, run.optimizer, dataset.task,
                          run.dtype, run.device, dataset.loss is not None, random, run.precision)

    def time_step(plan: CellPlan) -> Callable[[], int]:
        # a scratch stack: new tensors made from the model, as the real ones are, with the
        # real trials' metaparameters and masks; the step counter is the scratch stack's own
        trial_count = plan.trials_per_stack if plan.name == "func" else max(
            2, 2 * torch.get_num_threads())
        k = max(1, min(len(trials), trial_count))
        st = make_stacks(model, trials[:k], masks, run.seed, first_index, run.optimizer, k, run.device, run.dtype,
                         getattr(plan.program, "takes_module_state", False), random)[0]
        st.init_loss = torch.full_like(st.init_loss, float("inf"))  # no trial "diverges"
        scratch = replace(runner, program=plan.program, update_in_step=plan.update_in_step)
        # from the run's own first update: a run resumed from a state reads its data order
        # from there, and an update before it has no batch
        done = [runner.origin.step]

        def step() -> int:
            scratch.step(st, done[0])
            done[0] += 1
            device.synchronize(run.device)   # a GPU's step is done when its kernels are
            return k

        return step

    return choice.choose(candidates, key, time_step)[0]


def _advance(runner: _Runner, st: TrialStack, start: int, end: int, goal: Goal | None, record
             ) -> tuple[TrialStack, list[tuple[int, int, list[Tensor]]], list[int],
                        dict[int, int]]:
    """Run ``st`` from step ``start`` to the evaluation at ``end`` and evaluate it: the stack,
    its diverged trials as (step, id, parameters), the positions of its trials meeting the goal
    and their exact hit steps (:func:`_replay`). The replay's snapshot (not needed for a one-step
    interval, nor without a goal) is freed on return, so one stack's copy is alive at a time."""
    snapshot = st.clone() if end - start > 1 and goal is not None else None
    with runner.step_timer:
        st, dropped_all = runner.steps(st, start, end)
    met = record(st, end, end - start) if st.ids else []
    hits = _replay(runner, snapshot, [st.ids[r] for r in met], start, end, goal) if met else {}
    return st, dropped_all, met, hits


def _replay(runner: _Runner, snapshot: TrialStack | None, ids: list[int], start: int, end: int,
            goal: Goal) -> dict[int, int]:
    """Exact hit steps in (start, end] of trials ``ids``, which meet the goal at ``end``: rerun
    them from the snapshot at ``start`` evaluating after every step."""
    if snapshot is None or end - start == 1:
        return {i: end for i in ids}
    st = snapshot.select([snapshot.ids.index(i) for i in ids])  # a copy: select gathers
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


def _trial_tensors(st: TrialStack, r: int, copy: bool = True) -> list[Tensor]:
    """Row ``r``'s parameters, then its module buffers (if the stack keeps them)."""
    rows = [p[r] for p in st.params] + ([] if st.module is None else
                                        [b[r] for b in st.module.buffers])
    return [t.clone() for t in rows] if copy else rows


def _result(model: nn.Module, trials: list[Trial], rows, hit, diverged, taken, final,
            steps_run: int, program: str) -> TrialsResult:
    n = len(trials)
    status = ["diverged" if diverged[i] is not None else "reached" if hit[i] is not None
              else "not_reached" for i in range(n)]
    reached = [i for i in range(n) if status[i] == "reached"]
    best = min(reached, key=lambda i: (hit[i], i)) if reached else None
    curves = [Curve.from_rows(rs) for rs in rows]
    names = [name for name, _ in model.named_parameters()]
    params = {name: torch.stack([final[i][j] for i in range(n)]) for j, name in enumerate(names)}
    buffers = {name: torch.stack([final[i][len(names) + j] for i in range(n)])
               for j, (name, _) in enumerate(model.named_buffers())
               if len(final[0]) > len(names)}
    return TrialsResult(
        steps_to_result=None if best is None else hit[best], best=best,
        best_trial=None if best is None else trials[best], status=status, hit_step=list(hit),
        diverged_step=list(diverged), steps_taken=list(taken), curves=curves,
        steps_run=steps_run, trials=trials, program=program, params=params, buffers=buffers)
