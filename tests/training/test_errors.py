"""One error hierarchy: every exception class the project defines is a SparsescaleError."""

import importlib
import inspect
import pkgutil

import pytest

import training
from training.errors import ConfigError, SparsescaleError

PACKAGES = ("training", "pruning", "theory", "experiments")


def project_exceptions():
    found = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        modules = [root] + [importlib.import_module(m.name)
                            for m in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")
                            if not m.name.rpartition(".")[2].startswith("_")]
        for module in modules:
            for name, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__.split(".")[0] in PACKAGES:
                    found[f"{cls.__module__}.{name}"] = cls
    return found


def test_every_project_exception_is_a_sparsescale_error():
    found = project_exceptions()
    # the named subclasses of each package are all there
    for name in ("training.errors.ConfigError", "training.masks.MaskError",
                 "training.errors.DataError", "training.models.ModelError",
                 "pruning.errors.PruningError", "theory.errors.TheoryError"):
        assert name in found, name
    strays = sorted(n for n, cls in found.items() if not issubclass(cls, SparsescaleError))
    assert strays == []
    assert issubclass(SparsescaleError, ValueError)
