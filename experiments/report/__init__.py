"""The study report, read only from the store: the analysis tables (:mod:`~experiments.report.analysis`),
the theory beside the measurement (:mod:`~experiments.report.theory_view`,
:mod:`~experiments.report.verdicts`), the sentences, tables and figures, and
:func:`experiments.report.write.write_report`, which renders them, with every registered
measurement's part (:mod:`experiments.measures`), to Markdown and HTML through the templates in
``templates/``."""
