"""The top-level ``measures`` key: the measurements of the user's own a study runs beside its
built-in ones (:mod:`experiments.measurement`)::

    measures = ["mymeasures:WeightNorm"]   # import paths, or names a measurements.register made

An import path names a :class:`experiments.measurement.Measurement` subclass (or instance) in a
module of the user's, found as a ``[workload]`` factory is (``sys.path``, then the spec's
folder: :mod:`experiments.spec.factories`); it is registered under its path, and its module's
digest enters the spec hash (``measure_digests``), so editing the measurement makes a new
study. A spec without the key keeps its hash. A stored spec's measurement (a store's, read by
the report) is imported when it can be, for its part of the report, and otherwise taken as
recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiments import measurement
from experiments.spec.checks import Checker, did_you_mean
from experiments.spec.factories import is_path, path_key



def measures_key(ck: Checker, raw: Mapping[str, Any], folders: tuple[str, ...] = (),
                 digests: Mapping[str, str] | None = None
                 ) -> tuple[tuple[str, ...], dict[str, str]]:
    """(names, the digest of each named by import path) of ``raw``'s ``measures``; problems go
    to ``ck``. ``digests`` given (path -> digest): a stored spec's, checked as recorded."""
    value = raw.get("measures", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        ck.add("measures", f"found {value!r}; allowed: a list of measurement names or import "
                           f"paths \"package.module:Class\"")
        return (), {}
    if len(set(value)) != len(value):
        ck.add("measures", f"found duplicates in {value}; allowed: distinct names")
        return (), {}
    found: dict[str, str] = {}
    names = tuple(n for i, v in enumerate(value)
                  if (n := _one(ck, v, f"measures[{i}]", folders, digests, found)) is not None)
    return names, found


def _one(ck: Checker, value: str, path: str, folders: tuple[str, ...],
         digests: Mapping[str, str] | None, found: dict[str, str]) -> str | None:
    """One name: registered, or an import path whose measurement is imported and registered
    (for a stored spec: when it can be) and whose digest goes into ``found``."""
    # a built-in kind is asked for by its own table ([probes], [branching]); these are named
    allowed = [n for n, m in measurement.MEASURES.items()
               if type(m).wanted is measurement.Measurement.wanted]
    if not is_path(value):
        if value in allowed:
            return value
        listed = ", ".join([*allowed, 'a measurement "package.module:Class"'])
        ck.add(path, f"found {value!r}{did_you_mean(value, allowed)}; allowed: {listed}")
        return None
    return path_key(ck, value, path, "measurement", folders, digests, found,
                    accept=lambda obj: measurement.add_instance(value, obj),
                    errors=(measurement.MeasurementError,), digest_key="measure_digests",
                    reload=True)
