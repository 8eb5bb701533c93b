"""Shared fixtures for the experiments tests: a tiny study spec on the instant teacher data."""

import textwrap

import pytest


TINY = textwrap.dedent("""\
    name = "tiny"
    optimizer = "momentum"
    batch_sizes = [8, 32, 128]
    sparsities = [0.0, 0.5]
    trials = 4
    seeds = [0]

    [workload]
    dataset = "teacher"
    dataset_options = {n = 600, dim = 8, num_classes = 3, hidden = 16}
    model = "mlp"
    model_options = {hidden = [16]}

    [goal]
    metric = "error"
    target = 0.3

    [search]
    lr = {scale = "log", min = 0.01, max = 1.0}
    momentum = {scale = "reverse-log", min = 0.5, max = 0.99}

    [budget]
    examples = 8000
    min = 20
    max = 200

    [eval]
    every = 10

    [probes]
    enabled = false
    """)


@pytest.fixture
def tiny_toml(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path
