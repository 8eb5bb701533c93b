"""Interleaved rounds: how ``sparsescale bench`` times two (or more) trainers against each other
in one process, so that the ratio of their rates is a same-moment measurement rather than two
measurements taken minutes apart.

A *run* is one call ``run(steps)`` of a trainer; it returns the seconds its step loop took, timed
by the trainer itself (:class:`training.bench.measure.StepTimer`: from just before its first
update to just after its last, the device's queue drained), so that what a run pays once —
building the model copy or the trial stacks, the program choice, evaluations, copying results —
is never in the rate, and no rate is a difference of two long runs.

The protocol (:func:`interleave`):

1. **Warm-up**, each trainer in turn, untimed for the result: a one-step run (one-off imports,
   kernel builds, the program choice of a vectorized cell), then runs grown until one's step loop
   lasts a quarter of a round; its per-step time fixes the trainer's steps per round (a one-step
   run sets it only if it lasts a whole round: its time includes the one-off costs).
2. **Rounds**: ``rounds`` times, every trainer runs once, in the order given (plain, vectorized,
   plain, vectorized, ...). A round's step loops each last about ``seconds / rounds`` (at least
   one step). A round's ratio compares rates measured seconds apart, under the same load.

The caller reports the median of the per-round ratios (:func:`median_index`: the lower median,
so that the reported ratio is one round's, with that round's rates) and their range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from training.errors import ConfigError

# a run of ``steps`` updates -> the seconds its step loop took
Run = Callable[[int], float]
MAX_STEPS = 1 << 20
WARMUP_SHARE = 0.25   # a warm-up ends once a run's step loop lasts this share of a round


@dataclass(frozen=True)
class Rounds:
    """What :func:`interleave` measured: per trainer, the steps of each of its timed runs (one
    per round) and the seconds their step loops took; ``order``: the trainers' names in the
    order they ran, warm-up runs included (name, steps)."""

    steps: dict[str, int]
    seconds: dict[str, tuple[float, ...]]
    order: tuple[tuple[str, int], ...] = ()

    def rates(self, name: str) -> list[float]:
        """Steps per second of ``name`` in each round."""
        return [self.steps[name] / t if t > 0 else math.inf for t in self.seconds[name]]

    @property
    def count(self) -> int:
        return len(next(iter(self.seconds.values()), ()))


def warm_up(run: Run, round_seconds: float, name: str = "", order: list | None = None) -> int:
    """Warm ``run`` up and return its steps per round: a one-step run, then runs grown (at
    least doubling, to the estimated half-round) until one lasts WARMUP_SHARE of
    ``round_seconds``; the steps that fill ``round_seconds`` at that run's per-step time (at least
    one). The one-step run's time carries the one-off costs of a first call, so it sets the
    steps only when it lasts a whole round by itself (a step that long runs once a round
    whatever its one-off share). ``order`` collects (name, steps) of each run."""
    steps, first = 1, True
    while True:
        took = run(steps)
        if order is not None:
            order.append((name, steps))
        enough = round_seconds if first else WARMUP_SHARE * round_seconds
        if took >= enough or steps >= MAX_STEPS:
            break
        first = False
        # the first run's one-off costs make its per-step time an over-estimate: safe
        grown = 10 * steps if took <= 0 else math.ceil(0.5 * round_seconds * steps / took)
        steps = min(MAX_STEPS, max(2 * steps, grown))
    return max(1, min(MAX_STEPS, round(round_seconds * steps / took) if took > 0 else steps))


def interleave(runs: Mapping[str, Run], seconds: float, rounds: int = 3) -> Rounds:
    """Time the trainers ``runs`` (name -> run) in ``rounds`` interleaved rounds after a warm-up
    of each (see the module docstring): every trainer's step loops total about ``seconds``
    over the rounds. Raises ConfigError for ``rounds`` < 1 or ``seconds`` <= 0."""
    if rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {rounds}")
    if not seconds > 0:
        raise ConfigError(f"seconds must be > 0, got {seconds}")
    per_round = seconds / rounds
    order: list[tuple[str, int]] = []
    steps = {name: warm_up(run, per_round, name, order) for name, run in runs.items()}
    took: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            took[name].append(run(steps[name]))
            order.append((name, steps[name]))
    return Rounds(steps, {name: tuple(t) for name, t in took.items()}, tuple(order))


def median_index(values: Sequence[float]) -> int:
    """Index of the lower median of ``values`` (the middle one of an odd count): a value that
    was measured, so the rates of its round can be reported beside it."""
    if not values:
        raise ConfigError("median of no values")
    ranked = sorted(range(len(values)), key=lambda i: values[i])
    return ranked[(len(values) - 1) // 2]
