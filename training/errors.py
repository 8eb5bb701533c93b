"""The base of every exception and warning sparsescale raises, and the trainers' own errors.

Every exception the project raises is a :class:`SparsescaleError`, and it is one of two kinds:

- **bad input** (a ``ValueError`` too): a key, an argument, a file's contents the library cannot
  accept: ``training.ConfigError``, ``training.DataError``, ``training.MaskError``,
  ``pruning.PruningError``, ``theory.TheoryError``, ``experiments.SpecError``, a store holding
  another study, a malformed archive, ... The message names what was wrong and what is allowed.
- **storage and IO failures** (an ``OSError`` too, through :class:`SparsescaleIOError`): a file or
  folder that cannot be read or written: a store locked by another process, a read-only run
  folder, a full disk, a file that cannot be opened. The message names the path.

Catching :class:`SparsescaleError` catches both; catching ``ValueError`` or ``OSError`` catches
one kind. The ``sparsescale`` command exits with status 2 for the first and 1 for the second.

Every warning the project issues is a :class:`SparsescaleWarning` (a ``UserWarning``), never an
exception class of ours: ``warnings.simplefilter("ignore", SparsescaleWarning)`` silences them.

The trainers' :class:`ConfigError` and the data sets' :class:`DataError` and :class:`DataIOError`
live here, below every module that raises them.
"""


class SparsescaleError(Exception):
    """An error sparsescale raises; each is a ``ValueError`` (bad input) or an ``OSError`` (a file
    or folder that cannot be used). Raise one of its subclasses, never this class itself."""


class SparsescaleIOError(SparsescaleError, OSError):
    """A file or folder cannot be read or written (missing, unreadable, read-only, locked, a full
    disk): the message names the path and why. Each package names its own subclasses
    (``training.DataIOError``, ``experiments.StoreIOError``, ...)."""


class SparsescaleWarning(UserWarning):
    """A warning sparsescale issues (e.g. ``KernelWarning``, ``pruning.LayerCollapseWarning``)."""


class ConfigError(SparsescaleError, ValueError):
    """A trial, run configuration, schedule or optimizer setting is invalid; names the key and
    what is allowed."""


class DataError(SparsescaleError, ValueError):
    """A data set could not be loaded or made, or is not a ``training.Dataset``: names the file,
    option or argument and what was expected."""


class DataIOError(SparsescaleIOError):
    """A data file cannot be read, or the data cache cannot be written: names the path."""


class ModelError(SparsescaleError, ValueError):
    """A model cannot be built for the given data set or options, or cannot be trained as given
    (``training.models``): names the layer or the option and what to do."""
