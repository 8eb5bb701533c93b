"""The ``[workload]`` table: registered names, or a study's own model and data set named by
import path, ``"package.module:factory"``.

A ``[workload] model`` or ``dataset`` holding a colon names a factory by the entry-point
convention (module, colon, attribute; the attribute may be dotted, ``module:Class.method``).
The factories have the signatures of the registered builders (``training.models.register``,
``training.data.register``) and are called the same way:

- ``model_factory(dataset, **model_options) -> torch.nn.Module``, with torch's global generator
  seeded by the group's seed (``training.models.seeded``), so each replicate seed gets its own
  initialization, the same in every process;
- ``dataset_factory(**dataset_options) -> training.Dataset``, with torch's global generator
  seeded by 0 (a factory drawing from it gives the same data in every process; numpy's and
  ``random``'s global generators are not seeded: draw from a generator you seed).

**Where the module is found.** On ``sys.path`` first, as any import (an installed package, the
current folder of ``python -m``, a notebook's folder); else in the spec file's folder, which is
then appended to ``sys.path`` (a spec given as text or a :class:`Spec` object, or a bundled
config, has no folder: ``sys.path`` only). Every process that trains imports the factory
itself by its path: the driver, the local pool's spawned workers and Dask workers, each given
the same folders to search. A remote Dask worker therefore needs the module importable there:
installed in its environment, or the spec's folder at the same path on a shared filesystem.

**The digest.** A factory's key is the SHA-256 of its module's file, byte for byte: the
``.py`` file the path names (for ``package.module:f``, ``package/module.py``; for a package,
its ``__init__.py``), not the files it imports. It enters the spec's canonical JSON
(``workload.model_digest`` / ``dataset_digest``), hence the spec hash and every group key:
editing that file makes a new study whose groups are all new, and a store trained from the old
code is never reused (a rerun into its folder is refused, naming the change). Keep what you
change in the named file, or change that file (a comment will do) when a helper changes. Each
worker checks that the file it imported has the driver's digest, so a worker holding other
code fails its groups with the reason instead of training it. Registered names have no digest
and keep their keys.

**Callables.** From Python a factory may be given as the function itself
(``experiments.run_study(spec, model=mymodels.mlp)``): it is recorded by its
``module:qualname``, which must import back to the same object. A function that worker
processes cannot import (defined in ``__main__``, such as a notebook cell or a script, or
inside another function) is accepted only for a run in this process
(``executor=concurrent.futures.ThreadPoolExecutor(n)``); its digest is that of its own source
text (``inspect.getsource``). A lambda has no name and is refused.

Bad input (a malformed path, a missing module or attribute, a factory that raises or returns
the wrong type) is one line naming the key and the path; the spec checks and the runner report
it before anything is trained or written.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from training.data import Dataset
from training.errors import SparsescaleError
from training.models.initialization import initialize
from training.models import seeded


# what a factory of each kind must return, and how a message names it
RETURNS: dict[str, tuple[type, str]] = {"model": (nn.Module, "a torch.nn.Module"),
                                        "dataset": (Dataset, "a training.Dataset")}
# modules that worker processes cannot import by name: their factories run in this process only
_MAIN = ("__main__", "__mp_main__")


# the spec key that names a factory of each kind (a pruning criterion is imported as they are)
KEYS = {"model": "workload.model", "dataset": "workload.dataset", "criterion": "pruning.criterion"}


class FactoryError(SparsescaleError, ValueError):
    """A factory (or a pruning criterion) named by import path cannot be imported, called or
    used: one line naming the spec key (``workload.<kind>``, ``pruning.criterion``), the path and
    what is wrong (``detail``)."""

    def __init__(self, kind: str, detail: str):
        self.kind, self.detail = kind, detail
        super().__init__(f"{KEYS.get(kind, kind)}: {detail}")


Factory = str | Callable[..., Any]   # as given: a registered name, "module:factory", a callable


@dataclass(frozen=True)
class Resolved:
    """A resolved factory: its import path, the callable, the SHA-256 of its source (the module
    file's bytes, or for an in-process function its own source text) and where that came from."""

    path: str
    fn: Callable[..., Any]
    digest: str
    origin: str


# module name -> (its __spec__ when first digested here, that digest): a module's file edited
# after this process imported it would train other code than the digest says
_SEEN: dict[str, tuple[Any, str]] = {}
# top-level module name -> the spec folder this process imported it from
_FROM_FOLDER: dict[str, str] = {}
# path -> a function of this process that worker processes cannot import (see "Callables")
_IN_PROCESS: dict[str, Callable[..., Any]] = {}


def is_path(name: str) -> bool:
    """Whether a ``[workload]`` name is an import path (it holds a colon) rather than a
    registered name."""
    return ":" in name


def split(kind: str, path: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``"package.module:factory"``, or :class:`FactoryError` for a
    path that is not dotted names around one colon."""
    module, _, attr = path.partition(":")
    parts = module.split(".") + attr.split(".")
    if not all(p.isidentifier() or p == "<locals>" for p in parts) or "<locals>" in module:
        raise FactoryError(kind, f"{path!r} is not an import path; allowed: a registered name or "
                                 f"\"package.module:factory\" (dotted Python names, one colon)")
    return module, attr


def in_process_only(path: str) -> bool:
    """Whether ``path`` names a function worker processes cannot import (``__main__``, or
    defined inside a function)."""
    module, _, attr = path.partition(":")
    return module in _MAIN or "<locals>" in attr


def path_of(kind: str, fn: Callable[..., Any]) -> str:
    """The import path ``module:qualname`` of a factory given from Python as a callable. A
    function worker processes cannot import is kept for this process (:func:`in_process_only`)."""
    name = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if isinstance(name, str) and name.rpartition(".")[2] == "<lambda>":
        raise FactoryError(kind, "a lambda has no name to import or record; define the factory "
                                 "with def in a module (e.g. mymodels.py) and pass it, or "
                                 "\"mymodels:name\"")
    if not isinstance(name, str) or not isinstance(module, str):
        raise FactoryError(kind, f"{fn!r} has no module and name to import it by (a "
                                 f"functools.partial?); allowed: a function or class, or "
                                 f"\"package.module:factory\"")
    path = f"{module}:{name}"
    if in_process_only(path):
        _IN_PROCESS[path] = fn
        return path
    found = resolve(kind, path).fn
    if found is not fn:
        raise FactoryError(kind, f"{path} imports as {found!r}, not the object given ({fn!r}): "
                                 f"was it redefined or decorated after import? Pass the import "
                                 f"path instead")
    return path


def resolve(kind: str, path: str, folders: Iterable[str] = (), digest: str | None = None
            ) -> Resolved:
    """Import the ``kind`` factory ``path`` (``sys.path`` first, then ``folders``), checking
    that its source has ``digest`` when given (the digest the spec recorded)."""
    module_name, attr = split(kind, path)
    if in_process_only(path):
        return _in_process(kind, path, digest)
    module = _import(kind, module_name, path, tuple(folders))
    origin = getattr(module, "__file__", None) or "no file"
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            where = ".".join([module_name] + attr.split(".")[:i])
            raise FactoryError(kind, f"{path}: {where} ({origin}) has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(kind, f"{path} is {type(obj).__name__} {obj!r}, not callable; "
                                 f"allowed: a function or class")
    found = _module_digest(kind, module, path)
    if digest is not None and found != digest:
        raise FactoryError(kind, f"{path}: {origin} has sha256 {found[:12]} here, the study was "
                                 f"made from sha256 {digest[:12]}: this process holds other code "
                                 f"than the study's (install or share the same file, or load "
                                 f"the spec again)")
    return Resolved(path, obj, found, origin)


DIGEST = re.compile(r"[0-9a-f]{64}")


def path_key(problems: Any, value: str, path: str, kind: str, folders: Iterable[str],
             digests: Mapping[str, str] | None, found: dict[str, str], *,
             accept: Callable[[Any], Any], errors: tuple[type[Exception], ...],
             digest_key: str, reload: bool = False) -> str | None:
    """One import path a spec names for a ``kind`` of its own (a criterion, a measurement):
    ``value`` if it holds, else None after ``problems.add(key, line)`` (an
    :class:`experiments.spec.checks.Checker`; ``path`` is the spec key it came from).

    A new spec (``digests`` None): the path is imported (``folders`` after ``sys.path``) and
    its object given to ``accept``, which raises one of ``errors`` when it is no ``kind``; its
    module's digest goes into ``found``. A stored spec: the digest recorded under
    ``digest_key`` must be 64 hex digits and goes into ``found``; with ``reload`` the object
    is imported and accepted where this process can import it at that digest (for the report)
    and skipped where it cannot."""
    try:
        if digests is None:
            resolved = resolve(kind, value, folders)
            accept(resolved.fn)
            found[value] = resolved.digest
            return value
        split(kind, value)
    except FactoryError as exc:
        problems.add(path, exc.detail)
        return None
    except errors as exc:
        problems.add(path, str(exc))
        return None
    digest = digests.get(value)
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        problems.add(digest_key, f"found {digest!r}; allowed: the 64 hex digits of the SHA-256 "
                                 f"of the {kind}'s module")
        return None
    if reload:
        try:
            accept(resolve(kind, value, (), digest).fn)
        except (FactoryError, *errors):
            pass
    found[value] = digest
    return value


def _in_process(kind: str, path: str, digest: str | None) -> Resolved:
    fn = _IN_PROCESS.get(path)
    if fn is None:
        raise FactoryError(kind, f"{path} is defined in __main__ or inside a function: worker "
                                 f"processes import a factory by its path and cannot import "
                                 f"it; move it into a module (e.g. mymodels.py beside the spec)")
    try:
        found = _sha256(inspect.getsource(fn).encode())
    except (OSError, TypeError):
        raise FactoryError(kind, f"{path}: its source cannot be read to key the study's groups; "
                                 f"move it into a module (e.g. mymodels.py beside the spec)"
                           ) from None
    if digest is not None and found != digest:
        raise FactoryError(kind, f"{path} was redefined since the study was made (source sha256 "
                                 f"{found[:12]}, the study's {digest[:12]}): load the spec again")
    return Resolved(path, fn, found, "<in process>")


def _import(kind: str, name: str, path: str, folders: tuple[str, ...]) -> ModuleType:
    """Import ``name``: from ``sys.path`` if it is there, else from the first of ``folders``
    holding it (appended to ``sys.path``, where the module's own imports look too)."""
    top = name.partition(".")[0]
    try:
        on_path = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        on_path = False
    holding = [f for f in folders if importlib.machinery.PathFinder.find_spec(top, [f])]
    if not on_path:
        if not holding:
            where = "sys.path" + "".join(f" or {f}" for f in folders)
            raise FactoryError(kind, f"{path}: no module named {top!r} on {where}")
        if holding[0] not in sys.path:
            sys.path.append(holding[0])
            importlib.invalidate_caches()
        _FROM_FOLDER.setdefault(top, holding[0])
    elif top in _FROM_FOLDER and holding and _FROM_FOLDER[top] not in holding:
        raise FactoryError(kind, f"{path}: this process already imported a module {top!r} from "
                                 f"{_FROM_FOLDER[top]}, and the spec's folder holds another; "
                                 f"rename one of them or start a fresh process")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise FactoryError(kind, f"{path}: no module named {exc.name!r}") from None
        raise FactoryError(kind, f"{path}: importing {name} failed: {_one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while being imported
        raise FactoryError(kind, f"{path}: importing {name} failed: {_one_line(exc)}") from None


def _module_digest(kind: str, module: ModuleType, path: str) -> str:
    """SHA-256 of ``module``'s file; refused when the file changed since this process first
    digested the module (the code in memory would not be the code the digest names)."""
    file = getattr(module, "__file__", None)
    if not file:
        raise FactoryError(kind, f"{path}: module {module.__name__} has no file to key the "
                                 f"study's groups by (a namespace package?); allowed: a module "
                                 f"in a .py file")
    try:
        found = _sha256(Path(file).read_bytes())
    except OSError as exc:
        raise FactoryError(kind, f"{path}: cannot read {file} to key the study's groups: "
                                 f"{exc.strerror}") from None
    seen = _SEEN.get(module.__name__)
    if seen is None or seen[0] is not module.__spec__:   # first look, or reloaded since
        _SEEN[module.__name__] = (module.__spec__, found)
    elif seen[1] != found:
        raise FactoryError(kind, f"{path}: {file} changed since this process imported "
                                 f"{module.__name__} (the workers would train the new code, "
                                 f"this process holds the old): importlib.reload("
                                 f"{module.__name__}) or start a fresh process")
    return found


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def build_model(path: str, dataset: Dataset, seed: int, options: dict[str, Any],
                folders: Iterable[str] = (), digest: str | None = None,
                init: str = "torch") -> nn.Module:
    """The model of the factory ``path`` for ``dataset``, initialized with ``seed`` by scheme
    ``init`` (``"torch"``: as the factory makes it; ``"lee"``: Lee et al. 2021's rule by layer
    kind, :mod:`training.models.initialization`)."""
    factory = resolve("model", path, folders, digest)
    with seeded(seed):
        model = _checked("model", path, lambda: factory.fn(dataset, **options))
    return initialize(model, init, seed)


def load_dataset(path: str, options: dict[str, Any], folders: Iterable[str] = (),
                 digest: str | None = None) -> Dataset:
    """The data set of the factory ``path``."""
    factory = resolve("dataset", path, folders, digest)
    with seeded(0):
        return _checked("dataset", path, lambda: factory.fn(**options))


def _checked(kind: str, path: str, call: Callable[[], Any]) -> Any:
    """``call()``'s value, or a :class:`FactoryError` when it raises or returns the wrong type."""
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - any failure of the user's code is one line
        raise FactoryError(kind, f"{path} raised {_one_line(exc)}") from None
    want, what = RETURNS[kind]
    if not isinstance(value, want):
        raise FactoryError(kind, f"{path} returned {type(value).__module__}."
                                 f"{type(value).__qualname__}; allowed: {what}")
    return value
