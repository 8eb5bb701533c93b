"""Checks of study-spec values: every problem becomes one line naming the key path, what was
found and what is allowed (with the closest valid name for a mistyped one).

:class:`Checker` collects the problems of a whole spec so validation never stops at the first
one; the value parsers here (a search dimension, the batch sizes, the sparsity levels) return the
parsed value, or None after recording why not. :func:`experiments.spec.study.validate` composes them.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from training.config import ADAM_KEYS, ADAM_OPTIMIZERS, OPTIMIZERS, EvalSchedule
from training.data import list_datasets
from training.device import PRECISIONS, DeviceError, check_device
from training.errors import SparsescaleError
from training.goal import unreachable
from training.models.initialization import INITS
from training.models import list_models

from experiments.spec.search import SCALES, SEARCH_KEYS, Dimension

COMPARISONS = {"<": True, "<=": False}   # goal comparison -> Goal.strict


def did_you_mean(value: str, allowed: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest allowed name, or nothing when none is close."""
    near = difflib.get_close_matches(value, list(allowed), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


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


# bounds of each searchable metaparameter: (lo, hi, lo_open, hi_open)
_BOUNDS = {"lr": (0.0, None, True, False), "momentum": (0.0, 1.0, False, True),
           "decay_steps": (0.0, None, True, False), "end_factor": (0.0, 1.0, False, False),
           "beta1": (0.0, 1.0, False, True), "beta2": (0.0, 1.0, False, True),
           "eps": (0.0, None, True, False), "weight_decay": (0.0, None, False, False)}


def dimension(ck: Checker, raw: Any, path: str, key: str) -> Dimension | None:
    """A search dimension: a value (fixed) or ``{scale, min, max}`` (``relative`` for
    decay_steps only) within ``key``'s bounds."""
    lo_b, hi_b, lo_open, hi_open = _BOUNDS[key]
    if not isinstance(raw, dict):
        v = ck.number(raw, path, lo_b, hi_b, hi_open=hi_open, lo_open=lo_open)
        return None if v is None else Dimension("linear", v, v)
    allowed = ("scale", "min", "max") + (("relative",) if key == "decay_steps" else ())
    ck.keys(raw, path, allowed)
    n = len(ck.problems)
    scale = ck.choice(raw.get("scale", "log"), f"{path}.scale", SCALES)
    lo = ck.number(raw.get("min"), f"{path}.min", lo_b, hi_b, hi_open=hi_open, lo_open=lo_open)
    hi = ck.number(raw.get("max"), f"{path}.max", lo_b, hi_b, hi_open=hi_open, lo_open=lo_open)
    relative = raw.get("relative", False)
    if not isinstance(relative, bool):
        ck.add(f"{path}.relative", f"found {relative!r}; allowed: true or false")
    if lo is not None and hi is not None and lo > hi:
        ck.add(path, f"min {lo} > max {hi}; allowed: min <= max")
    if scale == "log" and lo is not None and lo <= 0:
        ck.add(f"{path}.min", f"found {lo}; allowed: > 0 on a log scale")
    if scale == "reverse-log" and hi is not None and hi >= 1:
        ck.add(f"{path}.max", f"found {hi}; allowed: < 1 on a reverse-log scale (1 - x is logged)")
    if relative is True and hi is not None and hi > 1:
        ck.add(f"{path}.max", f"found {hi}; allowed: <= 1 for a relative decay (fraction of budget)")
    if len(ck.problems) > n:
        return None
    return Dimension(scale, lo, hi, bool(relative))


def search_overrides(ck: Checker, se: Mapping[str, Any], optimizers: tuple[str | None, ...]
                     ) -> dict[str, dict[str, Dimension]]:
    """The ``[search.optimizers.<optimizer>]`` tables (each for an optimizer of the study), and a
    problem for Adam keys that no optimizer of the study uses."""
    listed = [o for o in optimizers if o]
    tables = ck.table(se, "optimizers", "search.optimizers") or {}
    ck.keys(tables, "search.optimizers", tuple(listed))
    out: dict[str, dict[str, Dimension]] = {}
    for opt in listed:
        path = f"search.optimizers.{opt}"
        table = ck.table(tables, opt, path) if opt in tables else None
        if table is not None:
            ck.keys(table, path, SEARCH_KEYS)
            out[opt] = {k: dimension(ck, table[k], f"{path}.{k}", k)
                        for k in SEARCH_KEYS if k in table}
    if not any(o in ADAM_OPTIMIZERS for o in listed):
        for key in ADAM_KEYS:
            if key in se:
                ck.add(f"search.{key}", f"used by optimizers {', '.join(ADAM_OPTIMIZERS)} only; "
                                        f"the study's: {', '.join(listed)}")
    return out


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


def goal(ck: Checker, raw: Mapping[str, Any]) -> tuple[str | None, float | None, str | None]:
    """The ``[goal]`` table: (metric, target, comparison), a target the metric can reach."""
    table = ck.table(raw, "goal", "goal", required=True) or {}
    ck.keys(table, "goal", ("metric", "target", "comparison"))
    metric = ck.choice(table.get("metric", "error"), "goal.metric", ("error", "loss"))
    target = ck.number(table.get("target"), "goal.target") if "goal" in raw else None
    comparison = ck.choice(table.get("comparison", "<"), "goal.comparison", tuple(COMPARISONS))
    if metric is not None and target is not None and comparison is not None:
        reason = unreachable(metric, target, COMPARISONS[comparison])
        if reason:
            ck.add("goal.target", f"{reason}; allowed: a target > 0, or 0 with "
                                  'comparison = "<="')
    return metric, target, comparison


def seeds(ck: Checker, raw: Any) -> tuple[int | None, ...] | None:
    """``seeds``: a non-empty list of distinct integers >= 0, in the order given."""
    if not isinstance(raw, list) or not raw:
        ck.add("seeds", f"found {raw!r}; allowed: a non-empty list of integers >= 0")
        return None
    out = tuple(ck.integer(s, f"seeds[{i}]", 0) for i, s in enumerate(raw))
    if len(set(out)) != len(out):
        ck.add("seeds", f"found duplicates in {raw}; allowed: distinct values")
    return out


def eval_schedule(ck: Checker, table: Mapping[str, Any]) -> EvalSchedule | None:
    """The ``[eval]`` table as a :class:`training.EvalSchedule` (None after a problem: an unknown
    key, too, keeps the schedule from being built)."""
    n_before = len(ck.problems)
    ck.keys(table, "eval", ("kind", "every", "first", "ratio", "max_gap"))
    kind = ck.choice(table.get("kind", "interval"), "eval.kind", ("interval", "geometric"))
    for key in ("every", "first", "max_gap"):
        if key in table:
            ck.integer(table[key], f"eval.{key}", 1)
    if "ratio" in table:
        ck.number(table["ratio"], "eval.ratio", 1.0, lo_open=True)
    if len(ck.problems) > n_before or kind is None:
        return None
    try:
        return EvalSchedule(**table)
    except (SparsescaleError, TypeError) as exc:
        ck.add("eval", str(exc))
        return None


# The keys of ``[workload]`` that say where and in which arithmetic the groups train.
DEVICE_KEYS = ("device", "precision")


def device_keys(ck: Checker, raw: Mapping[str, Any]) -> tuple[str, str]:
    """``[workload] device`` (``"cpu"`` default, ``"cuda"``, ``"cuda:N"``; checked for its form
    only: a spec stays valid on a machine without the GPU, and the runner checks the machine)
    and ``[workload] precision`` (:data:`training.device.PRECISIONS`, ``"fp32"`` default)."""
    wl = raw.get("workload")
    wl = wl if isinstance(wl, Mapping) else {}
    device, precision = wl.get("device", "cpu"), wl.get("precision", "fp32")
    try:
        device = check_device(device, "workload.device")
    except DeviceError as exc:
        ck.problems.append(str(exc))
        device = "cpu"
    if precision not in PRECISIONS:
        ck.add("workload.precision", f"found {precision!r}"
                                     f"{did_you_mean(str(precision), PRECISIONS)}; "
                                     f"allowed: {', '.join(PRECISIONS)}")
        precision = "fp32"
    return device, precision


def init_key(ck: Checker, raw: Mapping[str, Any]) -> str:
    """``[workload] init``: how the model's weights are initialized,
    :data:`training.models.initialization.INITS` (``"torch"`` default: as the model's builder makes
    them; ``"lee"``: Lee et al. 2021's, TensorFlow's variance scaling with zero biases)."""
    wl = raw.get("workload")
    init = wl.get("init", "torch") if isinstance(wl, Mapping) else "torch"
    if init not in INITS:
        ck.add("workload.init", f"found {init!r}{did_you_mean(str(init), INITS)}; allowed: "
                                f"{', '.join(INITS)}")
        return "torch"
    return init
