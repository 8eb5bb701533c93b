"""The programs by name: one name -> builder table, every program in a module of its own.

The strategy rules (:mod:`training.engine.strategy`) build the programs they pick from this
table, the measured choice (:mod:`training.engine.choice`) times the candidates it lists, and
``SPARSESCALE_PROGRAM_CHOICE`` and the store name programs by its names
(:class:`training.registry.Registry`). A new program is a module with a
:class:`~training.engine.programs.base.Program` subclass and a ``build(cell, examples_per_chunk,
eval_chunk)``, added here, and a rule (or a candidacy) in the strategy that picks it.
"""

from __future__ import annotations

from training.engine.programs import batched, func, fused, per_trial, plain
from training.engine.programs.base import Builder, Cell, Program
from training.errors import ConfigError
from training.registry import Registry

PROGRAMS: Registry[Builder] = Registry("program", ConfigError)
PROGRAMS.add("fused", fused.build)          # the compiled kernel's (csrc/): MLPs, 1-D CNNs
PROGRAMS.add("per_trial", per_trial.build)  # trials side by side through the module's autograd
PROGRAMS.add("batched", batched.build)      # hand-batched matmuls over the stack (fused's twin)
PROGRAMS.add("func", func.build)            # any module through torch.func's vmap
PROGRAMS.add("plain", plain.build)          # the plain loop's way, one trial after another
# the library's own: a program registered after them is the user's, run where it is named
# (training.engine.strategy.named)
LIBRARY = tuple(PROGRAMS.names())


def build(name: str, cell: Cell, examples_per_chunk: int, eval_chunk: int) -> Program | None:
    """Program ``name`` (a key of :data:`PROGRAMS`) for ``cell``, or None where it cannot run
    the cell."""
    return PROGRAMS.get(name)(cell, examples_per_chunk, eval_chunk)
