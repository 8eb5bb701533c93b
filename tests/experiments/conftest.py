"""Shared fixtures for the experiments tests: a tiny study spec on the instant teacher data."""

import contextlib
import sys
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


def run_text(tmp, text: str, name: str):
    """Run the study ``text`` (written to ``tmp/<name>.toml``) in one thread into ``tmp/run``,
    without a report, and load its results."""
    import experiments
    from concurrent.futures import ThreadPoolExecutor

    (tmp / f"{name}.toml").write_text(text)
    run_dir = experiments.run_study(tmp / f"{name}.toml", out=tmp / "run",
                                    executor=ThreadPoolExecutor(1), quiet=True, report=False)
    return experiments.load_results(run_dir)


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


# A study of the user's own: a model factory and a data set factory in a module beside the spec
# (experiments.spec.factories). Tiny: 400 examples, 2 batch sizes, 2 trials, 40 steps.

MYMODELS = textwrap.dedent('''\
    """A small model and data set of the user's own."""
    import torch
    from torch import nn

    import training

    WIDTH = 16


    def mlp(dataset, hidden=WIDTH):
        """Two Linear layers with a LayerNorm between them."""
        d_in = dataset.input_shape[0]
        return nn.Sequential(nn.Linear(d_in, hidden), nn.LayerNorm(hidden), nn.ReLU(),
                             nn.Linear(hidden, dataset.num_classes))


    def blobs(n=400, dim=6, classes=3, seed=0):
        """Gaussian blobs around random centres: a synthetic classification set."""
        g = torch.Generator().manual_seed(seed)
        centres = 1.5 * torch.randn(classes, dim, generator=g)
        y = torch.randint(0, classes, (n,), generator=g)
        x = centres[y] + torch.randn(n, dim, generator=g)
        cut = n * 4 // 5
        return training.Dataset(name="blobs", task="classification", x_train=x[:cut],
                                y_train=y[:cut], x_val=x[cut:], y_val=y[cut:],
                                num_classes=classes, input_shape=(dim,))
    ''')

OWN = textwrap.dedent("""\
    name = "own"
    optimizer = "momentum"
    batch_sizes = [8, 32]
    sparsities = [0.0]
    trials = 2
    seeds = [0]

    [workload]
    dataset = "mymodels:blobs"
    model = "mymodels:mlp"

    [goal]
    metric = "error"
    target = 0.2

    [search]
    lr = {scale = "log", min = 0.01, max = 0.3}

    [budget]
    max_steps = 40

    [eval]
    every = 5

    [probes]
    enabled = false
    """)


def forget_imports(names=("mymodels",)):
    """What a fresh process would see: the factory modules not yet imported (their digests and
    folders forgotten too)."""
    from experiments.spec import factories

    for name in names:
        sys.modules.pop(name, None)
        factories._SEEN.pop(name, None)
        factories._FROM_FOLDER.pop(name, None)


@contextlib.contextmanager
def own_project_in(folder):
    """``folder`` (made) holding ``mymodels.py`` and ``own.toml``; on leaving, this process
    forgets the module and the folder on ``sys.path`` (the next test's folder holds another)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mymodels.py").write_text(MYMODELS)
    (folder / "own.toml").write_text(OWN)
    path = list(sys.path)
    try:
        yield folder
    finally:
        forget_imports()
        sys.path[:] = path


@pytest.fixture
def own_project(tmp_path):
    with own_project_in(tmp_path / "project") as folder:
        yield folder
