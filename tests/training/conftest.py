"""Fixtures shared by the trainer tests."""

import pytest
import torch

import training


@pytest.fixture(scope="module")
def teacher():
    """A small teacher-network classification set (500 examples, 8 features, 3 classes)."""
    return training.data.load("teacher", n=500, dim=8, num_classes=3, seed=1)


@pytest.fixture(scope="module")
def teacher320():
    """400 examples, 320 for training: a batch of 48 does not divide an epoch (32 are dropped)."""
    return training.data.load("teacher", n=400, dim=8, num_classes=3, seed=1)


@pytest.fixture(scope="module")
def net16(teacher320):
    """A one-hidden-layer MLP (16 units) on :func:`teacher320`."""
    return training.models.build("mlp", teacher320, hidden=[16], seed=0)


@pytest.fixture(scope="session")
def tiny_images():
    """A 3-class data set of 96 random 1 x 8 x 8 images (64 train / 32 val): small enough for
    the image models to train in float64 within a test."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 1, 8, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    return training.Dataset("tiny-images", "classification", x[:64], y[:64], x[64:], y[64:], 3,
                            (1, 8, 8))


def _stacked(model, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [p.detach().double().unsqueeze(0) + 0.1 * torch.randn(n, *p.shape, generator=g,
                                                                   dtype=torch.float64)
            for p in model.parameters()]


@pytest.fixture(scope="session")
def stacked():
    """``stacked(model, n, seed=0)``: n float64 copies of the model's parameters, each moved by
    its own Gaussian noise (std 0.1), stacked [n, *shape]."""
    return _stacked
