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


# ---------------------------------------------------------------------------------------------
# your own data: Dataset.from_tensors and Dataset.from_torch


def random_images(n=60, classes=4, seed=0):
    """A small real-looking image set: n 1 x 8 x 8 uint8 images (numpy) and int labels."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, size=(n, 1, 8, 8), dtype=np.uint8),
            rng.integers(0, classes, size=n))


def same_data(a, b):
    """Two Datasets hold the same splits, task, classes and input shape."""
    assert (a.task, a.num_classes, a.input_shape) == (b.task, b.num_classes, b.input_shape)
    for split in ("x_train", "y_train", "x_val", "y_val"):
        u, v = getattr(a, split), getattr(b, split)
        assert u.dtype == v.dtype and torch.equal(u, v), split


def test_from_tensors_splits_exactly_as_a_registered_loader(tmp_path):
    """The same pool and seed give the registered MNIST loader's split, bit for bit."""
    data = make_idx_folder(tmp_path, n_train=50)
    ds = training.data.load("mnist", root=tmp_path, val_fraction=0.2, seed=3)
    x = torch.tensor(data["train"][0], dtype=torch.float32).div_(255.0).unsqueeze(1)
    own = training.Dataset.from_tensors(x.numpy(), data["train"][1], val_fraction=0.2, seed=3,
                                        num_classes=10)
    same_data(own, ds)
    assert own.name == "tensors" and own.provenance["split_seed"] == 3
    assert (own.n_train, own.n_val) == (40, 10)
    assert own.provenance["source"] == "tensors" and own.provenance["examples"] == 50
    other = training.Dataset.from_tensors(x, torch.as_tensor(data["train"][1]), seed=4)
    assert not torch.equal(other.x_val, own.x_val[:5])  # the seed picks the split


def test_from_tensors_infers_the_task_from_the_labels():
    x, y = random_images()
    cls = training.Dataset.from_tensors(x, y)
    assert cls.task == "classification" and cls.num_classes == int(y.max()) + 1
    assert cls.x_train.dtype == torch.float32 and cls.y_train.dtype == torch.int64
    # the split: the first round(60 * 0.1) of a permutation seeded with seed=0 are validation
    perm = torch.randperm(60, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cls.x_train, torch.tensor(x, dtype=torch.float32)[perm[6:]])
    assert torch.equal(cls.y_val, torch.tensor(y)[perm[:6]])
    assert cls.input_shape == (1, 8, 8) and (cls.n_train, cls.n_val) == (54, 6)
    assert training.Dataset.from_tensors(x, y, num_classes=7).num_classes == 7
    # float labels: regression, an [n, 1] column flattened to [n]
    targets = np.linspace(-1, 1, 60)[:, None]
    reg = training.Dataset.from_tensors(x, targets, name="heights")
    assert reg.task == "regression" and reg.num_classes == 0 and reg.name == "heights"
    assert reg.y_train.dtype == torch.float32 and reg.y_train.shape == (54,)
    # stated tasks: whole-number floats as classes, integers as regression targets
    stated = training.Dataset.from_tensors(x, y.astype(np.float64), task="classification")
    same_data(stated, cls)
    counts = training.Dataset.from_tensors(x, y, task="regression")
    assert counts.task == "regression" and counts.y_train.dtype == torch.float32


def test_from_tensors_given_validation_is_used_as_given_and_owned():
    x, y = random_images()
    xv, yv = torch.randn(10, 1, 8, 8), torch.arange(10) % 4
    ds = training.Dataset.from_tensors(torch.tensor(x), torch.tensor(y), x_val=xv, y_val=yv)
    assert torch.equal(ds.x_val, xv) and torch.equal(ds.y_val, yv)
    assert torch.equal(ds.x_train, torch.tensor(x, dtype=torch.float32))
    assert ds.provenance["validation"] == "given" and (ds.n_train, ds.n_val) == (60, 10)
    xv[0] = 99.0  # the data set holds its own copy
    assert float(ds.x_val[0].max()) < 99.0


def test_from_tensors_digest_tells_data_sets_apart():
    x, y = random_images()
    digest = training.Dataset.from_tensors(x, y).provenance["digest"]
    assert len(digest) == 16
    assert training.Dataset.from_tensors(x.copy(), y.copy(), seed=5).provenance["digest"] == digest
    changed = x.copy()
    changed[7, 0, 3, 3] ^= 1
    assert training.Dataset.from_tensors(changed, y).provenance["digest"] != digest
    assert training.Dataset.from_tensors(x.reshape(60, 64), y).provenance["digest"] != digest


X, Y = torch.randn(20, 3), torch.arange(20) % 2
# finite in float64 but past float32's largest value (3.4e38) in one entry: inf once cast
X_OVERFLOW = X.double()
X_OVERFLOW[7, 2] = 1e39
BAD_TENSORS = [
    (dict(x=X[:19]), "x has 19 examples but y has 20 labels"),
    (dict(x=X.tolist()), "x must be a torch.Tensor or a numpy array, got list"),
    (dict(y=np.array(["a"] * 20)), "y has numpy dtype <U1; expected numbers"),
    (dict(x=torch.zeros(0, 3), y=torch.zeros(0, dtype=torch.long)), r"x is empty \(0 examples\)"),
    (dict(x=torch.zeros(20, 0)), r"x's examples are empty: shape \(20, 0\)"),
    (dict(x=torch.tensor(1.0)), "x is a scalar"),
    (dict(x=X.clone().index_put_((torch.tensor([4]), torch.tensor([1])), torch.tensor(float("nan")))),
     r"x\[4\] has a non-finite value \(NaN or inf, after the cast to float32\)"),
    (dict(x=X_OVERFLOW), r"x\[7\] has a non-finite value \(NaN or inf, after the cast to float32\)"),
    (dict(y=Y.reshape(10, 2)), r"x has 20 examples but y has 10"),
    (dict(y=torch.nn.functional.one_hot(Y)), r"y has shape \(20, 2\); classification needs one "
                                             r"class label per example.*one-hot labels\? pass their argmax"),
    (dict(y=torch.randn(20, 2)), r"y has shape \(20, 2\); regression needs one target"),
    (dict(y=Y - 1), r"y\[0\] = -1: class labels must be >= 0"),
    (dict(y=Y * 3, num_classes=2), r"y\[1\] = 3 but num_classes=2: class labels must be in \[0, 2\)"),
    (dict(y=Y * 0), "every label of y is 0: classification needs at least 2 classes"),
    (dict(num_classes=1), "num_classes must be an integer >= 2, got 1"),
    (dict(y=Y + 0.5, task="classification"), r"y\[0\] = 0.5: classification needs whole-number"),
    (dict(y=Y.float(), num_classes=2), "num_classes=2 is given but y holds floats"),
    (dict(task="regression", num_classes=2), "num_classes applies to classification only"),
    (dict(task="cls"), "task must be 'classification', 'regression' or None"),
    (dict(y=Y.bool()), "y is bool; class labels must be integers"),
    (dict(y=torch.tensor([float("inf")] + [0.0] * 19)), r"y\[0\] is not finite"),
    (dict(x=X.to(torch.complex64)), "x is complex"),
    (dict(x_val=X[:4]), "y_val is missing: x_val and y_val come together"),
    (dict(x_val=torch.randn(4, 5), y_val=Y[:4]),
     r"x_val's examples have shape \(5,\) but x's have \(3,\)"),
    (dict(x_val=X[:4], y_val=Y[:3]), "x_val has 4 examples but y_val has 3 labels"),
    (dict(x_val=X[:4], y_val=Y[:4] + 5, num_classes=2), r"y_val\[0\] = 5 but num_classes=2"),
    (dict(val_fraction=1.0), r"val_fraction must be in \(0, 1\), got 1.0"),
    (dict(x=X[:2], y=Y[:2], val_fraction=0.9), "val_fraction=0.9 of 2 examples leaves no training"),
    (dict(seed="0"), "seed must be an integer, got '0'"),
    (dict(name=""), "name must be a non-empty string"),
]


@pytest.mark.parametrize("kwargs, message", BAD_TENSORS, ids=[m[:30] for _, m in BAD_TENSORS])
def test_from_tensors_refuses_bad_input_in_one_line(kwargs, message):
    args = dict(dict(x=X, y=Y), **kwargs)
    with pytest.raises(DataError, match=message) as info:
        training.Dataset.from_tensors(args.pop("x"), args.pop("y"), **args)
    assert "\n" not in str(info.value)


class ImageFolderLike(torch.utils.data.Dataset):
    """A map-style data set of (image tensor, int label) pairs, as torchvision gives with
    ToTensor(); ``item`` may replace some items to make it bad."""

    def __init__(self, x, y, item=None):
        self.x, self.y, self.item = x, y, item or {}

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if i in self.item:
            return self.item[i]
        return torch.from_numpy(self.x[i]).float() / 255, int(self.y[i])


def test_from_torch_reads_a_map_style_dataset_once_like_from_tensors():
    x, y = random_images()
    torch_ds = ImageFolderLike(x, y)
    ds = training.Dataset.from_torch(torch_ds, seed=2, progress=False)
    expect = training.Dataset.from_tensors(torch.from_numpy(x).float() / 255, y, seed=2)
    same_data(ds, expect)
    assert ds.name == "ImageFolderLike" and ds.provenance["source"] == "torch"
    assert ds.provenance["torch_class"] == "ImageFolderLike"
    assert ds.provenance["digest"] == expect.provenance["digest"]
    # numpy inputs and labels, a validation data set used as given
    pairs = [(x[i].astype(np.float64), np.int64(y[i])) for i in range(60)]
    val = [(np.zeros((1, 8, 8)), 1), (np.ones((1, 8, 8)), 3)]
    with_val = training.Dataset.from_torch(pairs, val_dataset=val, name="own")
    assert torch.equal(with_val.x_train, torch.tensor(x, dtype=torch.float32))
    assert with_val.y_val.tolist() == [1, 3] and with_val.name == "own"


def test_from_torch_of_a_tensor_dataset_equals_from_tensors():
    x, y = torch.randn(50, 6), torch.randint(0, 3, (50,))
    made = training.Dataset.from_torch(torch.utils.data.TensorDataset(x, y), seed=1)
    same_data(made, training.Dataset.from_tensors(x, y, seed=1))
    regression = training.Dataset.from_torch(torch.utils.data.TensorDataset(x, x[:, 0]))
    same_data(regression, training.Dataset.from_tensors(x, x[:, 0]))


def test_from_torch_shows_progress_only_for_large_sets(capsys):
    n = training.data.torch_data.PROGRESS_ITEMS + 1
    big = [(float(i % 7), i % 2) for i in range(n)]
    ds = training.Dataset.from_torch(big)
    assert "reading dataset" in capsys.readouterr().err and ds.n_train + ds.n_val == n
    training.Dataset.from_torch(big, progress=False)
    training.Dataset.from_torch(big[:100])
    assert capsys.readouterr().err == ""


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield torch.zeros(3), 0


class Picture:
    """Stands for a PIL image: not a tensor, array or number."""


IMG = np.zeros((1, 8, 8), np.uint8), np.zeros(4, np.int64)
BAD_TORCH = [
    (Stream(), "dataset is an IterableDataset \\(Stream\\): from_torch needs a map-style"),
    (torch.utils.data.DataLoader(ImageFolderLike(*random_images())),
     r"dataset is a DataLoader: pass the data set .*from_torch\(loader.dataset\)"),
    ((torch.zeros(3, 2), torch.zeros(3)),  # tensors belong to from_tensors
     r"dataset\[0\] is a Tensor, not an \(x, y\) pair.*use training.Dataset.from_tensors\(x, y\)"),
    (object(), "dataset must be a map-style torch Dataset .* got object"),
    ([], r"dataset is empty \(len 0\)"),
    (ImageFolderLike(*random_images(), item={3: torch.zeros(1, 8, 8)}),
     r"dataset\[3\] is a Tensor, not an \(x, y\) pair"),
    (ImageFolderLike(*random_images(), item={2: (torch.zeros(1, 8, 8), 0, 0)}),
     r"dataset\[2\] is a tuple of 3, not an \(x, y\) pair"),
    (ImageFolderLike(*random_images(), item={5: (torch.zeros(1, 8, 7), 0)}),
     r"dataset\[5\]: x has shape \(1, 8, 7\) but dataset\[0\]'s has \(1, 8, 8\)"),
    (ImageFolderLike(*random_images(), item={4: (torch.zeros(1, 8, 8), torch.tensor([0, 1]))}),
     r"dataset\[4\]: y has shape \(2,\) but dataset\[0\]'s has \(\)"),
    (ImageFolderLike(*random_images(), item={6: (torch.zeros(1, 8, 8), 0.5)}),
     r"dataset\[6\]: y is of dtype torch.float32 but dataset\[0\]'s is torch.int64"),
    (ImageFolderLike(*random_images(), item={0: (Picture(), 0)}),
     r"dataset\[0\]: x is a Picture, not a tensor, array or number \(a torchvision data set "
     r"needs transform=ToTensor\(\)\)"),
    (ImageFolderLike(*random_images(), item={1: (torch.full((1, 8, 8), float("nan")), 0)}),
     r"dataset\[1\]'s x has a non-finite value"),
    (torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4), torch.zeros(4)),
     "dataset is a TensorDataset of 3 tensors; from_torch needs two"),
    (torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4, 3, dtype=torch.long)),
     r"dataset's y has shape \(4, 3\); classification needs one class label"),
]


@pytest.mark.parametrize("dataset, message", BAD_TORCH, ids=[str(i) for i in range(len(BAD_TORCH))])
def test_from_torch_refuses_bad_data_in_one_line(dataset, message):
    with pytest.raises(DataError, match=message) as info:
        training.Dataset.from_torch(dataset, progress=False)
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match="progress must be True, False or None"):
        training.Dataset.from_torch([(0.0, 1)], progress="yes")


# ---------------------------------------------------------------------------------------------
# where the local-file data sets are found


@pytest.fixture
def no_system_folders(monkeypatch):
    """No operating-system folder is searched (the real Fashion-MNIST package may be installed)."""
    monkeypatch.setattr(training.data.registry, "SYSTEM_FOLDERS", {})
    monkeypatch.delenv("SPARSESCALE_DATA", raising=False)


def test_fashion_mnist_found_in_a_system_folder_with_no_configuration(tmp_path, monkeypatch,
                                                                        no_system_folders):
    folder = tmp_path / "usr" / "share" / "datasets" / "fashion-mnist"
    folder.mkdir(parents=True)
    make_idx_folder(folder, gz=True)   # Debian's package ships the four files gzipped
    monkeypatch.setattr(training.data.registry, "SYSTEM_FOLDERS", {"fashion_mnist": (folder,)})
    ds = training.data.load("fashion_mnist", test=True)
    assert ds.n_train + ds.n_val == 30 and ds.x_test.shape == (10, 1, 28, 28)
    assert ds.provenance["folder"] == str(folder)
    # MNIST has no system folder: the same files do not make it found
    with pytest.raises(DataError, match="data set 'mnist' not found"):
        training.data.load("mnist")


@pytest.mark.parametrize("sub", ["fashion_mnist", "fashion-mnist"])
def test_fashion_mnist_found_under_sparsescale_data(tmp_path, monkeypatch, no_system_folders, sub):
    (tmp_path / sub).mkdir()
    make_idx_folder(tmp_path / sub, n_train=20)
    system = tmp_path / "system"
    system.mkdir()
    make_idx_folder(system, n_train=40)
    monkeypatch.setattr(training.data.registry, "SYSTEM_FOLDERS", {"fashion_mnist": (system,)})
    monkeypatch.setenv("SPARSESCALE_DATA", str(tmp_path))
    ds = training.data.load("fashion_mnist")
    # $SPARSESCALE_DATA comes before the system folder
    assert ds.n_train + ds.n_val == 20 and ds.provenance["folder"] == str(tmp_path / sub)
    # an explicit root= is the only place looked: not the environment, not the system folder
    with pytest.raises(DataError, match="not found"):
        training.data.load("fashion_mnist", root=tmp_path / "empty")


def test_fashion_mnist_not_found_names_every_place_and_the_install(tmp_path, monkeypatch,
                                                                   no_system_folders):
    system = tmp_path / "system"
    monkeypatch.setattr(training.data.registry, "SYSTEM_FOLDERS", {"fashion_mnist": (system,)})
    monkeypatch.setenv("SPARSESCALE_DATA", str(tmp_path / "data"))
    with pytest.raises(DataError) as err:
        training.data.load("fashion_mnist")
    msg = str(err.value)
    assert "\n" not in msg
    for place in (tmp_path / "data" / "fashion_mnist", tmp_path / "data" / "fashion-mnist",
                  tmp_path / "data", system):
        assert str(place) in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "train-images-idx3-ubyte[.gz]" in msg and "t10k-labels-idx1-ubyte[.gz]" in msg


@pytest.mark.parametrize("name, files", [
    ("mnist", ["train-images-idx3-ubyte[.gz]", "train-labels-idx1-ubyte[.gz]",
               "t10k-images-idx3-ubyte[.gz]", "t10k-labels-idx1-ubyte[.gz]"]),
    ("cifar10", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]),
])
def test_local_file_data_sets_say_which_files_go_where(tmp_path, monkeypatch, no_system_folders,
                                                        name, files):
    with pytest.raises(DataError) as err:
        training.data.load(name)
    msg = str(err.value)
    assert "SPARSESCALE_DATA is not set" in msg and f"$SPARSESCALE_DATA/{name}" in msg
    assert all(f in msg for f in files) and "apt-get" not in msg
    monkeypatch.setenv("SPARSESCALE_DATA", str(tmp_path))
    with pytest.raises(DataError, match=rf"looked in {tmp_path / name}, "):
        training.data.load(name)


def test_cifar10_in_the_extracted_archive_folder(tmp_path, monkeypatch, no_system_folders):
    sub = tmp_path / "cifar10" / "cifar-10-batches-py"
    sub.mkdir(parents=True)
    write_cifar(sub)
    monkeypatch.setenv("SPARSESCALE_DATA", str(tmp_path))
    assert training.data.load("cifar10", val_fraction=0.25).n_train == 30


def test_real_fashion_mnist_from_the_debian_package(monkeypatch):
    folder = training.data.SYSTEM_FOLDERS["fashion_mnist"][0]
    if not (folder / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"the Debian package dataset-fashion-mnist is not installed ({folder})")
    monkeypatch.delenv("SPARSESCALE_DATA", raising=False)
    ds = training.data.load("fashion_mnist", test=True)
    assert (ds.n_train, ds.n_val, ds.x_test.shape[0]) == (54_000, 6_000, 10_000)
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    # balanced classes: 6,000 training and 1,000 test images of each
    assert torch.bincount(torch.cat([ds.y_train, ds.y_val])).tolist() == [6000] * 10
    assert torch.bincount(ds.y_test).tolist() == [1000] * 10
