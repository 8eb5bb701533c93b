"""A group's trials counted as Shallue et al. (2019) count them: only complete trials.

Shallue et al. take steps-to-result at each batch size over "the first 100 complete trials" of
the quasi-random search: a trial that diverged (infeasible) is not one of them. With
``complete_trials = true`` (:mod:`experiments.spec.tables.probes`) a group trains its ``trials``
Sobol points, counts those that did not diverge, and trains the next points of the same
sequence (:attr:`experiments.spec.plan.GroupPlan.reserve`, trial indices N, N + 1, ..., each
with its own data order) until ``trials`` of them completed or the reserve is spent.

What a trial's outcome is does not depend on which round trained it (a trial's result never
depends on the other trials of its call, ``training.train_trials``). Under ``stop = "first"``
the group ends at the first evaluation where any trial meets the goal: a later round trains at
most up to the evaluation where the rounds before it stopped, and at the end every trial is
read at the group's final stop E: a hit after E is "not_reached", a divergence after E did not
happen (that trial is complete), curves end at E, as one call with all the points would have
given them (up to a trial whose metric met the goal between two evaluations and left it again
before E, which one call would not have seen either way).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

import training
from training.results import Curve


@dataclass(frozen=True)
class GroupOutcome:
    """Every trial a group trained, in index order: its metaparameter point, ``status``
    (reached | not_reached | diverged), ``hit_step``, ``steps_taken`` and evaluation curve;
    the group's ``steps_to_result`` and ``best`` trial (None: none reached), the program that
    trained it (``training.TrialsResult.program``) and how many rounds it took."""

    points: tuple[Mapping[str, Any], ...]
    status: tuple[str, ...]
    hit_step: tuple[int | None, ...]
    steps_taken: tuple[int, ...]
    curves: tuple[Curve, ...]
    steps_to_result: int | None
    best: int | None
    program: str
    rounds: int = 1

    @property
    def complete(self) -> int:
        """Trials that did not diverge."""
        return sum(s != "diverged" for s in self.status)


@dataclass(frozen=True)
class _Trial:
    point: Mapping[str, Any]
    status: str
    hit: int | None
    diverged: int | None
    taken: int
    curve: Curve


def train_group(model: torch.nn.Module, dataset: training.Dataset,
                points: Sequence[Mapping[str, Any]], run: training.RunConfig,
                masks: Mapping[str, torch.Tensor] | None = None, complete: bool = False,
                reserve: Sequence[Mapping[str, Any]] = (),
                train: Callable[..., training.TrialsResult] = training.train_trials,
                init_params: Any = None, program: str | None = None) -> GroupOutcome:
    """Train ``points`` as one group under ``run``; with ``complete``, then the points of
    ``reserve`` in order, as many as trials diverged, until ``len(points)`` trials completed
    (module docstring). ``train``: the trainer (``training.train_trials``'s signature);
    ``init_params``: each trial's own initialization (``train_trials``'), only without
    ``complete`` (the spec refuses the two together); ``program``: the one every round runs
    (``train_trials``'), the cell's recorded program."""
    if complete and init_params is not None:
        raise training.ConfigError("complete trials with per-trial initializations: a "
                                   "replacement trial has no initialization of its own")
    trials: list[_Trial] = []
    stops: list[int] = []   # each round's last step when a trial of it met the goal
    programs: list[str] = []
    rounds, drawn = 0, 0
    todo = list(points)
    while todo:
        stop = min(stops) if stops and run.stop == "first" else None
        res = train(model, dataset, todo, run if stop is None else replace(run, max_steps=stop),
                    masks=masks, first_index=len(trials), init_params=init_params,
                    program=program)
        rounds += 1
        programs.append(res.program)
        trials += [_Trial(p, res.status[i], res.hit_step[i], res.diverged_step[i],
                          res.steps_taken[i], res.curves[i]) for i, p in enumerate(todo)]
        if res.steps_to_result is not None:
            stops.append(int(res.steps_run))
        if not complete:
            break
        end = min(stops) if stops and run.stop == "first" else None
        need = len(points) - sum(_status(t, end) != "diverged" for t in trials)
        todo = list(reserve[drawn:drawn + max(need, 0)])
        drawn += len(todo)
    end = min(stops) if stops and run.stop == "first" else None
    status = tuple(_status(t, end) for t in trials)
    hits = tuple(t.hit if s == "reached" else None for t, s in zip(trials, status))
    reached = [(h, i) for i, h in enumerate(hits) if h is not None]
    best = min(reached) if reached else None
    return GroupOutcome(
        points=tuple(t.point for t in trials), status=status, hit_step=hits,
        steps_taken=tuple(t.taken if end is None else min(t.taken, end) for t in trials),
        curves=tuple(t.curve if end is None else _until(t.curve, end) for t in trials),
        steps_to_result=None if best is None else best[0],
        best=None if best is None else best[1],
        program=",".join(dict.fromkeys(programs)), rounds=rounds)


def _status(t: _Trial, end: int | None) -> str:
    """A trial's status in a group that ended at step ``end`` (None: each at its own end)."""
    if end is None:
        return t.status
    if t.status == "reached":
        return "reached" if t.hit is not None and t.hit <= end else "not_reached"
    if t.status == "diverged":
        # diverged_step is the update that blew up (0-based): inside the group's run if < end
        return "diverged" if t.diverged is not None and t.diverged < end else "not_reached"
    return t.status


def _until(curve: Curve, end: int) -> Curve:
    """The evaluations of ``curve`` at steps <= ``end``."""
    keep = curve.step <= end
    return Curve(curve.step[keep], curve.train_loss[keep], curve.metric[keep])
