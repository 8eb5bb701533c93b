"""A study spec's tables, one module each: its keys, their checks and their parser.

- :mod:`~experiments.spec.tables.workload`: ``[workload]`` (data set, model, their options, by
  registered name or import path; device, precision, init).
- :mod:`~experiments.spec.tables.goal`: ``[goal]``.
- :mod:`~experiments.spec.tables.pruning`: ``[pruning]`` (criteria, sanity checks, the options of
  how a mask is made).
- :mod:`~experiments.spec.tables.search`: ``[search]`` (and ``[search.optimizers.<name>]``).
- :mod:`~experiments.spec.tables.budget`: ``[budget]``.
- :mod:`~experiments.spec.tables.eval`: ``[eval]``.
- :mod:`~experiments.spec.tables.probes`: ``[probes]`` (L at Lee et al.'s stage included).
- :mod:`~experiments.spec.tables.branching`: ``[branching]``.
- :mod:`~experiments.spec.tables.stopping`: ``[stopping]`` (the pre-declared stopping rule).
- :mod:`~experiments.spec.tables.tuning`: ``[tuning]`` (search, then repeat the best point).
- :mod:`~experiments.spec.tables.executor`: ``[executor]``.
- :mod:`~experiments.spec.tables.measures`: the top-level ``measures`` key (the user's own
  measurements, by import path).

The top-level keys are checked by :mod:`experiments.spec.checks`, and
:func:`experiments.spec.study.validate` composes them all.
"""
