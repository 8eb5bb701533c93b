"""The run folders a report reads, loaded once and stacked into tables.

Everything here reads :class:`experiments.store.results.Results` (never a study's in-memory state), so the
same store always gives the same report. Several run folders can be combined (e.g. an SGD and a
momentum study): each run gets a label "study (optimizer)" and every curve is a *series* = (run,
sparsity level). :class:`RunSet` holds the stored tables of every run with ``run`` and ``series``
columns, and what the runs' specs plan (:func:`experiments.spec.plan.plan`; an imported run,
:mod:`experiments.spec.external`, plans the groups it holds); the analysis
(:mod:`experiments.report.analysis`) takes these frames.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from training.errors import SparsescaleError, SparsescaleIOError

from experiments.spec.external import ExternalSpec, StudySpec
from experiments.report.formatting import series_label
from experiments.spec.plan import plan
from experiments.spec.search import Dimension
from experiments.store.results import Results, load_results, table_attribute


# Canonical spec entries that make two runs' dense networks the same experiment.
DENSE_KEYS = ("workload", "optimizer", "goal", "batch_sizes", "search", "trials", "budget", "eval",
              "seeds")


class ReportError(SparsescaleError, ValueError):
    """The report cannot be written as asked: names the argument and what is allowed."""


class ReportIOError(SparsescaleIOError):
    """The report's files cannot be written (a read-only or full folder): names the path."""


@dataclass(frozen=True)
class Run:
    """One run folder's stored results and the label its series carry in a combined report."""

    results: Results
    label: str

    @property
    def spec(self) -> StudySpec:
        return self.results.spec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def optimizer(self) -> str:
        return self.spec.optimizer


@dataclass(frozen=True)
class RunSet:
    """The runs of one report and their tables, each with ``run`` (label) and ``series`` columns
    first: ``groups``, ``trials``, ``probes``, ``study`` and ``stage`` (the store's
    ``stage_probes``: L at Lee et al.'s stage) as stored, ``planned`` one row per (sparsity,
    batch size, seed) the run's spec plans (with ``probes``: whether it plans probes), and
    ``tables``: every table of :attr:`experiments.store.results.Results.tables` stacked the
    same way (each measurement's: ``branching``, ``warmup``, a user's own), also read as
    attributes (``runs.branching``).
    ``order`` lists the series in report order: runs as given, sparsity ascending."""

    runs: tuple[Run, ...]
    groups: pd.DataFrame
    trials: pd.DataFrame
    probes: pd.DataFrame
    study: pd.DataFrame
    planned: pd.DataFrame
    order: tuple[str, ...]
    stage: pd.DataFrame = field(default_factory=pd.DataFrame)
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)

    def __getattr__(self, name: str) -> pd.DataFrame:
        return table_attribute(self, name)

    @property
    def combined(self) -> bool:
        return len(self.runs) > 1

    @property
    def labels(self) -> list[str]:
        return [r.label for r in self.runs]

    def run(self, label: str) -> Run:
        return next(r for r in self.runs if r.label == label)

    def searched(self) -> dict[str, dict[str, Dimension]]:
        """Run -> its search space; plain SGD records momentum 0 whatever the space says, so
        momentum was not searched there."""
        return {r.label: {k: d for k, d in r.spec.search.items()
                          if not (k == "momentum" and r.optimizer == "sgd")} for r in self.runs}

    def dense_runs(self) -> dict[str, str]:
        """Run -> the run whose dense series its sparse series are measured against: itself if
        it plans a dense level, else the first run that does with the same :data:`DENSE_KEYS`
        (a pruning series other than a study's first trains no dense level of its own,
        :mod:`experiments.spec.series`)."""
        dense = [r for r in self.runs if 0.0 in r.spec.sparsities]

        def same(a: Run, b: Run) -> bool:
            ca, cb = a.spec.canonical(), b.spec.canonical()
            return all(ca[k] == cb[k] for k in DENSE_KEYS)

        return {r.label: r.label if 0.0 in r.spec.sparsities else
                next((d.label for d in dense if same(d, r)), r.label) for r in self.runs}

    def info(self) -> pd.DataFrame:
        """One row per run: ``run`` (label), ``study`` (the spec's name) and ``optimizer``."""
        return pd.DataFrame([(r.label, r.name, r.optimizer) for r in self.runs],
                            columns=["run", "study", "optimizer"])


def load_runs(run_dirs: list[str | Path]) -> RunSet:
    """Load every run folder (``experiments.load_results``) and label it "study (optimizer)";
    a repeated label gets " #2", " #3", ... in the order given."""
    if isinstance(run_dirs, (str, Path)) or not run_dirs:
        raise ReportError(f"run_dirs must be a non-empty list of run folders, got {run_dirs!r}")
    results = [load_results(d) for d in run_dirs]
    for d, r in zip(run_dirs, results):
        if r.spec is None:
            raise ReportError(f"run_dirs: {d} holds a store without a study row; run a study into it")
    runs, seen = [], {}
    for r in results:
        name, opt = r.spec.name, r.spec.optimizer
        # a sub-study of a multi-optimizer spec is named "<study>-<optimizer>"; a pruning series
        # (experiments.spec.series) is labelled by the series
        base = f"{r.spec.series or name.removesuffix('-' + opt)} ({opt})"
        seen[base] = seen.get(base, 0) + 1
        runs.append(Run(r, base if seen[base] == 1 else f"{base} #{seen[base]}"))
    return stack(tuple(runs))


def stack(runs: tuple[Run, ...]) -> RunSet:
    """The :class:`RunSet` of loaded runs."""
    combined = len(runs) > 1

    def stacked(table: str) -> pd.DataFrame:
        frames = []
        for r in runs:
            df = getattr(r.results, table).copy()
            df.insert(0, "run", r.label)
            if "sparsity" in df.columns:
                df.insert(1, "series", [series_label(r.label, s, combined) for s in df["sparsity"]])
            frames.append(df)
        return pd.concat(frames, ignore_index=True)

    planned = pd.DataFrame(
        [(r.label, series_label(r.label, s, combined), float(s), int(b), int(seed),
          r.spec.probes.enabled, int(tau)) for r in runs for s, b, seed, tau in planned_cells(r.spec)],
        columns=["run", "series", "sparsity", "batch_size", "seed", "probes", "delay"])
    order = []
    for r in runs:
        levels = sorted(set(r.spec.sparsities) | set(r.results.groups["sparsity"]))
        order += [series_label(r.label, s, combined) for s in levels]
    tables = {t: stacked(t) for t in runs[0].results.tables}
    return RunSet(runs, stacked("groups"), stacked("trials"), tables["probes"], stacked("study"),
                  planned, tuple(order), tables["stage_probes"], tables)


def planned_cells(spec: StudySpec) -> list[tuple[float, int, int, int]]:
    """(sparsity, batch size, seed, delay) of every group ``spec`` plans; an import plans the
    groups it holds (synchronous ones)."""
    if isinstance(spec, ExternalSpec):
        return [(*cell, 0) for cell in spec.cells()]
    return [(g.sparsity, g.batch_size, g.seed, g.delay) for g in plan(spec)]


def synchronous(runs: RunSet) -> RunSet:
    """``runs`` with only their synchronous (delay 0) groups, trials and planned groups: what
    every part of the report but the delay axis's reads (a study without the axis is all of
    it)."""
    def sync(frame: pd.DataFrame) -> pd.DataFrame:
        if "delay" not in frame or not (frame["delay"] != 0).any():
            return frame
        return frame[frame["delay"] == 0].reset_index(drop=True)

    return replace(runs, groups=sync(runs.groups), trials=sync(runs.trials),
                   planned=sync(runs.planned))
