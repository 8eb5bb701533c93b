"""Shared setup of the reliability tests: a tiny study on the instant teacher data set, and
helpers to prove that a refused run wrote nothing and trained nothing."""

import textwrap
from concurrent.futures import Executor
from pathlib import Path

import pytest

# Two groups of two trials, 40 steps each: a whole study runs in about a second in-process.
SPEC = textwrap.dedent("""\
    name = "reliability"
    optimizer = "momentum"
    batch_sizes = [8, 32]
    sparsities = [0.0]
    trials = 2
    seeds = [0]

    [workload]
    dataset = "teacher"
    dataset_options = {n = 300, dim = 6, num_classes = 3, hidden = 8}
    model = "mlp"
    model_options = {hidden = [8]}

    [goal]
    metric = "error"
    target = 0.3

    [search]
    lr = {scale = "log", min = 0.01, max = 1.0}
    momentum = 0.9

    [budget]
    max_steps = 40

    [eval]
    every = 10

    [probes]
    enabled = false
    """)


def edit(old: str, new: str, text: str = SPEC) -> str:
    """``text`` with ``old`` replaced by ``new`` (``old`` must occur: a typo fails loudly)."""
    assert old in text, old
    return text.replace(old, new)


@pytest.fixture
def spec_file(tmp_path) -> Path:
    path = tmp_path / "reliability.toml"
    path.write_text(SPEC)
    return path


class NoTraining(Executor):
    """An executor that fails the test if the runner submits any group to it."""

    def submit(self, fn, *args, **kwargs):
        raise AssertionError("training started although the run should have been refused")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes): equal snapshots mean no writes."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}
