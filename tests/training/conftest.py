"""Fixtures shared by the trainer tests."""

import pytest

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
