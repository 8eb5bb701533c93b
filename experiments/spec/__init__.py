"""A study as written: the validated spec (:mod:`experiments.spec.study`), the checks of its
values (:mod:`~experiments.spec.checks`), the search space (:mod:`~experiments.spec.search`),
the ``[branching]`` table (:mod:`~experiments.spec.tables.branching`), an imported workload's spec
(:mod:`~experiments.spec.external`) and the plan of groups it expands into
(:mod:`~experiments.spec.plan`)."""
