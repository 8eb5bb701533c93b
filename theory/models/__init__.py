"""Models and bounds of steps-to-result: the smooth nonconvex SGD bound
(:mod:`~theory.models.bounds`), the delayed-SGD bound with its critical batch and delay
(:mod:`~theory.models.delay`), the noisy quadratic model (:mod:`~theory.models.nqm`, its
branching, :mod:`~theory.models.nqm_branching`, and with delay, :mod:`~theory.models.nqm_delay`), the fit of a measured scaling curve
(:mod:`~theory.models.scaling`), the predicted curves per sparsity level
(:mod:`~theory.models.predict`) and the time to result on k workers
(:mod:`~theory.models.walltime`)."""
