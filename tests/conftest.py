"""Shared test setup: generated data sets are cached under the repo's .cache/ (gitignored)."""

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("SPARSESCALE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "data"))
# Tests use small tensors: one thread is as fast and does not thrash when the cores are shared.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def mnist1d_small():
    """MNIST-1D with 1000 samples (720 train / 80 val / 200 test): generated in about a second."""
    import training

    return training.data.load("mnist1d", num_samples=1000, test=True)
