"""Specs of workloads measured elsewhere: what a report reads of an imported run folder.

An importer (:mod:`experiments.exchange`) writes a results store whose study row holds a
synthesized spec, not one of this library's studies: its data set and model are the archive's
(not in this library's registries), nothing was pruned, no evaluation schedule or probes were
run, its goal metric is an archive column (``val/classification_error``), and its trials per
group and step budget may differ between batch sizes (a range such as ``"5–7"``, or a sentence).
Its canonical form carries ``"source": {"format": "batch_science", ...}``;
:func:`experiments.store.results.stored_spec` recognises it and returns an :class:`ExternalSpec`: checked
for every field the report reads, never against the registries. A report then reads an imported
run folder like a study of this library's, alone or beside one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Union

from experiments.spec import checks
from experiments.spec.search import Dimension
from experiments.spec.errors import SpecError
from experiments.spec.study import Spec, SpecCore
from experiments.spec.tables.budget import Budget
from experiments.spec.tables.probes import Probes
from experiments.spec.tables.search import dimension

# archives an importer reads (the ``format`` of a spec's ``source``)
FORMATS = ("batch_science",)
SEARCHED = ("lr", "momentum")
KEYS = ("name", "source", "workload", "optimizer", "goal", "batch_sizes", "sparsities", "seeds",
        "trials", "search", "budget", "probes")


@dataclass(frozen=True)
class ExternalSpec(SpecCore):
    """An imported workload's spec. The fields the report reads have :class:`Spec`'s names and
    meanings; ``trials`` and ``budget`` are a text where batch sizes differ. Nothing was pruned
    or probed: ``pruning_criterion`` is "–", there is no pruning series, and ``probes`` disabled."""

    source: dict[str, Any]
    seeds: tuple[int, ...]
    trials: int | str
    search: dict[str, Dimension]
    budget: Budget | str
    toml: str = field(default="", compare=False)

    pruning_criterion = "–"
    pruning_sanity = None
    series = ""
    probes = Probes(enabled=False)

    def cells(self) -> list[tuple[float, int, int]]:
        """(sparsity, batch size, seed) of every group the import holds."""
        return [(s, b, seed) for s in self.sparsities for b in self.batch_sizes
                for seed in self.seeds]

    def canonical(self) -> dict[str, Any]:
        """The canonical JSON-able form (``study.spec_json``); its hash identifies the import."""
        return {
            **self.core(),
            "source": dict(self.source),
            "seeds": list(self.seeds),
            "trials": self.trials,
            "search": {k: asdict(d) for k, d in sorted(self.search.items())},
            "budget": {"max_steps": self.budget if isinstance(self.budget, str)
                       else self.budget.max_steps},
            "probes": {"enabled": False},
        }


# what a results store's study row describes: a study of this library's, or an import
StudySpec = Union[Spec, ExternalSpec]


def is_external(canonical: Mapping[str, Any]) -> bool:
    """Whether a stored canonical spec describes an imported workload."""
    return "source" in canonical


def _text_or_int(ck: checks.Checker, value: Any, path: str) -> int | str | None:
    if isinstance(value, str) and value.strip():
        return value
    return ck.integer(value, path, 1)


def external_spec(canonical: Mapping[str, Any], toml_text: str = "") -> ExternalSpec:
    """The :class:`ExternalSpec` of a synthesized canonical spec, or :class:`SpecError` listing
    every problem (key path first)."""
    c, ck = canonical, checks.Checker()
    ck.keys(c, "", KEYS)
    source = ck.table(c, "source", "source", required=True) or {}
    ck.choice(source.get("format"), "source.format", FORMATS)
    ck.plain(source, "source")
    name = c.get("name")
    if not isinstance(name, str) or not name:
        ck.add("name", f"found {name!r}; allowed: a non-empty string")
    wl = ck.table(c, "workload", "workload", required=True) or {}
    ck.keys(wl, "workload", ("dataset", "dataset_options", "model", "model_options"))
    for key in ("dataset", "model"):
        if not isinstance(wl.get(key), str) or not wl.get(key):
            ck.add(f"workload.{key}", f"found {wl.get(key)!r}; allowed: a non-empty string")
    options = {k: ck.table(wl, k, f"workload.{k}") or {} for k in ("dataset_options", "model_options")}
    optimizer = checks.optimizers(ck, c.get("optimizer"))[0]
    goal = ck.table(c, "goal", "goal", required=True) or {}
    ck.keys(goal, "goal", ("metric", "target", "strict"))
    metric = goal.get("metric")
    if not isinstance(metric, str) or not metric:
        ck.add("goal.metric", f"found {metric!r}; allowed: a column name")
    target = ck.number(goal.get("target"), "goal.target")
    strict = goal.get("strict", True)
    if not isinstance(strict, bool):
        ck.add("goal.strict", f"found {strict!r}; allowed: true or false")
    batch_sizes = checks.batch_sizes(ck, c.get("batch_sizes"))
    sparsities = checks.sparsities(ck, c.get("sparsities", [0.0]))
    seeds = checks.seeds(ck, c.get("seeds", [0]))
    trials = _text_or_int(ck, c.get("trials"), "trials")
    search_table = ck.table(c, "search", "search") or {}
    ck.keys(search_table, "search", SEARCHED)
    search = {k: dimension(ck, {x: v for x, v in d.items() if x != "relative" or v}
                                  if isinstance(d, dict) else d, f"search.{k}", k)
              for k, d in search_table.items() if k in SEARCHED}
    budget_table = ck.table(c, "budget", "budget", required=True) or {}
    ck.keys(budget_table, "budget", ("max_steps",))
    max_steps = _text_or_int(ck, budget_table.get("max_steps"), "budget.max_steps")
    probes = ck.table(c, "probes", "probes") or {}
    if probes.get("enabled", False) is not False:
        ck.add("probes.enabled", f"found {probes['enabled']!r}; allowed: false (an import "
                                 "holds no probes)")
    if ck.problems:
        raise SpecError(ck.problems)
    return ExternalSpec(
        name=name, source=dict(source), dataset=wl["dataset"],
        dataset_options=dict(options["dataset_options"]), model=wl["model"],
        model_options=dict(options["model_options"]), optimizer=optimizer, metric=metric,
        target=target, strict=strict, batch_sizes=batch_sizes, sparsities=sparsities,
        seeds=seeds, trials=trials, search=search,
        budget=max_steps if isinstance(max_steps, str) else Budget(max_steps=max_steps),
        toml=toml_text)
