"""Training under a batch-size policy: the vectorized trainer segment by segment, the noise
monitor's reading between segments, the policy's decision after each.

Every ``every`` updates each running trial stops; where the policy reads the noise
(``reads_noise``), :func:`read_noise` measures the trial's weights with
:class:`theory.NoiseScaleMonitor` at its current batch size (``measure_steps`` batches drawn
without replacement from the training split by a generator of their own, on a copy of the
model: the run's data order, weights and random draws are left alone); the policy's
``decide(signal, current)`` gives the next (B, lr). A trial's lr enters as its own lr times the
policy's scale (``Setting.lr / Trial.lr``), its schedule's ``lr_factor(t)`` on top, exactly as
:func:`training.reference.train_schedule_reference` applies a segment's ``lr_scale``.

Vectorized where trials share their batch sizes: trials that have followed the same B(t) so
far share one :class:`training.state.TrainState` (their data positions agree) and train as one
:func:`training.schedule_trials.train_schedule_trials` call per segment; a decision that gives
them different batch sizes splits them into cohorts, which never merge again. A trial's run is
that of ``train_schedule_reference(..., schedule=PolicyTrial.schedule, trial_index=first_index +
i)`` (tested in float64). Goals and stopping: ``run.stop`` is ``"all"`` (each trial stops at
its own first hit, exact to the step) or ``"never"``; a segment also evaluates at its end, so
choose ``every`` a multiple of the evaluation interval to keep the run's evaluations as they are.

The readings cost ``measure_steps`` forward and backward passes of B examples per trial and
decision (``PolicyTrial.measured_examples``); the modelled wall time (:meth:`PolicyTrial.seconds`)
counts the training steps only. Readings are of the dense gradient (a mask's pruned weights
included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from training.config import ADAM_OPTIMIZERS, RunConfig, Trial, check_trials
from training.data import Dataset
from training.goal import loss_fn
from training.masks import check_mask
from training.schedule_trials import train_schedule_trials
from training.schedules.batch_schedule import BatchSchedule, BatchSegment
from training.schedules.order import trial_seed
from training.state import TrainState, model_at

from theory.errors import TheoryError, check_int
from theory.monitor.monitor import NoiseScaleMonitor
from theory.monitor.parts import NORM, PRECONDITIONED
from theory.policies.builtin import make_policy
from theory.policies.interface import Policy, Setting, Signal, StepTime, step_seconds

DEFAULT_MEASURE_STEPS = 4
# micro-batches per measured step where the per-example norms cannot read a layer
MICRO_BATCHES = 8


@dataclass(frozen=True)
class Decision:
    """One decision of a trial: at ``step`` (``examples`` seen) the reading ``b_simple`` (of the
    policy's ``part`` where it has one; nan: not measured) gave ``batch_size`` and ``lr_scale``
    (x the trial's lr) from then on."""

    step: int
    examples: int
    b_simple: float
    batch_size: int
    lr_scale: float


@dataclass(frozen=True, eq=False)
class PolicyTrial:
    """One trial under a policy: the ``schedule`` B(t) it followed (lr scales x its own lr),
    its ``decisions``, ``hit_step`` (first step meeting the goal, None: not reached),
    ``diverged_step``, ``steps_taken``, ``measured_examples`` (the readings' cost) and its
    final parameters ``params`` by name."""

    schedule: BatchSchedule
    decisions: tuple[Decision, ...]
    hit_step: int | None
    diverged_step: int | None
    steps_taken: int
    measured_examples: int
    params: Mapping[str, torch.Tensor]

    @property
    def examples_to_result(self) -> int | None:
        return None if self.hit_step is None else self.schedule.examples(self.hit_step)

    def seconds(self, step_time: StepTime | None, steps: int | None = None) -> float:
        """Modelled wall time of the first ``steps`` updates (default: to the goal; nan if not
        reached): sum over segments of steps x t(B)."""
        steps = self.hit_step if steps is None else steps
        if steps is None:
            return math.nan
        segs = self.schedule.segments
        total = 0.0
        for seg, nxt in zip(segs, segs[1:] + (None,)):
            end = steps if nxt is None else min(steps, nxt.start_step)
            total += max(0, end - seg.start_step) * step_seconds(step_time, seg.batch_size)
        return total


@dataclass
class _Cohort:
    members: list[int]
    state: TrainState | None
    batch_size: int


def train_under_policy(model: nn.Module, dataset: Dataset,
                       trials: Sequence[Trial | Mapping[str, Any]], run: RunConfig,
                       policy: Policy | str, *, every: int,
                       masks: Mapping[str, torch.Tensor] | None = None, first_index: int = 0,
                       data_seeds: Sequence[int] | None = None,
                       measure_steps: int = DEFAULT_MEASURE_STEPS,
                       monitor_options: Mapping[str, Any] | None = None,
                       trials_per_stack: int | None = None) -> list[PolicyTrial]:
    """Train N trials from ``run.batch_size`` under ``policy`` (a policy or its name, see
    :func:`theory.policies.builtin.make_policy`), deciding every ``every`` updates (module
    docstring). ``monitor_options``: extra :class:`theory.NoiseScaleMonitor` arguments (e.g.
    ``norm_layers=True`` for a policy reading ``"<norm layers>"``). One :class:`PolicyTrial` per
    trial, in order. A policy's ``part`` (an attribute, as the built-ins') sets what the
    monitor reads (:func:`part_options`)."""
    policy = make_policy(policy)
    trial_list = check_trials(trials)
    n = len(trial_list)
    every = check_int(every, "every")
    measure_steps = check_int(measure_steps, "measure_steps")
    if run.stop not in ("all", "never"):
        raise TheoryError(f"run.stop {run.stop!r}: each trial follows its own batch sizes; "
                          f"allowed: 'all' (each stops at its own goal) or 'never'")
    seeds = list(data_seeds) if data_seeds is not None else [
        trial_seed(run.seed, first_index + i) for i in range(n)]
    if len(seeds) != n:
        raise TheoryError(f"data_seeds must hold one seed per trial ({n}), got {len(seeds)}")
    mask_map = check_mask(masks, model, trials=n)
    dims = {name: p.dim() for name, p in model.named_parameters()}
    reads = bool(getattr(policy, "reads_noise", True))
    options = {**part_options(getattr(policy, "part", None), run.optimizer),
               **dict(monitor_options or {})}
    adam = options.get("optimizer") == "adam"   # built per reading from the trial's state
    if adam:
        del options["optimizer"]

    scale = [1.0] * n
    segments: list[list[BatchSegment]] = [[BatchSegment(0, run.batch_size)] for _ in range(n)]
    decisions: list[list[Decision]] = [[] for _ in range(n)]
    hit: list[int | None] = [None] * n
    diverged: list[int | None] = [None] * n
    taken, measured = [0] * n, [0] * n
    params: dict[int, dict[str, torch.Tensor]] = {}
    seen = [0] * n   # examples at the previous decision
    cohorts = [_Cohort(list(range(n)), None, run.batch_size)]
    while cohorts:
        nxt: list[_Cohort] = []
        for c in cohorts:
            step = 0 if c.state is None else c.state.step
            end = min(step + every, run.max_steps)
            sub = {k: m if m.dim() == dims[k] else m[c.members] for k, m in mask_map.items()}
            res = train_schedule_trials(
                model, dataset, [replace(trial_list[i], lr=trial_list[i].lr * scale[i])
                                 for i in c.members],
                replace(run, batch_size=c.batch_size, max_steps=end), masks=sub or None,
                start=c.state, data_seeds=[seeds[i] for i in c.members],
                first_index=first_index, trials_per_stack=trials_per_stack)
            for j, i in enumerate(c.members):
                hit[i] = hit[i] if hit[i] is not None else res.hit_step[j]
                diverged[i], taken[i] = res.diverged_step[j], res.steps_taken[j]
                params[i] = {k: v.clone() for k, v in res.state(j).items()}
            if res.steps_run >= run.max_steps or not res.end_trials:
                continue
            state, step = res.end_state, res.steps_run
            groups: dict[int, list[int]] = {}
            for j, i in enumerate(c.members[k] for k in res.end_trials):
                examples = BatchSchedule(tuple(segments[i])).examples(step)
                b_simple = math.nan
                signal = Signal(step, examples, previous_examples=seen[i])
                if reads:
                    reading = read_noise(model, dataset, state.trial(j), c.batch_size, run,
                                         steps=measure_steps, seed=seeds[i] + step,
                                         adam=trial_list[i] if adam else None, **options)
                    signal = Signal.of(reading, step, examples, seen[i])
                    part = getattr(policy, "part", None)   # what the policy reads
                    b_simple = signal.parts.get(part, math.nan) if part else signal.b_simple
                    measured[i] += measure_steps * c.batch_size
                lr = trial_list[i].lr
                new = policy.decide(signal, Setting(c.batch_size, lr * scale[i]))
                if not isinstance(new, Setting) or new.batch_size > dataset.n_train:
                    raise TheoryError(f"policy {type(policy).__name__} returned {new!r}; it must "
                                      f"return a Setting with batch_size <= the training set "
                                      f"({dataset.n_train})")
                scale[i], seen[i] = new.lr / lr, examples
                decisions[i].append(Decision(step, examples, b_simple, new.batch_size, scale[i]))
                last = segments[i][-1]
                if (new.batch_size, scale[i]) != (last.batch_size, last.lr_scale):
                    segments[i].append(BatchSegment(step, new.batch_size, scale[i]))
                groups.setdefault(new.batch_size, []).append(j)
            for b, js in groups.items():
                nxt.append(_Cohort([c.members[res.end_trials[j]] for j in js],
                                   _take(state, js), b))
        cohorts = nxt
    return [PolicyTrial(BatchSchedule(tuple(_merged(segments[i]))), tuple(decisions[i]), hit[i],
                        diverged[i], taken[i], measured[i], params[i]) for i in range(n)]


def _merged(segments: list[BatchSegment]) -> list[BatchSegment]:
    """Segments starting at one step keep the last (a decision at the run's first step)."""
    out: list[BatchSegment] = []
    for s in segments:
        if out and out[-1].start_step == s.start_step:
            out.pop()
        out.append(s)
    return out


def _take(state: TrainState, rows: Sequence[int]) -> TrainState:
    """The trials ``rows`` of ``state`` (their data position is the state's)."""
    idx = list(rows)
    pick = lambda d: {k: v[idx] for k, v in d.items()}   # noqa: E731
    return TrainState(pick(state.params), pick(state.buffers), state.step, state.position,
                      tuple(state.initial_loss[r] for r in idx), pick(state.moments),
                      pick(state.model_buffers),
                      tuple(state.rng_states[r] for r in idx) if state.rng_states else ())


def part_options(part: str | None, optimizer: str) -> dict[str, Any]:
    """The :class:`theory.NoiseScaleMonitor` options that give a policy's ``part``:
    ``"<preconditioned>"`` (Adam-type runs only; ``optimizer="adam"`` here asks
    :func:`read_noise` for Adam's state), ``"<norm layers>"``, a layer's name, or none."""
    if part is None:
        return {}
    if part == PRECONDITIONED:
        if optimizer not in ADAM_OPTIMIZERS:
            raise TheoryError(f"a policy reading {PRECONDITIONED!r} needs an Adam-type run "
                              f"({', '.join(ADAM_OPTIMIZERS)}), got {optimizer!r}")
        return {"optimizer": "adam"}
    return {"norm_layers": True} if part == NORM else {"per_layer": True}


def read_noise(model: nn.Module, dataset: Dataset, state: TrainState, batch_size: int,
               run: RunConfig, *, steps: int = DEFAULT_MEASURE_STEPS, seed: int = 0,
               adam: Trial | None = None, **monitor_options: Any) -> Any:
    """The :class:`theory.NoiseScaleMonitor` reading (window ``steps``) of one trial's weights
    (``state``, N = 1) at batch ``batch_size``: ``steps`` batches drawn without replacement
    from the training split (``population`` = its size) by a generator seeded ``seed``, each
    two accumulated forward and backward passes of its halves on a copy of ``model`` in train
    mode, read by the per-example estimator; where it cannot read a layer, ``MICRO_BATCHES``
    passes read by the micro-batch estimator. The caller's random state is left as it was. ``adam``: the trial whose Adam state (``state``'s m, v and step, its betas and
    eps) preconditions the gradients for the ``"<preconditioned>"`` part."""
    if state.n_trials != 1:
        raise TheoryError(f"read_noise reads one trial; state has {state.n_trials}")
    net = model_at(model, state, device=run.device, dtype=run.dtype).train()
    if adam is not None:
        monitor_options["optimizer"] = _adam(net, state, adam)
    data = dataset.to(run.device, run.dtype)
    criterion = loss_fn(dataset.task, dataset.loss)
    try:
        return _read(net, data, criterion, batch_size, steps, seed, monitor_options, 2)
    except TheoryError as exc:
        # a layer the per-example norms cannot read (a table read outside its call, a shared
        # parameter): the micro-batch estimator reads any layer
        if "method" in monitor_options or "micro_batch" not in str(exc):
            raise
        return _read(net, data, criterion, batch_size, steps, seed,
                     {**monitor_options, "method": "micro_batch"}, MICRO_BATCHES)


def _read(net: nn.Module, data: Dataset, criterion: Any, batch_size: int, steps: int, seed: int,
          monitor_options: Mapping[str, Any], passes: int) -> Any:
    """The monitor's reading of ``steps`` seeded batches of ``net`` (:func:`read_noise`), each
    split into ``passes`` accumulated backward passes (as many as its examples allow)."""
    gen = torch.Generator().manual_seed(int(seed))
    reading = None
    with torch.random.fork_rng(devices=[]), \
            NoiseScaleMonitor(net, window=steps, population=data.n_train,
                              **monitor_options) as monitor:
        torch.manual_seed(int(seed))
        for _ in range(steps):
            idx = torch.randperm(data.n_train, generator=gen)[:batch_size].to(data.x_train.device)
            # the per-example estimator reads the passes as one batch; the micro-batch one
            # compares them, so it gets more of them
            halves = idx.tensor_split(min(passes, batch_size // 2)) if batch_size >= 4 else (idx,)
            net.zero_grad(set_to_none=True)
            for half in halves:
                (criterion(net(data.x_train[half]), data.y_train[half]) / len(halves)).backward()
            reading = monitor.step(loss_scale=1.0 / len(halves))
    return reading


def _adam(net: nn.Module, state: TrainState, trial: Trial) -> torch.optim.Adam:
    """A ``torch.optim.Adam`` over ``net`` holding the trial's moments and step (what the
    monitor's preconditioned part reads: v, the step's bias correction, beta2 and eps)."""
    opt = torch.optim.Adam(net.parameters(), lr=1.0, betas=(trial.beta1, trial.beta2),
                           eps=trial.eps)
    for name, p in net.named_parameters():
        if name in state.moments:
            opt.state[p] = {"step": torch.tensor(float(state.step)),
                            "exp_avg": state.buffers[name][0].to(p).clone(),
                            "exp_avg_sq": state.moments[name][0].to(p).clone()}
    return opt
