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

A name that was renamed keeps working for a while as a deprecated alias: :func:`renamed_keyword`
(an argument) and :func:`renamed_names` (a module attribute) issue one ``DeprecationWarning``
naming the new name, the one way every package says so.
"""

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


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


class ArgumentError(ConfigError, TypeError):
    """A call gives an argument twice, under its name and its deprecated name: a
    :class:`ConfigError` (the project's errors are ``ValueError`` s or ``OSError`` s), and a
    ``TypeError``, as Python's own for an argument given twice."""


class ModelError(SparsescaleError, ValueError):
    """A model cannot be built for the given data set or options, or cannot be trained as given
    (``training.models``): names the layer or the option and what to do."""


def deprecated(old: str, new: str, where: str, stacklevel: int = 3) -> None:
    """Warn (``DeprecationWarning``) that ``old`` is a deprecated name of ``new`` in ``where``."""
    warnings.warn(f"{where}: {old!r} is deprecated, use {new!r}", DeprecationWarning,
                  stacklevel=stacklevel)


def renamed_keyword(old: str, new: str) -> Callable[[F], F]:
    """Decorator: the keyword argument ``old`` is accepted as ``new`` with a deprecation
    warning; given both, an :class:`ArgumentError` (a ``TypeError``, as for any argument given
    twice)."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if old in kwargs:
                if new in kwargs:
                    raise ArgumentError(f"{fn.__qualname__}() got {new!r} and its deprecated "
                                    f"name {old!r}; give {new!r} only")
                deprecated(old, new, f"{fn.__qualname__}()")
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return call  # type: ignore[return-value]
    return wrap


def renamed_names(module: str, names: Mapping[str, Any]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` (PEP 562) answering each deprecated name of ``names`` (old name
    -> the renamed object, which has its new ``__name__``) with a deprecation warning."""
    def getattr_(name: str) -> Any:
        if name in names:
            deprecated(name, getattr(names[name], "__name__", name), module)
            return names[name]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return getattr_
