"""The base of every exception sparsescale raises.

Each package names its own subclasses (``training.DataError``, ``pruning.MaskError``,
``theory.TheoryError``, ``experiments.SpecError``, ...); catching :class:`SparsescaleError` catches
any bad input the library reports, and nothing else. It is a ``ValueError`` because every one of
them reports a bad value: a key, a file, an argument.
"""


class SparsescaleError(ValueError):
    """Bad input to sparsescale: the message names what was wrong and what is allowed."""
