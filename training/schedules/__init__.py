"""What changes along a run: the learning rate's schedule (:mod:`~training.schedules.lr_schedule`),
a batch-size schedule (:mod:`~training.schedules.batch_schedule`) and each trial's data order
(:mod:`~training.schedules.order`)."""
