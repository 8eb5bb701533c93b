"""The private multi-trial engine behind :func:`training.train_trials`: how N trials are stacked
and stepped together.

- :mod:`training.engine.cell_plan`: which program computes a stack's step for a (model, batch
  size) cell, how many trials share a stack, how many examples a chunk holds.
- The four programs, one module each, named as the store records them: ``fused``
  (:mod:`~training.engine.fused`, the compiled kernel's), ``per_trial``
  (:mod:`~training.engine.per_trial`), ``batched`` (:mod:`~training.engine.batched`) and
  ``func`` (:mod:`~training.engine.func`).
- :mod:`training.engine.compiled_kernel`: builds and loads the compiled kernel (the C++
  extension in ``csrc/``).
- :mod:`training.engine.trial_stack`, :mod:`~training.engine.updates`,
  :mod:`~training.engine.adam`: the state of a stack and its update.
- :mod:`training.engine.resume`: a saved state's rows into the stacks, and back.

Nothing here is public API: names may change between releases.
"""
