"""Shared fixtures for the experiments tests: a tiny study spec on the instant teacher data."""

import textwrap

import pytest

from experiments.report.write import write_report

from .synthetic import make_store


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


# Reports of synthetic stores (each takes a few seconds: built once per session, read by several
# test modules; the tests only read these folders).


@pytest.fixture(scope="session")
def full(tmp_path_factory):
    run = make_store(tmp_path_factory.mktemp("full") / "run", seeds=(0, 1))
    write_report([run])
    return run


@pytest.fixture(scope="session")
def combined(tmp_path_factory):
    base = tmp_path_factory.mktemp("combined")
    sgd = make_store(base / "sgd", name="shallue", optimizer="sgd")
    mom = make_store(base / "momentum", name="shallue", optimizer="momentum", momentum_gain=2.0)
    write_report([sgd, mom], out=base / "both")
    return base


@pytest.fixture(scope="session")
def partial(tmp_path_factory):
    run = make_store(tmp_path_factory.mktemp("partial") / "run", skip={(0.9, 128), (0.9, 256)},
                     fail={(0.0, 8)}, unreached={(0.9, 8)}, probes=False)
    write_report([run])
    return run
