"""Where a study's wall time goes: masks, training (per batch size), measurements, report.

``run_study`` times each phase it runs with a :class:`PhaseClock` and reads from its store every
finished group's own training time and trial-steps, summed per batch size, and the kernels that
trained them (:mod:`training.engine.strategy`), and the summed seconds of each kind of task
(:func:`task_seconds`: training groups, then each measurement's, e.g. probed runs and branching
measurements, :meth:`experiments.measurement.Measurement.seconds`); :func:`record`
writes them to ``timing.json`` in the run folder and prints the breakdown. Phase times are wall
clock of this invocation (a rerun that skips stored groups shows a short training phase); the
measurements (the probes, branching, the policies' shoot-out, a user's own) share one phase,
"measurements", because they run together in one pool. Task seconds are each task's own time summed over tasks (from the store, so a rerun
reports what the stored work cost), so with several workers they add up to more than their
phase's wall time; the probes' share of training compares like with like, summed task seconds
against summed group seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from experiments import measurement

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
    seconds, trial-steps, trial-steps per second and programs (``groups.program``)."""
    done = groups[groups.status == "done"]
    rows = []
    for batch_size, g in done.groupby("batch_size"):
        seconds, steps = float(g.wall_time.sum()), int(g.trial_steps.sum())
        rows.append({"batch_size": int(batch_size), "groups": len(g), "seconds": seconds,
                     "trial_steps": steps, "trial_steps_per_s": steps / seconds if seconds else 0,
                     "programs": sorted(str(k) for k in g.program.dropna().unique())})
    return rows


def summed(values: pd.Series) -> float | None:
    """Sum of the known values (None when none is known: a store written before the column)."""
    known = values.dropna()
    return float(known.sum()) if len(known) else None


def task_seconds(frame: Callable[[str], pd.DataFrame]) -> dict[str, Any]:
    """Summed seconds per kind of task of a store (``frame(table)`` reads its tables):
    ``training`` (finished groups, their ``wall_time``), then each registered measurement's
    kinds (:meth:`experiments.measurement.Measurement.seconds`: the probed runs, the branching
    measurements, ...), in the registry's order, each ``{"tasks", "seconds", "unit"}``
    (``seconds`` None where the store does not hold them); a kind with a ``share`` key also
    records its seconds / training seconds under it, and names it as its ``share`` (None when
    either is unknown or training is 0)."""
    groups = frame("groups")
    done = groups[groups.status == "done"]
    train = summed(done.wall_time) if len(done) else 0.0
    out: dict[str, Any] = {"training": {"tasks": len(done), "seconds": train, "unit": "group"}}
    for _, m in measurement.MEASURES.items():
        for kind, t in m.seconds(frame).items():
            out[kind] = {"tasks": t.tasks, "seconds": t.seconds, "unit": t.unit}
            if t.share is not None:
                out[kind]["share"] = t.share
                out[t.share] = t.seconds / train if train and t.seconds is not None else None
    return out


def _format_tasks(tasks: dict[str, Any]) -> str:
    """'training 5.0 s in 2 groups, probes 2.2 s in 3 runs (45 % of training), ...'."""
    def one(kind: str, t: dict[str, Any]) -> str:
        seconds = "? s" if t["seconds"] is None else f"{t['seconds']:.1f} s"
        share = tasks.get(t.get("share"))
        return (f"{kind} {seconds} in {t['tasks']} {t['unit']}{'' if t['tasks'] == 1 else 's'}"
                + ("" if share is None else f" ({100 * share:.0f} % of training)"))

    return ("task seconds (each task's own, summed over workers): "
            + ", ".join(one(k, t) for k, t in tasks.items() if isinstance(t, dict)))


def format_timing(timing: dict[str, Any]) -> str:
    """The breakdown as text: phases, summed task seconds, then training per batch size."""
    phases = timing["phases"]
    lines = ["wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
             + f" (total {sum(phases.values()):.1f} s)"]
    if timing.get("tasks"):
        lines.append(_format_tasks(timing["tasks"]))
    if timing["training"]:
        lines.append(f"{'batch':>6} {'groups':>6} {'group s':>9} {'trial-steps':>12} "
                     f"{'trial-steps/s':>13}  program")
        lines += [f"{r['batch_size']:>6} {r['groups']:>6} {r['seconds']:>9.1f} "
                  f"{r['trial_steps']:>12,} {r['trial_steps_per_s']:>13,.0f}  "
                  f"{', '.join(r.get('programs', r.get('kernels', []))) or '-'}"
                  for r in timing["training"]]
    return "\n".join(lines)


def record(run_dir: Path, clock: PhaseClock, quiet: bool = False,
           training: list[dict[str, Any]] | None = None,
           tasks: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``timing.json`` (phases of this invocation, ``training`` per batch size from
    :func:`training_by_batch_size`, ``tasks`` from :func:`task_seconds`; both empty for a study
    of sub-studies) into ``run_dir``, print the breakdown unless ``quiet``; return what was
    written."""
    timing = {"phases": {k: round(v, 3) for k, v in clock.phases.items()},
              "tasks": tasks or {}, "training": training or []}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / TIMING_FILE).write_text(json.dumps(timing, indent=2) + "\n")
    if not quiet:
        print(format_timing(timing))
    return timing
