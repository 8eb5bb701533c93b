"""The report's context: the loaded runs and the analysis every part of the report shares,
computed on first use and once (:class:`experiments.measurement.ReportContext` is what the
parts may read).

Lazy, so that a report computes only what its parts read (a study without probes evaluates
no bound until the sweep's part asks for it) and so that :func:`experiments.report.write.build`
itself calls nothing of ``theory``: each part does, through the context.
"""

from __future__ import annotations

from functools import cached_property

import pandas as pd

from experiments.report import analysis as A
from experiments.report.runs import RunSet, synchronous
from experiments.report.theory_view import TheoryPart, theory_view


class LazyContext:
    """The :class:`experiments.measurement.ReportContext` of ``loaded`` (every run folder of
    the report): ``every`` is it, ``runs`` its synchronous (delay 0) groups
    (:func:`experiments.report.runs.synchronous`); the rest is computed from ``runs``."""

    def __init__(self, loaded: RunSet) -> None:
        self.every = loaded
        self.runs = synchronous(loaded)

    @cached_property
    def points(self) -> pd.DataFrame:
        """Steps-to-result per (series, batch size) (:func:`experiments.report.analysis.points_table`)."""
        r = self.runs
        return A.points_table(r.groups, r.trials, r.planned, r.order)

    @cached_property
    def edges(self) -> pd.DataFrame:
        """Best metaparameters at the edge of their search space (:func:`~experiments.report.analysis.search_edges`)."""
        return A.search_edges(self.points, self.runs.searched())

    @cached_property
    def fits(self) -> A.Fits:
        """S(B) = S_min (1 + B_crit / B) per series (:func:`~experiments.report.analysis.fit_series`)."""
        return A.fit_series(self.runs.groups, self.runs.order)

    @cached_property
    def ratios(self) -> pd.DataFrame:
        """Sparse / dense steps at each common batch size (:func:`~experiments.report.analysis.step_ratios`)."""
        return A.step_ratios(self.points, self.runs.order, self.runs.dense_runs())

    @cached_property
    def theory(self) -> TheoryPart:
        """The theory beside the sweep: the bound from the probes, formulas, the noisy
        quadratic model (:func:`experiments.report.theory_view.theory_view`)."""
        r = self.runs
        return theory_view(r.groups, r.probes, self.fits, r.labels,
                           [run.optimizer for run in r.runs])
