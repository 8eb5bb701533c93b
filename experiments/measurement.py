"""Measurements as plug-ins: the :class:`Measurement` protocol and its registry.

A study trains its groups; everything measured beside them (the probes, L at Lee et al.'s
stage, the critical batch by branching, the pruning sanity checks, time to result on real
hardware, the gradient-delay axis, or a measurement of the user's own) is a
:class:`Measurement`, registered by name in :data:`MEASURES`. Each kind lives in one folder,
``experiments/measures/<name>/``, and says in one place:

- which store tables it owns (:attr:`Measurement.tables`, each a :class:`Table`): the store's
  schema (:mod:`experiments.store.schema`) is its core tables plus every registered one;
- whether a spec asks for it and what the store still lacks (:meth:`Measurement.wanted`,
  :meth:`Measurement.pending`), and its tasks (:meth:`Measurement.start`): the runner
  (:func:`experiments.run.runner.measure_runs`) starts every pending one, and finishes them in
  the registry's order;
- what it takes inside a group's runs while the group trains (:meth:`Measurement.watch`: L at
  Lee et al.'s stage), its rows written with the group;
- its tasks' summed seconds in ``timing.json`` (:meth:`Measurement.seconds`);
- its part of the report (:meth:`Measurement.report`, a :class:`Part`: sections, figures,
  tables, sentences, verdicts and CSV files), which :func:`experiments.report.write.build`
  places.

A measurement of the user's own is a subclass in a module of theirs, registered with
:func:`register` or named in a spec by import path (``measures = ["mymeasures:WeightNorm"]``,
found as a ``[workload]`` factory is; its module's digest enters the spec hash). The registry
refuses a second measurement under a taken name in one line and answers an unknown name with
"did you mean" (:class:`training.registry.Registry`).

This module imports nothing of the study's layers (spec, store, run, report): they import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from training.errors import SparsescaleError
from training.registry import Registry


class MeasurementError(SparsescaleError, ValueError):
    """A measurement is defined or named wrongly: a taken or unknown name, a path that is not a
    :class:`Measurement`, a table another measurement owns."""


@dataclass(frozen=True)
class Table:
    """One store table a measurement owns: its ``columns`` in order (the rows' tuples follow
    it), its SQL column definitions ``sql`` (types, checks, primary key), the ``sort`` keys its
    frame is read in, its ``volatile`` columns (that differ between two runs of one spec: wall
    times), the ``added`` columns (name, SQL type) a store written before them gains when opened
    for writing, its integer columns that may hold NULL (``nullable_int``, read as pandas'
    Int64), and the names it had in stores written before it was renamed (``former``: read,
    and migrated when opened for writing, under ``name``)."""

    name: str
    columns: tuple[str, ...]
    sql: str
    sort: tuple[str, ...] = ()
    volatile: tuple[str, ...] = ()
    added: tuple[tuple[str, str], ...] = ()
    nullable_int: tuple[str, ...] = ()
    former: tuple[str, ...] = ()

    def create(self) -> str:
        """The ``CREATE TABLE IF NOT EXISTS`` statement."""
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({self.sql})"


@dataclass(frozen=True)
class RunContext:
    """What a measurement's tasks get: the validated ``spec``, the loaded ``dataset``, the open
    ``store`` (the driver is its only writer) and the ``executor`` whose workers run the tasks
    (None: measure in this process)."""

    spec: Any
    dataset: Any
    store: Any
    executor: Any = None


class ReportContext(Protocol):
    """What a measurement's part of the report reads (:func:`experiments.report.write.build`
    makes one, :class:`experiments.report.context.LazyContext`): ``runs`` (the synchronous
    groups, :class:`experiments.report.runs.RunSet`), ``every`` (the same runs with every
    delay), and the analysis shared by the parts, each computed on first use and once:
    ``points``, ``edges``, ``fits`` and ``ratios`` (:mod:`experiments.report.analysis`) and
    ``theory`` (the theory beside the sweep, :func:`experiments.report.theory_view.theory_view`)."""

    runs: Any
    every: Any
    points: pd.DataFrame
    edges: pd.DataFrame
    fits: Any
    ratios: pd.DataFrame
    theory: Any


# a block of the report (or a findings entry) that shows every part's verdicts: a function of
# them all (the frame of :data:`experiments.report.verdicts.VERDICT_COLUMNS`), called once every
# part is made
Judged = Callable[[pd.DataFrame], Any]


@dataclass(frozen=True)
class Part:
    """A measurement's part of the report, placed by :func:`experiments.report.write.build` in
    the registry's order (the sweep's first):

    - ``head``: sections before Findings (the studies' overview);
    - in Findings: ``opening`` (sentences of its first paragraph: scaling and the cost of
      sparsity), ``findings`` (the claims' paragraph) and ``sentences`` (the last paragraph);
      ``verdicts`` (rows of :data:`experiments.report.verdicts.VERDICT_COLUMNS`; None: it
      judged none) among the claims of its table and in ``verdicts.csv``;
    - ``figures`` in Figures;
    - ``theory``: blocks of the Theory vs measurement section (present when a part gives one);
    - ``sections`` after Theory vs measurement;
    - in Tables: ``tables`` (sub-sections), then every part's ``last_tables`` (what is missing,
      what it cost);
    - ``appendix`` after the Tables section, ``closing`` at the end of the document;
    - ``files``: CSV tables written beside the report (None removes the file).

    A block of ``theory`` or ``sections``, or an entry of ``findings``, may be a function of
    every part's verdicts (:data:`Judged`): the claims' table of Theory vs measurement shows
    them all, and a failed claim's sentences (a list) give the probes' quantities."""

    head: tuple = ()
    opening: tuple[str, ...] = ()
    findings: tuple = ()
    sentences: tuple[str, ...] = ()
    verdicts: pd.DataFrame | None = None
    figures: tuple = ()
    theory: tuple = ()
    sections: tuple = ()
    tables: tuple = ()
    last_tables: tuple = ()
    appendix: tuple = ()
    closing: tuple = ()
    files: Mapping[str, pd.DataFrame | None] = field(default_factory=dict)


class Measurement:
    """The protocol of a kind of measurement (module docstring); subclass it and override what
    applies. ``name`` is set when it is registered."""

    name: str = ""
    tables: tuple[Table, ...] = ()

    def wanted(self, spec: Any) -> bool:
        """Whether ``spec`` asks for this measurement (default: it names it in ``measures``)."""
        return self.name in getattr(spec, "measures", ())

    def pending(self, ctx: RunContext) -> bool:
        """Whether the store lacks some of what the spec asks for (default: one of its tables
        has no row)."""
        return any(not len(ctx.store.frame(t.name)) for t in self.tables)

    def check(self, spec: Any, n_train: int) -> list[str]:
        """Problems of ``spec`` that need the loaded data set's training-set size, one line
        each (key, what was found, what is allowed)."""
        return []

    def start(self, ctx: RunContext) -> Callable[[bool], None] | None:
        """Start what the store lacks (submitted to ``ctx.executor`` when given) and return the
        function that waits for it and writes it (its argument: ``quiet``); None when this
        already measured and wrote everything."""
        return None

    def watch(self, spec: Any, group: Any) -> Any | None:
        """What this measurement takes inside the runs of ``group``
        (:class:`experiments.spec.plan.GroupPlan`) while the group trains: None (the default)
        for nothing, else a picklable plan, made on the driver and shipped with the group,
        whose ``watcher(model, dataset, mask_of)`` (in the worker: the group's network, its
        data set, and trial -> that trial's mask) returns an object with ``watch(first_index)``,
        the :class:`training.Watch` of each ``train_trials`` call of the group (its trial k is
        the group's trial ``first_index + k``), and ``taken(group, outcome)``: what it took, by
        table (rows in the table's column order, without ``lib_version`` and
        ``torch_version``), written with the group in its transaction, each table's rows of the
        group's (sparsity, seed, batch_size) replaced (none written where a table has no row)."""
        return None

    def seconds(self, frame: Callable[[str], pd.DataFrame]) -> dict[str, Any]:
        """This measurement's entries of ``timing.json``'s summed task seconds
        (:func:`experiments.run.timing.task_seconds`), read from a store's tables
        (``frame(table)``): by kind of task, :class:`TaskSeconds` (default: none)."""
        return {}

    def report(self, ctx: ReportContext) -> Part:
        """This measurement's part of the report (default: none)."""
        return Part()


@dataclass(frozen=True)
class TaskSeconds:
    """One kind of a measurement's tasks in a store (:meth:`Measurement.seconds`): how many
    ``tasks`` ran, their summed ``seconds`` (None: not known, a store written before they were
    stored), the ``unit`` a task is counted in ("run"), and ``share``: the key under which
    their seconds over the training's are recorded too (None: they are not)."""

    tasks: int
    seconds: float | None
    unit: str
    share: str | None = None


MEASURES: Registry[Measurement] = Registry(
    "measurement", MeasurementError,
    hint="a measurement \"package.module:Class\" (experiments.measurement.Measurement)")


def register(name: str) -> Callable[[type[Measurement]], type[Measurement]]:
    """Class decorator: register an instance of the decorated :class:`Measurement` subclass as
    ``name`` (the class is returned as it is)."""
    def add(cls: type[Measurement]) -> type[Measurement]:
        add_instance(name, cls)
        return cls
    return add


def add_instance(name: str, obj: Any) -> Measurement:
    """Register ``obj`` (a :class:`Measurement` subclass, instantiated without arguments, or an
    instance) as ``name``; a table another measurement owns is refused."""
    instance = obj() if isinstance(obj, type) and issubclass(obj, Measurement) else obj
    if not isinstance(instance, Measurement):
        raise MeasurementError(f"{name}: found {obj!r}; allowed: a subclass of "
                               f"experiments.measurement.Measurement, or an instance of one")
    owners = {t.name: n for n, m in MEASURES.items() if n != name for t in m.tables}
    taken = [f"{t.name!r} (owned by {owners[t.name]!r})" for t in instance.tables
             if t.name in owners]
    if taken:
        raise MeasurementError(f"measurement {name!r}: table {', '.join(taken)} is taken; "
                               f"allowed: a table name of its own")
    instance.name = name
    return MEASURES.add(name, instance, defined_by=type(instance))


def tables() -> dict[str, Table]:
    """Every registered measurement's tables, by table name, in registration order."""
    return {t.name: t for _, m in MEASURES.items() for t in m.tables}


def table_enabled(spec: Any, table: str) -> bool:
    """Whether ``spec`` has the spec table ``table`` (an attribute) with ``enabled`` set: what
    most measurements' ``wanted`` asks."""
    settings = getattr(spec, table, None)
    return bool(settings is not None and settings.enabled)


def wanted(spec: Any) -> list[Measurement]:
    """The registered measurements ``spec`` asks for, in registration order."""
    return [m for _, m in MEASURES.items() if m.wanted(spec)]
