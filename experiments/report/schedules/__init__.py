"""The report's section on the batch-size policies' shoot-out (``[schedules]``): the table per
policy against the best fixed batch size, the verdicts, each anchor's claimed gain beside what
it gains here, and the figure of the batch-size trajectories (:mod:`~.section`, :mod:`~.view`)."""
