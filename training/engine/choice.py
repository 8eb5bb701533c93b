"""The program of a cell no rule covers, chosen by measurement and cached per machine.

The strategy rules (:mod:`training.engine.strategy`) were written for the models the
library ships; for any other module (or a bundled one outside the compiled kernel's rule) the
candidates of :func:`training.engine.strategy.candidate_strategies` (``per_trial``, ``plain``, the
plain loop's own program, which is always among them, and ``func`` where ``torch.func`` can
batch the model) are each timed for a few training steps, and the fastest per trial-step wins.

**Timing.** :func:`choose` hands each candidate to the trainer's ``time_step`` (it runs the
trainer's own step on a scratch copy of a few trials: their own stacked weights and optimizer
state, their own generator states, made from the model like the real ones but never the real
trials' tensors, so nothing of the real run is touched and its results are the same whichever
program wins). A candidate takes one untimed step (first-call costs), then its per-step times
are measured up to ``MEASURE_STEPS`` steps or ``MEASURE_SECONDS``, and the fastest step counts
(the least disturbed by other work on a shared machine). A candidate that fails (e.g. a
``torch.func`` batching rule missing) is dropped.

**The cache.** The winner is kept in ``<cache>/program-choices.json``
(``training.data.cache_dir``), keyed by :func:`cell_key`: the module's structure (``str(model)``,
the names, shapes and dtypes of its parameters and buffers), the input shape, batch size,
optimizer, task, dtype, device (and a GPU's name), torch's thread count, whether the data set
brings its own loss or the model draws random numbers, and the torch version. On a GPU each
timed step ends with ``torch.cuda.synchronize`` (the trainer's ``time_step``). A study pays for each cell once per
machine; a change of the module's structure measures again. ``SPARSESCALE_CHOICE=rules`` turns
measuring off (the rules' strategy everywhere); ``SPARSESCALE_CHOICE=<program>`` runs that
candidate wherever it is one (how the tests run each of them).

**What it changes.** Speed only, in exact arithmetic: every program computes each trial's
gradient of its own mini-batch with the same update (float64 results agree with the plain
``torch.optim`` loop to 1e-12, tests/training/engine/test_choice.py). In float32 the programs
round differently (another convolution layout, chunk or vmap order), so a float32 trajectory
depends on which program a machine chose; the cache keeps that choice fixed on one machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from training.data import cache_dir
from training.engine.strategy import Strategy, candidates, rules
from training.engine.programs.base import Cell
from training.engine.programs.registry import PROGRAMS
from training.errors import ConfigError

MEASURE_STEPS = 3
MEASURE_SECONDS = 0.3
# a candidate whose untimed first step is this many times the best per-step time so far is not
# timed further (it cannot win; large cells would otherwise spend seconds on it)
GIVE_UP = 4.0
CACHE_NAME = "program-choices.json"

TimeStep = Callable[[Strategy], Callable[[], float]]


def setting() -> str:
    """``SPARSESCALE_CHOICE``: "measure" (the default), "rules" (the rules' strategy everywhere),
    or a program's name (that candidate wherever it is one, e.g. to test it; else the rules')."""
    value = os.environ.get("SPARSESCALE_CHOICE", "measure").strip() or "measure"
    if value not in ("measure", "rules", *PROGRAMS):
        raise ConfigError(f"SPARSESCALE_CHOICE={value!r}; allowed: measure, rules, or a program "
                          f"({', '.join(PROGRAMS)})")
    return value


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


def measure(candidate: Strategy, time_step: TimeStep, best: float,
            clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per trial-step of ``candidate``: ``time_step(candidate)`` prepares a scratch stack and
    returns a function running one step of it and returning its trial count; the first step is
    untimed, then the fastest of up to MEASURE_STEPS steps (within MEASURE_SECONDS) counts."""
    step = time_step(candidate)
    start = clock()
    trials = step()
    first = (clock() - start) / trials
    if first > GIVE_UP * best:
        return first
    fastest, spent = float("inf"), 0.0
    for _ in range(MEASURE_STEPS):
        start = clock()
        trials = step()
        took = clock() - start
        spent += took
        fastest = min(fastest, took / trials)
        if spent >= MEASURE_SECONDS:
            break
    return fastest


def choose(candidates: Sequence[Strategy], key: str, time_step: TimeStep,
           path: Path | None = None, clock: Callable[[], float] = time.perf_counter
           ) -> tuple[Strategy, dict[str, float]]:
    """The fastest of ``candidates`` (marked ``choice="measured"``) and the seconds per
    trial-step measured for each (empty when the cache had the cell: ``key``, in ``path``,
    default :func:`cache_path`). A candidate that raises while timed is dropped; if all do,
    the first (the rules' strategy) is used."""
    path = cache_path() if path is None else path
    by_name = {c.name: c for c in candidates}
    cached = _read(path).get(key)
    if isinstance(cached, dict) and cached.get("program") in by_name:
        return replace(by_name[cached["program"]], choice="measured"), {}
    seconds: dict[str, float] = {}
    for candidate in candidates:
        try:
            seconds[candidate.name] = measure(candidate, time_step, min(seconds.values(), default=math.inf),
                                         clock)
        except (RuntimeError, NotImplementedError, ValueError):
            continue   # e.g. no batching rule for one of the model's operations
    if not seconds:
        return candidates[0], {}
    name = min(seconds, key=seconds.__getitem__)
    _write(path, key, {"program": name, "seconds_per_trial_step": seconds,
                       "measured": time.strftime("%Y-%m-%d %H:%M:%S")})
    return replace(by_name[name], choice="measured"), seconds


def strategy(cell: Cell, time_step: TimeStep) -> Strategy:
    """The strategy of ``cell``: the rules' where they cover it, else, as :func:`setting` says, the
    fastest candidate measured by ``time_step`` (:func:`choose`; it runs a candidate's step on
    a scratch copy of the first trials), the candidate named, or the rules' strategy."""
    setting_ = setting()
    found = [] if setting_ == "rules" else candidates(cell)
    if not found:
        return rules(cell)
    if setting_ != "measure":
        return next((replace(c, choice="forced") for c in found if c.name == setting_), found[0])
    key = cell_key(cell.model, cell.input_shape, cell.batch_size, cell.optimizer, cell.task,
                   cell.dtype, cell.device, cell.loss is not None, cell.random, cell.precision)
    return choose(found, key, time_step)[0]
