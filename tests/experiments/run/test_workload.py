"""A spec's workload: its data set (loaded once per process), its model and its masks are the
ones the public API builds directly."""

import pickle

import torch

import pruning
import training
from experiments.spec.study import loads
from experiments.run.workload import Workload

from ..conftest import TINY


def test_workload_of_a_spec():
    spec = loads(TINY.replace('[goal]', '[pruning]\ncriterion = "magnitude"\n\n[goal]'))
    w = Workload.of(spec)
    assert w == Workload("teacher", "mlp", {"n": 600, "dim": 8, "num_classes": 3, "hidden": 16},
                         {"hidden": [16]}, "magnitude")
    assert pickle.loads(pickle.dumps(w)) == w          # shipped to worker processes


def test_dataset_model_and_masks_match_the_library():
    w = Workload.of(loads(TINY))
    ds = w.load_dataset()
    assert w.load_dataset() is ds                      # one load per process
    direct = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
    assert torch.equal(ds.x_train, direct.x_train) and torch.equal(ds.y_val, direct.y_val)
    net = w.build_model(ds, seed=3)
    ref = training.models.build("mlp", direct, seed=3, hidden=[16])
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), ref.state_dict().values()))
    masks = w.masks(ds, [(0.5, 3), (0.0, 3), (0.5, 3)])
    assert set(masks) == {(0.0, 3), (0.5, 3)} and masks[(0.0, 3)] is None
    expected = pruning.prune(ref, "snip", 0.5, dataset=direct, seed=3)
    assert set(masks[(0.5, 3)]) == set(expected.keys())
    assert all(torch.equal(masks[(0.5, 3)][k], expected[k]) for k in expected.keys())
