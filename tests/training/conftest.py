"""Fixtures shared by the trainer tests."""

import pytest

import training


@pytest.fixture(scope="module")
def teacher():
    """A small teacher-network classification set (500 examples, 8 features, 3 classes)."""
    return training.data.load("teacher", n=500, dim=8, num_classes=3, seed=1)
