"""Every kind of measurement of a study, one folder each, registered in
:data:`experiments.measurement.MEASURES` when this package is imported (``import experiments``
does): the pruning sanity checks (:mod:`~experiments.measures.sanity`), time to result on real
hardware (:mod:`~experiments.measures.hardware`), the gradient-delay axis
(:mod:`~experiments.measures.delay`), the critical batch by branching
(:mod:`~experiments.measures.branching`) and the probes (:mod:`~experiments.measures.probes`).
The order is the registry's: the runner starts them in it (branching before the probes: a
level's branching is the longer task) and the report places their parts in it.

A measurement of the user's own needs no file here: see :mod:`experiments.measurement`.
"""

from experiments.measures import sanity, hardware, delay, branching, probes  # noqa: F401
