"""The program of a cell no rule covers, chosen by measurement and cached per machine.

The strategy rules (:mod:`training.engine.strategy`) were written for the models the library
ships; for any other module (or a bundled one outside the compiled kernel's rule) the
candidates of :func:`training.engine.strategy.candidates` (the rules' strategy first, the
*default*; ``per_trial``; ``plain``, the plain loop's own program, always among them; ``func``
where ``torch.func`` can batch the model) are timed against each other, and one replaces the
default only when it is clearly faster.

**Timing.** :func:`choose` hands each candidate to the trainer's ``time_step`` (it runs the
trainer's own step on a scratch copy of a few trials: their own stacked weights and optimizer
state, their own generator states, made from the model like the real ones but never the real
trials' tensors, so nothing of the real run is touched). Each candidate takes one untimed step
(first-call costs); then the candidates are timed in interleaved rounds, one step of each per
round (:func:`measure_rounds`: ``MIN_ROUNDS`` rounds, up to ``ROUNDS`` within
``MEASURE_SECONDS``), so that a burst of other work on a shared machine falls on every
candidate of its round alike. Per round, each candidate's time is divided by the default's; a
candidate replaces the default only when the median of those ratios is below ``1 - MARGIN``
(10 %): a near-tie keeps the default. A candidate that fails (e.g. a ``torch.func`` batching
rule missing) is dropped, one whose first timed step is ``GIVE_UP`` times the fastest's is not
timed further.

**Why the margin.** The candidates round differently in float32 (another convolution layout,
chunk or vmap order), so the program decides a float32 run's numbers. A choice decided by noise
(per_trial 0.218 against plain 0.210 ms a trial-step, measured beside another job) made the
numbers depend on how busy the machine was when the cache was filled; a 10 % margin over
interleaved rounds is far outside that noise, and where the candidates are that close the
choice does not matter for speed either.

**The cache.** The choice is kept in ``<cache>/program-choices.json``
(``training.data.cache_dir``), keyed by :func:`cell_key`: the module's structure (``str(model)``,
the names, shapes and dtypes of its parameters and buffers), the input shape, batch size,
optimizer, task, dtype, device (and a GPU's name), torch's thread count, whether the data set
brings its own loss or the model draws random numbers, and the torch version; entries written
before the margin (without ``CACHE_VERSION``) are measured again. On a GPU each timed step ends
with ``torch.cuda.synchronize`` (the trainer's ``time_step``). A study pays for each cell once
per machine, and records each cell's program in its store, so that a resumed study, or its
groups on another machine, run the program its first groups ran
(``experiments.run.runner``).

**The setting.** ``program_choice``, one name for the study's spec key (``[executor]
program_choice``), the command line's ``--program-choice`` and the environment variable
``SPARSESCALE_PROGRAM_CHOICE`` (:func:`setting`): ``"measure"`` (the default) times the
candidates as above; ``"rules"`` never times anything (the rules' strategy everywhere, like
``torch.backends.cudnn.benchmark = False``: a run's program, hence its float32 numbers, depends
on the code and the machine's features only); a program's name runs that candidate wherever it
is one (how the tests run each of them).

**What it changes.** Speed only, in exact arithmetic: every program computes each trial's
gradient of its own mini-batch with the same update (float64 results agree with the plain
``torch.optim`` loop to 1e-12, tests/training/engine/test_choice.py). In float32 the programs
round differently, so a float32 trajectory depends on which program ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from training.data import cache_dir
from training.engine.programs.base import Cell
from training.engine.programs.registry import PROGRAMS
from training.engine.strategy import Strategy, candidates, named, rules
from training.errors import ConfigError

# A candidate replaces the default (the rules' strategy) only when it is this much faster.
MARGIN = 0.10
# Interleaved rounds of timed steps: at least MIN_ROUNDS, then more up to ROUNDS while the
# rounds so far took less than MEASURE_SECONDS.
MIN_ROUNDS = 3
ROUNDS = 7
MEASURE_SECONDS = 0.5
# a candidate whose first timed step is this many times the fastest's is not timed further (it
# cannot win; large cells would otherwise spend seconds on it)
GIVE_UP = 4.0
CACHE_NAME = "program-choices.json"
CACHE_VERSION = 2   # entries of another version (or none: before the margin) are measured again
ENV = "SPARSESCALE_PROGRAM_CHOICE"
SETTINGS = ("measure", "rules")

TimeStep = Callable[[Strategy], Callable[[], float]]


def check_setting(value: str, where: str = ENV) -> str:
    """``value`` as a program choice (``where`` names it in the error): "measure", "rules" or a
    program's name (:data:`training.engine.programs.registry.PROGRAMS`)."""
    value = str(value).strip() or "measure"
    if value not in (*SETTINGS, *PROGRAMS):
        raise ConfigError(f"{where}={value!r}; allowed: measure, rules, or a program "
                          f"({', '.join(PROGRAMS)})")
    return value


def setting() -> str:
    """``SPARSESCALE_PROGRAM_CHOICE``: "measure" (the default), "rules" (the rules' strategy
    everywhere, nothing timed), or a program's name (that candidate wherever it is one, e.g. to
    test it; else the rules')."""
    return check_setting(os.environ.get(ENV, "measure"))


def cache_path() -> Path:
    """The machine's cache of measured choices."""
    return cache_dir() / CACHE_NAME


def cell_key(model: nn.Module, input_shape: Sequence[int], batch_size: int, optimizer: str,
             task: str, dtype: torch.dtype, device: str | torch.device, own_loss: bool,
             random: bool, precision: str = "fp32") -> str:
    """The cache key of a cell: SHA-256 of the module's structure and the cell's settings (see
    the module docstring)."""
    parts = {
        "module": str(model),
        "parameters": [(n, list(p.shape), str(p.dtype)) for n, p in model.named_parameters()],
        "buffers": [(n, list(b.shape), str(b.dtype)) for n, b in model.named_buffers()],
        "input_shape": list(input_shape), "batch_size": int(batch_size),
        "optimizer": optimizer, "task": task, "dtype": str(dtype), "device": str(device),
        "threads": torch.get_num_threads(), "own_loss": bool(own_loss), "random": bool(random),
        "torch": torch.__version__,
    }
    if precision != "fp32":   # absent at the default: caches written before it stay valid
        parts["precision"] = precision
    if torch.device(device).type == "cuda":   # a cache may outlive the card it was timed on
        parts["device_name"] = torch.cuda.get_device_name(device)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _read(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):   # absent, unreadable or corrupt: measure again
        return {}
    return found if isinstance(found, dict) else {}


def _write(path: Path, key: str, entry: dict) -> None:
    """Add ``entry`` under ``key`` (atomically: a concurrent reader never sees half a file; a
    concurrent writer may drop the other's entry, which is then measured again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        table = _read(path)
        table[key] = entry
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(table, indent=1, sort_keys=True))
        os.replace(partial, path)
    except OSError:
        pass   # a read-only cache costs a measurement per process, never a failure


def measure_rounds(candidates: Sequence[Strategy], time_step: TimeStep,
                   clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds per trial-step of each candidate, one entry per interleaved round (see the
    module docstring): ``time_step(candidate)`` prepares a scratch stack and returns a function that
    runs one step of it and returns its trial count. A candidate that raises is left out; one
    whose first timed step is GIVE_UP times the fastest's keeps that one time."""
    steps: dict[str, Callable[[], float]] = {}
    for candidate in candidates:
        try:
            step = time_step(candidate)
            step()   # untimed: first-call costs
        except (RuntimeError, NotImplementedError, ValueError):
            continue   # e.g. no batching rule for one of the model's operations
        steps[candidate.name] = step
    times: dict[str, list[float]] = {name: [] for name in steps}
    spent = 0.0
    for k in range(ROUNDS):
        if k >= MIN_ROUNDS and spent >= MEASURE_SECONDS:
            break
        for name, step in steps.items():
            if k > 0 and times[name][0] > GIVE_UP * min(t[0] for t in times.values()):
                continue
            start = clock()
            trials = step()
            took = clock() - start
            spent += took
            times[name].append(took / trials)
    return {name: t for name, t in times.items() if t}


def decide(times: dict[str, list[float]], default: str) -> str:
    """The program that wins ``times`` (:func:`measure_rounds`): the candidate with the lowest
    median ratio to ``default`` over the rounds both ran, if that median is below
    ``1 - MARGIN``; else ``default``. Without the default's times, the lowest median."""
    if default not in times:
        return min(times, key=lambda name: statistics.median(times[name]))
    base = times[default]
    ratios = {name: statistics.median(t / b for t, b in zip(ts, base))
              for name, ts in times.items() if name != default}
    best = min(ratios, key=ratios.__getitem__, default=None)
    return best if best is not None and ratios[best] < 1.0 - MARGIN else default


def choose(candidates: Sequence[Strategy], key: str, time_step: TimeStep,
           path: Path | None = None, clock: Callable[[], float] = time.perf_counter
           ) -> tuple[Strategy, dict[str, float]]:
    """The program of a cell (marked ``choice="measured"``): the default (``candidates[0]``,
    the rules' strategy) unless another is faster by MARGIN (:func:`decide`), and the median
    seconds per trial-step measured for each (empty when the cache had the cell: ``key``, in
    ``path``, default :func:`cache_path`). If every candidate raises, the first is used."""
    path = cache_path() if path is None else path
    by_name = {c.name: c for c in candidates}
    cached = _read(path).get(key)
    if (isinstance(cached, dict) and cached.get("version") == CACHE_VERSION
            and cached.get("program") in by_name):
        return replace(by_name[cached["program"]], choice="measured"), {}
    times = measure_rounds(candidates, time_step, clock)
    if not times:
        return candidates[0], {}
    name = decide(times, candidates[0].name)
    seconds = {n: statistics.median(t) for n, t in times.items()}
    _write(path, key, {"program": name, "default": candidates[0].name,
                       "seconds_per_trial_step": seconds, "rounds": max(map(len, times.values())),
                       "margin": MARGIN, "version": CACHE_VERSION,
                       "measured": time.strftime("%Y-%m-%d %H:%M:%S")})
    return replace(by_name[name], choice="measured"), seconds


def strategy(cell: Cell, time_step: TimeStep, program: str | None = None,
             setting_: str | None = None) -> Strategy:
    """The strategy of ``cell``: ``program``'s if it names a program
    (:func:`training.engine.strategy.named`, ``choice="given"``); else, under ``program`` as a
    setting ("measure", "rules"), ``setting_`` (a setting, or a program's name: that candidate
    where it is one) or :func:`setting`'s, the rules' where they cover the cell, the candidate
    named, or the one :func:`choose` measures with ``time_step`` (it runs a candidate's step
    on a scratch copy of the first trials)."""
    if program is not None and program not in SETTINGS:
        return named(program, cell)
    chosen = program or setting_ or setting()
    found = [] if chosen == "rules" else candidates(cell)
    if not found:
        return rules(cell)
    if chosen != "measure":
        return next((replace(c, choice="forced") for c in found if c.name == chosen), found[0])
    key = cell_key(cell.model, cell.input_shape, cell.batch_size, cell.optimizer, cell.task,
                   cell.dtype, cell.device, cell.loss is not None, cell.random, cell.precision)
    return choose(found, key, time_step)[0]
