"""Predicted time-to-result on k workers from a measured steps-to-result curve and a cost model.

A measured curve gives S(B), the steps to reach the goal at global batch B (Shallue et al.,
2019); a fitted :class:`training.distributed.costmodel.CostModel` gives the seconds per step t(B, k) on k
data-parallel workers. Assuming the steps do not depend on how the batch is split (which the
DDP equivalence test checks):

    T(B, k) = S(B) * t(B, k)                (wall-clock seconds to the goal)
    W(B, k) = k * T(B, k)                   (cost in worker-seconds)

For each k the fastest batch size is argmin_B T(B, k) over the measured B divisible by k. In the
perfect-scaling regime T falls as k grows; once S(B) flattens (B >> B_crit, McCandlish et al.,
2018) or the all-reduce term dominates, more workers only add worker-seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from training.distributed.costmodel import CostModel

from theory.errors import TheoryError


class WallTimeError(TheoryError):
    """Bad input to a time-to-result prediction: names the argument and what is allowed."""


@dataclass(frozen=True)
class WallTime:
    """Predicted time-to-result at global batch ``batch_size`` on ``workers`` workers."""

    batch_size: int
    workers: int
    steps: int
    step_time: float
    time: float
    worker_seconds: float

    @property
    def per_worker_batch(self) -> int:
        return self.batch_size // self.workers


@dataclass(frozen=True)
class WallTimePrediction:
    """All (B, k) predictions, ordered by k then B."""

    points: tuple[WallTime, ...]

    @property
    def workers(self) -> list[int]:
        return sorted({p.workers for p in self.points})

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({p.batch_size for p in self.points})

    def at(self, batch_size: int, workers: int) -> WallTime | None:
        return next((p for p in self.points
                     if p.batch_size == batch_size and p.workers == workers), None)

    def fastest(self, workers: int | None = None) -> WallTime:
        """The fastest point on ``workers`` workers (over batch sizes), or over everything."""
        pts = [p for p in self.points if workers is None or p.workers == workers]
        if not pts:
            raise WallTimeError(f"no prediction for workers={workers}; predicted: {self.workers}")
        return min(pts, key=lambda p: (p.time, p.worker_seconds))

    def best_by_workers(self) -> list[WallTime]:
        """For every k, its fastest batch size."""
        return [self.fastest(k) for k in self.workers]


def predict_time_to_result(steps_to_result: Mapping[int, int | None], cost: CostModel,
                           workers: Sequence[int] = (1, 2, 4, 8)) -> WallTimePrediction:
    """T(B, k) = S(B) t(B, k) and W = k T for every measured B (``None`` = goal not reached,
    skipped) and every k in ``workers`` that divides B."""
    if not steps_to_result:
        raise WallTimeError("steps_to_result is empty: give at least one batch size -> steps")
    ks = sorted(set(workers))
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise WallTimeError(f"workers must be integers >= 1, got {list(workers)!r}")
    points = []
    for k in ks:
        for b, s in sorted(steps_to_result.items()):
            if not isinstance(b, int) or b < 1:
                raise WallTimeError(f"steps_to_result keys are batch sizes (integers >= 1), "
                                    f"got {b!r}")
            if s is not None and (not isinstance(s, int) or s < 0):
                raise WallTimeError(f"steps_to_result[{b}] must be an integer >= 0 or None, "
                                    f"got {s!r}")
            if s is None or b % k:
                continue
            t = cost.step_time(b, k)
            points.append(WallTime(b, k, s, t, s * t, k * s * t))
    if not points:
        raise WallTimeError(f"no batch size in {sorted(steps_to_result)} both reached the goal and "
                            f"is divisible by a worker count in {ks}")
    return WallTimePrediction(tuple(points))


def _seconds(t: float) -> str:
    return f"{t:.3g} s" if t < 100 else f"{t:.0f} s"


def format_table(pred: WallTimePrediction) -> str:
    """Markdown: time-to-result (worker-seconds) for every B and k, then the fastest B per k."""
    ks = pred.workers
    lines = ["Time to result (worker-seconds) with global batch B on k workers:", "",
             "| B | steps | " + " | ".join(f"k = {k}" for k in ks) + " |",
             "|---|---|" + "---|" * len(ks)]
    for b in pred.batch_sizes:
        cells, steps = [], None
        for k in ks:
            p = pred.at(b, k)
            steps = p.steps if p else steps
            cells.append(f"{_seconds(p.time)} ({_seconds(p.worker_seconds)})" if p else "-")
        lines.append(f"| {b} | {steps} | " + " | ".join(cells) + " |")
    lines += ["", "| k | fastest B | B/k | steps | step ms | time to result | worker-seconds |",
              "|---|---|---|---|---|---|---|"]
    for p in pred.best_by_workers():
        lines.append(f"| {p.workers} | {p.batch_size} | {p.per_worker_batch} | {p.steps} | "
                     f"{p.step_time * 1e3:.3f} | {_seconds(p.time)} | "
                     f"{_seconds(p.worker_seconds)} |")
    return "\n".join(lines)
