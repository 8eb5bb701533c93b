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


def random_images(n_train: int, n_val: int, shape: tuple[int, ...], classes: int, seed: int,
                  name: str) -> training.Dataset:
    """Gaussian images with uniform labels (the speed and the equivalence do not depend on
    the values)."""
    g = torch.Generator().manual_seed(seed)
    n = n_train + n_val
    x, y = torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g)
    return training.Dataset(name, "classification", x[:n_train], y[:n_train], x[n_train:],
                            y[n_train:], classes, shape)


@pytest.fixture(scope="session")
def tiny_images():
    """The CPU tests' 3-class set of 96 random 1 x 8 x 8 images (tests/training/conftest.py)."""
    return random_images(64, 32, (1, 8, 8), 3, 0, "tiny-images")


@pytest.fixture(scope="session")
def lee_images():
    """28 x 28 x 1 random images (lee_cnn's input), 48 train / 16 validation."""
    return random_images(48, 16, (1, 28, 28), 10, 1, "lee-images")
