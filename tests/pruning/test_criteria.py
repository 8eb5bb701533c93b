"""Each criterion against an independent computation of its formula."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import pruning
import training
from pruning import PruningError, criteria, prunable_parameters
from pruning.select import top_k_mask

# collapse at 99 % is expected here; tests/pruning/test_diagnostics.py tests the warning
pytestmark = pytest.mark.filterwarnings("ignore::pruning.LayerCollapseWarning")


def first_per_class(ds, per_class):
    """Independent construction of the documented batch: first examples of each class."""
    idx = []
    for c in range(ds.num_classes):
        idx += [i for i in range(ds.n_train) if int(ds.y_train[i]) == c][:per_class]
    return ds.x_train[idx], ds.y_train[idx]


def flat_loss(model, names, x, y, temperature=1.0):
    """Loss as a function of the prunable weights concatenated into one vector."""
    params = dict(model.named_parameters())
    shapes = [params[k].shape for k in names]
    sizes = [params[k].numel() for k in names]

    def f(theta):
        parts = dict(zip(names, (t.reshape(s) for t, s in zip(theta.split(sizes), shapes))))
        out = functional_call(model, {**params, **parts}, (x,))
        return F.cross_entropy(out / temperature, y)

    theta0 = torch.cat([params[k].detach().reshape(-1) for k in names])
    return f, theta0, sizes, shapes


def unflatten(vec, names, sizes, shapes):
    return {k: v.reshape(s) for k, v, s in zip(names, vec.split(sizes), shapes)}


def test_pruning_batch_is_class_balanced(teacher):
    x, y = criteria.pruning_batch(teacher, 10)
    ex, ey = first_per_class(teacher, 10)
    assert torch.equal(x, ex) and torch.equal(y, ey)
    assert torch.bincount(y).tolist() == [10] * teacher.num_classes


def test_snip_equals_abs_grad_times_weight(teacher, small_mlp):
    x, y = first_per_class(teacher, 10)
    names = list(prunable_parameters(small_mlp))
    f, theta, sizes, shapes = flat_loss(small_mlp, names, x, y)
    g = torch.func.grad(f)(theta)
    expected = unflatten((g * theta).abs(), names, sizes, shapes)

    got = criteria.snip_scores(small_mlp, prunable_parameters(small_mlp), x, y)
    for k in names:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-5, atol=1e-8)
    assert all(p.grad is None for p in small_mlp.parameters())  # model untouched

    mask = pruning.prune(small_mlp, "snip", 0.8, dataset=teacher)
    assert mask == top_k_mask(expected, 0.8)


def test_grasp_equals_minus_w_hessian_gradient(teacher):
    import training

    model = training.models.build("mlp", teacher, hidden=(6,), seed=3).double()
    x, y = first_per_class(teacher, 25)
    x = x.double()
    names = list(prunable_parameters(model))
    f, theta, sizes, shapes = flat_loss(model, names, x, y, temperature=200.0)
    hessian = torch.autograd.functional.hessian(f, theta)  # dense, 162 x 162
    g = torch.func.grad(f)(theta)
    expected = unflatten(-theta * (hessian @ g), names, sizes, shapes)

    got = criteria.grasp_scores(model, prunable_parameters(model), x, y, temperature=200.0)
    for k in names:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-6, atol=1e-18)
    assert max(v.abs().max() for v in expected.values()) > 0

    # GraSP removes the largest scores: the kept ones are the smallest
    mask = pruning.prune(model, "grasp", 0.7, dataset=teacher)
    assert mask == top_k_mask({k: -v for k, v in expected.items()}, 0.7)


def test_synflow_one_round_closed_form_two_layer_linear():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(7, 5), nn.Linear(5, 3)).double()
    w1, b1 = net[0].weight.detach().abs(), net[0].bias.detach().abs()
    w2 = net[1].weight.detach().abs()
    # R = 1' |W2| (|W1| 1 + |b1|) + 1' |b2|
    expected = {"0.weight": w1 * w2.sum(0)[:, None],
                "1.weight": w2 * (w1.sum(1) + b1)[None, :]}
    work = criteria.linearized_copy(net)
    got = criteria.synflow_scores(work, prunable_parameters(work), (7,))
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-12, atol=0)

    mask = pruning.prune(net, "synflow", 0.6, rounds=1, input_shape=(7,))
    assert mask == top_k_mask(expected, 0.6)
    # ReLUs change nothing: with |w| and an all-ones input every pre-activation is >= 0
    relu_net = nn.Sequential(net[0], nn.ReLU(), net[1])
    relu_mask = pruning.prune(relu_net, "synflow", 0.6, rounds=1, input_shape=(7,))
    assert torch.equal(relu_mask["0.weight"], mask["0.weight"])
    assert torch.equal(relu_mask["2.weight"], mask["1.weight"])


def test_synflow_rounds_rescore_the_pruned_network():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 2)).double()
    # independent two-round schedule: density 0.25 -> 0.5 then 0.25
    w1, b1 = net[0].weight.detach().abs(), net[0].bias.detach().abs()
    w2 = net[1].weight.detach().abs()
    m = top_k_mask({"0.weight": w1 * w2.sum(0)[:, None],
                    "1.weight": w2 * (w1.sum(1) + b1)[None, :]}, 0.5)
    v1, v2 = w1 * m["0.weight"], w2 * m["1.weight"]
    s = {"0.weight": v1 * v2.sum(0)[:, None], "1.weight": v2 * (v1.sum(1) + b1)[None, :]}
    s = {k: torch.where(m[k] > 0, s[k], torch.tensor(float("-inf"), dtype=s[k].dtype)) for k in s}
    expected = top_k_mask(s, 0.75)
    assert pruning.prune(net, "synflow", 0.75, rounds=2, input_shape=(6,)) == expected


def test_magnitude_and_random(small_mlp):
    params = prunable_parameters(small_mlp)
    mask = pruning.prune(small_mlp, "magnitude", 0.5)
    assert mask == top_k_mask({k: p.detach().abs() for k, p in params.items()}, 0.5)
    layer = pruning.prune(small_mlp, "magnitude", 0.5, scope="layer")
    for k, p in params.items():
        assert abs(layer.kept(k) - p.numel() / 2) <= 1
        kept, dropped = p.detach().abs()[layer[k] > 0], p.detach().abs()[layer[k] == 0]
        assert kept.min() >= dropped.max()
    r0 = pruning.prune(small_mlp, "random", 0.5, seed=0)
    assert r0 == pruning.prune(small_mlp, "random", 0.5, seed=0)
    assert r0 != pruning.prune(small_mlp, "random", 0.5, seed=1)


def test_prune_leaves_the_model_unchanged(teacher, small_mlp):
    before = copy.deepcopy(small_mlp.state_dict())
    for method in ("snip", "grasp", "synflow"):
        pruning.prune(small_mlp, method, 0.9, dataset=teacher, rounds=3)
    for k, v in small_mlp.state_dict().items():
        assert torch.equal(v, before[k])
    assert all(p.grad is None for p in small_mlp.parameters())


def test_prune_biases_option(teacher, small_mlp):
    mask = pruning.prune(small_mlp, "snip", 0.5, dataset=teacher, prune_biases=True)
    assert list(mask) == [k for k, _ in small_mlp.named_parameters()]
    assert mask.kept() == round(sum(p.numel() for p in small_mlp.parameters()) * 0.5)


def test_bad_arguments(teacher, small_mlp):
    with pytest.raises(PruningError, match=r"unknown pruning criterion 'snp' \(did you mean 'snip'\?\); "
                                         "allowed: random, magnitude, snip, grasp, synflow, imp"):
        pruning.prune(small_mlp, "snp", 0.5, dataset=teacher)
    with pytest.raises(PruningError, match=r"sparsity must be a number in \[0, 1\)"):
        pruning.prune(small_mlp, "magnitude", 1.0)
    with pytest.raises(PruningError, match="'snip' needs dataset"):
        pruning.prune(small_mlp, "snip", 0.5)
    with pytest.raises(PruningError, match="'synflow' needs input_shape"):
        pruning.prune(small_mlp, "synflow", 0.5)
    with pytest.raises(PruningError, match="scope 'all'"):
        pruning.prune(small_mlp, "magnitude", 0.5, scope="all")
    with pytest.raises(training.DataError, match="prune: dataset must be a training.Dataset, "
                                                 "got Tensor; build one with"):
        pruning.prune(small_mlp, "snip", 0.5, dataset=teacher.x_train)
    with pytest.raises(PruningError, match="GraSP temperature"):
        pruning.prune(small_mlp, "grasp", 0.5, dataset=teacher, temperature=0)


def independent_round_scores(model, teacher, mask, revive):
    """One round of iterative SNIP (revive=False) or FORCE (revive=True) from torch.func.grad of
    the loss at the pruned weights theta0 * mask: |theta0 * g| for FORCE (every weight ranked),
    |theta0 * mask * g| with -inf on pruned weights for iterative SNIP."""
    x, y = first_per_class(teacher, 10)
    names = list(prunable_parameters(model))
    f, theta0, sizes, shapes = flat_loss(model, names, x, y)
    m = torch.cat([mask[k].reshape(-1) for k in names]) if mask else torch.ones_like(theta0)
    g = torch.func.grad(f)(theta0 * m)
    if revive:
        return unflatten((theta0 * g).abs(), names, sizes, shapes)
    s = torch.where(m > 0, (theta0 * m * g).abs().double(), torch.tensor(float("-inf")).double())
    return unflatten(s, names, sizes, shapes)


@pytest.mark.parametrize("method,revive", [("iterative_snip", False), ("force", True)])
def test_iterative_snip_and_force_two_rounds(teacher, small_mlp, method, revive):
    # schedule: density 0.1 -> 0.1^(1/2) after round 1, 0.1 after round 2
    first = top_k_mask(independent_round_scores(small_mlp, teacher, None, revive),
                       1 - 0.1 ** 0.5)
    second = top_k_mask(independent_round_scores(small_mlp, teacher, first, revive), 0.9)
    assert pruning.prune(small_mlp, method, 0.9, dataset=teacher, rounds=2) == second
    # one round of either is one-shot SNIP, exactly
    assert pruning.prune(small_mlp, method, 0.9, dataset=teacher, rounds=1) == \
        pruning.prune(small_mlp, "snip", 0.9, dataset=teacher)


@pytest.mark.parametrize("sparsity", [0.5, 0.9, 0.99])
def test_force_revives_and_iterative_snip_never_does(teacher, small_mlp, sparsity):
    first = pruning.prune(small_mlp, "snip", 1 - (1 - sparsity) ** 0.5, dataset=teacher)
    force = pruning.prune(small_mlp, "force", sparsity, dataset=teacher, rounds=2)
    snip_it = pruning.prune(small_mlp, "iterative_snip", sparsity, dataset=teacher, rounds=2)
    revived = sum(int(((force[k] > 0) & (first[k] == 0)).sum()) for k in first)
    assert revived > 0   # FORCE ranks pruned weights too (measured: 27 / 12 / 3 here)
    assert all(torch.all(snip_it[k] <= first[k]) for k in first)


def test_keep_lowest_inverts_the_criterion(teacher, small_mlp):
    x, y = first_per_class(teacher, 10)
    names = list(prunable_parameters(small_mlp))
    f, theta, sizes, shapes = flat_loss(small_mlp, names, x, y)
    snip = unflatten((torch.func.grad(f)(theta) * theta).abs(), names, sizes, shapes)
    n = theta.numel()
    for s in (0.5, 0.9, 0.99):
        inverted = pruning.prune(small_mlp, "snip", s, dataset=teacher, keep="lowest")
        assert inverted == top_k_mask({k: -v for k, v in snip.items()}, s)
        assert inverted.kept() == round(n * (1 - s)) and inverted.info["keep"] == "lowest"
        kept = torch.cat([snip[k][inverted[k] > 0] for k in names])
        dropped = torch.cat([snip[k][inverted[k] == 0] for k in names])
        assert kept.max() <= dropped.min()


def test_iterative_snip_on_the_mlp(mnist1d, mlp):
    for s in (0.5, 0.9, 0.99):
        one_shot = pruning.prune(mlp, "snip", s, dataset=mnist1d)
        assert pruning.prune(mlp, "iterative_snip", s, dataset=mnist1d, rounds=1) == one_shot
    iterated = pruning.prune(mlp, "iterative_snip", 0.99, dataset=mnist1d)   # 5 rounds
    assert iterated.info["rounds"] == 5 and iterated.kept() == one_shot.kept() == 150
    shared = sum(int(((iterated[k] > 0) & (one_shot[k] > 0)).sum()) for k in iterated)
    assert shared < 150   # a different kept set (measured: 31 of 150 shared)
