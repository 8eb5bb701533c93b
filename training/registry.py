"""One registry of named entries, for every kind the library names: data sets, models, programs,
pruning criteria.

A :class:`Registry` maps names to entries (a loader, a builder, a program's builder, a
:class:`pruning.Criterion`). Its rules are the same for every kind:

- a name already taken by an entry defined elsewhere is refused with one error line naming where
  the first one was defined; the same definition again (a module imported twice, a script also
  imported by its module name, a notebook cell run again) replaces its entry;
- an unknown name is answered with the closest registered one ("did you mean") and the list of
  names allowed;
- every error is the kind's own exception class (``training.DataError`` for data sets, ...), so
  a caller catches what it caught before.

Usage, as the model registry does::

    MODELS: Registry[Builder] = Registry("model", ModelError, sort=True)

    @MODELS.register("mlp")
    def mlp(dataset, **options): ...

    MODELS.get("mpl")   # ModelError: unknown model 'mpl' (did you mean 'mlp'?); allowed: ...
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def did_you_mean(value: str, allowed: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest allowed name, or nothing when none is close."""
    near = difflib.get_close_matches(value, list(allowed), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def import_path(path: str, what: str, error: type[Exception]) -> Any:
    """The object at ``path`` (``module:attribute``, the attribute may be dotted), as a spec or a
    caller names its own criterion, policy or measurement; ``error`` (the package's error class)
    with ``what`` and the path where the module cannot be imported or lacks the attribute."""
    module, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise error(f"{what} {path!r}: cannot import {module}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise error(f"{what} {path!r}: {module} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def origin(obj: Any) -> str:
    """Where ``obj`` (a function or class) is defined: its file and qualified name. A script run
    as ``__main__`` and imported by its module name defines one function twice, from one file; a
    notebook cell run again defines it from a new ``<ipython-input-...>`` file, which counts as
    the same interactive origin."""
    code = getattr(obj, "__code__", None)
    where = code.co_filename if code is not None else getattr(obj, "__module__", "?")
    if where.startswith("<") or "ipykernel" in where:
        where = "<interactive>"
    return f"{where}:{getattr(obj, '__qualname__', repr(obj))}"


class Registry(Generic[T]):
    """Named entries of one ``kind`` (the word its errors use: "model", "data set"), raising
    ``error`` for a duplicate or an unknown name. ``sort``: names listed in sorted order (else in
    order of registration); ``hint``: what else a name may be, appended to the unknown-name
    error (for example an import path)."""

    def __init__(self, kind: str, error: type[Exception], *, sort: bool = False,
                 hint: str = "") -> None:
        self.kind = kind
        self.error = error
        self.sort = sort
        self.hint = hint
        self._entries: dict[str, T] = {}
        self._origins: dict[str, str] = {}

    def add(self, name: str, entry: T, *, defined_by: Any = None) -> T:
        """Register ``entry`` as ``name``; ``defined_by`` (default: the entry itself) is the
        function or class whose definition the duplicate rule compares."""
        if not isinstance(name, str) or not name:
            raise self.error(f"a {self.kind}'s name must be a non-empty string, got {name!r}")
        where = origin(entry if defined_by is None else defined_by)
        if name in self._entries and self._origins[name] != where:
            raise self.error(f"{self.kind} {name!r} is already registered by "
                             f"{self._origins[name]}; choose another name, or remove it first")
        self._entries[name] = entry
        self._origins[name] = where
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: :meth:`add` the decorated function or class as ``name``, returned as it is."""
        return lambda entry: self.add(name, entry)

    def remove(self, name: str) -> T:
        """Take ``name`` out of the registry (an unknown name raises as :meth:`get`)."""
        entry = self.get(name)
        del self._entries[name], self._origins[name]
        return entry

    def get(self, name: str) -> T:
        """The entry registered as ``name``; an unknown name raises the registry's error with the
        closest name and the names allowed."""
        if name not in self._entries:
            raise self.error(self.unknown(name))
        return self._entries[name]

    def unknown(self, name: Any) -> str:
        """The error line for an unknown ``name``."""
        names = self.names()
        hint = f", or {self.hint}" if self.hint else ""
        return (f"unknown {self.kind} {name!r}{did_you_mean(str(name), names)}; allowed: "
                f"{', '.join(names)}{hint}")

    def names(self) -> list[str]:
        """The registered names, sorted or in order of registration."""
        return sorted(self._entries) if self.sort else list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """``(name, entry)`` pairs in the order of :meth:`names`."""
        return [(name, self._entries[name]) for name in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.contextmanager
    def preserved(self) -> Iterator[None]:
        """Run the body, then restore the registry's entries as they were before it (for tests
        that register entries of their own)."""
        entries, origins = dict(self._entries), dict(self._origins)
        try:
            yield
        finally:
            self._entries.clear()
            self._entries.update(entries)
            self._origins.clear()
            self._origins.update(origins)
