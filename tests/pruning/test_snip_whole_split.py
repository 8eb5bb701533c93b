"""SNIP as Lee et al. (2021) ran it: on the whole training split in chunks of 100, biases scored and
pruned, global top-k with exact kept counts, against an independent float64 computation
(``tests/lee_snip.py``)."""

import warnings

import pytest
import torch

import pruning
import training
from pruning import PruningError
from pruning.criteria import SNIP_CHUNK

from ..lee_snip import lee_snip_mask


@pytest.fixture(scope="module")
def data():
    """480 training examples: four chunks of 100 and a last one of 80."""
    return training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)


def lee_mlp(data, seed=0):
    return training.models.build("mlp", data, hidden=[16, 16], seed=seed, init="lee")


@pytest.mark.parametrize("sparsity", [0.5, 0.9])
def test_whole_split_snip_with_biases_equals_lees_saliency_in_float64(data, sparsity):
    assert data.n_train == 480 and SNIP_CHUNK == 100
    net = lee_mlp(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pruning.LayerCollapseWarning)
        mask = pruning.prune(net, "snip", sparsity, dataset=data, examples="all",
                             prune_biases=True)
    want = lee_snip_mask(net, data.x_train, data.y_train, sparsity)
    assert set(mask) == set(want)
    for k in want:
        assert torch.equal(mask[k].double(), want[k]), k
    n = sum(p.numel() for p in net.parameters())   # every parameter is a weight or a bias
    assert mask.total() == n and mask.kept() == round(n * (1 - sparsity))
    # with Lee's initialization every bias scores 0: all are pruned (the network is bias-free)
    assert all(mask.kept(k) == 0 for k in mask if k.endswith("bias"))
    assert mask.info["examples"] == "all" and mask.info["chunk"] == 100


def test_the_whole_split_is_not_the_default_batch(data):
    net = lee_mlp(data)
    default = pruning.prune(net, "snip", 0.5, dataset=data)
    whole = pruning.prune(net, "snip", 0.5, dataset=data, examples="all")
    assert default.info["per_class"] == 10 and "examples" not in default.info
    assert any(not torch.equal(default[k], whole[k]) for k in default)
    assert set(default) == {k for k, _ in net.named_parameters() if k.endswith("weight")}


def test_ties_go_to_weights_before_biases(data):
    """Lee's vector holds all weights, then all biases; tf.nn.top_k keeps the lower index of
    equal scores. With half the first layer's weights at zero (score 0, as every bias) and a
    kept count reaching 7 entries into the zero scores, the 7 kept are the first zero weights."""
    net = lee_mlp(data)
    with torch.no_grad():
        net[1].weight.view(-1)[::2] = 0.0
    scores = pruning.criteria.snip_scores(
        net, dict(net.named_parameters()), data.x_train, data.y_train, chunk=100)
    positive = sum(int((v > 0).sum()) for v in scores.values())
    n = sum(v.numel() for v in scores.values())
    sparsity = 1 - (positive + 7) / n
    mask = pruning.prune(net, "snip", sparsity, dataset=data, examples="all", prune_biases=True)
    assert mask.kept() == positive + 7
    assert all(mask.kept(k) == 0 for k in mask if k.endswith("bias"))
    zero = (scores["1.weight"].view(-1) == 0).nonzero().flatten()   # the first zero scores
    assert mask["1.weight"].view(-1)[zero[:7]].sum() == 7
    assert mask["1.weight"].view(-1)[zero[7:]].sum() == 0


@pytest.mark.parametrize("method, options", [
    ("snip", {}), ("snip", {"examples": "all", "prune_biases": True}), ("random", {"seed": 3}),
    ("magnitude", {"scope": "layer"}), ("grasp", {}), ("snip", {"keep": "lowest"}),
])
def test_prune_levels_gives_prunes_masks_from_one_scoring(data, method, options):
    net = lee_mlp(data)
    levels = [0.5, 0.7, 0.9]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pruning.LayerCollapseWarning)
        together = pruning.prune_levels(net, method, levels, dataset=data, **options)
        alone = [pruning.prune(net, method, s, dataset=data, **options) for s in levels]
    for a, b in zip(together, alone):
        assert a == b and a.info == b.info


@pytest.mark.parametrize("kwargs, message", [
    ({"examples": "al"}, r"examples must be 'all' .* got 'al'"),
    ({"examples": "all", "method": "grasp"}, r"examples='all' applies to snip, iterative_snip, "
                                             r"force; criterion 'grasp'"),
    ({"examples": "all", "method": "magnitude"}, "criterion 'magnitude' scores no data"),
    ({"examples": "all", "per_class": 5}, "per_class and examples='all' exclude each other"),
    ({"colour": 1}, "unknown pruning option 'colour'"),
])
def test_bad_options_are_one_line_naming_what_is_allowed(data, kwargs, message):
    method = kwargs.pop("method", "snip")
    net = lee_mlp(data)
    with pytest.raises(PruningError, match=message):
        if "colour" in kwargs:
            pruning.prune_levels(net, method, [0.5], dataset=data, **kwargs)
        else:
            pruning.prune(net, method, 0.5, dataset=data, **kwargs)
