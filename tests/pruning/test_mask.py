import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import training
from pruning import Mask, MaskError, prunable_parameters

SHAPES = {"0.weight": (5, 3), "2.weight": (2, 5)}


def toy_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))


@st.composite
def masks(draw):
    entries = {}
    for name, shape in SHAPES.items():
        bits = draw(st.lists(st.integers(0, 1), min_size=shape[0] * shape[1],
                             max_size=shape[0] * shape[1]))
        entries[name] = torch.tensor(bits, dtype=torch.float32).reshape(shape)
    return Mask(entries, {"criterion": "test"})


@settings(max_examples=50, deadline=None)
@given(masks())
def test_sparsity_bounds_and_counts(mask):
    total = sum(a * b for a, b in SHAPES.values())
    kept = sum(int(mask[k].sum()) for k in SHAPES)
    assert mask.total() == total and mask.kept() == kept
    assert 0.0 <= mask.sparsity() <= 1.0
    assert mask.sparsity() == pytest.approx(1 - kept / total)
    assert mask.density() + mask.sparsity() == pytest.approx(1.0)
    for name, s in mask.layer_sparsity().items():
        assert 0.0 <= s <= 1.0
        assert s == pytest.approx(1 - float(mask[name].mean()))


@settings(max_examples=50, deadline=None)
@given(masks())
def test_apply_zeroes_exactly_the_pruned_weights_and_is_idempotent(mask):
    model = toy_model()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    mask.apply(model)
    once = {k: v.detach().clone() for k, v in model.named_parameters()}
    mask.apply(model)
    for k, v in model.named_parameters():
        assert torch.equal(v.detach(), once[k])  # idempotent
        expected = before[k] * mask[k] if k in mask else before[k]  # biases untouched
        assert torch.equal(once[k], expected)


@settings(max_examples=30, deadline=None)
@given(masks())
def test_save_load_round_trip(mask):
    with tempfile.TemporaryDirectory() as tmp:
        path = mask.save(Path(tmp) / "m")
        assert path.suffix == ".pt"
        loaded = Mask.load(path)
        summary = json.loads(path.with_suffix(".json").read_text())
    assert loaded == mask
    assert list(loaded) == list(mask)
    assert loaded.info == mask.info
    assert all(loaded[k].dtype == torch.float32 for k in loaded)
    assert summary["kept"] == mask.kept() and summary["total"] == mask.total()
    assert summary["layers"]["2.weight"]["kept"] == mask.kept("2.weight")


@settings(max_examples=30, deadline=None)
@given(st.lists(masks(), min_size=1, max_size=4))
def test_stack_puts_trial_i_at_index_i(ms):
    stacked = Mask.stack(ms)
    assert list(stacked) == list(SHAPES)
    for name, shape in SHAPES.items():
        assert stacked[name].shape == (len(ms), *shape)
        for i, m in enumerate(ms):
            assert torch.equal(stacked[name][i], m[name])


def test_is_a_mapping_of_float_tensors():
    from collections.abc import Mapping

    m = Mask({"w": torch.tensor([[True, False]])})
    assert isinstance(m, Mapping)
    assert dict(m)["w"].dtype == torch.float32
    assert m.kept() == 1 and m.sparsity() == 0.5


@pytest.mark.parametrize("bad, match", [
    ({"w": torch.tensor([0.0, 0.5])}, "values other than 0 and 1"),
    ({"w": torch.tensor([0.0, float("nan")])}, "non-finite"),
    ({}, "at least one entry"),
])
def test_bad_entries_raise(bad, match):
    with pytest.raises(MaskError, match=match):
        Mask(bad)


def test_apply_rejects_unknown_names_and_shapes():
    model = toy_model()
    with pytest.raises(MaskError, match="'nope' is not a parameter"):
        Mask({"nope": torch.ones(5, 3)}).apply(model)
    with pytest.raises(MaskError, match="shape"):
        Mask({"0.weight": torch.ones(3, 5)}).apply(model)
    with pytest.raises(MaskError, match="no entry 'x'"):
        Mask({"0.weight": torch.ones(5, 3)}).sparsity("x")


def test_stack_rejects_mismatched_masks():
    a = Mask({"w": torch.ones(2)})
    with pytest.raises(MaskError, match="entries"):
        Mask.stack([a, Mask({"v": torch.ones(2)})])
    with pytest.raises(MaskError, match="different shapes"):
        Mask.stack([a, Mask({"w": torch.ones(3)})])
    with pytest.raises(MaskError, match="non-empty"):
        Mask.stack([])


def test_load_rejects_other_files(tmp_path):
    torch.save({"x": 1}, tmp_path / "other.pt")
    with pytest.raises(MaskError, match="not a mask file"):
        Mask.load(tmp_path / "other.pt")


def test_prunable_parameters_weights_only_by_default():
    ds = training.data.load("teacher", n=100)
    for name in ("mlp", "linear"):
        model = training.models.build(name, ds)
        weights = [k for k, p in model.named_parameters() if p.dim() > 1]
        assert list(prunable_parameters(model)) == weights
        assert list(prunable_parameters(model, prune_biases=True)) == [
            k for k, _ in model.named_parameters()]
    with pytest.raises(MaskError, match="no prunable parameters"):
        prunable_parameters(nn.Sequential(nn.ReLU()))


def test_dense_mask_keeps_everything(small_mlp):
    m = Mask.dense(small_mlp)
    assert m.sparsity() == 0.0
    assert m.total() == sum(p.numel() for p in prunable_parameters(small_mlp).values())


def test_pickles_for_process_pools():
    import pickle

    m = Mask({"w": torch.tensor([1.0, 0.0])}, {"criterion": "x"})
    back = pickle.loads(pickle.dumps(m))
    assert back == m and back.info == m.info
