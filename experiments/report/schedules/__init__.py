"""The batch-size policies' shoot-out's numbers (``[schedules]``, :mod:`~.view`): per policy
the steps, examples and modelled time to the goal against the best fixed batch size, with
intervals and verdicts. Shared by the report's section (:mod:`experiments.measures.schedules`)
and the advice (:mod:`experiments.run.advise_schedule`), so it stays below both."""
