"""The critical batch measured directly by branching from checkpoints (Merrill et al. 2025,
"Critical Batch Size Revisited"), and the batch-size warmup it suggests, on a real network.

:func:`branch_critical_batch` wires :mod:`theory.estimators.branching` (the rule, its intervals, checkpoints,
windows and lr scaling) to the trainers:

1. The base run (trial ``trial`` of ``run``: batch B, optimizer, data order of
   ``trial_seed(run.seed, trial_index)``) trains with ``training.train_trials`` to its goal step H
   (given, e.g. the study's steps-to-result, or found by running it), stopping at K checkpoints
   t_1 < ... < t_K (``theory.checkpoint_steps``: evenly spaced over [0, H]) and keeping the
   :class:`training.state.TrainState` at each.
2. For every checkpoint and every k in 1, 2, 4, ..., k_max: ONE vectorized group from that state
   (``train_trials(..., start=state)``) at batch k B for W / (k B) steps (W examples, default a
   fraction of the H B examples to the goal, ``theory.default_window``), whose trials are the lr
   multipliers m (default 0.5, 1, 2) x the branch seeds: lr = m x the base lr scaled by the
   optimizer's rule (``theory.branch_lrs``: x k for SGD-type, x sqrt(k) for Adam-type). Branch
   seed s reads its own data order from the checkpoint's position (``data_seeds``); seed 0 reads
   the base run's, so the k = 1, m = 1 branch of seed 0 IS the base run continued.
3. The held-out loss (cross-entropy or half squared error on the validation split) after the
   window fills ``branch_loss[t, k, m, seed]``; the k = 1, m = 1 branch of each seed is that
   seed's base loss (the comparison is paired per seed). ``theory.critical_batch`` gives CBS(t):
   the largest k B whose best multiplier's seed-mean loss is within (1 + eps) of the base's
   seed mean, with bootstrap intervals over the seeds.

The cost is counted in trial-steps (updates summed over trials): the base run's H plus every
branch's W / (k B), the unit of a sweep's ``groups.trial_steps``.

:func:`warmup_comparison` runs the warmup ``theory.warmup_schedule`` builds from CBS(t) (from each
checkpoint on, B(t) = the largest power of two <= CBS(t), capped; lr by the same rule) with the
vectorized schedule trainer, over several replicate data orders, against fixed batch sizes B, 2B,
... with the rule-scaled lr under the same examples budget, and reports steps- and
examples-to-result of the warmup and of the best fixed B (fewest median steps among those that
reached the goal in every replicate).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

import training
from theory.estimators.branching import (
    DEFAULT_CHECKPOINTS, DEFAULT_EPS, DEFAULT_MULTIPLIERS, DEFAULT_WINDOW_FRACTION, BranchingError,
    CriticalBatch, branch_factors, branch_lrs, checkpoint_steps, critical_batch, default_window,
    lr_scale, warmup_schedule,
)
from training.schedules.batch_schedule import BatchSchedule
from training.schedules.order import trial_seed
from training.schedule_trials import train_schedule_trials
from training.state import TrainState

DEFAULT_K_MAX = 64
DEFAULT_SEEDS = 3
# a goal that is never met: the branches evaluate the held-out loss and never stop early
_LOSS = training.Goal("loss", 0.0)


@dataclass(frozen=True, eq=False)
class BranchResult:
    """CBS(t) of one base run: ``critical`` (``theory.CriticalBatch``: steps, CBS, intervals,
    per-k gaps), the base run's ``goal_step`` H and ``window`` W (examples), the held-out losses
    ``base_loss`` [K, seeds] and ``branch_loss`` [K, ks, multipliers, seeds] (inf: diverged), and
    the cost in trial-steps: ``base_trial_steps`` (the base run to its checkpoints, plus the run
    that found H when it was not given) and ``branch_trial_steps``."""

    critical: CriticalBatch
    goal_step: int
    window: int
    base_loss: np.ndarray
    branch_loss: np.ndarray
    base_trial_steps: int
    branch_trial_steps: int

    @property
    def trial_steps(self) -> int:
        return self.base_trial_steps + self.branch_trial_steps


def branch_data_seeds(base_seed: int, n: int) -> list[int]:
    """Data seeds of ``n`` branch seeds: the base run's own, then independent ones."""
    return [int(base_seed)] + [trial_seed(base_seed, s) for s in range(1, n)]


def branch_critical_batch(model: torch.nn.Module, dataset: training.Dataset,
                          trial: training.Trial, run: training.RunConfig, *,
                          mask: Mapping[str, torch.Tensor] | None = None, trial_index: int = 0,
                          goal_step: int | None = None, checkpoints: int = DEFAULT_CHECKPOINTS,
                          k_max: int = DEFAULT_K_MAX, window: int | None = None,
                          window_fraction: float = DEFAULT_WINDOW_FRACTION,
                          eps: float = DEFAULT_EPS, seeds: int = DEFAULT_SEEDS,
                          multipliers: Sequence[float] = DEFAULT_MULTIPLIERS,
                          level: float = 0.9, steps: Sequence[int] | None = None,
                          base_only_at_k1: bool = False,
                          on_checkpoint: Callable[[int, TrainState], None] | None = None,
                          ) -> BranchResult:
    """CBS(t) along the base run ``trial`` / ``run`` (module docstring). ``goal_step``: the base
    run's steps-to-result H (None: run it to its goal within ``run.max_steps``); ``window``: W in
    examples (a multiple of ``k_max * run.batch_size``; None: ``window_fraction`` of H B);
    ``seeds``: branch seeds (1, or >= 3 for intervals); ``multipliers`` must include 1.

    ``steps``: the checkpoint steps themselves (increasing, in [0, H]) instead of ``checkpoints``
    evenly spaced ones. ``base_only_at_k1``: at k = 1 run only multiplier 1 (the base run's
    continuation, which the rule compares with): the other multipliers at k = 1 cannot change
    CBS, since k = 1 always passes, so this saves their cost; their entries stay inf.
    ``on_checkpoint(step, state)``: called with the base run's state at each checkpoint (e.g. to
    probe the weights there)."""
    trial = training.Trial.from_dict(trial)
    base_batch = run.batch_size
    ks = branch_factors(k_max)
    if k_max * base_batch > dataset.n_train:
        raise BranchingError(f"k_max * batch_size = {k_max * base_batch} exceeds the training set "
                             f"({dataset.n_train} examples); allowed: k_max <= {dataset.n_train // base_batch}")
    mults = [float(m) for m in multipliers]
    if 1.0 not in mults:
        raise BranchingError(f"multipliers must include 1 (the k = 1, multiplier 1 branch is the base "
                             f"run the rule compares with), got {list(multipliers)}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1 or seeds == 2:
        raise BranchingError(f"seeds must be 1 or an integer >= 3 (intervals need 3), got {seeds!r}")
    quiet = replace(run, stop="never", goal=None, eval_schedule=training.EvalSchedule(every=10**9))
    found = 0
    if goal_step is None:
        res = training.train_trials(model, dataset, [trial], replace(run, stop="first"), masks=mask,
                                    first_index=trial_index)
        if res.steps_to_result is None:
            raise BranchingError(f"the base run (lr {trial.lr}, batch {base_batch}) does not reach the goal "
                                 f"within {run.max_steps} steps; give goal_step or a trial that does")
        goal_step, found = int(res.steps_to_result), int(res.steps_run)
    steps = checkpoint_steps(int(goal_step), checkpoints) if steps is None else \
        _given_steps(steps, int(goal_step))
    window = default_window(int(goal_step) * base_batch, base_batch, int(k_max), window_fraction) \
        if window is None else window
    if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % (k_max * base_batch):
        raise BranchingError(f"window must be a positive multiple of k_max * batch_size ({k_max * base_batch} "
                             f"examples: whole steps at every branch batch), got {window!r}")

    data_seeds = branch_data_seeds(trial_seed(run.seed, trial_index), seeds)
    branch = np.full((len(steps), len(ks), len(mults), seeds), np.inf)
    state, branch_cost = None, 0
    for i, t in enumerate(steps):
        state = training.train_trials(model, dataset, [trial], replace(quiet, max_steps=int(t)), masks=mask,
                                      first_index=trial_index, start=state, return_state=True).end_state
        if on_checkpoint is not None:
            on_checkpoint(int(t), state)
        for j, k in enumerate(ks):
            b = int(k) * base_batch
            tried = [1.0] if base_only_at_k1 and k == 1 else mults
            lrs = branch_lrs(trial.lr, int(k), run.optimizer, tried)
            group = [replace(trial, lr=float(lr)) for _ in range(seeds) for lr in lrs]
            res = training.train_trials(
                model, dataset, group,
                replace(run, batch_size=b, goal=_LOSS, stop="never", max_steps=int(t) + window // b,
                        eval_schedule=training.EvalSchedule(every=10**9)),
                masks=mask, start=state, data_seeds=[s for s in data_seeds for _ in tried])
            branch_cost += sum(res.steps_taken) - int(t) * len(group)
            for r, (curve, status) in enumerate(zip(res.curves, res.status)):
                s, m = divmod(r, len(tried))
                if status != "diverged" and len(curve) and math.isfinite(curve.metric[-1]):
                    branch[i, j, mults.index(tried[m]), s] = float(curve.metric[-1])
    base = branch[:, 0, mults.index(1.0), :]
    if not np.all(np.isfinite(base)):
        raise BranchingError("the base run's continuation (k = 1, multiplier 1) diverged at a checkpoint")
    result = critical_batch(steps, base, branch, base_batch=base_batch, ks=ks, eps=eps, level=level)
    return BranchResult(critical=result, goal_step=int(goal_step), window=int(window), base_loss=base,
                        branch_loss=branch, base_trial_steps=found + int(steps[-1]),
                        branch_trial_steps=int(branch_cost))


def _given_steps(steps: Sequence[int], goal_step: int) -> np.ndarray:
    """Checkpoint steps given by the caller: distinct, increasing integers in [0, goal_step]."""
    t = np.asarray(steps)
    if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer) or np.any(np.diff(t) <= 0) \
            or t[0] < 0 or t[-1] > goal_step:
        raise BranchingError(f"steps must be increasing integers in [0, goal_step={goal_step}], "
                             f"got {list(steps)}")
    return t.astype(np.int64)


@dataclass(frozen=True, eq=False)
class WarmupResult:
    """The warmup against fixed batch sizes under one examples budget ``examples``.

    ``schedule``: the warmup's B(t); ``runs``: one row per (kind, batch_size, replicate) with
    ``kind`` in {"warmup", "fixed"} (warmup rows: batch_size = the schedule's largest),
    ``steps_to_result`` and ``examples_to_result`` (NaN: not reached in the budget) and
    ``max_steps``; ``best_fixed``: the fixed B with the fewest median steps among those that
    reached the goal in every replicate (None if none did); ``trial_steps``: the cost.
    """

    schedule: BatchSchedule
    examples: int
    runs: pd.DataFrame
    best_fixed: int | None
    trial_steps: int

    def summary(self, kind: str, batch_size: int | None = None) -> tuple[float, float, float, float, float, float]:
        """(median, min, max) of steps-to-result, then of examples-to-result, over replicates
        of the warmup (``kind="warmup"``) or of fixed ``batch_size``."""
        rows = self.runs[(self.runs.kind == kind) & ((self.runs.batch_size == batch_size) if kind == "fixed" else True)]
        out: list[float] = []
        for col in ("steps_to_result", "examples_to_result"):
            v = rows[col].to_numpy(float)
            out += [float(np.median(v)), float(np.min(v)), float(np.max(v))] if len(v) else [math.nan] * 3
        return tuple(out)


def steps_for_examples(schedule: BatchSchedule, examples: int) -> int:
    """The fewest updates of ``schedule`` that consume at least ``examples`` examples."""
    step, seen = 0, 0
    for seg, nxt in zip(schedule.segments, schedule.segments[1:] + (None,)):
        span = math.inf if nxt is None else nxt.start_step - seg.start_step
        take = min(span, math.ceil((examples - seen) / seg.batch_size))
        step, seen = step + take, seen + take * seg.batch_size
        if seen >= examples:
            return int(step)
    return int(step)


def warmup_comparison(model: torch.nn.Module, dataset: training.Dataset, trial: training.Trial,
                      run: training.RunConfig, critical: CriticalBatch, *,
                      mask: Mapping[str, torch.Tensor] | None = None, trial_index: int = 0,
                      replicates: int = DEFAULT_SEEDS, examples: int | None = None,
                      cap: int | None = None) -> WarmupResult:
    """Steps- and examples-to-result of the CBS(t) warmup (``theory.warmup_schedule``, capped at
    ``cap``, default the largest branch batch) and of fixed B = run.batch_size * 2^i up to the
    schedule's largest batch (lr x ``lr_scale``), ``replicates`` data orders each (the base run's
    and independent ones, :func:`branch_data_seeds`), every run under ``examples`` examples
    (default twice the base run's examples to its goal, the last checkpoint) and stopped at its
    own goal (``run.goal``)."""
    trial = training.Trial.from_dict(trial)
    base_batch = run.batch_size
    if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 1:
        raise BranchingError(f"replicates must be an integer >= 1, got {replicates!r}")
    top = min(cap or int(critical.ks[-1]) * base_batch, dataset.n_train)
    schedule = warmup_schedule(critical.examples, critical.critical_batch, base_batch=base_batch,
                               optimizer=run.optimizer, cap=top)
    budget = int(examples) if examples is not None else 2 * int(critical.examples[-1])
    if budget < 1:
        raise BranchingError(f"examples must be a positive budget, got {budget}")
    seeds = branch_data_seeds(trial_seed(run.seed, trial_index), replicates)
    largest = max(s.batch_size for s in schedule.segments)
    fixed = [base_batch * 2**i for i in range(int(math.log2(largest // base_batch)) + 1)]
    rows, cost = [], 0
    schedules = [("warmup", largest, schedule)] + [
        ("fixed", b, BatchSchedule(((replace(schedule.segments[0], batch_size=b,
                                             lr_scale=lr_scale(b / base_batch, run.optimizer))),)))
        for b in fixed]
    for kind, b, sched in schedules:
        max_steps = steps_for_examples(sched, budget)
        res = train_schedule_trials(model, dataset, [trial] * replicates,
                                    replace(run, stop="all", max_steps=max_steps), schedule=sched,
                                    masks=mask, data_seeds=seeds)
        cost += sum(res.steps_taken)
        for r, hit in enumerate(res.hit_step):
            rows.append({"kind": kind, "batch_size": b, "replicate": r, "max_steps": max_steps,
                         "steps_to_result": math.nan if hit is None else float(hit),
                         "examples_to_result": math.nan if hit is None else float(sched.examples(hit))})
    runs = pd.DataFrame(rows)
    fixed_rows = runs[runs.kind == "fixed"]
    reached = fixed_rows.groupby("batch_size").steps_to_result.agg(lambda v: v.notna().all())
    medians = fixed_rows.groupby("batch_size").steps_to_result.median()[reached]
    best = None if medians.empty else int(medians.idxmin())
    return WarmupResult(schedule=schedule, examples=budget, runs=runs, best_fixed=best, trial_steps=int(cost))
