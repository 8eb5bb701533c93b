"""The programs of the multi-trial engine: the ways a training step of a stack of trials is
computed, one module each, behind one registry (:mod:`~training.engine.programs.registry`).

- :mod:`~training.engine.programs.base`: the :class:`Program` protocol, its optional abilities
  declared, and the :class:`Cell` a program is built for.
- ``fused`` (:mod:`~training.engine.programs.fused`, the compiled kernel's), ``per_trial``
  (:mod:`~training.engine.programs.per_trial`), ``batched``
  (:mod:`~training.engine.programs.batched`), ``func`` (:mod:`~training.engine.programs.func`)
  and ``plain`` (:mod:`~training.engine.programs.plain`).
"""

from training.engine.programs.base import Cell, Program
from training.engine.programs.registry import PROGRAMS, build

__all__ = ["Cell", "PROGRAMS", "Program", "build"]
