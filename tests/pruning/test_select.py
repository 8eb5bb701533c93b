import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pruning import PruningError
from pruning.iterative import round_sparsities
from pruning.select import kept_count, layer_quotas, top_k_mask

sparsities = st.floats(0.0, 0.999, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=6), sparsities)
def test_layer_quotas_exact_total_and_within_one_of_share(sizes, s):
    quotas = layer_quotas(sizes, s)
    assert sum(quotas) == kept_count(sum(sizes), s)
    for n, q in zip(sizes, quotas):
        assert 0 <= q <= n
        assert abs(q - n * (1 - s)) < 1.0 + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=4), sparsities, st.integers(0, 2**31),
       st.sampled_from(["global", "layer"]))
def test_top_k_keeps_the_highest_scores(sizes, s, seed, scope):
    g = torch.Generator().manual_seed(seed)
    # few distinct values: many ties
    scores = {f"p{i}": torch.randint(0, 4, (n,), generator=g).double() for i, n in enumerate(sizes)}
    mask = top_k_mask(scores, s, scope)
    assert sum(int(m.sum()) for m in mask.values()) == kept_count(sum(sizes), s)
    groups = [list(scores)] if scope == "global" else [[k] for k in scores]
    for names in groups:
        kept = torch.cat([scores[k][mask[k] > 0] for k in names])
        dropped = torch.cat([scores[k][mask[k] == 0] for k in names])
        if kept.numel() and dropped.numel():
            assert kept.min() >= dropped.max()


def test_ties_broken_by_position():
    scores = {"a": torch.tensor([1.0, 2.0, 2.0]), "b": torch.tensor([2.0, 0.0])}
    mask = top_k_mask(scores, 0.4, "global")  # keep 3 of 5: the three 2.0s
    assert mask["a"].tolist() == [0, 1, 1] and mask["b"].tolist() == [1, 0]
    mask = top_k_mask(scores, 0.6, "global")  # keep 2: the first two 2.0s in order
    assert mask["a"].tolist() == [0, 1, 1] and mask["b"].tolist() == [0, 0]


def test_kept_count_is_round():
    assert kept_count(15000, 0.99) == 150
    assert kept_count(10, 0.7) == 3
    assert kept_count(5, 0.5) == 2  # Python's round: half to even


def test_bad_arguments():
    scores = {"a": torch.ones(3)}
    for bad in (1.0, -0.1, float("nan"), "0.5", True):
        with pytest.raises(PruningError, match=r"sparsity must be a number in \[0, 1\)"):
            top_k_mask(scores, bad)
    with pytest.raises(PruningError, match="scope 'x'; allowed: global, layer"):
        top_k_mask(scores, 0.5, "x")
    with pytest.raises(PruningError, match="NaN"):
        top_k_mask({"a": torch.tensor([1.0, float("nan")])}, 0.5)


@settings(max_examples=50, deadline=None)
@given(sparsities, st.integers(1, 120))
def test_exponential_schedule(s, rounds):
    steps = round_sparsities(s, rounds)
    assert len(steps) == rounds and steps[-1] == s
    assert all(a <= b + 1e-12 for a, b in zip(steps, steps[1:]))
    # density after round r is density^((r+1)/rounds)
    assert 1 - steps[0] == pytest.approx((1 - s) ** (1 / rounds))


def test_rounds_must_be_positive_int():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(PruningError, match="rounds must be an integer >= 1"):
            round_sparsities(0.5, bad)
