"""The private multi-trial engine behind :func:`training.train_trials`: how N trials are stacked
and stepped together.

- :mod:`training.engine.loop`: the step loop: the cell's strategy, the stacks of trials and their
  steps from one evaluation to the next, the replay of a hit, and the call it takes and what it
  leaves of it (``Call``, ``Outcome``).
- :mod:`training.engine.strategy`: the rules that choose, for a (model, batch size) cell, which
  program computes a stack's step, how many trials share a stack, how many examples a chunk
  holds; :mod:`training.engine.choice`: the measured choice where no rule covers the cell.
- :mod:`training.engine.programs`: the five programs, one module each, behind one registry,
  named as the store records them: ``fused`` (the compiled kernel's), ``per_trial``,
  ``batched``, ``func`` and ``plain``.
- :mod:`training.engine.compiled_kernel`: builds and loads the compiled kernel (the C++
  extension in ``csrc/``); :mod:`training.engine.threads`: trials spread over host threads.
- :mod:`training.engine.updates`, :mod:`~training.engine.adam`: a stack's update;
  :mod:`training.engine.module_state`: the module's own state per trial.
- :mod:`training.engine.resume`: a saved state's rows into the stacks, and back.

Nothing here is public API: names may change between releases.
"""
