"""Measurements of a network on a split, as the probes take them: the training loss as a function
of one flat parameter vector (:mod:`~theory.estimators.functional`), gradient noise
(:mod:`~theory.estimators.noise`, :mod:`~theory.estimators.sampling`,
:mod:`~theory.estimators.example_norms`), curvature (:mod:`~theory.estimators.curvature`), the
plain ReLU MLP's passes written out (:mod:`~theory.estimators.mlp_passes`), and the critical
batch by branching from checkpoints (:mod:`~theory.estimators.branching`)."""
