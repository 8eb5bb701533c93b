"""The vectorized multi-trial trainer: N metaparameter points trained as one computation.

``train_trials`` stacks N copies of the model's parameters (``[N, *shape]``) and advances them
with one program per step, chosen for each (model, batch size) cell by
:func:`training.engine.strategy.ruled_strategy`: a compiled kernel, trials one after another through
oneDNN, or batched kernels over the stack (the programs of :mod:`training.engine.programs`); the
step loop is :mod:`training.engine.loop`. Each trial
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from training import device, randomness
from training.config import (
    RunConfig, Trial, check_batch_size, check_index, check_optimizer, check_run, check_trials,
)
from training.data.dataset import Dataset
from training.delay import refuse
from training.engine import choice, loop
from training.engine.watch import Watch
from training.engine.resume import check_data_seeds, check_init_params, check_start
from training.errors import ConfigError
from training.goal import as_goal
from training.masks import check_mask
from training.models import check_output, check_runnable
from training.results import Curve
from training.state import TrainState

Tensor = torch.Tensor


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
    program that computed the steps (a key of :data:`training.engine.programs.PROGRAMS`; ``batched`` where
    the compiled kernel could not be built; under a batch-size schedule, those of its segments,
    comma-separated). ``params``: final parameters stacked by name,
    ``[N, *shape]`` (:meth:`state` gives one trial's); ``buffers``: the module's final buffers
    stacked the same way (BatchNorm's running statistics; empty for the programs that run
    modules without state). ``program_choice``: how the program was chosen, "ruled" (the
    strategy rules), "measured" (timed on this machine, :mod:`training.engine.choice`),
    "forced" (``SPARSESCALE_PROGRAM_CHOICE=<program>``) or "given" (``train_trials(program=...)``).
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


def train_trials(model: nn.Module, dataset: Dataset, trials: Sequence[Trial | Mapping[str, Any]],
                 run: RunConfig, *, masks: Mapping[str, Tensor] | None = None,
                 trials_per_stack: int | None = None, first_index: int = 0,
                 start: TrainState | None = None, data_seeds: Sequence[int] | None = None,
                 return_state: bool = False,
                 step_timer: contextlib.AbstractContextManager | None = None,
                 init_params: Mapping[str, Tensor] | None = None,
                 program: str | None = None, watch: Watch | None = None) -> TrialsResult:
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
    ``trials_per_stack``: trials stacked per computation (default: the strategy of
    :func:`training.engine.strategy.ruled_strategy`, which also picks the program computing a stack's step);
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
    ``program``: the program to run (a key of :data:`training.engine.programs.PROGRAMS`)
    instead of choosing one (``TrialsResult.program_choice`` is then ``"given"``): what a study
    passes for a cell whose program its store recorded; a program that cannot run the cell here
    (``fused`` without the compiled kernel, ``func`` for a model ``torch.func`` cannot batch)
    raises :class:`ConfigError`. ``"rules"`` or ``"measure"``: choose under that setting
    instead of ``SPARSESCALE_PROGRAM_CHOICE``'s (:mod:`training.engine.choice`). None: the
    environment's setting (:func:`choose_program` says what it chooses), within
    :func:`given_programs` the program it gives for the batch size.
    ``watch``: a :class:`training.Watch`, called at its steps with every trial's weights before
    and after that update (a measurement taken inside the run instead of by a replay; the
    trials train as they would without it).
    A process that trains many groups should call
    :func:`training.processes.setup.setup_training_process` once (the ``sparsescale`` command and its
    worker pools do). The caller's generator state is left as it was.
    """
    with _checked(model, dataset, run, "train_trials") as random:
        call = _call(model, dataset, trials, run, masks, first_index, random, start=start,
                     data_seeds=data_seeds, init_params=init_params,
                     trials_per_stack=trials_per_stack, return_state=return_state,
                     step_timer=step_timer)
        if start is not None or return_state:
            refuse(call.trials, "train_trials with start or return_state",
                   "a TrainState holds no queue of past weights")
        out = loop.run(model, dataset, run,
                       replace(call, watch=None if watch is None else watch.checked(),
                               **_choosing(program, call.batch_size)))
    return _result(call.trials, out)


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
    with _checked(model, dataset, run, "choose_program") as random:
        call = _call(model, dataset, trials, run, masks, first_index, random)
        chosen = loop.strategy_for(model, dataset, run, replace(
            call, **(_choosing(None, call.batch_size) if setting is None
                     else {"setting": setting})))
    return chosen.name, chosen.choice


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


def _choosing(program: str | None, batch_size: int) -> dict[str, str | None]:
    """How a call's program is chosen: ``program`` as given, else :func:`given_programs`' for
    the batch size (a program), or their ``otherwise`` (a setting, even a program's name: that
    candidate where it is one); None: the environment's setting."""
    given = _GIVEN.get()
    if program is not None or given is None:
        return {"program": program}
    return {"program": given[0].get(batch_size), "setting": given[1]}


@contextlib.contextmanager
def _checked(model: nn.Module, dataset: Dataset, run: RunConfig, caller: str
             ) -> Iterator[bool]:
    """The checks of a trainer's model, data set and run; within: the run's precision, and
    whether the model draws random numbers (the process-wide generator is then preserved
    around the block)."""
    check_run(run, caller)
    check_runnable(model)   # before a forward pass, which would materialize lazy parameters
    check_output(model, dataset, caller)
    random = randomness.draws(model, dataset.x_train[:2])
    # the process-wide generator is only ever touched (under its lock) for a model that draws
    with (randomness.preserved(run.device) if random else contextlib.nullcontext(),
          device.precision(run.precision, run.device)):
        yield random


def _call(model: nn.Module, dataset: Dataset, trials: Sequence[Trial | Mapping[str, Any]],
          run: RunConfig, masks: Mapping[str, Tensor] | None, first_index: int, random: bool,
          *, start: TrainState | None = None, data_seeds: Sequence[int] | None = None,
          init_params: Mapping[str, Tensor] | None = None, trials_per_stack: int | None = None,
          **given: Any) -> loop.Call:
    """Every argument of a call beyond the model, data set and run, checked (one line each),
    as the loop takes them (:class:`training.engine.loop.Call`); ``given``: the call's other
    fields, as they are."""
    trial_list = check_trials(trials)
    check_optimizer(run.optimizer, [t.momentum for t in trial_list],
                    [t.weight_decay for t in trial_list])
    batch_size = check_batch_size(run.batch_size, dataset.n_train)
    if trials_per_stack is not None and trials_per_stack < 1:
        raise ConfigError(f"trials_per_stack must be >= 1, got {trials_per_stack}")
    n = len(trial_list)
    mask_map = check_mask(masks, model, trials=n)
    start = check_start(start, model, run.optimizer, n, run.max_steps)
    inits = check_init_params(init_params, model, n)
    if inits and start is not None:
        raise ConfigError("init_params and start exclude each other (a start state holds the "
                          "weights); allowed: one of them")
    return loop.Call(trial_list, batch_size, mask_map, as_goal(run.goal, dataset.task),
                     check_index(first_index, "first_index"), random, start,
                     check_data_seeds(data_seeds, n), inits, trials_per_stack, **given)


def _result(trials: list[Trial], out: loop.Outcome) -> TrialsResult:
    """The result of ``trials`` from what the loop left of them (``out``: their final
    parameters ``out.names``, then module buffers ``out.buffer_names`` where a program kept
    them, are ``out.final[i]``)."""
    n, names, final, hit, diverged = len(trials), out.names, out.final, out.hit, out.diverged
    status = ["diverged" if diverged[i] is not None else "reached" if hit[i] is not None
              else "not_reached" for i in range(n)]
    reached = [i for i in range(n) if status[i] == "reached"]
    best = min(reached, key=lambda i: (hit[i], i)) if reached else None
    curves = [Curve.from_rows(rs) for rs in out.rows]
    params = {name: torch.stack([final[i][j] for i in range(n)]) for j, name in enumerate(names)}
    buffers = {name: torch.stack([final[i][len(names) + j] for i in range(n)])
               for j, name in enumerate(out.buffer_names) if len(final[0]) > len(names)}
    return TrialsResult(
        steps_to_result=None if best is None else hit[best], best=best,
        best_trial=None if best is None else trials[best], status=status, hit_step=list(hit),
        diverged_step=list(diverged), steps_taken=list(out.taken), curves=curves,
        steps_run=out.steps_run, trials=trials, program=out.program, params=params,
        end_state=out.end_state, end_trials=out.end_trials, buffers=buffers,
        program_choice=out.program_choice)
