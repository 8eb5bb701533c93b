"""The base of every exception sparsescale raises, and the trainers' own.

Each package names its own subclasses (``training.DataError``, ``training.MaskError``,
``pruning.PruningError``, ``theory.TheoryError``, ``experiments.SpecError``, ...); catching
:class:`SparsescaleError` catches any bad input the library reports, and nothing else. It is a
``ValueError`` because every one of them reports a bad value: a key, a file, an argument.
The trainers' :class:`ConfigError` and the data sets' :class:`DataError` live here, below every
module that raises them.
"""


class SparsescaleError(ValueError):
    """Bad input to sparsescale: the message names what was wrong and what is allowed."""


class ConfigError(SparsescaleError):
    """A trial, run configuration, schedule or optimizer setting is invalid; names the key and
    what is allowed."""


class DataError(SparsescaleError):
    """A data set could not be loaded or made, or is not a ``training.Dataset``: names the file,
    option or argument and what was expected."""
