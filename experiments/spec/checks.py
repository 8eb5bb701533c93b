"""Checks of study-spec values, and the spec's top-level keys: every problem becomes one line
naming the key path, what was found and what is allowed (with the closest valid name for a
mistyped one).

:class:`Checker` collects the problems of a whole spec so validation never stops at the first
one; the parsers of the top-level keys here (the optimizers, batch sizes, sparsity levels,
seeds, the trial rules ``stop`` and ``complete_trials``) return the parsed value, or None after
recording why not. Each table has its own module (:mod:`experiments.spec.tables`), and
:func:`experiments.spec.study.validate` composes them all.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from training.config import OPTIMIZERS
from training.delay import DELAY_KINDS
from training.data import list_datasets
from training.models import list_models
from training.registry import did_you_mean


class Checker:
    """Collects problems; helpers return a value or None after recording a problem."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, path: str, msg: str) -> None:
        self.problems.append(f"{path}: {msg}")

    def keys(self, table: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
        for key in table:
            if key not in allowed:
                self.add(key_path(path, key),
                         f"unknown key{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")

    def plain(self, value: Any, path: str) -> None:
        """Options are passed on as JSON (the spec hash): strings, booleans, integers, finite
        floats, lists and tables only (TOML dates and nan / inf are refused)."""
        if isinstance(value, dict):
            for k, v in value.items():
                self.plain(v, key_path(path, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self.plain(v, f"{path}[{i}]")
        elif not (isinstance(value, (str, int)) or (isinstance(value, float)
                                                    and math.isfinite(value))):
            self.add(path, f"found {value!r}; allowed: strings, numbers (finite), booleans, "
                           "lists and tables")

    def table(self, d: Mapping[str, Any], key: str, path: str, required: bool = False
              ) -> dict[str, Any] | None:
        if key not in d:
            if required:
                self.add(path, "missing (a table is required)")
            return {} if not required else None
        value = d[key]
        if not isinstance(value, dict):
            self.add(path, f"expected a table, found {value!r}")
            return None
        return value

    def optional_table(self, d: Mapping[str, Any], key: str, allowed: tuple[str, ...]
                       ) -> dict[str, Any] | None:
        """The table ``d[key]`` of a spec that may leave it out, its keys checked against
        ``allowed``; None when it is absent or not a table (the latter recorded)."""
        if key not in d:
            return None
        table = self.table(d, key, key)
        if table is not None:
            self.keys(table, key, allowed)
        return table

    def choice(self, value: Any, path: str, allowed: list[str] | tuple[str, ...]) -> str | None:
        if value is None:   # TOML has no null: None means the key is missing
            self.add(path, f"missing; allowed: {', '.join(allowed)}")
            return None
        if not isinstance(value, str) or value not in allowed:
            self.add(path, f"found {value!r}{did_you_mean(str(value), allowed)}; "
                           f"allowed: {', '.join(allowed)}")
            return None
        return value

    def integer(self, value: Any, path: str, lo: int | None = None,
                hi: int | None = None) -> int | None:
        bound = (f" in [{lo}, {hi}]" if hi is not None else f" >= {lo}") if lo is not None else ""
        if value is None:
            self.add(path, f"missing; allowed: an integer{bound}")
            return None
        if (isinstance(value, bool) or not isinstance(value, int) or (lo is not None and value < lo)
                or (hi is not None and value > hi)):
            self.add(path, f"found {value!r}; allowed: an integer{bound}")
            return None
        return value

    def number(self, value: Any, path: str, lo: float | None = None, hi: float | None = None,
               hi_open: bool = False, lo_open: bool = False) -> float | None:
        if value is None:
            self.add(path, "missing; allowed: a finite number")
            return None
        ok = (not isinstance(value, bool) and isinstance(value, (int, float))
              and math.isfinite(value))
        if ok and lo is not None:
            ok = value > lo if lo_open else value >= lo
        if ok and hi is not None:
            ok = value < hi if hi_open else value <= hi
        if not ok:
            rng = ""
            if lo is not None or hi is not None:
                rng = (f" in {'(' if lo_open else '['}{lo if lo is not None else '-inf'}, "
                       f"{hi if hi is not None else 'inf'}{')' if hi_open else ']'}")
            self.add(path, f"found {value!r}; allowed: a finite number{rng}")
            return None
        return float(value)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_path(path: str, key: str) -> str:
    """``path.key``, the key quoted as in TOML when it is not a bare key (e.g. holds a newline)."""
    name = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
    return f"{path}.{name}" if path else name


def batch_sizes(ck: Checker, raw: Any) -> tuple[int, ...] | None:
    """Distinct batch sizes >= 1, sorted: a list, or ``{min, max}`` powers of two."""
    if isinstance(raw, dict):
        ck.keys(raw, "batch_sizes", ("min", "max"))
        lo = ck.integer(raw.get("min"), "batch_sizes.min", 1)
        hi = ck.integer(raw.get("max"), "batch_sizes.max", 1)
        for value, path in ((lo, "batch_sizes.min"), (hi, "batch_sizes.max")):
            if value is not None and value & (value - 1):
                ck.add(path, f"found {value}; allowed: a power of two")
                return None
        if lo is None or hi is None:
            return None
        if lo > hi:
            ck.add("batch_sizes", f"min {lo} > max {hi}; allowed: min <= max")
            return None
        out, b = [], lo
        while b <= hi:
            out.append(b)
            b *= 2
        return tuple(out)
    if not isinstance(raw, list) or not raw:
        ck.add("batch_sizes", f"found {raw!r}; allowed: a non-empty list of integers >= 1 "
                              "or {min = ..., max = ...} (powers of two)")
        return None
    return _distinct(ck, "batch_sizes", raw,
                     [ck.integer(b, f"batch_sizes[{i}]", 1) for i, b in enumerate(raw)])


def sparsities(ck: Checker, raw: Any) -> tuple[float, ...] | None:
    """Distinct sparsity levels in [0, 1), sorted."""
    if not isinstance(raw, list) or not raw:
        ck.add("sparsities", f"found {raw!r}; allowed: a non-empty list of fractions in [0, 1)")
        return None
    return _distinct(ck, "sparsities", raw, [ck.number(s, f"sparsities[{i}]", 0.0, 1.0, hi_open=True)
                                             for i, s in enumerate(raw)])


def _distinct(ck: Checker, path: str, raw: list, values: list) -> tuple | None:
    """The parsed list ``values`` sorted, or None when an item was bad (already recorded) or
    repeated (recorded here)."""
    if any(v is None for v in values):
        return None
    if len(set(values)) != len(values):
        ck.add(path, f"found duplicates in {raw}; allowed: distinct values")
        return None
    return tuple(sorted(values))


def registry(kind: str) -> list[str]:
    """Names known to the data set and model registries."""
    return list_datasets() if kind == "dataset" else list_models()


def optimizers(ck: Checker, raw: Any) -> tuple[str | None, ...]:
    """``optimizer``: one name or a non-empty list of names."""
    names = raw if isinstance(raw, list) else [raw]
    out = tuple(ck.choice(o, "optimizer" if not isinstance(raw, list) else f"optimizer[{i}]",
                          OPTIMIZERS) for i, o in enumerate(names))
    if not names:
        ck.add("optimizer", f"found an empty list; allowed: {', '.join(OPTIMIZERS)} or a list")
    return out


def seeds(ck: Checker, raw: Any) -> tuple[int | None, ...] | None:
    """``seeds``: a non-empty list of distinct integers >= 0, in the order given."""
    if not isinstance(raw, list) or not raw:
        ck.add("seeds", f"found {raw!r}; allowed: a non-empty list of integers >= 0")
        return None
    out = tuple(ck.integer(s, f"seeds[{i}]", 0) for i, s in enumerate(raw))
    if len(set(out)) != len(out):
        ck.add("seeds", f"found duplicates in {raw}; allowed: distinct values")
    return out


# ``stop`` and ``complete_trials``: what a group does at the goal, and whether it counts only
# trials that did not diverge (experiments.run.complete)
STOPS = ("first", "all")


def trial_rules(ck: Checker, raw: Mapping[str, Any]) -> tuple[str, bool]:
    """The top-level ``stop`` and ``complete_trials`` (module docstring)."""
    stop = ck.choice(raw.get("stop", "first"), "stop", STOPS) or "first"
    complete = raw.get("complete_trials", False)
    if not isinstance(complete, bool):
        ck.add("complete_trials", f"found {complete!r}; allowed: true or false")
        complete = False
    return stop, complete


def trial_rules_canonical(stop: str, complete: bool) -> dict[str, Any]:
    """``stop`` and ``complete_trials`` for the canonical JSON and group keys: only when set."""
    return {**({"stop": stop} if stop != "first" else {}),
            **({"complete_trials": True} if complete else {})}


# ``delays`` / ``workers`` and ``delay_kind``: the gradient-delay axis (training.delay, whose
# DELAY_KINDS are the kinds); ``workers`` is round-robin's W (delay W - 1).
DELAY_KEYS = ("delays", "workers", "delay_kind")


def delays(ck: Checker, raw: Mapping[str, Any]) -> tuple[tuple[int, ...], str]:
    """The top-level ``delays`` (fixed or uniform maximal delays tau >= 0) or ``workers``
    (round-robin workers W >= 1, delay W - 1) and ``delay_kind``: the distinct delays, sorted,
    and the kind. Absent: ``((0,), "fixed")``, synchronous SGD. The list must hold the
    synchronous reference (delay 0, or 1 worker): every critical delay is measured against it."""
    kind = ck.choice(raw.get("delay_kind", "round_robin" if "workers" in raw else "fixed"),
                     "delay_kind", DELAY_KINDS) or "fixed"
    if "delays" in raw and "workers" in raw:
        ck.add("workers", "given with delays; allowed: one of delays (a list of delays) or "
                          "workers (a list of round-robin worker counts, delay W - 1)")
        return (0,), kind
    key = "workers" if "workers" in raw else "delays"
    if key not in raw:
        if "delay_kind" in raw:
            ck.add("delay_kind", "given without delays or workers; allowed: add delays = "
                                 "[0, ...] or workers = [1, ...], or leave delay_kind out")
        return (0,), kind
    if (key == "workers") != (kind == "round_robin"):
        ck.add("delay_kind", f"found {kind!r} with {key}; allowed: "
               + ("'round_robin' (or leave it out) with workers" if key == "workers" else
                  "'fixed' or 'uniform' with delays; round_robin takes workers = [...]"))
    value, lo = raw[key], 1 if key == "workers" else 0
    what = ("round-robin worker counts W >= 1 (delay W - 1; the process count is [executor] "
            "workers)" if key == "workers" else "delays tau >= 0 (updates between a "
            "gradient's weights and its update)")
    if not isinstance(value, list) or not value:
        ck.add(key, f"found {value!r}; allowed: a non-empty list of {what}")
        return (0,), kind
    parsed = _distinct(ck, key, value, [ck.integer(v, f"{key}[{i}]", lo, 1024)
                                        for i, v in enumerate(value)])
    if parsed is None:
        return (0,), kind
    taus = tuple(v - 1 for v in parsed) if key == "workers" else parsed
    if 0 not in taus:
        ck.add(key, f"found {value}; allowed: a list holding {lo} (the synchronous reference "
                    f"each critical delay is measured against)")
    return taus, kind


def delay_fields(delay: int, kind: str) -> dict[str, Any]:
    """The ``training.Trial`` fields of one delay of the axis: none for delay 0 (so a group of
    synchronous SGD has the trials, hence the key, it had before the axis), else the delay and
    its kind (round-robin as its workers)."""
    if delay == 0:
        return {}
    if kind == "round_robin":
        return {"delay_kind": kind, "workers": delay + 1}
    return {"delay": delay, **({"delay_kind": kind} if kind != "fixed" else {})}


def delays_canonical(taus: tuple[int, ...], kind: str) -> dict[str, Any]:
    """``delays`` and ``delay_kind`` for the canonical JSON: only with a delay axis, so every
    earlier spec keeps its hash."""
    if taus == (0,):
        return {}
    return {"delays": list(taus), **({"delay_kind": kind} if kind != "fixed" else {})}
