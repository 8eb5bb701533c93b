"""Sanity transforms: shuffle, matched random, reinitialization, random scopes."""

import pytest
import torch
from torch import nn

import pruning
import training
from pruning import PruningError, prunable_parameters
from pruning.select import even_quotas

# collapse at 99 % is expected here; tests/pruning/test_diagnostics.py tests the warning
pytestmark = pytest.mark.filterwarnings("ignore::pruning.LayerCollapseWarning")

LEVELS = (0.5, 0.9, 0.99)


@pytest.fixture(scope="module")
def snip_masks(mnist1d, mlp):
    with pytest.warns(pruning.LayerCollapseWarning):   # 0.99 empties most of layer 2
        return {s: pruning.prune(mlp, "snip", s, dataset=mnist1d) for s in LEVELS}


@pytest.mark.parametrize("transform", [pruning.shuffle_layers, pruning.matched_random])
@pytest.mark.parametrize("sparsity", LEVELS)
def test_transforms_keep_every_layer_count_and_move_positions(snip_masks, transform, sparsity):
    mask = snip_masks[sparsity]
    out = transform(mask, seed=3)
    assert list(out) == list(mask) and out.kept() == mask.kept()
    for k in mask:
        assert out.kept(k) == mask.kept(k) and out[k].shape == mask[k].shape
        moved = int(((out[k] > 0) & (mask[k] == 0)).sum())
        assert moved > 0, (k, sparsity)   # positions change in every (partly kept) layer
    assert out.info["transform_seed"] == 3 and out.info["criterion"] == "snip"
    assert out == transform(mask, seed=3)           # seeded
    assert out != transform(mask, seed=4)


def test_shuffle_is_a_permutation_within_each_layer(snip_masks):
    mask = snip_masks[0.9]
    g = torch.Generator().manual_seed(7)
    for k, m in mask.items():   # independent replay of the documented draw order
        perm = torch.randperm(m.numel(), generator=g)
        assert torch.equal(pruning.shuffle_layers(mask, 7)[k].reshape(-1), m.reshape(-1)[perm])


def test_matched_random_is_uniform_within_layers(snip_masks):
    # each position of a layer is kept with probability kept / total, whatever SNIP chose:
    # over 200 draws, SNIP's kept positions are kept no more often than its pruned ones
    mask = snip_masks[0.9]
    counts = {k: torch.zeros_like(m) for k, m in mask.items()}
    for seed in range(200):
        for k, m in pruning.matched_random(mask, seed).items():
            counts[k] += m
    for k, m in mask.items():
        rate = mask.density(k)
        on, off = counts[k][m > 0].mean() / 200, counts[k][m == 0].mean() / 200
        assert on == pytest.approx(rate, rel=0.1) and off == pytest.approx(rate, rel=0.1)


def test_reinitialize_reproduces_another_seeds_build(mnist1d, snip_masks):
    net1 = training.models.build("mlp", mnist1d, seed=1)
    net2 = training.models.build("mlp", mnist1d, seed=2)
    mask = snip_masks[0.9]
    before = torch.random.get_rng_state()
    out = pruning.reinitialize(net1, seed=2, mask=mask)
    assert torch.equal(torch.random.get_rng_state(), before)   # process RNG untouched
    for name, p in out.named_parameters():
        expected = dict(net2.named_parameters())[name].detach()
        if name in mask:
            expected = expected * mask[name]
        assert torch.equal(p.detach(), expected), name
    assert not torch.equal(net1[1].weight, out[1].weight)   # the caller's model is untouched
    cnn = training.models.build("cnn1d", mnist1d, channels=4, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(
        pruning.reinitialize(training.models.build("cnn1d", mnist1d, channels=4), 5).parameters(),
        cnn.parameters()))


def test_reinitialize_refuses_modules_without_reset():
    class Gain(nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(3))

    net = nn.Sequential(nn.Linear(2, 3))
    net.add_module("gain_layer", Gain())
    with pytest.raises(PruningError, match="module.s. gain_layer own parameters but have no "
                                           "reset_parameters"):
        pruning.reinitialize(net, 0)


def test_even_quotas_by_hand():
    # 15 kept of 4000 / 10000 / 1000 (99.9 % sparse): 5 each
    assert even_quotas([4000, 10000, 1000], 0.999) == [5, 5, 5]
    # 16 kept: the extra goes to the first layer
    assert even_quotas([10, 10, 10], 1 - 16 / 30) == [6, 5, 5]
    # a small layer fills up and the rest is shared by the others: 20 kept of 3 / 100 / 100
    assert even_quotas([3, 100, 100], 1 - 20 / 203) == [3, 9, 8]
    # non-decreasing in the kept count, total exact
    sizes = [7, 50, 3, 20]
    last = [0] * 4
    for k in range(sum(sizes) + 1):
        q = even_quotas(sizes, 1 - k / sum(sizes)) if k < sum(sizes) else sizes
        assert sum(q) == k and all(a >= b for a, b in zip(q, last))
        assert all(0 <= a <= n for a, n in zip(q, sizes))
        last = q


@pytest.mark.parametrize("sparsity", LEVELS)
def test_random_variants(mlp, sparsity):
    sizes = [p.numel() for p in prunable_parameters(mlp).values()]
    n = sum(sizes)
    masks = {scope: pruning.prune(mlp, "random", sparsity, scope=scope, seed=0)
             for scope in ("global", "layer", "even")}
    for scope, mask in masks.items():
        assert mask.kept() == round(n * (1 - sparsity)), scope
    assert [masks["even"].kept(k) for k in masks["even"]] == even_quotas(sizes, sparsity)
    for k, size in zip(masks["layer"], sizes):
        assert abs(masks["layer"].kept(k) - size * (1 - sparsity)) < 1
    # global: one uniform draw, so per-layer densities scatter around the global one
    densities = [masks["global"].density(k) for k in masks["global"]]
    assert len(set(densities)) > 1 and max(densities) < 3 * (1 - sparsity) + 0.01
