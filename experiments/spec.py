"""Study specs: a TOML file (stdlib ``tomllib``) validated into frozen dataclasses.

Validation never stops at the first problem: every problem is collected as one line naming the
key path, what was found and what is allowed (with the closest valid key for a mistyped one), and
a single :class:`SpecError` carrying the list is raised. The format (all keys but ``workload``,
``goal``, ``batch_sizes`` and ``search.lr`` have defaults)::

    name = "quickstart"
    optimizer = "momentum"              # sgd | momentum | nesterov, or a list of them
    batch_sizes = {min = 8, max = 4096} # powers of two from min to max, or an explicit list
    sparsities = [0.0, 0.9]             # fractions in [0, 1)
    trials = 16                         # metaparameter points per batch size (same at every B)
    seeds = [0]                         # replicate seeds (model init, masks, data order)

    [workload]
    dataset = "mnist1d"                 # training.data.list_datasets()
    dataset_options = {num_samples = 10000}
    model = "mlp"                       # training.models.list_models()
    model_options = {}

    [goal]
    metric = "error"                    # error | loss
    target = 0.3
    comparison = "<"                    # "<" (Shallue et al. 2019) or "<=" (Lee et al. 2021)

    [pruning]
    method = "snip"                     # pruning.list_methods(), or a list of them
    sanity = []                         # shuffle | reinit | matched_random | invert: extra series

    [search]                            # each: {scale = log|reverse-log|linear, min, max} or a value
    seed = 0
    lr = {scale = "log", min = 1e-3, max = 10.0}
    momentum = 0.9
    decay_steps = {scale = "linear", min = 0.5, max = 1.0, relative = true}  # fraction of budget
    end_factor = {scale = "log", min = 1e-4, max = 0.1}

    [budget]                            # max_steps = N, or a rule in examples seen:
    examples = 2_000_000                # max_steps(B) = clamp(ceil(examples / B), min, max)
    min = 100
    max = 20000

    [eval]                              # training.EvalSchedule
    kind = "interval"
    every = 50

    [probes]
    enabled = true
    batch_size = 64                     # reference batch size of the trajectory probes
    examples = 512                      # examples used by each noise / curvature estimate
    points = 4                          # trajectory snapshots

    [executor]
    workers = 2
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from training.data import list_datasets
from training.goal import unreachable
from training.models import list_models
from training.schedules import OPTIMIZERS, ConfigError, EvalSchedule
from training.errors import SparsescaleError

from .series import pruning_series, series_label, series_names

SCALES = ("log", "reverse-log", "linear")
SEARCH_KEYS = ("lr", "momentum", "decay_steps", "end_factor")
COMPARISONS = {"<": True, "<=": False}   # comparison -> Goal.strict


class SpecError(SparsescaleError):
    """A study spec is invalid. ``problems`` holds one line per problem (key path first)."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + f"{len(self.problems)} problem(s) in the study spec:\n"
                         + "\n".join(self.problems))


# ---------------------------------------------------------------------------------------------
# validated spec


@dataclass(frozen=True)
class Dimension:
    """One metaparameter: searched over [min, max] on ``scale``, or ``fixed`` (min == max).

    ``relative`` (decay_steps only): values are fractions of the group's step budget.
    """

    scale: str
    min: float
    max: float
    relative: bool = False

    @property
    def fixed(self) -> bool:
        return self.min == self.max


@dataclass(frozen=True)
class Budget:
    """Step budget: ``max_steps`` fixed, or ``clamp(ceil(examples / B), min, max)``."""

    max_steps: int | None = None
    examples: int | None = None
    min: int = 1
    max: int | None = None

    def steps(self, batch_size: int) -> int:
        """The step budget of a group at ``batch_size``."""
        if self.max_steps is not None:
            return self.max_steps
        steps = max(self.min, math.ceil(self.examples / batch_size))
        return min(steps, self.max) if self.max is not None else steps


@dataclass(frozen=True)
class Probes:
    """The ``[probes]`` table: noise / curvature measurements per sparsity level."""

    enabled: bool = True
    batch_size: int | None = None   # None: the median batch size of the study
    examples: int = 512
    points: int = 4


@dataclass(frozen=True)
class Spec:
    """A validated study. ``optimizer`` is one name; a spec listing several optimizers, several
    pruning methods or sanity checks is split into one spec per optimizer and pruning series
    with :func:`variants` (``experiments.series``)."""

    name: str
    dataset: str
    dataset_options: dict[str, Any]
    model: str
    model_options: dict[str, Any]
    optimizer: str
    metric: str
    target: float
    strict: bool
    batch_sizes: tuple[int, ...]
    sparsities: tuple[float, ...]
    pruning_method: str
    search: dict[str, Dimension]
    search_seed: int
    trials: int
    budget: Budget
    eval: EvalSchedule
    seeds: tuple[int, ...]
    probes: Probes
    workers: int | None
    optimizers: tuple[str, ...] = ()
    toml: str = field(default="", compare=False)
    pruning_methods: tuple[str, ...] = ()   # every listed method (the series' criteria)
    sanity: tuple[str, ...] = ()            # sanity checks listed (each adds a series per method)
    pruning_sanity: str | None = None       # this series' sanity check (a variant's)
    series: str = ""                        # this series' name when the study has several
    subdir: str = field(default="", compare=False)   # a variant's folder under the study's

    def canonical(self) -> dict[str, Any]:
        """The canonical JSON-able form (``study.spec_json``); its hash identifies the study."""
        return {
            "name": self.name,
            "workload": {"dataset": self.dataset, "dataset_options": self.dataset_options,
                         "model": self.model, "model_options": self.model_options},
            "optimizer": self.optimizer,
            "goal": {"metric": self.metric, "target": self.target, "strict": self.strict},
            "batch_sizes": list(self.batch_sizes),
            "sparsities": list(self.sparsities),
            "pruning": {"method": self.pruning_method,
                        **({"sanity": self.pruning_sanity} if self.pruning_sanity else {})},
            **({"series": self.series} if self.series else {}),
            "search": {"seed": self.search_seed,
                       **{k: asdict(d) for k, d in sorted(self.search.items())}},
            "trials": self.trials,
            "budget": asdict(self.budget),
            "eval": asdict(self.eval),
            "seeds": list(self.seeds),
            "probes": asdict(self.probes),
        }

    def to_json(self) -> str:
        return canonical_json(self.canonical())

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def variants(self) -> list["Spec"]:
        """One spec per listed optimizer and pruning series (``[self]`` if there is one of each),
        named ``<study>[-<optimizer>][-<series>]``, run into ``subdir`` = ``[<optimizer>/]
        [<series>]``. Only the first series of each optimizer keeps the dense level."""
        optimizers = self.optimizers if len(self.optimizers) > 1 else (self.optimizer,)
        series = series_names(self.pruning_methods or (self.pruning_method,), self.sanity)
        if len(optimizers) == 1 and len(series) == 1:
            return [self]
        out = []
        for o in optimizers:
            for i, (method, check) in enumerate(series):
                label = series_label(method, check) if len(series) > 1 else ""
                parts = ([o] if len(optimizers) > 1 else []) + ([label] if label else [])
                sparse = tuple(x for x in self.sparsities if x > 0)
                out.append(replace(
                    self, optimizer=o, optimizers=(o,), name="-".join([self.name, *parts]),
                    pruning_method=method, pruning_methods=(method,), sanity=(),
                    pruning_sanity=check, series=label, subdir="/".join(parts),
                    sparsities=self.sparsities if i == 0 else sparse))
        return out


def canonical_json(obj: Any) -> str:
    """Key-sorted compact JSON (no NaN): equal configs give equal text, hence equal hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


# ---------------------------------------------------------------------------------------------
# validation


def _did_you_mean(value: str, allowed: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest allowed name, or nothing when none is close."""
    near = difflib.get_close_matches(value, list(allowed), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


class _Checker:
    """Collects problems; helpers return a value or None after recording a problem."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, path: str, msg: str) -> None:
        self.problems.append(f"{path}: {msg}")

    def keys(self, table: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
        for key in table:
            if key not in allowed:
                self.add(key_path(path, key),
                         f"unknown key{_did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")

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
            self.add(path, f"found {value!r}{_did_you_mean(str(value), allowed)}; "
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


# Trials per group are planned (Sobol points) and stacked in memory up front: a typo such as
# 10**12 must fail validation, not exhaust memory while planning.
MAX_TRIALS = 2**16

TOP_KEYS = ("name", "description", "optimizer", "batch_sizes", "sparsities", "trials", "seeds",
            "workload", "goal", "pruning", "search", "budget", "eval", "probes", "executor")

# bounds of each searchable metaparameter: (lo, hi, lo_open, hi_open)
_BOUNDS = {"lr": (0.0, None, True, False), "momentum": (0.0, 1.0, False, True),
           "decay_steps": (0.0, None, True, False), "end_factor": (0.0, 1.0, False, False)}
_DEFAULTS = {"momentum": 0.9, "end_factor": 1.0}


def _dimension(ck: _Checker, raw: Any, path: str, key: str) -> Dimension | None:
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


def _batch_sizes(ck: _Checker, raw: Any) -> tuple[int, ...] | None:
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
    values = [ck.integer(b, f"batch_sizes[{i}]", 1) for i, b in enumerate(raw)]
    if any(v is None for v in values):
        return None
    if len(set(values)) != len(values):
        ck.add("batch_sizes", f"found duplicates in {raw}; allowed: distinct values")
        return None
    return tuple(sorted(values))


def _sparsities(ck: _Checker, raw: Any) -> tuple[float, ...] | None:
    if not isinstance(raw, list) or not raw:
        ck.add("sparsities", f"found {raw!r}; allowed: a non-empty list of fractions in [0, 1)")
        return None
    values = [ck.number(s, f"sparsities[{i}]", 0.0, 1.0, hi_open=True) for i, s in enumerate(raw)]
    if any(v is None for v in values):
        return None
    if len(set(values)) != len(values):
        ck.add("sparsities", f"found duplicates in {raw}; allowed: distinct values")
        return None
    return tuple(sorted(values))


def _registry(kind: str) -> list[str]:
    """Names known to the data set, model and pruning registries."""
    if kind == "dataset":
        return list_datasets()
    if kind == "model":
        return list_models()
    import pruning   # imported late: it pulls torch-pruning, which `sparsescale list` may not need

    return list(pruning.list_methods())


def validate(raw: Mapping[str, Any], source: str | None = None, toml_text: str = "") -> Spec:
    """Validate a parsed TOML mapping into a :class:`Spec` or raise :class:`SpecError` listing
    every problem."""
    ck = _Checker()
    ck.keys(raw, "", TOP_KEYS)

    name = raw.get("name", Path(source).stem if source else "study")
    if not isinstance(name, str) or not name:
        ck.add("name", f"found {name!r}; allowed: a non-empty string")

    # workload
    wl = ck.table(raw, "workload", "workload", required=True)
    dataset = model = None
    dataset_options: dict[str, Any] | None = {}
    model_options: dict[str, Any] | None = {}
    if wl is not None:
        ck.keys(wl, "workload", ("dataset", "dataset_options", "model", "model_options"))
        dataset = ck.choice(wl.get("dataset"), "workload.dataset", _registry("dataset"))
        model = ck.choice(wl.get("model"), "workload.model", _registry("model"))
        dataset_options = ck.table(wl, "dataset_options", "workload.dataset_options")
        model_options = ck.table(wl, "model_options", "workload.model_options")
        for options, path in ((dataset_options, "workload.dataset_options"),
                              (model_options, "workload.model_options")):
            if options is not None:
                ck.plain(options, path)

    # optimizer
    opt_raw = raw.get("optimizer", "momentum")
    opt_list = opt_raw if isinstance(opt_raw, list) else [opt_raw]
    optimizers = tuple(ck.choice(o, "optimizer" if not isinstance(opt_raw, list)
                                 else f"optimizer[{i}]", OPTIMIZERS)
                       for i, o in enumerate(opt_list))
    if not opt_list:
        ck.add("optimizer", f"found an empty list; allowed: {', '.join(OPTIMIZERS)} or a list")

    # goal
    goal = ck.table(raw, "goal", "goal", required=True) or {}
    ck.keys(goal, "goal", ("metric", "target", "comparison"))
    metric = ck.choice(goal.get("metric", "error"), "goal.metric", ("error", "loss"))
    target = ck.number(goal.get("target"), "goal.target") if "goal" in raw else None
    comparison = ck.choice(goal.get("comparison", "<"), "goal.comparison", tuple(COMPARISONS))
    if metric is not None and target is not None and comparison is not None:
        reason = unreachable(metric, target, COMPARISONS[comparison])
        if reason:
            ck.add("goal.target", f"{reason}; allowed: a target > 0, or 0 with "
                                  'comparison = "<="')

    batch_sizes = _batch_sizes(ck, raw["batch_sizes"]) if "batch_sizes" in raw else None
    if "batch_sizes" not in raw:
        ck.add("batch_sizes", "missing; allowed: a list of integers or {min = ..., max = ...}")
    sparsities = _sparsities(ck, raw.get("sparsities", [0.0]))
    trials = ck.integer(raw.get("trials", 16), "trials", 1, MAX_TRIALS)
    seeds_raw = raw.get("seeds", [0])
    seeds = None
    if not isinstance(seeds_raw, list) or not seeds_raw:
        ck.add("seeds", f"found {seeds_raw!r}; allowed: a non-empty list of integers >= 0")
    else:
        seeds = tuple(ck.integer(s, f"seeds[{i}]", 0) for i, s in enumerate(seeds_raw))
        if len(set(seeds)) != len(seeds):
            ck.add("seeds", f"found duplicates in {seeds_raw}; allowed: distinct values")

    # pruning
    pr = ck.table(raw, "pruning", "pruning") or {}
    ck.keys(pr, "pruning", ("method", "sanity"))
    methods, sanity = pruning_series(ck, pr, sparsities, lambda: _registry("pruning"))

    # search space
    se = ck.table(raw, "search", "search") or {}
    ck.keys(se, "search", ("seed",) + SEARCH_KEYS)
    search_seed = ck.integer(se.get("seed", 0), "search.seed", 0)
    if "lr" not in se:
        ck.add("search.lr", "missing; allowed: {scale = log|reverse-log|linear, min, max} or a value")
    search = {}
    for key in SEARCH_KEYS:
        if key in se:
            search[key] = _dimension(ck, se[key], f"search.{key}", key)
        elif key in _DEFAULTS:
            search[key] = Dimension("linear", _DEFAULTS[key], _DEFAULTS[key])

    # budget
    bu = ck.table(raw, "budget", "budget") or {"max_steps": 1000}
    ck.keys(bu, "budget", ("max_steps", "examples", "min", "max"))
    budget = None
    if "max_steps" in bu and "examples" in bu:
        ck.add("budget", "found both max_steps and examples; allowed: one of them")
    elif "max_steps" in bu:
        ms = ck.integer(bu["max_steps"], "budget.max_steps", 1)
        extra = sorted(set(bu) & {"min", "max"})
        if extra:
            ck.add(f"budget.{extra[0]}", "only used with budget.examples; allowed: remove it")
        budget = Budget(max_steps=ms) if ms is not None else None
    elif "examples" in bu:
        ex = ck.integer(bu["examples"], "budget.examples", 1)
        lo = ck.integer(bu.get("min", 1), "budget.min", 1)
        hi = ck.integer(bu["max"], "budget.max", 1) if "max" in bu else None
        if lo is not None and hi is not None and lo > hi:
            ck.add("budget", f"min {lo} > max {hi}; allowed: min <= max")
        elif ex is not None and lo is not None:
            budget = Budget(examples=ex, min=lo, max=hi)
    elif bu:
        ck.add("budget", "missing max_steps or examples; allowed: max_steps = N or "
                         "{examples = N, min = ..., max = ...}")

    # evaluation schedule
    ev = ck.table(raw, "eval", "eval") or {}
    eval_schedule = None
    n_before = len(ck.problems)  # an unknown key, too, keeps the schedule from being built
    ck.keys(ev, "eval", ("kind", "every", "first", "ratio", "max_gap"))
    kind = ck.choice(ev.get("kind", "interval"), "eval.kind", ("interval", "geometric"))
    for key in ("every", "first", "max_gap"):
        if key in ev:
            ck.integer(ev[key], f"eval.{key}", 1)
    if "ratio" in ev:
        ck.number(ev["ratio"], "eval.ratio", 1.0, lo_open=True)
    if len(ck.problems) == n_before and kind is not None:
        try:
            eval_schedule = EvalSchedule(**ev)
        except (ConfigError, TypeError) as exc:
            ck.add("eval", str(exc))

    # probes
    pb = ck.table(raw, "probes", "probes") or {}
    ck.keys(pb, "probes", ("enabled", "batch_size", "examples", "points"))
    enabled = pb.get("enabled", True)
    if not isinstance(enabled, bool):
        ck.add("probes.enabled", f"found {enabled!r}; allowed: true or false")
    pb_bs = ck.integer(pb["batch_size"], "probes.batch_size", 1) if "batch_size" in pb else None
    pb_ex = ck.integer(pb.get("examples", 512), "probes.examples", 2)
    pb_pts = ck.integer(pb.get("points", 4), "probes.points", 1)

    # executor
    ex_t = ck.table(raw, "executor", "executor") or {}
    ck.keys(ex_t, "executor", ("workers",))
    workers = ck.integer(ex_t["workers"], "executor.workers", 1) if "workers" in ex_t else None

    if pb_bs is not None and batch_sizes is not None and pb_bs not in batch_sizes:
        ck.add("probes.batch_size", f"found {pb_bs}; allowed: one of the study's batch sizes "
                                    f"({', '.join(map(str, batch_sizes))})")

    if ck.problems:
        raise SpecError(ck.problems, source)
    return Spec(
        name=name, dataset=dataset, dataset_options=dict(dataset_options), model=model,
        model_options=dict(model_options), optimizer=optimizers[0], metric=metric, target=target,
        strict=COMPARISONS[comparison], batch_sizes=batch_sizes, sparsities=sparsities,
        pruning_method=methods[0], pruning_methods=methods, sanity=sanity,
        search=search, search_seed=search_seed, trials=trials, budget=budget,
        eval=eval_schedule, seeds=seeds,
        probes=Probes(enabled=enabled, batch_size=pb_bs, examples=pb_ex, points=pb_pts),
        workers=workers, optimizers=optimizers, toml=toml_text)


def loads(text: str, source: str | None = None) -> Spec:
    """Parse and validate TOML text."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError([f"(toml): not valid TOML: {exc}"], source) from None
    return validate(raw, source, text)


def load(path: str | Path) -> Spec:
    """Read and validate a TOML study file (a bare name is looked up in the bundled configs)."""
    p = resolve_config(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError([f"(file): cannot read {p}: {exc.strerror}"], str(p)) from None
    except UnicodeDecodeError as exc:
        raise SpecError([f"(file): cannot read {p}: not UTF-8 text (byte {exc.start}); a study "
                         "spec is a TOML file"], str(p)) from None
    return loads(text, str(p))


CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def list_configs() -> list[str]:
    """Names of the bundled study configs (``experiments/configs/*.toml``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def resolve_config(path: str | Path) -> Path:
    """``path`` if it exists, else the bundled config of that name (``quickstart``)."""
    p = Path(path)
    if p.exists():
        return p
    bundled = CONFIG_DIR / (p.name if p.suffix == ".toml" else f"{p.name}.toml")
    return bundled if bundled.exists() else p


def check_against_dataset(spec: Spec, n_train: int) -> None:
    """Checks that need the loaded data set: every batch size fits in the training set."""
    problems = [f"batch_sizes: found {b} > {n_train} (the training set size); allowed: "
                f"1..{n_train}" for b in spec.batch_sizes if b > n_train]
    if spec.probes.batch_size is not None and spec.probes.batch_size > n_train:
        problems.append(f"probes.batch_size: found {spec.probes.batch_size} > {n_train} "
                        f"(the training set size); allowed: 1..{n_train}")
    if problems:
        raise SpecError(problems)
