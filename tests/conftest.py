"""Shared test setup: the global generators seeded before each test module and each test;
generated data sets are cached under the repo's .cache/ (gitignored);
helpers that simulate storage faults (a read-only folder, a run folder in use by another driver)
and the compiled kernel a test needs (``compiled_kernel``)."""

import os
import random
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import settings

os.environ.setdefault("SPARSESCALE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "data"))
# Every test's program is pinned: the rules' (or one a test forces), never a measurement, whose
# winner would depend on the machine and on how busy it was when the cache was filled (and the
# programs round differently in float32). The tests of the measured choice ask for it
# themselves (SPARSESCALE_PROGRAM_CHOICE=measure, with a cache of their own).
os.environ.setdefault("SPARSESCALE_PROGRAM_CHOICE", "rules")
# The default run is reproducible: Hypothesis draws the same examples every time, so CI cannot
# flake on a new draw; HYPOTHESIS_PROFILE=explore draws fresh examples to hunt for failures.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
# Tests use small tensors: one thread is as fast and does not thrash when the cores are shared.
torch.set_num_threads(1)


# The seed of the global generators (torch, numpy, random) at the start of every test and before
# every test module is imported. Without it a draw from a global generator depends on everything
# drawn before it: which modules were collected, in which order, which tests ran first. A test
# that passed for one collection could then fail on another machine's (as
# test_registry's overflow case once did). SPARSESCALE_TEST_SEED=k runs the suite on other draws,
# to find a test that holds only for the default's.
SUITE_SEED = int(os.environ.get("SPARSESCALE_TEST_SEED", "0"))


def seed_global_generators() -> None:
    torch.manual_seed(SUITE_SEED)
    np.random.seed(SUITE_SEED)
    random.seed(SUITE_SEED)


def pytest_collectstart(collector):
    """Seed before a test module is imported, so its import-time draws are its own."""
    if isinstance(collector, pytest.Module):
        seed_global_generators()


@pytest.fixture(autouse=True)
def seeded_global_generators():
    """Every test starts from the same global generators, whatever ran before it."""
    seed_global_generators()


@pytest.fixture(autouse=True)
def ieee_subnormals():
    """Tests that run the ``sparsescale`` command in this process get its subnormal flushing
    (training.processes.setup.flush_subnormals) on this thread; every test starts and ends without it,
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


def _immutable(path, on: bool) -> bool:
    """Set / clear the ext* immutable attribute (even root cannot create files in such a folder)."""
    proc = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
    return proc.returncode == 0


@pytest.fixture
def read_only():
    """Make a folder read-only for this process: chmod for an ordinary user, the immutable
    attribute for root (root ignores permission bits); always restored."""
    made = []

    def make(path):
        if os.geteuid() != 0:
            path.chmod(0o555)
        elif not (shutil.which("chattr") and _immutable(path, True)):
            pytest.skip("running as root on a file system without chattr +i support")
        made.append(path)

    yield make
    for path in made:
        if os.geteuid() == 0:
            _immutable(path, False)
        else:
            path.chmod(0o755)


# A second driver on the same folder: it has reached training and waits there forever.
HOLDER = textwrap.dedent("""\
    import sys, threading
    from concurrent.futures import Executor
    import experiments

    class Hold(Executor):
        def submit(self, fn, *args, **kwargs):
            print("training", flush=True)
            threading.Event().wait()

    experiments.run_study(sys.argv[1], out=sys.argv[2], executor=Hold(), quiet=True,
                          report=False)
    """)


@pytest.fixture
def driver_holding():
    """``driver_holding(spec_file, out)``: a study driver in another process that holds the run
    folder ``out`` (its store open and locked) and waits in training; returns its ``Popen``. It
    is killed at the end of the test, if the test has not killed it."""
    started = []

    def start(spec_file, out):
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(spec_file), str(out)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(holder)
        assert holder.stdout.readline() == "training\n", holder.stderr.read()
        return holder

    yield start
    for holder in started:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


def compiled_kernel_or_skip():
    """The compiled kernel (``training.engine.compiled_kernel.fused_sequential()``) for a test
    that needs it. Where it cannot be built the test is skipped, unless
    ``SPARSESCALE_REQUIRE_KERNEL=1`` (CI sets it): then it fails, so that a green CI has run
    every kernel test."""
    from training.engine import compiled_kernel as kernels

    try:
        module = kernels.fused_sequential()
    except kernels.KernelError as exc:   # the library refuses the fallback under the variable
        pytest.fail(f"{kernels.REQUIRE_ENV} is set and {exc}", pytrace=False)
    if module is None:
        if kernels.required():
            pytest.fail(f"{kernels.REQUIRE_ENV} is set but the compiled kernel is switched off "
                        f"({kernels.DISABLE_ENV}=0 or compiled_kernel.disabled()): this test "
                        f"needs it", pytrace=False)
        pytest.skip(f"the compiled kernel cannot be built here ({kernels.REQUIRE_ENV}=1 makes "
                    f"this a failure)")
    return module


@pytest.fixture
def compiled_kernel():
    """The compiled kernel module; skips the test where it cannot be built, fails it instead
    under ``SPARSESCALE_REQUIRE_KERNEL=1`` (:func:`compiled_kernel_or_skip`)."""
    return compiled_kernel_or_skip()


@pytest.fixture
def kernel_or_skip():
    """:func:`compiled_kernel_or_skip` itself, for the tests of its two behaviours."""
    return compiled_kernel_or_skip
