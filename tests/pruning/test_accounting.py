import pandas as pd
import pytest
import torch

import pruning
import training
from pruning import Mask, MaskError


@pytest.fixture(scope="module")
def mnist1d():
    return training.data.load("mnist1d", num_samples=1000)


def test_mlp_flops_closed_form(mnist1d):
    net = training.models.build("mlp", mnist1d)
    mask = pruning.prune(net, "snip", 0.9, dataset=mnist1d)
    table = pruning.report(net, mask)  # input shape taken from mask.info
    assert isinstance(table, pd.DataFrame)
    rows = table.set_index("parameter")
    assert list(rows.index) == ["1.weight", "3.weight", "5.weight", "total"]
    # Linear on flat inputs: one position per example, 2 FLOPs per weight
    assert rows["flops_dense"].tolist() == [2 * 4000, 2 * 10000, 2 * 1000, 2 * 15000]
    for name in mask:
        assert rows.loc[name, "kept"] == mask.kept(name)
        assert rows.loc[name, "total"] == mask.total(name)
        assert rows.loc[name, "flops_kept"] == 2 * mask.kept(name)
        assert rows.loc[name, "density"] == pytest.approx(mask.density(name))
    assert rows.loc["total", "kept"] == 1500 and rows.loc["total", "density"] == pytest.approx(0.1)


def test_conv_flops_closed_form(mnist1d):
    net = training.models.build("cnn1d", mnist1d)
    mask = pruning.prune(net, "random", 0.7, prune_biases=True)
    table = pruning.report(net, mask, example=mnist1d.x_train[:5]).set_index("parameter")
    # output lengths 19, 10, 5 for the three stride-2 convolutions of a length-40 input
    positions = {"1": 19, "3": 10, "5": 5, "8": 1}
    for name, m in mask.items():
        layer, kind = name.split(".")
        per_entry = positions[layer] * (2 if kind == "weight" else 1)
        assert table.loc[name, "flops_dense"] == per_entry * m.numel()
        assert table.loc[name, "flops_kept"] == per_entry * int(m.sum())
    assert table.loc["1.weight", "flops_dense"] == 2 * 19 * 25 * 5
    assert table.loc["total", "flops_kept"] == table["flops_kept"].iloc[:-1].sum()


def test_without_mask_or_input(mnist1d):
    net = training.models.build("mlp", mnist1d)
    table = pruning.report(net)
    assert "flops_dense" not in table.columns
    assert (table["kept"] == table["total"]).all()
    assert pruning.report(net, example=(40,))["flops_dense"].iloc[-1] == 30000


def test_mask_must_fit(mnist1d):
    net = training.models.build("mlp", mnist1d)
    with pytest.raises(MaskError, match="not a parameter"):
        pruning.report(net, Mask({"9.weight": torch.ones(2)}))
