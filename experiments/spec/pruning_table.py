"""The ``[pruning]`` table: its keys and their parser.

``method`` names the pruning criterion of every sparse level: a name from the pruning registry
(``pruning.list_methods()``: the built-in criteria and those a ``pruning.register`` made), or
the import path of a score function, ``"package.module:function"``, in a module of the user's
(found as a ``[workload]`` factory is: on ``sys.path``, else in the spec's folder; see
:mod:`experiments.spec.factories`). Such a module's file is digested, and its digest enters the
spec hash (``pruning.method_digest``), so editing the criterion makes a new study. A list of
methods, and ``sanity`` checks, make one series each (:mod:`experiments.spec.series`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pruning

from experiments.spec.checks import Checker, did_you_mean
from experiments.spec.factories import FactoryError, is_path, resolve, split
from experiments.spec.series import SANITY

KEYS = ("method", "sanity")
_DIGEST = re.compile(r"[0-9a-f]{64}")


def pruning_table(ck: Checker, raw: Mapping[str, Any], sparsities: tuple[float, ...] | None,
                  folders: tuple[str, ...] = (), digests: Mapping[str, str] | None = None
                  ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """The ``[pruning]`` table: (methods, sanity checks, the digest of each method named by
    import path). ``method`` is checked only when a sparsity level is > 0; a criterion by
    import path is imported (``sys.path``, then ``folders``) and its module digested, or, for a
    stored spec (``digests`` given, path -> digest), taken as recorded."""
    table = ck.table(raw, "pruning", "pruning") or {}
    ck.keys(table, "pruning", KEYS)
    sparse = bool(sparsities) and any(s > 0 for s in sparsities)
    method = table.get("method", "snip")
    found: dict[str, str] = {}
    methods = _methods(ck, method, folders, digests, found) if sparse else None
    sanity = _sanity(ck, table.get("sanity", []))
    if sparsities and not sparse and (isinstance(method, list) or table.get("sanity")):
        ck.add("pruning", "a list of methods or sanity checks needs a sparsity level > 0; "
                          "allowed: add one to sparsities")
    fallback = (method,) if isinstance(method, str) else ("snip",)
    return methods or fallback, sanity or (), found


def _allowed() -> str:
    return f"{', '.join(pruning.list_methods())}, or a criterion \"package.module:function\""


def _methods(ck: Checker, raw: Any, folders: tuple[str, ...], digests: Mapping[str, str] | None,
             found: dict[str, str]) -> tuple[str, ...] | None:
    """The distinct methods of ``pruning.method`` (a name, or a non-empty list), in the order
    given, or None after recording the problem."""
    values = raw if isinstance(raw, list) else [raw]
    if isinstance(raw, list) and not raw:
        ck.add("pruning.method", f"found []; allowed: a name or a non-empty list of {_allowed()}")
        return None
    return _distinct(ck, "pruning.method", raw, tuple(
        _method(ck, v, "pruning.method" if not isinstance(raw, list) else f"pruning.method[{i}]",
                folders, digests, found) for i, v in enumerate(values)))


def _method(ck: Checker, value: Any, path: str, folders: tuple[str, ...],
            digests: Mapping[str, str] | None, found: dict[str, str]) -> str | None:
    """One method: a registered name, or a criterion's import path whose digest goes into
    ``found``."""
    if not isinstance(value, str) or not is_path(value):
        if isinstance(value, str) and value in pruning.list_methods():
            return value
        near = did_you_mean(str(value), pruning.list_methods())
        ck.add(path, f"found {value!r}{near}; allowed: {_allowed()}")
        return None
    try:
        if digests is None:
            resolved = resolve("criterion", value, folders)
            pruning.registry.criterion(value)   # the object at the path is a score function
            found[value] = resolved.digest
            return value
        split("criterion", value)
    except FactoryError as exc:
        ck.add(path, exc.detail)
        return None
    except pruning.PruningError as exc:
        ck.add(path, str(exc))
        return None
    digest = digests.get(value)
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        ck.add("pruning.method_digest", f"found {digest!r}; allowed: the 64 hex digits of the "
                                        f"SHA-256 of the criterion's module")
        return None
    found[value] = digest
    return value


def _sanity(ck: Checker, raw: Any) -> tuple[str, ...] | None:
    """The distinct sanity checks of ``pruning.sanity`` (a list of SANITY), or None."""
    if not isinstance(raw, list):
        ck.add("pruning.sanity", f"found {raw!r}; allowed: a list of {', '.join(SANITY)}")
        return None
    return _distinct(ck, "pruning.sanity", raw,
                     tuple(ck.choice(v, f"pruning.sanity[{i}]", SANITY) for i, v in enumerate(raw)))


def _distinct(ck: Checker, path: str, raw: Any, names: tuple[str | None, ...]
              ) -> tuple[str, ...] | None:
    """``names`` when each was valid and none repeats, else None (a repeat recorded)."""
    if None in names:
        return None
    if len(set(names)) != len(names):
        ck.add(path, f"found duplicates in {raw}; allowed: distinct values")
        return None
    return names
