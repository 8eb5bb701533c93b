"""training.masks: the one check and enforcement of masks, against hand-computed expectations."""

import pytest
import torch
from torch import nn

import training
from training import MaskError, RunConfig, Trial
from training.masks import apply_mask, check_entry, check_mask, mask_


def toy():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 2))


@pytest.mark.parametrize("mask, trials, match", [
    ([1, 0], None, "a mask must be a mapping name -> 0/1 tensor, got list"),
    ({"nope": torch.ones(2)}, None, "mask entry 'nope' is not a parameter of the model; "
                                    "parameters: 0.weight, 0.bias, 2.weight, 2.bias"),
    ({"0.weight": torch.ones(3, 2)}, None, r"'0.weight' has shape \(3, 2\); allowed: \(2, 3\)$"),
    ({"0.weight": torch.ones(4, 2, 3)}, 3,
     r"allowed: \(2, 3\) \(shared\) or \(3, 2, 3\) \(one per trial\)"),
    ({"0.bias": torch.tensor([0.0, 0.5])}, None, "'0.bias' has values other than 0 and 1"),
    ({"0.bias": torch.tensor([0.0, float("nan")])}, None, "'0.bias' has non-finite values"),
    ({"0.bias": torch.tensor([1j, 0j])}, None, "'0.bias' is complex"),
    ({"0.bias": torch.ones(0)}, None, "'0.bias' is empty"),
    ({"0.bias": "ab"}, None, "'0.bias' is not a 0/1 tensor"),
])
def test_check_mask_names_the_entry_and_what_is_allowed(mask, trials, match):
    with pytest.raises(MaskError, match=match) as info:
        check_mask(mask, toy(), trials=trials)
    assert "\n" not in str(info.value)


def test_check_mask_accepts_shared_and_per_trial_entries_unchanged():
    net = toy()
    shared = torch.tensor([[1, 0, 1], [0, 1, 1]], dtype=torch.float64)
    per_trial = torch.ones(3, 2, dtype=torch.bool)
    out = check_mask({"0.weight": shared, "2.bias": per_trial}, dict(net.named_parameters()),
                     trials=3)
    # checked, not converted or copied
    for name, given in (("0.weight", shared), ("2.bias", per_trial)):
        assert out[name].dtype == given.dtype and out[name].data_ptr() == given.data_ptr()
    assert check_mask(None, net) == {}
    assert check_entry("b", [True, False]).dtype == torch.bool


def test_apply_mask_zeroes_exactly_the_masked_weights_and_returns_the_mask_in_place():
    net = toy().double()
    before = {k: v.detach().clone() for k, v in net.named_parameters()}
    m = torch.tensor([[1, 0, 1], [0, 1, 1]])
    out = apply_mask(net, {"0.weight": m})
    assert out["0.weight"].dtype == torch.float64
    expected = before["0.weight"] * m
    assert torch.equal(net[0].weight, expected) and torch.equal(net[2].weight, before["2.weight"])
    assert net[0].weight.requires_grad and net[0].weight.grad_fn is None
    # a mapping of parameters works the same, and applying twice changes nothing
    apply_mask(dict(net.named_parameters()), {"0.weight": m})
    assert torch.equal(net[0].weight, expected)


def test_a_refused_mask_changes_no_weight():
    net = toy()
    before = {k: v.detach().clone() for k, v in net.named_parameters()}
    with pytest.raises(MaskError, match="'2.weight' has values other than 0 and 1"):
        apply_mask(net, {"0.weight": torch.zeros(2, 3), "2.weight": torch.full((2, 2), 2.0)})
    assert all(torch.equal(p, before[k]) for k, p in net.named_parameters())
    with pytest.raises(MaskError, match="applies to a torch.nn.Module or a mapping"):
        apply_mask(42, {"0.weight": torch.zeros(2, 3)})


def test_mask_multiplies_in_place_skipping_dense_and_broadcasting_shared():
    stacked = torch.arange(12.0).reshape(2, 2, 3)           # two trials of a [2, 3] weight
    shared = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    dense = torch.arange(4.0)
    mask_([stacked, dense], [shared, None])
    assert torch.equal(stacked, torch.arange(12.0).reshape(2, 2, 3) * shared)
    assert torch.equal(dense, torch.arange(4.0))
    with pytest.raises(ValueError):
        mask_([dense], [])


def test_the_same_bad_mask_raises_the_same_mask_error_everywhere():
    """Trainers, pruning and theory all check masks with training.masks.check_mask."""
    import pruning
    import theory

    ds = training.data.load("teacher", n=100, dim=3, num_classes=2)
    net = training.models.build("mlp", ds, hidden=[4])
    bad = {"1.weight": torch.full((4, 3), 0.5)}
    message = "mask entry '1.weight' has values other than 0 and 1"
    run = RunConfig(8, max_steps=1)
    calls = [
        lambda: training.train_reference(net, ds, Trial(lr=0.1), run, mask=bad),
        lambda: training.train_trials(net, ds, [Trial(lr=0.1)], run, masks=bad),
        lambda: pruning.Mask(bad),
        lambda: pruning.report(net, bad),
        lambda: theory.estimators.functional.flat_loss(net, ds, mask=bad),
        lambda: apply_mask(net, bad),
    ]
    for call in calls:
        with pytest.raises(MaskError) as info:
            call()
        assert str(info.value) == message
    assert pruning.MaskError is MaskError
