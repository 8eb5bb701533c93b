"""Benchmark: what delayed gradients (:mod:`training.delay`) cost ``train_trials``, the same
trials trained with delay tau against delay 0 in one process.

``sparsescale bench --delay 4 [--delay-kind fixed] [--programs batched,fused]``
(:mod:`experiments.cli.bench`). For each cell (model, batch size, program), the undelayed and
the delayed trainer run in interleaved rounds (:mod:`training.bench.rounds`), each timed by its
step loops alone (:class:`training.bench.measure.StepTimer`), with the trials of
:func:`training.bench.speed.bench_trials`; the delayed run gives every trial
``delay=tau, delay_kind=kind``. A round's *cost* is the undelayed trial-steps/s over the
delayed ones (1.00: free); the table gives the median round's (lower median) and the range.

What a delayed step adds (:class:`training.delay.DelayQueue`): a gather of the past weights
where the trials of a stack read different steps (``uniform``; else the gradient reads a view
of the ring); on the eager programs nothing more, the update writing its new weights straight
into the ring; on the compiled kernel (``fused``) a copy of each trial's updated weights into
the ring, in cache; for ``per_trial`` on the CPU, which updates inside its step, the loop's
stacked update after the program's gradients instead, one step a call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from training import data as data_mod
from training.bench.measure import CLOCKS, StepTimer
from training.bench.rounds import interleave, median_index
from training.bench.speed import vectorized


@dataclass(frozen=True)
class DelayRow:
    """One cell: the median round's trial-steps/s undelayed and delayed, each round's cost
    (undelayed rate over delayed), the program that ran both."""

    model: str
    batch_size: int
    trials: int
    program: str
    delay: int
    kind: str
    undelayed: float
    delayed: float
    cost_rounds: tuple[float, ...]

    @property
    def cost(self) -> float:
        """Undelayed over delayed trial-steps/s of the median round (1.0: the queue is free)."""
        return self.undelayed / self.delayed


def bench_delay(model: str, net: nn.Module, ds: data_mod.Dataset, batch_size: int,
                n_trials: int, delay: int, kind: str = "fixed", program: str | None = None,
                seconds: float = 1.0, rounds: int = 3, clock: str = "wall") -> DelayRow:
    """One :class:`DelayRow`: ``n_trials`` trials of ``net`` at ``batch_size`` on ``ds``,
    delay 0 and delay ``delay`` of ``kind``, in ``rounds`` interleaved rounds of about
    ``seconds / rounds`` each, on ``program`` (None: the rules' or measured choice)."""
    tick = CLOCKS[clock]
    ran: dict[str, str] = {}

    def run(tau: int):
        def steps(n: int) -> float:
            timer = StepTimer(tick)
            res = vectorized(net, ds, batch_size, n_trials, n, timer=timer, delay=tau,
                             delay_kind=kind, program=program)
            ran[str(tau)] = res.program
            return timer.seconds
        return steps

    measured = interleave({"0": run(0), str(delay): run(delay)}, seconds, rounds)
    plain = [r * n_trials for r in measured.rates("0")]
    late = [r * n_trials for r in measured.rates(str(delay))]
    costs = tuple(p / d for p, d in zip(plain, late))
    m = median_index(costs)
    return DelayRow(model, batch_size, n_trials, ran[str(delay)], delay, kind, plain[m],
                    late[m], costs)


def format_delay_table(rows: Sequence[DelayRow]) -> str:
    """The rows as a Markdown table: both rates of the median round, its cost and the rounds'
    range."""
    lines = ["| model | B | trials | program | delay | kind | tau = 0 trial-steps/s | "
             "delayed trial-steps/s | cost (median) | cost range |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        low, high = (min(r.cost_rounds), max(r.cost_rounds)) if r.cost_rounds else (
            math.nan, math.nan)
        lines.append(f"| {r.model} | {r.batch_size} | {r.trials} | {r.program} | {r.delay} | "
                     f"{r.kind} | {r.undelayed:.4g} | {r.delayed:.4g} | {r.cost:.2f}x | "
                     f"{low:.2f}-{high:.2f}x |")
    return "\n".join(lines)
