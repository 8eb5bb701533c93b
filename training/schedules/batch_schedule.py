"""A piecewise-constant batch-size schedule B(t), with the learning-rate scale that goes with it.

Segment j runs from update ``start_step`` (inclusive) to the next segment's start at batch size
``batch_size`` and learning rate ``lr * lr_scale`` (the trial's own lr schedule multiplies on
top). The last segment runs to the end of training. Built, for example, from a critical batch
measured along a run (``theory.estimators.branching.warmup_schedule``, Merrill et al. 2025's batch-size
warmup); a trainer reads it with :meth:`BatchSchedule.at`.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from training.config import is_int
from training.errors import ConfigError


@dataclass(frozen=True)
class BatchSegment:
    """From update ``start_step`` on: mini-batches of ``batch_size``, learning rate x ``lr_scale``."""

    start_step: int
    batch_size: int
    lr_scale: float = 1.0

    def __post_init__(self) -> None:
        for name, minimum in (("start_step", 0), ("batch_size", 1)):
            value = getattr(self, name)
            if not is_int(value) or value < minimum:
                raise ConfigError(f"BatchSegment {name} must be an integer >= {minimum}, got {value!r}")
            object.__setattr__(self, name, int(value))
        if not (isinstance(self.lr_scale, (int, float, np.floating)) and math.isfinite(self.lr_scale)
                and self.lr_scale > 0):
            raise ConfigError(f"BatchSegment lr_scale must be a positive finite number, got {self.lr_scale!r}")
        object.__setattr__(self, "lr_scale", float(self.lr_scale))


@dataclass(frozen=True)
class BatchSchedule:
    """Segments in order of ``start_step``; the first starts at update 0."""

    segments: tuple[BatchSegment, ...]

    def __post_init__(self) -> None:
        segs = tuple(self.segments)
        if not segs or not all(isinstance(s, BatchSegment) for s in segs):
            raise ConfigError("BatchSchedule segments must be a non-empty sequence of BatchSegment")
        if segs[0].start_step != 0:
            raise ConfigError(f"BatchSchedule must start at step 0, got start_step {segs[0].start_step}")
        starts = [s.start_step for s in segs]
        if any(b <= a for a, b in zip(starts, starts[1:])):
            raise ConfigError(f"BatchSchedule start steps must increase strictly, got {starts}")
        object.__setattr__(self, "segments", segs)

    @classmethod
    def constant(cls, batch_size: int) -> "BatchSchedule":
        """One batch size for the whole run (lr scale 1)."""
        return cls((BatchSegment(0, batch_size),))

    def at(self, step: int) -> BatchSegment:
        """The segment that update ``step`` (0-based) belongs to."""
        if step < 0:
            raise ConfigError(f"step must be >= 0, got {step}")
        return self.segments[bisect.bisect_right([s.start_step for s in self.segments], step) - 1]

    def examples(self, steps: int) -> int:
        """Training examples consumed by the first ``steps`` updates."""
        total = 0
        for seg, nxt in zip(self.segments, self.segments[1:] + (None,)):
            end = steps if nxt is None else min(steps, nxt.start_step)
            total += max(0, end - seg.start_step) * seg.batch_size
        return total
