"""Study specs: a TOML file (stdlib ``tomllib``) validated into frozen dataclasses.

Validation never stops at the first problem: every problem is collected as one line naming the
key path, what was found and what is allowed (with the closest valid key for a mistyped one), and
a single :class:`SpecError` carrying the list is raised. The format (all keys but ``workload``,
``goal``, ``batch_sizes`` and ``search.lr`` have defaults)::

    name = "quickstart"
    optimizer = "momentum"              # sgd | momentum | nesterov | adam | adamw, or a list
    batch_sizes = {min = 8, max = 4096} # powers of two from min to max, or an explicit list
    sparsities = [0.0, 0.9]             # fractions in [0, 1)
    trials = 16                         # metaparameter points per batch size (same at every B)
    seeds = [0]                         # replicate seeds (model init, masks, data order)
    stop = "first"                      # first | all: a group stops at its first hit, or each
                                        # trial at its own (experiments.spec.tables.probes)
    complete_trials = false             # count only trials that did not diverge (Shallue et al.)
    delays = [0, 1, 2, 4, 8, 16]        # gradient delays tau (training.delay): a group per
                                        # (level, B, tau, seed); or workers = [1, 2, 4, ...]
                                        # (round-robin, tau = W - 1); must hold the synchronous 0
    delay_kind = "fixed"                # fixed | uniform (tau drawn from 0..tau) | round_robin
    measures = ["mymeasures:WeightNorm"]  # your own measurements (spec.tables.measures)

    [workload]
    dataset = "mnist1d"                 # training.data.list_datasets(), or "module:factory"
    dataset_options = {num_samples = 10000}
    model = "mlp"                       # training.models.list_models(), or "module:factory"
    model_options = {}                  # (experiments.spec.factories: your own, by import path)
    device = "cpu"                      # cpu | cuda | cuda:N (not in the hash: results agree)
    precision = "fp32"                  # fp32 | tf32 | bf16 (in the hash when not fp32)
    init = "torch"                      # torch | lee (Lee et al. 2021's; in the hash when lee)

    [goal]
    metric = "error"                    # error | loss
    target = 0.3
    comparison = "<"                    # "<" (Shallue et al. 2019) or "<=" (Lee et al. 2021)

    [pruning]
    criterion = "snip"                  # pruning.list_criteria(), "module:function", or a list
    sanity = []                         # shuffle | reinit | matched_random | invert: extra series
    examples = "all"                    # SNIP on the whole training split (default: 10 per class)
    prune_biases = true                 # biases scored and pruned too (default false)
    mask_per_trial = true               # each trial its own init and mask (default false)

    [search]                            # each: {scale = log|reverse-log|linear, min, max} or a value
    seed = 0
    lr = {scale = "log", min = 1e-3, max = 10.0}
    momentum = 0.9
    decay_steps = {scale = "linear", min = 0.5, max = 1.0, relative = true}  # fraction of budget
    end_factor = {scale = "log", min = 1e-4, max = 0.1}
    # adam / adamw only (defaults 0.9, 0.999, 1e-8, 0): beta1, beta2, eps, weight_decay;
    # [search.optimizers.<name>]: one optimizer's overrides (experiments.spec.tables.search)

    [budget]                            # max_steps = N, or a rule in examples seen:
    examples = 2_000_000                # max_steps(B) = clamp(ceil(examples / B), min, max)
    min = 100
    max = 20000

    [eval]                              # training.EvalSchedule
    kind = "interval"
    every = 50

    [probes]                            # along the best trial's run, per level, seed and B
    enabled = true
    batch_sizes = ["smallest", "b_crit", "largest"]   # rules, or batch sizes that reached the goal
    points = 10                         # K evenly spaced steps of [0, H]
    average = 3                         # consecutive steps averaged for |G|^2, tr(Sigma)
    examples = 1024                     # noise sample (default: the full training split)
    curvature_examples = 1024           # lambda_max and B_noise sample (default: full split)
    hessian_examples = 16               # examples of B_noise's tr(H Sigma) sample
    lanczos = 20                        # Lanczos steps for lambda_max (Lee's L: always full split)
    lipschitz_every = 1000              # Lee's stage: L and noise at steps N, 2N, ... to the end
    lipschitz_start = 1000              # ... from this step on (default N)
    lipschitz_examples = 8000           # ... L on a fixed sample (experiments.spec.tables.probes)
    lipschitz_trials = 3                # ... runs per probed group
    lipschitz_check = [0.0]             # ... levels whose first run checks L on the whole split

    [branching]                         # CBS(t) by branching (experiments.spec.tables.branching)
    enabled = true
    [schedules]                         # batch-size policies' shoot-out (experiments.spec.tables.schedules)

    [stopping]                          # a paired claim's stopping rule (spec.tables.stopping)

    [tuning]                            # search each (level, B), then repeat its best point
    points = 8                          # (experiments.spec.tables.tuning); trials: the repeats
    seed = 1000

    [executor]
    workers = 2
    program_choice = "measure"          # measure | rules (training.engine.choice; no hash)

A spec's canonical JSON (:meth:`SpecCore.to_json`) and its hash identify the study: a run
folder's store refuses a spec of another hash, and each group's key (``experiments.spec.plan``)
hashes part of it. The rule: a new spec key's default must leave existing hashes unchanged (omit
the key from the canonical JSON when it has its default, as ``branching`` and
``search_overrides`` are), and a change that moves a hash must update the golden files in the
same commit and say why. ``tests/experiments/spec/test_golden_hashes.py`` pins the canonical
JSON and hash of every bundled config and the key of one quickstart group
(``tests/experiments/spec/golden/``).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from training.config import EvalSchedule

from experiments.spec import checks
from experiments.spec.checks import Checker, delays_canonical, trial_rules_canonical
from experiments.spec.errors import SpecError, SpecIOError
from experiments.spec.factories import Factory
from experiments.spec.search import Dimension, optimizer_search
from experiments.spec.series import SANITY, control_variants, series_label, series_names
from experiments.spec.tables.branching import Branching, branching
from experiments.spec.tables.schedules import Schedules, schedules
from experiments.spec.tables.budget import Budget, budget_table
from experiments.spec.tables.eval import eval_table
from experiments.spec.tables.executor import executor_table
from experiments.spec.tables.goal import COMPARISONS, goal_table
from experiments.spec.tables.measures import measures_key
from experiments.spec.tables.probes import Probes, probes_table
from experiments.spec.tables.pruning import (
    HASHED, PruningOptions, pruning_options, pruning_table, stored_pruning,
)
from experiments.spec.tables.search import search_table
from experiments.spec.tables.stopping import Stopping, stopping_table
from experiments.spec.tables.tuning import Tuning, tuning_table
# the bundled configs and their reductions text (kept importable from here)
from experiments.spec.bundled import (  # noqa: F401
    CONFIG_DIR, list_configs, reductions, resolve_config,
)
from experiments.spec.tables.workload import (
    device_keys, init_key, stored, workload_table,
)


# ---------------------------------------------------------------------------------------------
# validated spec


@dataclass(frozen=True)
class SpecCore:
    """What every stored spec says: a study of this library's (:class:`Spec`) or an imported
    workload (:class:`experiments.spec.external.ExternalSpec`). Subclasses give :meth:`canonical`."""

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

    def core(self) -> dict[str, Any]:
        """The canonical form of the fields above."""
        return {
            "name": self.name,
            "workload": {"dataset": self.dataset, "dataset_options": self.dataset_options,
                         "model": self.model, "model_options": self.model_options},
            "optimizer": self.optimizer,
            "goal": {"metric": self.metric, "target": self.target, "strict": self.strict},
            "batch_sizes": list(self.batch_sizes),
            "sparsities": list(self.sparsities),
        }

    def canonical(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_json(self) -> str:
        return canonical_json(self.canonical())

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()


@dataclass(frozen=True)
class Spec(SpecCore):
    """A validated study. ``optimizer`` is one name; a spec listing several optimizers, several
    pruning criteria or sanity checks is split into one spec per optimizer and pruning series
    with :func:`variants` (``experiments.spec.series``)."""

    pruning_criterion: str
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
    pruning_criteria: tuple[str, ...] = ()  # every listed criterion (one series each)
    sanity: tuple[str, ...] = ()            # sanity checks listed (each a series per criterion)
    pruning_sanity: str | None = None       # this series' sanity check (a variant's)
    series: str = ""                        # this series' name when the study has several
    subdir: str = field(default="", compare=False)   # a variant's folder under the study's
    # ``[search.optimizers.<optimizer>]`` tables of a multi-optimizer spec (:meth:`variants`)
    search_overrides: dict[str, dict[str, Dimension]] = field(default_factory=dict)
    branching: Branching = Branching()
    schedules: Schedules = Schedules()   # the policies' shoot-out, in the hash when enabled
    # by kind, the SHA-256 of each factory's source (experiments.spec.factories): in the hash
    digests: dict[str, str] = field(default_factory=dict)
    # by import path, the SHA-256 of each pruning criterion's module (the series' own is hashed)
    criterion_digests: dict[str, str] = field(default_factory=dict)
    # where the groups train (not in the hash: like the worker count, it does not decide what
    # is measured; each group's row records its device) and in which arithmetic (in the hash,
    # and every group key, when not fp32: it changes the results)
    device: str = "cpu"
    precision: str = "fp32"
    folders: tuple[str, ...] = field(default=(), compare=False)   # searched after sys.path
    # how the model is initialized (training.models.initialization.INITS) and how masks are made
    # (experiments.spec.tables.pruning): in the hash only when not the defaults
    init: str = "torch"
    pruning_options: PruningOptions = PruningOptions()
    # what a group does at the goal, and whether diverged trials count (experiments.spec.tables.probes)
    stop: str = "first"
    complete_trials: bool = False
    # how the program of a cell no rule covers is chosen: "measure" or "rules" (None: the
    # environment's SPARSESCALE_PROGRAM_CHOICE, else "measure"). Not in the hash: the store
    # records each cell's program, which every later group of the cell runs.
    program_choice: str | None = None
    # the gradient-delay axis (experiments.spec.checks.delays): (0,) is synchronous SGD, and
    # leaves the hash and every group key as they were before the axis
    delays: tuple[int, ...] = (0,)
    delay_kind: str = "fixed"
    # the pre-declared stopping rule (experiments.spec.tables.stopping): in the hash when set
    stopping: Stopping | None = None
    # search, then repeat the best point (experiments.spec.tables.tuning): in the hash when
    # set; ``tuned``: each (sparsity, batch size)'s best point, set by the runner after the search
    tuning: Tuning | None = None
    tuned: dict[tuple[float, int], dict[str, Any]] = field(default_factory=dict, compare=False)
    # the user's measurements (spec.tables.measures), their modules' SHA-256 by path: hashed
    measures: tuple[str, ...] = ()
    measure_digests: dict[str, str] = field(default_factory=dict)

    def canonical(self) -> dict[str, Any]:
        """The canonical JSON-able form (``study.spec_json``); its hash identifies the study.
        A factory named by import path adds ``workload.<kind>_digest``, a pruning criterion named
        by import path ``pruning.method_digest`` (the pruning keys' old names: ``pruning.HASHED``);
        registered names add nothing, so their hashes and group keys are those of every earlier
        version. A precision other than fp32 adds
        ``workload.precision``, an init other than torch ``workload.init``, and each
        ``[pruning]`` option not at its default its key under ``pruning``; the device adds
        nothing."""
        overrides = ({"search_overrides": {o: {k: asdict(d) for k, d in sorted(t.items())}
                                           for o, t in sorted(self.search_overrides.items())}}
                     if self.search_overrides else {})   # only a multi-optimizer spec has them
        core = self.core()
        core["workload"].update({f"{kind}_digest": d for kind, d in self.digests.items()})
        if self.precision != "fp32":
            core["workload"]["precision"] = self.precision
        if self.init != "torch":
            core["workload"]["init"] = self.init
        return {
            **core,
            "pruning": {HASHED["criterion"]: self.pruning_criterion, **({HASHED["criterion_digest"]:
                        self.criterion_digests[self.pruning_criterion]}
                        if self.pruning_criterion in self.criterion_digests else {}),
                        **({"sanity": self.pruning_sanity} if self.pruning_sanity else {}),
                        **self.pruning_options.canonical()},
            **({"series": self.series} if self.series else {}),
            "search": {"seed": self.search_seed,
                       **{k: asdict(d) for k, d in sorted(self.search.items())}},
            "trials": self.trials,
            "budget": asdict(self.budget),
            "eval": asdict(self.eval),
            "seeds": list(self.seeds),
            "probes": self.probes.canonical(),
            **trial_rules_canonical(self.stop, self.complete_trials),
            **delays_canonical(self.delays, self.delay_kind),
            **overrides,
            # only an enabled table changes what a study stores (older hashes stay valid)
            **({"branching": self.branching.canonical()} if self.branching.enabled else {}),
            **({"schedules": self.schedules.canonical()} if self.schedules.enabled else {}),
            **({"stopping": self.stopping.canonical()} if self.stopping else {}),
            **({"tuning": self.tuning.canonical()} if self.tuning else {}),
            **({"measures": list(self.measures), "measure_digests": self.measure_digests}
               if self.measures else {}),
        }

    def variants(self) -> list["Spec"]:
        """One spec per listed optimizer and pruning series (``[self]`` if there is one of each),
        named ``<study>[-<optimizer>][-<series>]``, run into ``subdir`` = ``[<optimizer>/]
        [<series>]``. Only the first series of each optimizer keeps the dense level. Each
        optimizer searches its own space (:func:`experiments.spec.search.optimizer_search`)."""
        if self.pruning_options.bias_controls:   # one optimizer and series (validated)
            return control_variants(self)
        optimizers = self.optimizers if len(self.optimizers) > 1 else (self.optimizer,)
        series = series_names(self.pruning_criteria or (self.pruning_criterion,), self.sanity)
        if len(optimizers) == 1 and len(series) == 1:
            return [self]
        out = []
        for o in optimizers:
            for i, (criterion, check) in enumerate(series):
                label = series_label(criterion, check) if len(series) > 1 else ""
                parts = ([o] if len(optimizers) > 1 else []) + ([label] if label else [])
                sparse = tuple(x for x in self.sparsities if x > 0)
                out.append(replace(
                    self, optimizer=o, optimizers=(o,), name="-".join([self.name, *parts]),
                    pruning_criterion=criterion, pruning_criteria=(criterion,), sanity=(),
                    pruning_sanity=check, series=label, subdir="/".join(parts),
                    sparsities=self.sparsities if i == 0 else sparse,
                    search=optimizer_search(self.search, self.search_overrides, o),
                    search_overrides={}))
        return out


def canonical_json(obj: Any) -> str:
    """Key-sorted compact JSON (no NaN): equal configs give equal text, hence equal hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def from_canonical(canonical: Mapping[str, Any], toml_text: str = "") -> Spec:
    """The :class:`Spec` whose canonical form is ``canonical`` (a store's ``study.spec_json``),
    validated again: the canonical form is turned back into the TOML tables it stands for.
    ``workers`` and ``device`` are not part of it (they do not change what is measured) and
    come back as None and ``"cpu"``; a precision other than fp32 is, and comes back. A pruning
    series' sanity check and name (a variant's, :meth:`Spec.variants`) come back as they were."""
    c = canonical
    goal, budget = c["goal"], c["budget"]
    raw = {key: c[key] for key in ("name", "optimizer", "batch_sizes", "sparsities", "trials",
                                   "seeds", "workload", "stop", "complete_trials", "delays",
                                   "delay_kind", "measures") if key in c}
    if raw.get("delay_kind") == "round_robin":   # stored as its delays W - 1
        raw["workers"] = [tau + 1 for tau in raw.pop("delays")]
    raw["workload"], digests = stored(c["workload"])
    raw["pruning"], digest = stored_pruning(c["pruning"])
    check, series = c["pruning"].get("sanity"), c.get("series", "")
    raw["goal"] = {"metric": goal["metric"], "target": goal["target"],
                   "comparison": "<" if goal["strict"] else "<="}
    raw["search"] = {key: value if key == "seed" else
                     {k: v for k, v in value.items() if k != "relative" or v}
                     for key, value in c["search"].items()}
    raw["budget"] = ({"max_steps": budget["max_steps"]} if budget["max_steps"] is not None else
                     {k: v for k, v in budget.items() if k != "max_steps" and v is not None})
    for table in ("eval", "probes", "branching", "stopping", "tuning", "schedules"):
        if table in c:
            raw[table] = {k: v for k, v in c[table].items() if v is not None}
    spec = validate(raw, toml_text=toml_text, digests=digests, criterion_digests=(
        {} if digest is None else {raw["pruning"]["criterion"]: digest}),
        measure_digests=c.get("measure_digests", {}))
    if check is None and not series:
        return spec
    if (check is not None and check not in SANITY) or not isinstance(series, str):
        raise SpecError([f"pruning.sanity: found {check!r} in series {series!r}; allowed: one of "
                         f"{', '.join(SANITY)}"])
    return replace(spec, pruning_sanity=check, series=series)


# ---------------------------------------------------------------------------------------------
# validation


# Trials per group are planned (Sobol points) and stacked in memory up front: a typo such as
# 10**12 must fail validation, not exhaust memory while planning.
MAX_TRIALS = 2**16

TOP_KEYS = ("name", "description", "reductions", "optimizer", "batch_sizes", "sparsities", "trials", "seeds",
            "stop", "complete_trials", *checks.DELAY_KEYS, "workload", "goal", "pruning",
            "search", "budget", "eval", "probes", "branching", "stopping", "tuning", "executor",
            "schedules", "measures")


def validate(raw: Mapping[str, Any], source: str | None = None, toml_text: str = "",
             folders: tuple[str, ...] = (), digests: Mapping[str, str] | None = None,
             criterion_digests: Mapping[str, str] | None = None,
             measure_digests: Mapping[str, str] | None = None) -> Spec:
    """Validate a parsed TOML mapping into a :class:`Spec` or raise :class:`SpecError` listing
    every problem: the top-level keys (:mod:`experiments.spec.checks`), then each table by its
    own module (:mod:`experiments.spec.tables`). A factory or pruning criterion named by import
    path is imported (from ``sys.path``, then ``folders``) and its source digested; ``digests``
    (by kind), ``criterion_digests`` (by criterion path) and ``measure_digests``: a stored
    spec's, as recorded."""
    ck = Checker()
    ck.keys(raw, "", TOP_KEYS)

    name = raw.get("name", Path(source).stem if source else "study")
    if not isinstance(name, str) or not name:
        ck.add("name", f"found {name!r}; allowed: a non-empty string")
    dataset, model, dataset_options, model_options, found = workload_table(
        ck, raw, folders, digests)
    device, precision = device_keys(ck, raw)
    init = init_key(ck, raw)
    optimizers = checks.optimizers(ck, raw.get("optimizer", "momentum"))
    metric, target, comparison = goal_table(ck, raw)
    batch_sizes = checks.batch_sizes(ck, raw["batch_sizes"]) if "batch_sizes" in raw else None
    if "batch_sizes" not in raw:
        ck.add("batch_sizes", "missing; allowed: a list of integers or {min = ..., max = ...}")
    sparsities = checks.sparsities(ck, raw.get("sparsities", [0.0]))
    trials = ck.integer(raw.get("trials", 16), "trials", 1, MAX_TRIALS)
    seeds = checks.seeds(ck, raw.get("seeds", [0]))
    stop, complete = checks.trial_rules(ck, raw)
    delays, delay_kind = checks.delays(ck, raw)
    criteria, sanity, criterion_digests = pruning_table(ck, raw, sparsities, folders,
                                                        criterion_digests)
    options = pruning_options(ck, raw, criteria)
    if complete and options.mask_per_trial:
        # a replacement trial would need its own initialization and mask, drawn after the group
        # started: not built (Lee et al. count every run, Shallue et al. share one network)
        ck.add("complete_trials", "cannot be combined with [pruning] mask_per_trial = true; "
               "allowed: one of the two")
    search_seed, search, overrides = search_table(ck, raw, optimizers)
    budget = budget_table(ck, raw)
    eval_schedule = eval_table(ck, ck.table(raw, "eval", "eval") or {})
    probes = probes_table(ck, raw, sparsities, trials, stop, len(seeds or ()), batch_sizes)
    branch, sched = branching(ck, raw, batch_sizes), schedules(ck, raw, batch_sizes)
    stopping = stopping_table(ck, raw, sparsities, len(seeds or ()), probes.pairs_per_seed(trials),
                              probes.lipschitz_in_run)
    tuning = tuning_table(ck, raw, seeds)
    if tuning and (complete or len(delays or ()) > 1):
        ck.add("tuning", "cannot be combined with complete_trials or a delay axis (a cell's one "
               "point is repeated); allowed: one of them")
    if options.bias_controls and (len(optimizers) > 1 or not {0.0} < set(sparsities or ())):
        ck.add("pruning.bias_controls", "needs one optimizer, the dense level 0 and a sparse "
               "level; allowed: sparsities = [0.0, ...] with one optimizer")
    if not isinstance(raw.get("reductions", ""), str):
        ck.add("reductions", f"found {raw['reductions']!r}; allowed: a string (how the design is "
                             f"reduced from the paper's, printed by the report)")
    workers, program_choice = executor_table(ck, raw)
    measures, measure_found = measures_key(ck, raw, folders, measure_digests)

    if ck.problems:
        raise SpecError(ck.problems, source)
    if len(optimizers) == 1:   # one optimizer: its own space now (several: in variants)
        search, overrides = optimizer_search(search, overrides, optimizers[0]), {}
    return Spec(
        name=name, dataset=dataset, dataset_options=dict(dataset_options), model=model,
        model_options=dict(model_options), optimizer=optimizers[0], metric=metric, target=target,
        strict=COMPARISONS[comparison], batch_sizes=batch_sizes, sparsities=sparsities,
        pruning_criterion=criteria[0], pruning_criteria=criteria, sanity=sanity,
        search=search, search_seed=search_seed, trials=trials, budget=budget,
        eval=eval_schedule, seeds=seeds,
        probes=probes, branching=branch, schedules=sched,
        workers=workers, optimizers=optimizers, toml=toml_text, search_overrides=overrides,
        digests=found, criterion_digests=criterion_digests, folders=folders, device=device,
        precision=precision, init=init, pruning_options=options, stop=stop,
        complete_trials=complete, program_choice=program_choice, delays=delays,
        delay_kind=delay_kind, stopping=stopping, tuning=tuning, measures=measures,
        measure_digests=measure_found)


def with_workload(spec: Spec, model: Factory | None = None, dataset: Factory | None = None
                  ) -> Spec:
    """``spec`` with its model and / or data set replaced (a registered name, an import path
    ``"module:factory"`` or a callable), checked as ``[workload]`` is (:class:`SpecError`)."""
    if model is None and dataset is None:
        return spec
    table = {"dataset": spec.dataset if dataset is None else dataset,
             "model": spec.model if model is None else model,
             "dataset_options": spec.dataset_options, "model_options": spec.model_options}
    ck = Checker()
    ds, mo, _, _, found = workload_table(ck, {"workload": table}, spec.folders)
    if ck.problems:
        raise SpecError(ck.problems)
    return replace(spec, dataset=ds, model=mo, digests=found)


def loads(text: str, source: str | None = None, model: Factory | None = None,
          dataset: Factory | None = None, folders: tuple[str, ...] = ()) -> Spec:
    """Parse and validate TOML text. ``model`` / ``dataset``: replace ``[workload]``'s (as in
    :func:`with_workload`); ``folders``: where factory modules may be found after ``sys.path``."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError([f"(toml): not valid TOML: {exc}"], source) from None
    given = {k: v for k, v in (("model", model), ("dataset", dataset)) if v is not None}
    if given and isinstance(raw.get("workload", {}), dict):
        raw["workload"] = {**raw.get("workload", {}), **given}
    return validate(raw, source, text, folders)


def load(path: str | Path, model: Factory | None = None, dataset: Factory | None = None
         ) -> Spec:
    """Read and validate a TOML study file (a bare name is looked up in the bundled configs).
    A factory named by import path is found on ``sys.path``, else in the file's folder (not a
    bundled config's). ``model`` / ``dataset``: as in :func:`loads`. A file that cannot be read
    raises :class:`SpecIOError`, an invalid spec :class:`SpecError`."""
    p = resolve_config(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecIOError(f"cannot read the study spec {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SpecError([f"(file): cannot read {p}: not UTF-8 text (byte {exc.start}); a study "
                         "spec is a TOML file"], str(p)) from None
    folder = p.resolve().parent
    return loads(text, str(p), model, dataset,
                 () if folder == CONFIG_DIR else (str(folder),))
