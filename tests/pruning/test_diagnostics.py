"""Layer-collapse diagnostics against hand-built masks and an independent path computation."""

import warnings

import matplotlib.figure
import pytest
import torch
from torch import nn

import pruning
import training
from pruning import LayerCollapseWarning, Mask, diagnose, prunable_parameters


def random_mask(model, density, seed):
    g = torch.Generator().manual_seed(seed)
    return Mask({k: (torch.rand(p.shape, generator=g) < density).float()
                 for k, p in prunable_parameters(model).items()})


def paths_by_autograd(model, mask, input_shape):
    """Independent ground truth: with |w| on kept weights, zero biases and an all-ones input,
    every ReLU passes what it gets, so output unit j is positive iff some input reaches it; a
    kept weight lies on an input-output path iff d(sum of outputs)/dw != 0, and an input unit
    is used iff d(sum of outputs)/dx != 0 (float64)."""
    work = pruning.criteria.linearized_copy(model)
    with torch.no_grad():
        for name, p in work.named_parameters():
            p.mul_(mask[name]) if name in mask else p.zero_()   # only biases are unmasked
    x = torch.ones((1, *input_shape), dtype=torch.float64, requires_grad=True)
    out = work(x)
    weights = [p for k, p in work.named_parameters() if k in mask]
    grads = torch.autograd.grad(out.sum(), [x, *weights])
    on_path = [int(((g != 0) & (mask[k] > 0)).sum()) for k, g in zip(mask, grads[1:])]
    return int((out[0] > 0).sum()), int((grads[0] != 0).sum()), on_path


def test_dense_mask_is_healthy(small_mlp):
    d = diagnose(small_mlp, Mask.dense(small_mlp))
    assert d.chain and d.connected and d.outputs == 4 and d.outputs_reached == 4
    assert d.inputs == d.inputs_used == 20
    assert [layer.dead for layer in d.layers] == [0, 0, 0]
    assert [layer.on_path for layer in d.layers] == [320, 192, 48]
    assert d.problems() == [] and d.collapsed() == []


def test_dead_units_by_hand(small_mlp):
    # 20 -> 16 -> 12 -> 4: unit 2 of layer 1 loses its inputs, unit 5 of layer 1 its outputs,
    # output unit 1 every incoming weight
    mask = {k: m.clone() for k, m in Mask.dense(small_mlp).items()}
    mask["1.weight"][2, :] = 0
    mask["3.weight"][:, 5] = 0
    mask["5.weight"][1, :] = 0
    d = diagnose(small_mlp, mask)
    first, second, last = d.layers
    assert (first.no_incoming, first.no_outgoing, first.dead) == (1, 1, 2)
    assert (second.no_incoming, second.no_outgoing, second.dead) == (0, 0, 0)
    assert (last.no_incoming, last.no_outgoing, last.dead) == (1, 0, 1)
    assert d.outputs_reached == 3 and d.connected is False
    assert first.on_path == 320 - 20 - 20   # row 2 is pruned, row 5 kept but off every path
    with pytest.warns(LayerCollapseWarning, match="1 of 4 output units have no path"):
        pruning.diagnostics.check(small_mlp, mask)


@pytest.mark.parametrize("density", [0.5, 0.2, 0.08, 0.03])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paths_match_autograd_on_random_masks(small_mlp, density, seed):
    mask = random_mask(small_mlp, density, seed)
    d = diagnose(small_mlp, mask)
    reached, used, on_path = paths_by_autograd(small_mlp, mask, (20,))
    assert (d.outputs_reached, d.inputs_used) == (reached, used)
    assert [layer.on_path for layer in d.layers] == on_path


@pytest.mark.parametrize("density", [0.3, 0.1, 0.04])
def test_paths_bound_autograd_on_the_cnn(mnist1d, density):
    # channel-level reach ignores positions (a kept kernel tap may only ever see padding), so
    # on a CNN it is an upper bound: what it calls cut off is cut off
    cnn = training.models.build("cnn1d", mnist1d, channels=4)
    exact = 0
    for seed in range(6):
        mask = random_mask(cnn, density, seed)
        d = diagnose(cnn, mask)
        assert d.chain
        reached, _, on_path = paths_by_autograd(cnn, mask, (40,))
        assert d.outputs_reached >= reached
        assert all(a >= b for a, b in zip([layer.on_path for layer in d.layers], on_path))
        exact += [layer.on_path for layer in d.layers] == on_path
    assert exact >= 3   # usually tight


def test_conv_pool_flatten_chain():
    net = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(3 * 4 * 4, 5))
    mask = {k: m.clone() for k, m in Mask.dense(net).items()}
    mask["0.weight"][1] = 0   # channel 1 gets no input ...
    mask["4.weight"][:, 0:16] = 0   # ... and channel 0 feeds nothing (its 16 flattened features)
    d = diagnose(net, mask)
    assert d.chain and d.connected
    assert (d.layers[0].no_incoming, d.layers[0].no_outgoing, d.layers[0].dead) == (1, 1, 2)
    assert d.layers[1].on_path == 5 * 16   # only channel 2's features carry a path


def test_residual_network_gets_local_counts_only():
    from training.models import ResNet8

    net = ResNet8(3, 10, (4, 8, 8))
    d = diagnose(net, Mask.dense(net))
    assert not d.chain and d.connected is None and d.outputs_reached is None
    assert all(layer.no_incoming == 0 and layer.no_outgoing is None for layer in d.layers)
    empty_shortcut = {k: (torch.zeros_like(m) if "shortcut" in k else m)
                      for k, m in Mask.dense(net).items()}
    with pytest.warns(LayerCollapseWarning, match="stages.1.shortcut.weight' is 100 % pruned"):
        pruning.diagnostics.check(net, empty_shortcut)


def test_prune_warns_on_collapse_only(mnist1d, mlp):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pruning.prune(mlp, "snip", 0.9, dataset=mnist1d)    # healthy: no warning
    with pytest.warns(LayerCollapseWarning, match=r"mask by 'magnitude': layer '3.weight' is "
                                                  r"100 % pruned \(kept 0 of 10000\)") as caught:
        pruning.prune(mlp, "magnitude", 0.99)
    assert caught[0].filename == __file__   # attributed to the caller of prune
    assert issubclass(LayerCollapseWarning, training.SparsescaleWarning)
    assert not issubclass(LayerCollapseWarning, training.SparsescaleError)


def test_pruned_biases_are_not_collapse(small_mlp):
    mask = {k: torch.zeros_like(p) if k.endswith("bias") else torch.ones_like(p)
            for k, p in small_mlp.named_parameters()}
    d = diagnose(small_mlp, mask)
    assert [layer.units for layer in d.layers] == [16, None, 12, None, 4, None]
    assert d.collapsed() == [] and d.problems() == [] and d.connected


def test_table_and_dict(small_mlp):
    mask = random_mask(small_mlp, 0.2, 0)
    d = diagnose(small_mlp, mask)
    table = d.table()
    assert list(table["name"]) == ["1.weight", "3.weight", "5.weight"]
    assert list(table["kept"]) == [mask.kept(k) for k in mask]
    assert d.to_dict()["layers"][0]["total"] == 320 and d.to_dict()["connected"] == d.connected


def test_density_figure(small_mlp):
    masks = {"snip": random_mask(small_mlp, 0.2, 0),
             "empty layer": Mask({k: (m * 0 if k == "3.weight" else m)
                                  for k, m in random_mask(small_mlp, 0.5, 1).items()})}
    fig = pruning.density_figure(masks)
    assert isinstance(fig, matplotlib.figure.Figure)
    ax = fig.axes[0]
    assert len(ax.containers) == 2 and ax.get_yscale() == "log"
    heights = [b.get_height() for b in ax.containers[0]]
    assert heights == pytest.approx([masks["snip"].density(k) for k in masks["snip"]])
    assert [t.get_text() for t in ax.texts] == ["0"]   # the emptied layer is marked
    with pytest.raises(pruning.PruningError, match="columns series, layer, density"):
        pruning.density_figure(__import__("pandas").DataFrame({"series": []}))


def test_pruning_in_another_thread_waits_for_a_trace(teacher, small_mlp):
    """torch.fx replaces nn.Module.__call__ process-wide while it traces; a pruning in another
    thread (its forward passes) waits for the trace to end instead of being caught in it
    ("module is not installed as a submodule")."""
    import threading

    from pruning.diagnostics import _chain

    entered, release = threading.Event(), threading.Event()

    class Paused(torch.nn.Module):
        def forward(self, x):
            entered.set()          # inside the trace, nn.Module.__call__ patched
            release.wait(30)
            return x

    tracer = threading.Thread(target=_chain, args=(Paused(),))
    tracer.start()
    assert entered.wait(30)
    done: list = []
    pruner = threading.Thread(
        target=lambda: done.append(pruning.prune(small_mlp, "snip", 0.5, dataset=teacher)))
    pruner.start()
    pruner.join(1.0)
    still_waiting = pruner.is_alive()
    release.set()
    tracer.join(30)
    pruner.join(60)
    assert still_waiting and len(done) == 1 and done[0].sparsity() == pytest.approx(0.5)
