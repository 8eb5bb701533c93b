"""Shared test setup: generated data sets are cached under the repo's .cache/ (gitignored)."""

import os
import sqlite3
from pathlib import Path

import pytest
import torch
from hypothesis import settings

os.environ.setdefault("SPARSESCALE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "data"))
# The default run is reproducible: Hypothesis draws the same examples every time, so CI cannot
# flake on a new draw; HYPOTHESIS_PROFILE=explore draws fresh examples to hunt for failures.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
# Tests use small tensors: one thread is as fast and does not thrash when the cores are shared.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def ieee_subnormals():
    """Tests that run the ``sparsescale`` command in this process get its subnormal flushing
    (training.process.flush_subnormals) on this thread; every test starts and ends without it,
    as the library leaves a process (Hypothesis refuses to draw floats otherwise)."""
    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def mnist1d_small():
    """MNIST-1D with 1000 samples (720 train / 80 val / 200 test): generated in about a second."""
    import training

    return training.data.load("mnist1d", num_samples=1000, test=True)


def count_done_groups(db: Path) -> int:
    """Finished groups in a results store that another process may be writing (0 if unreadable)."""
    if not Path(db).exists():
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute("SELECT COUNT(*) FROM groups WHERE status='done'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


@pytest.fixture
def done_groups():
    """``done_groups(db)``: how many groups a (possibly running) study has stored as done."""
    return count_done_groups
