"""The per-trial convolutional program against vmap-of-autograd (float64), for every chunking."""

import pytest
import torch
from torch import nn

import training
from training.engine.programs.func import FuncProgram
from training.engine.programs.per_trial import PerTrialProgram
from training.models.features import has_conv2d

MODELS = [("resnet8", {"widths": [4, 4, 8]}), ("simple_cnn", {"width": "narrow"})]


@pytest.mark.parametrize("name, options", MODELS)
@pytest.mark.parametrize("chunk", [1, 3, 6])
def test_loss_and_grads_match_vmap_autograd(tiny_images, stacked, name, options, chunk):
    ds = tiny_images
    model = training.models.build(name, ds, **options).double()
    params = stacked(model, 2)
    x, y = ds.x_train[:12].double().view(2, 6, 1, 8, 8), ds.y_train[:12].view(2, 6)
    loss_p, grads_p = PerTrialProgram(model, ds.task, chunk).loss_and_grads(params, x, y)
    loss_f, grads_f = FuncProgram(model, ds.task).loss_and_grads(params, x, y)
    torch.testing.assert_close(loss_p, loss_f, rtol=1e-12, atol=0)
    for gp, gf in zip(grads_p, grads_f):
        torch.testing.assert_close(gp, gf, rtol=1e-12, atol=1e-15)
    # the stacked parameters are read, never written
    for p, q in zip(params, stacked(model, 2)):
        assert torch.equal(p, q)


@pytest.mark.parametrize("name, options", MODELS)
def test_forward_matches_vmap_for_shared_and_per_trial_inputs(tiny_images, stacked, name,
                                                               options):
    ds = tiny_images
    model = training.models.build(name, ds, **options).double()
    params = stacked(model, 2)
    program, func = PerTrialProgram(model, ds.task, 4), FuncProgram(model, ds.task)
    shared = ds.x_val[:5].double()
    for x in (shared.unsqueeze(0).expand(2, *shared.shape),
              ds.x_train[:10].double().view(2, 5, 1, 8, 8)):
        torch.testing.assert_close(program.forward(params, x), func.forward(params, x),
                                   rtol=1e-12, atol=1e-14)


def test_batch_statistics_and_random_draws_take_the_whole_batch():
    """A module with BatchNorm or Dropout runs per_trial, one chunk a mini-batch (its batch
    statistics and its random draws are those of the whole batch, as in the plain loop); a
    batch-norm-free convolutional model is chunked."""
    from training.engine.strategy import ruled_strategy

    with_bn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(),
                            nn.Linear(72, 3))
    with_dropout = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.2), nn.Linear(8, 3))
    assert has_conv2d(with_bn)
    assert not has_conv2d(nn.Sequential(nn.Linear(3, 3)))
    for net, shape in ((with_bn, (1, 8, 8)), (with_dropout, (8,))):
        plan = ruled_strategy(net, "classification", shape, 512, 4)
        assert plan.name == "per_trial" and plan.examples_per_chunk == 512
    plain = nn.Sequential(nn.Conv2d(1, 64, 3), nn.Flatten(), nn.Linear(64 * 26 * 26, 3))
    assert ruled_strategy(plain, "classification", (1, 28, 28), 4096, 4).examples_per_chunk < 4096
