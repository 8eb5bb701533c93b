"""Fixtures for the pruning tests: tiny models and data sets."""

import pytest
import torch

import training


@pytest.fixture(autouse=True)
def one_thread():
    # The tiny models here run faster on one thread, and two threads stall badly when the shared
    # 2-core machine is busy; restore the session's setting afterwards.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def teacher():
    """4-class teacher-MLP data, 20 inputs: instant."""
    return training.data.load("teacher", n=400, dim=20, num_classes=4)


@pytest.fixture
def small_mlp(teacher):
    return training.models.build("mlp", teacher, hidden=(16, 12), seed=1)


@pytest.fixture(scope="session")
def mnist1d():
    """MNIST-1D, 1000 samples (720 training examples)."""
    return training.data.load("mnist1d", num_samples=1000)


@pytest.fixture(scope="session")
def mlp(mnist1d):
    """The 40-100-100-10 MLP (4000 / 10000 / 1000 weights); tests never modify it."""
    return training.models.build("mlp", mnist1d)
