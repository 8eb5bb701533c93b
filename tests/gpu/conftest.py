"""The GPU tests: every test under tests/gpu/ is marked ``gpu`` and runs wherever CUDA is
available (``pytest -m gpu tests/gpu`` runs only them); elsewhere each is skipped with the
reason. ``tests/gpu/check.sh`` runs them on a GPU machine (docs/guide/gpu.md)."""

from pathlib import Path

import pytest
import torch

import training

HERE = Path(__file__).resolve().parent
CUDA = torch.cuda.is_available()
REASON = ("no CUDA device (torch.cuda.is_available() is False): the GPU tests run where one is, "
          "e.g. with tests/gpu/check.sh")


@pytest.hookimpl(tryfirst=True)   # marked before `-m gpu` selects
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skipif(not CUDA, reason=REASON)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_images():
    """The CPU tests' 3-class set of 96 random 1 x 8 x 8 images (tests/training/conftest.py)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 1, 8, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    return training.Dataset("tiny-images", "classification", x[:64], y[:64], x[64:], y[64:], 3,
                            (1, 8, 8))


@pytest.fixture(scope="session")
def lee_images():
    """28 x 28 x 1 random images (lee_cnn's input), 48 train / 16 validation."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)
    return training.Dataset("lee-images", "classification", x[:48], y[:48], x[48:], y[48:], 10,
                            (1, 28, 28))
