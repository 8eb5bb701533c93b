"""Every kind of measurement of a study, one folder each, registered in
:data:`experiments.measurement.MEASURES` when this package is imported (``import experiments``
does): the sweep itself (:mod:`~experiments.measures.sweep`: no task, the report's core
sections), the pruning sanity checks (:mod:`~experiments.measures.sanity`), time to result on real
hardware (:mod:`~experiments.measures.hardware`), the gradient-delay axis
(:mod:`~experiments.measures.delay`), the critical batch by branching
(:mod:`~experiments.measures.branching`), the probes (:mod:`~experiments.measures.probes`), L
at Lee et al.'s stage (:mod:`~experiments.measures.stage`) and the batch-size policies'
shoot-out (:mod:`~experiments.measures.schedules`). The order is the registry's: the runner
starts them in it (branching before the probes: a level's branching is the longer task) and
finishes them in it (the shoot-out last: it reads the branching rows), and the report places
their parts in it.

A measurement of the user's own needs no file here: see :mod:`experiments.measurement`.
"""

from experiments.measures import (  # noqa: F401
    sweep, sanity, hardware, delay, branching, probes, stage, schedules,
)
