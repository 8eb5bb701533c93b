import gzip
import pickle
import random

import numpy as np
import pytest
import torch

import training
from training.data import DataError, read_idx


def write_idx(path, array, magic, gz=False):
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)


def make_idx_folder(folder, n_train=30, n_test=10, gz=False):
    rng = np.random.default_rng(0)
    sfx = ".gz" if gz else ""
    data = {}
    for split, n, (img, lab) in (("train", n_train, ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")),
                                 ("test", n_test, ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))):
        x = rng.integers(0, 256, size=(n, 28, 28))
        y = rng.integers(0, 10, size=n)
        write_idx(folder / (img + sfx), x, 2051, gz)
        write_idx(folder / (lab + sfx), y, 2049, gz)
        data[split] = (x, y)
    return data


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_idx_loader_reads_values(tmp_path, name, gz):
    data = make_idx_folder(tmp_path, gz=gz)
    ds = training.data.load(name, root=tmp_path, val_fraction=0.2, test=True, seed=3)
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10 and ds.task == "classification"
    assert ds.n_train == 24 and ds.n_val == 6
    # the union of train and val is exactly the file's content, pixels scaled by 1/255
    x = torch.cat([ds.x_train, ds.x_val]) * 255
    y = torch.cat([ds.y_train, ds.y_val])
    order = torch.argsort(y * 10**6 + x.flatten(1)[:, :3].sum(1).long())
    ref_x = torch.tensor(data["train"][0], dtype=torch.float32).unsqueeze(1)
    ref_y = torch.tensor(data["train"][1])
    ref_order = torch.argsort(ref_y * 10**6 + ref_x.flatten(1)[:, :3].sum(1).long())
    assert torch.allclose(x[order], ref_x[ref_order], atol=1e-4)
    assert torch.equal(y[order], ref_y[ref_order])
    assert torch.allclose(ds.x_test * 255, torch.tensor(data["test"][0], dtype=torch.float32).unsqueeze(1), atol=1e-4)


def test_idx_subfolder_and_env(tmp_path, monkeypatch):
    (tmp_path / "mnist").mkdir()
    make_idx_folder(tmp_path / "mnist")
    monkeypatch.setenv("SPARSESCALE_DATA", str(tmp_path))
    ds = training.data.load("mnist")
    assert ds.n_train + ds.n_val == 30 and ds.x_test is None


def test_idx_errors_name_the_file(tmp_path):
    make_idx_folder(tmp_path)
    bad = tmp_path / "train-labels-idx1-ubyte"
    write_idx(bad, np.zeros(30), 2051)  # image magic in a label file
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte: wrong magic number 2051; expected IDX labels"):
        training.data.load("mnist", root=tmp_path)
    write_idx(bad, np.zeros(30), 2049)
    img = tmp_path / "train-images-idx3-ubyte"
    img.write_bytes(img.read_bytes()[:-5])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: expected 23520 bytes.*found 23515"):
        training.data.load("mnist", root=tmp_path)
    img.write_bytes(b"\x00\x00")
    with pytest.raises(DataError, match="truncated header"):
        training.data.load("mnist", root=tmp_path)
    img.unlink()
    with pytest.raises(DataError, match=r"missing file .*train-images-idx3-ubyte\[\.gz\]"):
        training.data.load("mnist", root=tmp_path)


def test_idx_bad_gzip(tmp_path):
    p = tmp_path / "x.gz"
    p.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"x\.gz: cannot read"):
        read_idx(p, 2051)


def test_local_data_needs_a_folder(monkeypatch):
    monkeypatch.delenv("SPARSESCALE_DATA", raising=False)
    with pytest.raises(DataError, match="SPARSESCALE_DATA"):
        training.data.load("cifar10")


def write_cifar(folder, n=8):
    rng = np.random.default_rng(1)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels}, f)
        batches[name] = (data, labels)
    return batches


def test_cifar10_loader(tmp_path):
    sub = tmp_path / "cifar-10-batches-py"
    sub.mkdir()
    batches = write_cifar(sub)
    ds = training.data.load("cifar10", root=tmp_path, test=True, val_fraction=0.25)
    assert ds.input_shape == (3, 32, 32) and ds.n_train == 30 and ds.n_val == 10
    x = torch.cat([ds.x_train, ds.x_val])
    # standardized per channel with the training pool's statistics
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert torch.allclose(x.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-4)
    labels = sorted(sum((batches[f"data_batch_{i}"][1] for i in range(1, 6)), []))
    assert sorted(torch.cat([ds.y_train, ds.y_val]).tolist()) == labels
    assert ds.y_test.tolist() == batches["test_batch"][1]
    # R, G, B planes: pixel (c, 0, 0) of the first test image is data[0, c * 1024]
    raw = torch.tensor(batches["test_batch"][0][0, [0, 1024, 2048]], dtype=torch.float32) / 255
    pool = torch.tensor(np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)]),
                        dtype=torch.float32).reshape(-1, 3, 32, 32) / 255
    expect = (raw - pool.mean(dim=(0, 2, 3))) / pool.std(dim=(0, 2, 3))
    assert torch.allclose(ds.x_test[0, :, 0, 0], expect, atol=1e-5)


def test_cifar10_errors(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"data_batch_3: not a CIFAR-10 python batch"):
        training.data.load("cifar10", root=tmp_path)
    with open(tmp_path / "data_batch_3", "wb") as f:
        pickle.dump({b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4}, f)
    with pytest.raises(DataError, match=r"data_batch_3: data shape \(4, 100\)"):
        training.data.load("cifar10", root=tmp_path)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(DataError, match=r"missing file .*data_batch_3"):
        training.data.load("cifar10", root=tmp_path)


def test_mnist1d_generation_is_deterministic_cached_and_keeps_rng(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSESCALE_CACHE", str(tmp_path))
    np.random.seed(123)
    random.seed(123)
    before = (np.random.random(), random.random())
    np.random.seed(123)
    random.seed(123)
    a = training.data.load("mnist1d", num_samples=200, seed=1)
    assert (np.random.random(), random.random()) == before
    assert (tmp_path / "mnist1d_n200_s42.npz").exists()
    b = training.data.load("mnist1d", num_samples=200, seed=1)  # from the cache
    c = training.data.load("mnist1d", num_samples=200, seed=1, cache=False)
    for d in (b, c):
        assert torch.equal(a.x_train, d.x_train) and torch.equal(a.y_val, d.y_val)
    assert a.input_shape == (40,) and a.n_train + a.n_val == 160 and a.n_val == 16
    other = training.data.load("mnist1d", num_samples=200, seed=2)
    assert not torch.equal(a.x_val, other.x_val)  # the split seed changes the split
    assert torch.equal(torch.sort(torch.cat([a.y_train, a.y_val])).values,
                       torch.sort(torch.cat([other.y_train, other.y_val])).values)


def test_mnist1d_corrupt_cache_is_regenerated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSESCALE_CACHE", str(tmp_path))
    (tmp_path / "mnist1d_n100_s42.npz").write_bytes(b"broken")
    ds = training.data.load("mnist1d", num_samples=100)
    assert ds.n_train == 72


def test_mnist1d_default_size(mnist1d_small):
    assert mnist1d_small.n_train == 720 and mnist1d_small.n_val == 80
    assert mnist1d_small.x_test.shape == (200, 40)
    assert abs(float(torch.cat([mnist1d_small.x_train, mnist1d_small.x_val]).std()) - 1.0) < 0.1


def test_synthetic_sets():
    t1, t2 = training.data.load("teacher", seed=4), training.data.load("teacher", seed=4)
    assert torch.equal(t1.x_train, t2.x_train) and torch.equal(t1.y_train, t2.y_train)
    assert t1.task == "classification" and t1.num_classes == 4 and t1.n_train == 1600
    assert len(torch.unique(t1.y_train)) == 4
    lr = training.data.load("linreg", n=400, dim=5, noise=0.1, seed=0, test=True)
    w = torch.tensor(lr.provenance["w_star"])
    resid = lr.y_train - lr.x_train @ w
    assert lr.task == "regression" and abs(float(resid.std()) - 0.1) < 0.02
    assert lr.x_test.shape == (100, 5)


@pytest.mark.parametrize("call, message", [
    (lambda: training.data.load("imagenet"), "unknown data set 'imagenet'; allowed: cifar10, fashion_mnist"),
    (lambda: training.data.load("teacher", bogus=1), "bad options for data set 'teacher'"),
    (lambda: training.data.load("teacher", val_fraction=1.5), r"val_fraction must be in \(0, 1\)"),
])
def test_bad_requests(call, message):
    with pytest.raises(DataError, match=message):
        call()


def test_dataset_to_dtype_keeps_labels():
    ds = training.data.load("teacher").to(dtype=torch.float64)
    assert ds.x_train.dtype == torch.float64 and ds.y_train.dtype == torch.long
    reg = training.data.load("linreg").to(dtype=torch.float64)
    assert reg.y_train.dtype == torch.float64
