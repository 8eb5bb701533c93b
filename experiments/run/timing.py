"""Where a study's wall time goes: masks, training (per batch size), probes, report.

``run_study`` times each phase it runs with a :class:`PhaseClock` and reads from its store every
finished group's own training time and trial-steps, summed per batch size, and the kernels that
trained them (:mod:`training.engine.cell_plan`); :func:`record` writes them to ``timing.json`` in the
run folder and prints the breakdown. Phase times are wall clock of this invocation (a rerun that skips stored groups shows a short training phase); the
per-batch-size group seconds are summed over groups, so with several workers they add up to
more than the training phase's wall time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

TIMING_FILE = "timing.json"


@dataclass
class PhaseClock:
    """Wall seconds per named phase, accumulated by :meth:`phase`."""

    phases: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start


def training_by_batch_size(groups: pd.DataFrame) -> list[dict[str, Any]]:
    """Per batch size of the store's ``groups`` table: finished groups, their summed training
    seconds, trial-steps, trial-steps per second and kernels."""
    done = groups[groups.status == "done"]
    rows = []
    for batch_size, g in done.groupby("batch_size"):
        seconds, steps = float(g.wall_time.sum()), int(g.trial_steps.sum())
        rows.append({"batch_size": int(batch_size), "groups": len(g), "seconds": seconds,
                     "trial_steps": steps, "trial_steps_per_s": steps / seconds if seconds else 0,
                     "kernels": sorted(str(k) for k in g.kernel.dropna().unique())})
    return rows


def format_timing(timing: dict[str, Any]) -> str:
    """The breakdown as text: phases, then training per batch size."""
    phases = timing["phases"]
    lines = ["wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
             + f" (total {sum(phases.values()):.1f} s)"]
    if timing["training"]:
        lines.append(f"{'batch':>6} {'groups':>6} {'group s':>9} {'trial-steps':>12} "
                     f"{'trial-steps/s':>13}  kernel")
        lines += [f"{r['batch_size']:>6} {r['groups']:>6} {r['seconds']:>9.1f} "
                  f"{r['trial_steps']:>12,} {r['trial_steps_per_s']:>13,.0f}  "
                  f"{', '.join(r['kernels']) or '-'}"
                  for r in timing["training"]]
    return "\n".join(lines)


def record(run_dir: Path, clock: PhaseClock, quiet: bool = False,
           training: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Write ``timing.json`` (phases of this invocation, ``training`` per batch size from
    :func:`training_by_batch_size`, empty for a study of sub-studies) into ``run_dir``, print
    the breakdown unless ``quiet``; return what was written."""
    timing = {"phases": {k: round(v, 3) for k, v in clock.phases.items()},
              "training": training or []}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / TIMING_FILE).write_text(json.dumps(timing, indent=2) + "\n")
    if not quiet:
        print(format_timing(timing))
    return timing
