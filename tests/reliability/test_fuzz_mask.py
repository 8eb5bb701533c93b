"""Fuzzing pruning.Mask: any entries / info / model give a usable mask or MaskError."""

import math
import warnings

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pruning import Mask, MaskError

numbers = st.one_of(st.integers(-3, 3), st.floats(), st.booleans(),
                    st.sampled_from([0, 1, 0.0, 1.0]))
arrays = st.one_of(
    st.lists(st.sampled_from([0.0, 1.0]), max_size=6).map(torch.tensor),
    st.lists(numbers, max_size=6),
    st.lists(st.lists(numbers, max_size=3), max_size=3),            # possibly ragged
    st.tuples(st.integers(0, 3), st.integers(0, 3)).map(lambda s: torch.ones(s)),
    st.sampled_from([np.float16, np.int8, np.uint8, np.bool_, np.complex64]).flatmap(
        lambda t: st.lists(st.integers(0, 1), max_size=5).map(lambda v: np.array(v, dtype=t))),
    numbers, st.text(max_size=3), st.none(), st.just(object()),
)
infos = st.one_of(st.none(), st.dictionaries(st.text(max_size=5), numbers, max_size=3),
                  st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=2))
entries = st.one_of(st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), arrays,
                                    max_size=4),
                    st.lists(arrays, max_size=2), st.none(), st.integers())


def toy_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 2))


@settings(max_examples=400, deadline=None)
@given(entries, infos)
def test_constructor_gives_a_consistent_mask_or_mask_error(raw, info):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # e.g. a complex value silently cast to real
            mask = Mask(raw, info)
    except MaskError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert len(mask) == len(raw) >= 1
    for name in mask:
        t = mask[name]
        assert t.dtype == torch.float32 and bool(((t == 0) | (t == 1)).all())
    assert 0 <= mask.kept() <= mask.total()
    s = mask.sparsity()
    assert math.isfinite(s) and 0.0 <= s <= 1.0 and abs(s + mask.density() - 1.0) < 1e-12
    assert repr(mask) and mask.to_dict()["kept"] == mask.kept()


SHAPES = {"0.weight": (2, 3), "0.bias": (2,), "2.weight": (2, 2), "2.bias": (2,)}


@st.composite
def masks_for_toy(draw):
    """Masks whose names and shapes may or may not fit the toy model."""
    out = {}
    for name in draw(st.lists(st.sampled_from(list(SHAPES) + ["1.weight", "nope"]), min_size=1,
                              max_size=3, unique=True)):
        shape = SHAPES.get(name, (2, 3))
        if draw(st.booleans()):
            shape = draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
        bits = draw(st.lists(st.integers(0, 1), min_size=int(np.prod(shape)),
                             max_size=int(np.prod(shape))))
        out[name] = torch.tensor(bits, dtype=torch.float32).reshape(shape)
    return Mask(out)


@settings(max_examples=200, deadline=None)
@given(masks_for_toy())
def test_apply_zeroes_exactly_the_pruned_weights_or_raises_mask_error(mask):
    model = toy_model()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    try:
        mask.apply(model)
    except MaskError as exc:
        assert "\n" not in str(exc)
        # a refused mask leaves the model untouched
        for name, p in model.named_parameters():
            assert torch.equal(p, before[name])
        return
    for name, p in model.named_parameters():
        expected = before[name] * mask[name] if name in mask else before[name]
        assert torch.equal(p, expected)


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.none(), st.integers(), st.text(max_size=3), st.just(nn.Linear(3, 2))))
def test_apply_to_something_that_is_not_a_matching_model(target):
    mask = Mask({"0.weight": torch.ones(2, 3)})
    try:
        mask.apply(target)
    except MaskError as exc:
        assert "\n" not in str(exc)
    else:
        raise AssertionError(f"applied a mask for '0.weight' to {target!r}")
