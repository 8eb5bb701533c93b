"""The runner's rounds: a study with a group-sequential stopping rule trains round by round and
stops at the first look that stops.

``[stopping] rule = "group_sequential"`` (:mod:`experiments.spec.tables.stopping`) splits the
seeds, in the spec's order, into ``rounds`` equal rounds; round k is every group (each level,
batch size) of its seeds. After round k is stored the runner takes look k on the pairs of rounds
1 .. k (:func:`experiments.report.design_view.looks`: the paired difference of mean log L at Lee
et al.'s stage, L taken inside the runs, against the boundary's corrected c_k,
:func:`theory.verdicts.sequential.look`); it stops where that look crosses its boundary, where
its repeated interval is narrower than the planned resolution (a corrected interval: its
coverage holds whatever the stopping), or at the last look. It never looks at a partial round,
and never on an uncorrected statistic. Every look taken is stored (the store's ``looks`` table,
the stopping one marked), so a rerun trains no round after it. A ``fixed`` rule, or none, trains
every group in one round: exactly the pairs it planned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from experiments.report.design_view import looks
from experiments.spec.study import Spec
from experiments.store.database import Store

T = TypeVar("T")


def sequential(spec: Spec) -> bool:
    """Whether ``spec`` trains round by round (a group-sequential stopping rule)."""
    return spec.stopping is not None and spec.stopping.rule == "group_sequential"


def round_seeds(spec: Spec) -> list[tuple[int, ...]]:
    """The seeds of each round, in the spec's order (one round without a sequential rule)."""
    if not sequential(spec):
        return [tuple(spec.seeds)]
    per = len(spec.seeds) // spec.stopping.rounds
    return [tuple(spec.seeds[k * per:(k + 1) * per]) for k in range(spec.stopping.rounds)]


def stopped_at(store: Store) -> int | None:
    """The look a stored study stopped at (None: it has not stopped)."""
    frame = store.frame("looks")
    stop = frame[frame.stop.astype(bool)] if len(frame) else frame
    return int(stop.look.iloc[0]) if len(stop) else None


def train_rounds(spec: Spec, store: Store, tasks: Sequence[T], seed_of: Callable[[T], int],
                 train: Callable[[list[T]], object]) -> int | None:
    """Train ``tasks`` (``train`` writes a list of them to ``store``) round by round (module
    docstring): after each round of a sequential rule, take its look and store the looks so
    far; return the look that stopped the study (None: no sequential rule, or no look stopped,
    e.g. too few pairs). Rounds after a stored stop are not trained."""
    if not sequential(spec):
        if tasks:
            train(list(tasks))
        return None
    done = stopped_at(store)
    if done is not None:
        return done
    for k, seeds in enumerate(round_seeds(spec), start=1):
        part = [t for t in tasks if seed_of(t) in seeds]
        if part:
            train(part)
        taken = looks(store.frame("stage_probes"), spec.stopping, spec.seeds)
        store.write_looks(taken)
        if taken and taken[-1].stop and taken[-1].look == k:
            return k
    return None
