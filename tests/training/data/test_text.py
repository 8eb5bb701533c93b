"""The python_source data set: the corpus' files (tests and installed packages excluded, sorted),
its digest, the split by file and the next-byte windows, on a small folder of files; and the
real standard library once."""

import platform

import pytest
import torch

import training
from training.errors import DataError
from training.data.text import is_corpus_file, load_python_source, stdlib_files, windows

FILES = {
    "a.py": b"import os\nprint(os.sep)\n" * 3,
    "pkg/__init__.py": b"",
    "pkg/core.py": b"def f(x):\n    return x + 1\n" * 4,
    "pkg/util.py": b"class A:\n    pass\n" * 5,
    "z.py": b"# the last file\nvalue = 42\n" * 3,
    "b.py": b"while True:\n    break\n" * 4,
    # not part of the corpus
    "test/test_a.py": b"assert False\n",
    "tests/helpers.py": b"assert False\n",
    "pkg/tests/test_core.py": b"assert False\n",
    "idlelib/idle_test/x.py": b"assert False\n",
    "lib2to3/tests/data/y.py": b"assert False\n",
    "test_top.py": b"assert False\n",
    "site-packages/numpy/__init__.py": b"assert False\n",
    "dist-packages/foo.py": b"assert False\n",
    "pkg/__pycache__/core.py": b"assert False\n",
    "notes.txt": b"not python\n",
}
CORPUS = ["a.py", "b.py", "pkg/__init__.py", "pkg/core.py", "pkg/util.py", "z.py"]


@pytest.fixture
def corpus(tmp_path):
    for rel, data in FILES.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return tmp_path


def test_the_corpus_excludes_tests_and_installed_packages_in_sorted_order(corpus):
    assert [p.as_posix() for p in stdlib_files(corpus)] == CORPUS
    from pathlib import Path
    assert is_corpus_file(Path("unittest/case.py"))        # "unittest" does not start with "test"
    assert not is_corpus_file(Path("lib2to3/tests/pytree_idempotency.py"))


def test_deterministic_digest_and_records_the_python_version(corpus):
    a = load_python_source(context=8, val_fraction=0.34, root=str(corpus))
    b = load_python_source(context=8, val_fraction=0.34, root=str(corpus))
    assert a.provenance["corpus_digest"] == b.provenance["corpus_digest"]
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_val, b.y_val)
    assert a.provenance["python_version"] == platform.python_version()
    assert a.provenance["files"] == len(CORPUS)
    assert a.provenance["bytes"] == sum(len(FILES[f]) for f in CORPUS)
    # one changed byte in one file: another corpus
    (corpus / "pkg/util.py").write_bytes(FILES["pkg/util.py"].replace(b"pass", b"PASS"))
    c = load_python_source(context=8, val_fraction=0.34, root=str(corpus))
    assert c.provenance["corpus_digest"] != a.provenance["corpus_digest"]
    # a test file is not part of it: changing one leaves the digest alone
    (corpus / "test/test_a.py").write_bytes(b"changed\n")
    assert load_python_source(context=8, val_fraction=0.34,
                              root=str(corpus)).provenance["corpus_digest"] == \
        c.provenance["corpus_digest"]


def stream_of(files):
    return b"".join(FILES[f] for f in files)


def test_split_by_file_windows_and_next_byte_targets(corpus):
    ds = load_python_source(context=8, stride=3, val_fraction=0.34, seed=5, root=str(corpus))
    p = ds.provenance
    assert (p["train_files"], p["val_files"]) == (4, 2)   # round(6 * 0.34) = 2 files held out
    # the files of each split: the seeded permutation of the sorted corpus
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(5)).tolist()
    val_files = [CORPUS[i] for i in sorted(perm[:2])]
    train_files = [CORPUS[i] for i in sorted(perm[2:])]
    for x, y, files in ((ds.x_train, ds.y_train, train_files), (ds.x_val, ds.y_val, val_files)):
        stream = stream_of(files)
        starts = range(0, len(stream) - 8, 3)
        assert x.shape == y.shape == (len(starts), 8)
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        for row, i in enumerate(starts):
            assert bytes(x[row].long().tolist()) == stream[i:i + 8]
            assert bytes(y[row].tolist()) == stream[i + 1:i + 9]   # the next byte everywhere
    assert p["train_bytes"] == len(stream_of(train_files))
    assert ds.task == "classification" and ds.num_classes == 256 and ds.input_shape == (8,)


def test_window_counts_and_limits():
    s = torch.arange(20, dtype=torch.uint8)
    x, y = windows(s, 4, 4, None)
    assert x[:, 0].tolist() == [0, 4, 8, 12] and y[-1].tolist() == [13, 14, 15, 16]
    x, y = windows(s, 4, 1, 3)   # 16 windows, 3 kept evenly spaced: the first, middle, last
    assert x[:, 0].tolist() == [0, 8, 15] and torch.equal(y[:, :-1], x[:, 1:].long())
    with pytest.raises(DataError, match="holds no window of context 30"):
        windows(s, 30, 1, None)


@pytest.mark.parametrize("options, message", [
    ({"context": 0}, "context must be an integer >= 1"),
    ({"stride": 2.5}, "stride must be an integer >= 1"),
    ({"max_train_windows": 0}, "max_train_windows must be an integer >= 1 or None"),
    ({"val_fraction": 1.0}, r"val_fraction must be in \(0, 1\)"),
    ({"test": True}, "python_source has no test split"),
])
def test_bad_options(corpus, options, message):
    with pytest.raises(DataError, match=message):
        load_python_source(root=str(corpus), **options)


def test_too_few_files(tmp_path):
    (tmp_path / "only.py").write_bytes(b"x = 1\n" * 50)
    with pytest.raises(DataError, match="holds 1 corpus file"):
        load_python_source(root=str(tmp_path))


def test_the_real_standard_library_through_the_registry():
    ds = training.data.load("python_source", context=32, max_train_windows=100,
                            max_val_windows=50)
    again = training.data.load("python_source", context=32, max_train_windows=100,
                               max_val_windows=50)
    p = ds.provenance
    assert p["corpus_digest"] == again.provenance["corpus_digest"]
    assert torch.equal(ds.x_train, again.x_train)
    assert p["files"] > 300 and p["bytes"] > 5_000_000   # 734 files, 12.1 MB on Python 3.11.7
    assert ds.x_train.shape == (100, 32) and ds.y_val.shape == (50, 32)
    assert all(not part.startswith("test") for f in stdlib_files() for part in f.parts)
