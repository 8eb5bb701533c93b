"""One error hierarchy: every exception class the project defines is a SparsescaleError and
either a ValueError (bad input) or an OSError (storage and IO), never both; every warning class
is a SparsescaleWarning and no exception of ours."""

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import training
from training.errors import ConfigError, SparsescaleError, SparsescaleIOError, SparsescaleWarning

PACKAGES = ("training", "pruning", "theory", "experiments")
# bases that are neither kind: never raised themselves, caught for both kinds
BASES = {"training.errors.SparsescaleError", "experiments.store.database.StoreError"}


def project_classes(base: type) -> dict[str, type]:
    found = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        modules = [root] + [importlib.import_module(m.name)
                            for m in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")
                            if not m.name.rpartition(".")[2].startswith("_")]
        for module in modules:
            for name, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, base) and cls.__module__.split(".")[0] in PACKAGES:
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def project_exceptions() -> dict[str, type]:
    # errors only: a KeyboardInterrupt of ours (the command line's SIGTERM, experiments.cli.main.
    # Terminated) is a signal to stop, which every cleanup of Ctrl-C handles, not an error
    return {n: c for n, c in project_classes(Exception).items() if not issubclass(c, Warning)}


def test_sigterm_is_an_interrupt_not_an_error():
    from experiments.cli.main import Terminated

    assert issubclass(Terminated, KeyboardInterrupt) and not issubclass(Terminated, Exception)


def test_every_project_exception_is_a_sparsescale_error():
    found = project_exceptions()
    # the named subclasses of each package are all there
    for name in ("training.errors.ConfigError", "training.masks.MaskError",
                 "training.errors.DataError", "training.errors.ModelError",
                 "pruning.errors.PruningError", "theory.errors.TheoryError",
                 "experiments.spec.errors.SpecError", "experiments.store.database.StoreError",
                 "experiments.store.database.StoreIOError",
                 "experiments.store.database.StoreContentError"):
        assert name in found, name
    strays = sorted(n for n, cls in found.items() if not issubclass(cls, SparsescaleError))
    assert strays == []
    assert not issubclass(SparsescaleError, (ValueError, OSError))
    assert issubclass(training.SparsescaleError, Exception)


def test_every_project_exception_is_a_value_error_or_an_os_error_not_both():
    found = project_exceptions()
    assert BASES <= set(found)
    kinds = {n: (issubclass(c, ValueError), issubclass(c, OSError)) for n, c in found.items()}
    neither = sorted(n for n, k in kinds.items() if k == (False, False))
    both = sorted(n for n, k in kinds.items() if k == (True, True))
    assert neither == sorted(BASES) and both == []
    # each kind has members in every package that raises it
    value = {n for n, k in kinds.items() if k[0]}
    io = {n for n, k in kinds.items() if k[1]}
    assert {"training.errors.ConfigError", "training.masks.MaskError", "training.errors.DataError",
            "pruning.errors.PruningError", "theory.errors.TheoryError",
            "experiments.spec.errors.SpecError", "experiments.store.database.StoreContentError",
            "experiments.exchange.batch_science_tree.ArchiveError"} <= value
    assert {"training.errors.DataIOError", "experiments.store.database.StoreIOError",
            "experiments.spec.errors.SpecIOError", "pruning.errors.MaskIOError",
            "experiments.exchange.batch_science_tree.ArchiveIOError"} <= io
    assert issubclass(SparsescaleIOError, OSError) and issubclass(ConfigError, ValueError)


def test_store_error_catches_both_kinds():
    from experiments.store.database import StoreContentError, StoreError, StoreIOError

    assert issubclass(StoreIOError, StoreError) and issubclass(StoreContentError, StoreError)
    assert issubclass(StoreIOError, SparsescaleIOError)


def test_the_bases_are_never_raised_themselves():
    """A bare SparsescaleError or StoreError would be neither kind: the command line could not
    say whether the input or the machine was at fault."""
    repo = Path(training.__file__).resolve().parents[1]
    pattern = re.compile(r"raise\s+(SparsescaleError|StoreError)\s*\(")
    offenders = [f"{path.relative_to(repo)}:{i}"
                 for package in PACKAGES for path in sorted((repo / package).rglob("*.py"))
                 for i, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []


def test_every_project_warning_is_a_sparsescale_warning_and_no_exception_of_ours():
    warnings_found = {n: c for n, c in project_classes(Warning).items()}
    for name in ("training.engine.compiled_kernel.KernelWarning",
                 "pruning.diagnostics.LayerCollapseWarning", "training.errors.SparsescaleWarning"):
        assert name in warnings_found, name
    strays = sorted(n for n, c in warnings_found.items() if not issubclass(c, SparsescaleWarning))
    assert strays == []
    errors = sorted(n for n, c in warnings_found.items() if issubclass(c, SparsescaleError))
    assert errors == []
    assert issubclass(SparsescaleWarning, UserWarning)
    assert training.SparsescaleWarning is SparsescaleWarning


def test_io_failures_are_os_errors_and_bad_contents_value_errors(tmp_path, monkeypatch):
    """Each place that reads a file tells a file it cannot read (an OSError naming the path)
    from one whose contents are wrong (a ValueError)."""
    import pytest

    import pruning
    from experiments.exchange import batch_science_tree
    from experiments.spec.study import load
    from training.data import read_idx
    from training.distributed.costmodel import load_cost_model

    folder = tmp_path / "folder.bin"
    folder.mkdir()   # a path that exists but cannot be read as a file
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\xff\xfe garbage \x00" * 8)
    readers = {"idx": lambda p: read_idx(p, 2051), "mask": pruning.Mask.load,
               "cost model": load_cost_model, "spec": load,
               "archive": lambda p: batch_science_tree.read_measurements(p, "m")}
    for name, read in readers.items():
        target = tmp_path / "missing.json" if name == "cost model" else folder
        if name == "archive":   # it checks is_file() first: a file it may not open
            target = garbage

            def denied(path, *args, **kwargs):
                raise PermissionError(13, "Permission denied", str(path))

            monkeypatch.setattr(batch_science_tree, "open", denied, raising=False)
        with pytest.raises(SparsescaleError) as info:
            read(target)
        assert isinstance(info.value, OSError) and not isinstance(info.value, ValueError), name
        assert target.name in str(info.value), (name, str(info.value))
    monkeypatch.undo()
    for name, read in readers.items():
        target = garbage.with_suffix(".gz") if name == "idx" else garbage
        target.write_bytes(garbage.read_bytes())
        with pytest.raises(SparsescaleError) as info:
            read(target)
        assert isinstance(info.value, ValueError) and not isinstance(info.value, OSError), name
        assert target.name in str(info.value), (name, str(info.value))
