"""Bad input: every mistake is refused with one line naming the key or argument and what is
allowed, before anything is written or trained."""

import gzip

import numpy as np
import pytest

import experiments
import pruning
import training
from experiments.spec.study import SpecError, SpecIOError, load, loads

from .conftest import NoTraining, edit

# (spec text, key path the problem must start with, words the problem must contain)
BAD_SPECS = [
    # wrong types
    (edit("trials = 2", 'trials = "2"'), "trials", ["'2'", "integer"]),
    (edit("batch_sizes = [8, 32]", 'batch_sizes = ["8"]'), "batch_sizes[0]", ["'8'", "integer"]),
    (edit("batch_sizes = [8, 32]", "batch_sizes = [8.0]"), "batch_sizes[0]", ["8.0", "integer"]),
    (edit("sparsities = [0.0]", 'sparsities = "0.5"'), "sparsities", ["'0.5'", "list"]),
    (edit("target = 0.3", 'target = "0.3"'), "goal.target", ["'0.3'", "number"]),
    (edit('optimizer = "momentum"', "optimizer = 3"), "optimizer", ["3", "sgd, momentum"]),
    (edit("[workload]\n", "workload = 3\n[unused]\n"), "workload", ["expected a table"]),
    (edit("lr = {", 'lr = "big"\nlr_unused = {'), "search.lr", ["'big'", "number"]),
    (edit("every = 10", "every = true"), "eval.every", ["True", "integer"]),
    (edit("enabled = false", "points = 1.5"), "probes.points", ["1.5", "integer"]),
    (edit("hidden = 8}", "hidden = 8, when = 1979-05-27}"), "workload.dataset_options.when",
     ["1979", "allowed"]),
    (edit("hidden = [8]}", "hidden = [8], scale = nan}"), "workload.model_options.scale",
     ["nan", "allowed"]),
    # batch sizes <= 0
    (edit("batch_sizes = [8, 32]", "batch_sizes = [0, 8]"), "batch_sizes[0]", [">= 1"]),
    (edit("batch_sizes = [8, 32]", "batch_sizes = [-8]"), "batch_sizes[0]", [">= 1"]),
    (edit("batch_sizes = [8, 32]", "batch_sizes = {min = 0, max = 8}"), "batch_sizes.min",
     [">= 1"]),
    # sparsity outside [0, 1)
    (edit("sparsities = [0.0]", "sparsities = [-0.1]"), "sparsities[0]", ["[0.0, 1.0)"]),
    (edit("sparsities = [0.0]", "sparsities = [0.0, 1.5]"), "sparsities[1]", ["[0.0, 1.0)"]),
    (edit("sparsities = [0.0]", "sparsities = [nan]"), "sparsities[0]", ["[0.0, 1.0)"]),
    # targets no trial can ever meet: error is in [0, 1], a loss is >= 0
    (edit("target = 0.3", "target = -0.1"), "goal.target", ["unreachable"]),
    (edit("target = 0.3", "target = 0.0"), "goal.target", ["unreachable", "<="]),
    (edit('metric = "error"\ntarget = 0.3', 'metric = "loss"\ntarget = -1.0'), "goal.target",
     ["unreachable"]),
]


@pytest.mark.parametrize("text,key,words", BAD_SPECS, ids=[f"{b[1]}-{i}" for i, b in
                                                          enumerate(BAD_SPECS)])
def test_bad_spec_is_refused_before_any_write(text, key, words, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = tmp_path / "run"
    with pytest.raises(SpecError) as info:
        experiments.run_study(path, out=out, executor=NoTraining(), quiet=True, report=False)
    problems = info.value.problems
    assert all("\n" not in p for p in problems), problems
    hit = [p for p in problems if p.startswith(f"{key}:")]
    assert hit, f"no problem names {key!r}: {problems}"
    for word in words:
        assert word in hit[0], hit[0]
    assert not out.exists()


def test_reachable_edge_targets_are_accepted():
    # error 0 and loss 0 with "<=" are reachable: only the impossible is refused
    assert loads(edit("target = 0.3", 'target = 0.0\ncomparison = "<="')).target == 0.0
    spec = loads(edit('metric = "error"\ntarget = 0.3',
                      'metric = "loss"\ntarget = 0.0\ncomparison = "<="'))
    assert (spec.metric, spec.target, spec.strict) == ("loss", 0.0, False)


def test_batch_size_larger_than_training_set_writes_nothing(tmp_path):
    # teacher n = 300 with val_fraction 0.2 leaves 240 training examples
    path = tmp_path / "big.toml"
    path.write_text(edit("batch_sizes = [8, 32]", "batch_sizes = [8, 256]"))
    with pytest.raises(SpecError) as info:
        experiments.run_study(path, out=tmp_path / "run", executor=NoTraining(), quiet=True,
                              report=False)
    assert info.value.problems == ["batch_sizes: found 256 > 240 (the training set size); "
                                   "allowed: 1..240"]
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def teacher():
    return training.data.load("teacher", n=200, dim=6, num_classes=3, hidden=8)


# library calls with one bad argument: (call, error type, words of the message)
def _bad_calls(ds):
    net = training.models.build("mlp", ds, hidden=[8])
    trial = [{"lr": 0.1, "momentum": 0.9}]

    def trials(trials=trial, **kw):
        args = dict(batch_size=8, optimizer="momentum", goal=0.3, max_steps=5)
        return lambda: training.train_trials(net, ds, trials, training.RunConfig(**{**args, **kw}))

    def reference(**kw):
        args = dict(batch_size=8, optimizer="momentum", max_steps=5)
        return lambda: training.train_reference(net, ds, training.Trial(lr=0.1, momentum=0.9),
                                                training.RunConfig(**{**args, **kw}))

    n = ds.n_train
    return [
        (lambda: training.data.load("mnist2d"), training.DataError, ["'mnist2d'", "mnist1d"]),
        (lambda: training.models.build("resnet99", ds), training.ModelError,
         ["'resnet99'", "resnet8"]),
        (lambda: pruning.prune(net, "snipp", 0.5, dataset=ds), pruning.PruningError,
         ["'snipp'", "snip"]),
        (trials(optimizer="adagrad"), training.ConfigError, ["'adagrad'", "adamw"]),
        *[(call(batch_size=b), training.ConfigError, ["batch_size", ">= 1"])
          for b in (0, -1, 2.5) for call in (trials, reference)],
        *[(call(batch_size=n + 1), training.ConfigError, ["batch_size", f"[1, {n}]"])
          for call in (trials, reference)],
        *[(lambda s=s: pruning.prune(net, "magnitude", s, dataset=ds), pruning.PruningError,
           ["sparsity", "[0, 1)"]) for s in (-0.1, 1.0, 1.5, float("nan"))],
        (trials(trials=[{"lr": float("nan")}]), training.ConfigError, ["lr", "nan"]),
    ]


def test_library_calls_name_the_bad_argument(teacher):
    for call, error, words in _bad_calls(teacher):
        with pytest.raises(error) as info:
            call()
        assert isinstance(info.value, training.SparsescaleError)   # the CLI's one catch
        message = str(info.value)
        assert "\n" not in message and all(w in message for w in words), message


# ---------------------------------------------------------------------------------------------
# data files: missing, truncated, wrong format -> DataError naming the file, before any write


def _idx(magic: int, dims: tuple[int, ...], payload: bytes | None = None) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
    return header + (bytes(int(np.prod(dims))) if payload is None else payload)


def _mnist_folder(folder, broken: str):
    """A tiny MNIST folder (60 images) with one file made ``broken``."""
    folder.mkdir()
    files = {"train-images-idx3-ubyte": _idx(2051, (60, 28, 28)),
             "train-labels-idx1-ubyte": _idx(2049, (60,), bytes(range(6)) * 10)}
    if broken == "missing":
        del files["train-labels-idx1-ubyte"]
    elif broken == "truncated":
        files["train-images-idx3-ubyte"] = files["train-images-idx3-ubyte"][:5000]
    elif broken == "wrong-format":   # a labels file where the images belong
        files["train-images-idx3-ubyte"] = files["train-labels-idx1-ubyte"]
    elif broken == "bad-gzip":
        images = files.pop("train-images-idx3-ubyte")
        files["train-images-idx3-ubyte.gz"] = gzip.compress(images)[:40]
    for name, blob in files.items():
        (folder / name).write_bytes(blob)
    return folder


@pytest.mark.parametrize("broken,file,words", [
    ("missing", "train-labels-idx1-ubyte", ["missing file"]),
    ("truncated", "train-images-idx3-ubyte", ["expected 47040 bytes", "found 4984"]),
    ("wrong-format", "train-images-idx3-ubyte", ["wrong magic number 2049", "2051"]),
    ("bad-gzip", "train-images-idx3-ubyte.gz", ["cannot read"]),
])
def test_broken_data_files_refuse_the_study_before_any_write(broken, file, words, tmp_path):
    root = _mnist_folder(tmp_path / "mnist", broken)
    spec = tmp_path / "mnist.toml"
    spec.write_text(edit('dataset = "teacher"\ndataset_options = {n = 300, dim = 6, '
                         'num_classes = 3, hidden = 8}',
                         f'dataset = "mnist"\ndataset_options = {{root = "{root}"}}'))
    out = tmp_path / "run"
    with pytest.raises(training.DataError) as info:
        experiments.run_study(spec, out=out, executor=NoTraining(), quiet=True, report=False)
    message = str(info.value)
    assert "\n" not in message and file in message and all(w in message for w in words), message
    assert not out.exists()


def test_unreadable_spec_files_raise_spec_error(tmp_path):
    missing = tmp_path / "nowhere.toml"
    with pytest.raises(SpecIOError, match=f"cannot read the study spec {missing}"):   # an OSError
        load(missing)
    with pytest.raises(SpecIOError, match="cannot read"):   # a folder
        load(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"name = \"\xff\xfe\x00\"\n")
    with pytest.raises(SpecError) as info:
        load(binary)
    assert str(binary) in str(info.value) and "UTF-8" in info.value.problems[0]
