"""theory.callbacks.common without a framework: the error naming the missing extra, the
monitor's options refused by name, the metric names, the lr scaled with a schedule's base rates,
the batch sampler found through a wrapper."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.theory.callbacks.replay import data, net
from theory import NoiseScaleMonitor
from theory.callbacks.common import batch_sampler, check_options, metrics, require, scale_lr
from theory.errors import TheoryError


def test_a_missing_framework_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    with pytest.raises(TheoryError, match=r"needs the lightning package: pip install "
                                          r"'sparsescale\[lightning\]'"):
        require(("lightning.pytorch", "pytorch_lightning"), "lightning", "x")


def test_monitor_options_are_the_monitors():
    assert check_options({"window": 3, "per_layer": True}) == {"window": 3, "per_layer": True}
    with pytest.raises(TheoryError, match="'norm_layer' \\(did you mean 'norm_layers'\\?\\)"):
        check_options({"norm_layer": True})
    with pytest.raises(TheoryError, match="unknown monitor option 'optimizer'"):
        check_options({"optimizer": None})         # the callbacks' own: preconditioned=True


def test_metrics_are_the_tensorboard_tags_with_undefined_values_kept():
    model = net()
    x, y = data(16)
    opt = torch.optim.Adam(model.parameters())
    with NoiseScaleMonitor(model, norm_layers=True, optimizer=opt) as monitor:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        reading = monitor.step()
    out = metrics(reading, "noise/")
    assert out["noise/b_simple"] == reading.b_simple
    assert out["noise/g_sq[<norm layers>]"] == reading.parts[0].g_sq
    # before Adam's first step the preconditioned part is not defined: logged as nan
    assert math.isnan(out["noise/b_simple[<preconditioned>]"])
    assert len(out) == 9 + 2 * 6


def test_the_lr_is_scaled_with_the_schedules_base_rates():
    params = [torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": params, "lr": 0.1}, {"params": [], "lr": 0.4}])
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1 + t))
    opt.step()
    schedule.step()                                    # lr = base / 2
    scale_lr(opt, [schedule], 0.5)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.025, 0.1])
    opt.step()
    schedule.step()                                    # lr = base / 3, the base halved
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05 / 3, 0.2 / 3])


def test_the_batch_sampler_is_found_through_wrappers():
    x, y = data(16)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)

    class Wrapper:
        def __init__(self, inner):
            self.batch_sampler = inner

    assert batch_sampler(loader) is loader.batch_sampler
    wrapped = DataLoader(TensorDataset(x, y), batch_sampler=Wrapper(loader.batch_sampler))
    assert batch_sampler(wrapped) is loader.batch_sampler
    assert batch_sampler(DataLoader(TensorDataset(x, y), batch_size=None)) is None
    assert batch_sampler(object()) is None
