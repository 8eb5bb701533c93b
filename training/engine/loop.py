"""The step loop of :func:`training.train_trials`: a group's trials, stacked, from their first
update to the last evaluation.

:func:`run` takes the checked call (:class:`Call`, passed whole) and returns its
:class:`Outcome`, the plain data :func:`training.train_trials` makes its result of:

1. **Strategy** (:func:`strategy`): the cell's program, trials per stack and examples per
   chunk, by the strategy's rules (:mod:`training.engine.strategy`) or measured among its
   candidates (:mod:`training.engine.choice`) with this loop's own step, every program built
   from one registry (:mod:`training.engine.programs`).
2. **Stacks** (:mod:`training.engine.stack`): the trials in stacks of that size, each
   trial's weights, mask, optimizer state, data seed and (delayed trials, apart from the
   others) queue of past weights stacked along dim 0.
3. **Steps** (:class:`Runner`): between two evaluations of ``run.eval_schedule``, every stack
   takes its updates in turn (:meth:`Runner.steps`); a trial whose mini-batch loss diverges
   leaves its stack before that update. A delayed trial's gradient is taken at its past
   weights (:mod:`training.delay`).
4. **Evaluations and replay** (:func:`advance`, :func:`replay`): at each evaluation a trial meeting
   the goal for the first time is replayed from the previous evaluation with an evaluation
   after every step (from a snapshot that copies the queue of past weights too), so its hit
   step is exact to the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from training import device
from training.config import RunConfig, Trial
from training.data.dataset import Dataset
from training.engine import choice
from training.engine.programs.base import Cell, Program
from training.engine.programs.common import stacked_loss_and_grad
from training.engine.resume import DataOrigin, end_state, load_stack
from training.engine.stack import TrialStack, make_stacks
from training.engine.strategy import Strategy, cell
from training.engine.watch import Watch, watched_steps
from training.goal import Goal, goal_metric, metric_value
from training.schedules.order import epoch_permutation
from training.state import TrainState

Tensor = torch.Tensor
# Validation examples times trials per evaluation forward pass: bounds the activation memory.
EVAL_BUDGET = 1 << 16
# Bytes of inputs gathered at once for the first mini-batch loss: resnet8's batch of 4096 CIFAR
# images is 50 MB a trial, so gathering 32 trials' at once took 1.6 GB.
GATHER_BUDGET = 64 << 20
# Bytes of batch indices ([K, N, B] int64) handed to one call of a program that takes K steps
# at once (training.engine.programs.fused.FusedProgram.train_steps): 32 trials at B = 4096 take
# 1 MB a step, so such a call covers 16 steps; at B = 64, up to 1,024.
INDEX_BUDGET = 16 << 20
# Curve rows of one trial: (step, mean training loss since the last evaluation, goal metric).
Rows = list[tuple[int, float, float]]


@dataclass(frozen=True)
class Call:
    """One call of :func:`training.train_trials` (or :func:`training.choose_program`) as it
    checked it: beyond the model, the data set and the run, everything the loop reads (the
    trainer's docstring says what each is). ``random``: whether the model draws random numbers
    (``training.randomness.draws``); ``program`` and ``setting``: how the cell's program is
    chosen (:func:`training.engine.choice.strategy`)."""

    trials: list[Trial]
    batch_size: int
    masks: dict[str, Tensor]
    goal: Goal | None
    first_index: int
    random: bool
    start: TrainState | None = None
    data_seeds: list[int] | None = None
    init_params: dict[str, Tensor] = field(default_factory=dict)
    trials_per_stack: int | None = None
    return_state: bool = False
    step_timer: contextlib.AbstractContextManager | None = None
    program: str | None = None
    setting: str | None = None
    watch: Watch | None = None


@dataclass(frozen=True)
class Outcome:
    """What the loop leaves of one call, per trial i: its curve ``rows[i]``, the exact step it
    first met the goal ``hit[i]`` (or None), the update it diverged at ``diverged[i]`` (or None),
    the updates it took ``taken[i]``, and its final parameters ``names``, then module buffers
    ``buffer_names`` (where the program kept them), ``final[i]``; ``steps_run``, the steps the
    group ran; the ``program`` that ran them and how it was chosen (``program_choice``,
    ``Strategy.choice``); with ``return_state``, the state after ``steps_run`` updates of the
    trials ``end_trials``."""

    names: list[str]
    buffer_names: list[str]
    rows: list[Rows]
    hit: list[int | None]
    diverged: list[int | None]
    taken: list[int]
    final: dict[int, list[Tensor]]
    steps_run: int
    program: str
    program_choice: str = "ruled"
    end_state: TrainState | None = None
    end_trials: tuple[int, ...] = ()


@dataclass
class Runner:
    """What every step of every stack of one group shares."""

    program: Program
    update_in_step: bool  # the program's train_step applies the update (Strategy.update_in_step)
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
        """[n, B] indices: batch ``step`` of every trial's own data order (training.schedules.order)."""
        n = self.x_train.shape[0]
        epoch, offset = self.origin.locate(step, self.batch_size, n)
        if st.perm_epoch != epoch:
            st.perm = torch.stack([epoch_permutation(s, epoch, n) for s in st.seeds]).to(
                self.x_train.device)
            st.perm_epoch = epoch
        return st.perm[:, offset:offset + self.batch_size]

    def gather(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs [n, B, ...] and targets [n, B] (per-token: [n, B, T]) of the rows ``idx``
        [n, B] of the training split (``index_select``: 5x faster than advanced indexing for
        this gather)."""
        flat = idx.reshape(-1)
        return (self.x_train.index_select(0, flat).view(*idx.shape, *self.x_train.shape[1:]),
                self.y_train.index_select(0, flat).view(*idx.shape, *self.y_train.shape[1:]))

    def initial_loss(self, st: TrialStack) -> Tensor:
        """Every trial's first mini-batch loss at its initial weights, [n] float64, computed a
        few trials at a time so that their gathered inputs stay within GATHER_BUDGET."""
        idx = self.batch_indices(st, 0)
        per_trial = idx.shape[1] * self.x_train[0].numel() * self.x_train.element_size()
        step = max(1, GATHER_BUDGET // max(per_trial, 1))
        losses = []
        for a in range(0, idx.shape[0], step):
            x, y = self.gather(idx[a:a + step])
            module = None if st.module is None else st.module.rows(a, a + step)
            out = self.program.forward([p[a:a + step] for p in st.params], x, module)
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
        buffers stay zero. A program that ``takes_many_steps`` takes up to INDEX_BUDGET's worth
        of steps a call (a stack of delayed trials too, where it ``takes_delays``); the others
        one step a call (:meth:`step`).
        """
        dropped: list[tuple[int, int, list[Tensor]]] = []
        if not (self.update_in_step and self.program.takes_many_steps and self.delays_inside(st)):
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
                [st.update(self.optimizer, t) for t in range(s, s + k)], st.limit(),
                *([] if st.delay is None else [st.delay.steps(s, k)]))
            taken = taken.tolist()
            keep = [r for r, t in enumerate(taken) if t == k]
            if len(keep) < len(taken):
                dropped += [(s + t, st.ids[r], st.row(r))
                            for r, t in enumerate(taken) if t < k]
                st = st.select(keep)
            # one step after the other in float64, as a step a call adds its losses
            for row in loss.double()[:, keep]:
                st.loss_sum += row
            s += k
        return st, dropped

    def delays_inside(self, st: TrialStack) -> bool:
        """Whether the program takes ``st``'s delays itself (always, for a stack without)."""
        return st.delay is None or self.program.takes_delays

    def step(self, st: TrialStack, step: int
             ) -> tuple[TrialStack, list[tuple[int, list[Tensor]]]]:
        """Apply update ``step`` (0-based) to every trial of ``st`` (see :meth:`steps`); its
        diverged trials are returned as (id, parameters before the update). Delayed trials
        (``st.delay``, :mod:`training.delay`) take the gradient at their past weights, and the
        loss there decides their divergence; the update, to the current weights and optimizer
        state, follows the program's gradients (inside a program that ``takes_delays``)."""
        limit = st.limit()
        grads = None
        if self.update_in_step and self.delays_inside(st):  # the update runs inside, for the
            # trials within their limit
            loss = self.program.train_step(st.params, self.x_train, self.y_train,
                                           self.batch_indices(st, step),
                                           st.update(self.optimizer, step), limit,
                                           st.module,
                                           *([] if st.delay is None else [st.delay.steps(step, 1)]))
        else:
            at = st.params if st.delay is None else st.delay.stale(st.params, step)
            loss, grads = self.program.loss_and_grads(
                at, *self.gather(self.batch_indices(st, step)), st.module)
        loss = loss.double()
        bad = ~(loss <= limit)
        dropped: list[tuple[int, list[Tensor]]] = []
        if bool(bad.any()):
            rows = bad.nonzero().flatten().tolist()
            dropped = [(st.ids[r], st.row(r)) for r in rows]
            keep = (~bad).nonzero().flatten().tolist()
            st = st.select(keep)
            if not keep:
                return st, dropped
            sel = torch.tensor(keep, device=loss.device)
            loss = loss[sel]
            grads = None if grads is None else [g.index_select(0, sel) for g in grads]
        st.loss_sum += loss
        if grads is not None and st.delay is None:
            st.update(self.optimizer, step).apply_(st.params, grads)
        elif grads is not None:   # the new weights straight into the queue's next slot, the
            # stack's weights its views from now on: no copy into the queue (a program that
            # takes delays keeps the weights itself)
            st.update(self.optimizer, step).apply_(st.params, grads, st.delay.slot(step + 1))
            st.params[:] = st.delay.slot(step + 1)
        return st, dropped

    @torch.no_grad()
    def evaluate(self, st: TrialStack) -> Tensor:
        """Goal metric of every trial on the validation split, [n] float64."""
        n = len(st.ids)
        chunk = max(1, EVAL_BUDGET // n)
        total = torch.zeros(n, dtype=torch.float64, device=self.x_val.device)
        for i in range(0, self.x_val.shape[0], chunk):
            x = self.x_val[i:i + chunk]
            out = self.program.forward(st.params, x.unsqueeze(0).expand(n, *x.shape),
                                       st.module)
            y = self.y_val[i:i + chunk]
            value = (metric_value(self.metric, out, y, self.task) if self.loss is None else
                     torch.stack([metric_value(self.metric, o, y, self.task, self.loss)
                                  for o in out]))
            total += value.double() * x.shape[0]
        return total / self.x_val.shape[0]


def run(model: nn.Module, dataset: Dataset, run: RunConfig, call: Call) -> Outcome:
    """Train the trials of ``call`` (:func:`training.train_trials`'s, checked) of ``model``
    together; see the module docstring."""
    start, goal, trials = call.start, call.goal, call.trials
    origin = DataOrigin.of(start)
    runner = _runner(dataset, run, call, origin)
    chosen = strategy_for(model, dataset, run, call, runner)
    runner.program, runner.update_in_step = chosen.program, chosen.update_in_step
    stacks = make_stacks(model, trials, call.masks, run.seed, call.first_index, run.optimizer,
                         call.trials_per_stack or chosen.trials_per_stack, run.device,
                         run.dtype, chosen.program.takes_module_state, call.random,
                         call.init_params, call.data_seeds)
    names = [name for name, _ in model.named_parameters()]
    buffer_names = [name for name, _ in model.named_buffers()]
    for st in stacks:
        if start is None:
            st.init_loss = runner.initial_loss(st)
        else:
            load_stack(st, start, names, buffer_names)

    n = len(trials)
    rows: list[Rows] = [[] for _ in range(n)]
    hit: list[int | None] = [None] * n
    diverged: list[int | None] = [None] * n
    taken = [0] * n
    final: dict[int, list[Tensor]] = {}

    def finish(st: TrialStack, r: int, step: int, copy: bool = True) -> None:
        final[st.ids[r]] = st.row(r, copy)
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
            st, dropped, met, hits = advance(runner, st, prev, e, goal, record,
                                             call.watch, names, buffer_names)
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
    # the result's stack is the only copy of the final weights (simple_cnn: 420 MB for 32 trials)
    for st in stacks:
        for r in range(len(st.ids)):
            finish(st, r, steps_run, copy=False)
        if not call.return_state:  # nor are the optimizer states: free them before that copy
            st.bufs = st.adam = None
    outcome = Outcome(names, buffer_names, rows, hit, diverged, taken, final, steps_run,
                      chosen.name, chosen.choice)
    if not call.return_state:
        return outcome
    state, ids = end_state(stacks, names, steps_run, origin, call.batch_size, dataset.n_train,
                           buffer_names)
    return replace(outcome, end_state=state, end_trials=ids)


def _runner(dataset: Dataset, run: RunConfig, call: Call, origin: DataOrigin) -> Runner:
    """The runner of a call, its program not chosen yet: the data set on the run's device."""
    data = dataset.to(run.device, run.dtype)
    return Runner(None, False, data.x_train, data.y_train, data.x_val, data.y_val, dataset.task,
                  goal_metric(call.goal, dataset.task), call.batch_size, run.optimizer,
                  run.dtype, origin, dataset.loss, call.step_timer or contextlib.nullcontext())


def strategy_for(model: nn.Module, dataset: Dataset, run: RunConfig, call: Call,
                 runner: Runner | None = None) -> Strategy:
    """The strategy :func:`run` trains ``call`` with (``runner``: the call's, else one made
    here), which ``training.choose_program`` asks for without training: that of the call's
    cell (:func:`training.engine.strategy.cell`), by :func:`strategy`."""
    if runner is None:
        runner = _runner(dataset, run, call, DataOrigin())
    c = cell(model, dataset.task, dataset.input_shape, call.batch_size, len(call.trials),
             run.dtype, run.device, run.optimizer, dataset.loss, call.random, run.precision)
    return strategy(c, run, call, runner)


def strategy(c: Cell, run: RunConfig, call: Call, runner: Runner) -> Strategy:
    """The strategy of cell ``c`` (:func:`training.engine.choice.strategy`): ``call.program``'s
    if it names one, else the rules' where they cover it (under ``call.setting``), or the
    fastest candidate, each timed by this loop's own step on a scratch stack."""
    trials = call.trials

    def time_step(candidate: Strategy) -> Callable[[], int]:
        # a scratch stack: new tensors made from the model, as the real ones are, with the
        # real trials' metaparameters and masks; the step counter is the scratch stack's own
        program = candidate.program
        k = max(1, min(len(trials), program.timed_trials(candidate.trials_per_stack)))
        st = make_stacks(c.model, trials[:k], call.masks, run.seed, call.first_index,
                         run.optimizer, k, run.device, run.dtype, program.takes_module_state,
                         c.random)[0]
        st.init_loss = torch.full_like(st.init_loss, float("inf"))  # no trial "diverges"
        scratch = replace(runner, program=program, update_in_step=candidate.update_in_step)
        # from the run's own first update: a run resumed from a state reads its data order
        # from there, and an update before it has no batch
        done = [runner.origin.step]

        def step() -> int:
            scratch.step(st, done[0])
            done[0] += 1
            device.synchronize(run.device)   # a GPU's step is done when its kernels are
            return k

        return step

    return choice.strategy(c, time_step, call.program, call.setting)


def advance(runner: Runner, st: TrialStack, start: int, end: int, goal: Goal | None, record,
            watch: Watch | None = None, names: Sequence[str] = (),
            buffer_names: Sequence[str] = ()
            ) -> tuple[TrialStack, list[tuple[int, int, list[Tensor]]], list[int],
                       dict[int, int]]:
    """Run ``st`` from step ``start`` to the evaluation at ``end`` and evaluate it: the stack,
    its diverged trials as (step, id, parameters), the positions of its trials meeting the goal
    and their exact hit steps (:func:`replay`). The replay's snapshot (not needed for a one-step
    interval, nor without a goal) is freed on return, so one stack's copy is alive at a time.
    ``watch``: called at its steps in (start, end] with the weights ``names`` and
    ``buffer_names`` (:func:`training.engine.watch.watched_steps`)."""
    snapshot = st.clone() if end - start > 1 and goal is not None else None
    st, dropped_all = watched_steps(runner, st, start, end, watch, names, buffer_names)
    met = record(st, end, end - start) if st.ids else []
    hits = replay(runner, snapshot, [st.ids[r] for r in met], start, end, goal) if met else {}
    return st, dropped_all, met, hits


def replay(runner: Runner, snapshot: TrialStack | None, ids: list[int], start: int, end: int,
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
