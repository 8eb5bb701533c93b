"""Hand-written stacked forward/backward against autograd through torch.func (float64)."""

import pytest
import torch

import training
from training.engine.strategy import ruled_strategy
from training.engine.programs.batched import BatchedProgram
from training.engine.programs.func import FuncProgram


@pytest.fixture(scope="module")
def data():
    return training.data.load("mnist1d", num_samples=1000)


@pytest.mark.parametrize("name, options", [("mlp", {}), ("cnn1d", {"channels": 4}),
                                           ("linear", {})])
def test_sequential_program_matches_autograd(data, stacked, name, options):
    model = training.models.build(name, data, seed=0, **options).double()
    fast = BatchedProgram.try_build(model, data.task)
    assert isinstance(fast, BatchedProgram)
    slow = FuncProgram(model, data.task)
    params = stacked(model, 3)
    x = data.x_train[:15].double().view(3, 5, -1)
    y = data.y_train[:15].view(3, 5)
    loss_f, grads_f = fast.loss_and_grads(params, x, y)
    loss_s, grads_s = slow.loss_and_grads(params, x, y)
    torch.testing.assert_close(loss_f, loss_s, rtol=1e-12, atol=0)
    for gf, gs in zip(grads_f, grads_s):
        torch.testing.assert_close(gf, gs, rtol=1e-10, atol=1e-14)
    shared = data.x_val[:7].double()
    out_f = fast.forward(params, shared.unsqueeze(0).expand(3, *shared.shape))
    out_s = torch.stack([torch.func.functional_call(
        model, dict(zip([k for k, _ in model.named_parameters()], [p[i] for p in params])),
        (shared,)) for i in range(3)])
    torch.testing.assert_close(out_f, out_s, rtol=1e-12, atol=1e-14)


def test_regression_loss_gradient(stacked):
    ds = training.data.load("linreg", n=100, dim=4)
    model = training.models.build("mlp", ds, hidden=[6], seed=1).double()
    params = stacked(model, 2)
    x, y = ds.x_train[:8].double().view(2, 4, 4), ds.y_train[:8].double().view(2, 4)
    loss_f, grads_f = BatchedProgram.try_build(model, ds.task).loss_and_grads(params, x, y)
    loss_s, grads_s = FuncProgram(model, ds.task).loss_and_grads(params, x, y)
    torch.testing.assert_close(loss_f, loss_s, rtol=1e-12, atol=0)
    for gf, gs in zip(grads_f, grads_s):
        torch.testing.assert_close(gf, gs, rtol=1e-10, atol=1e-14)


def test_unsupported_layers_fall_back_to_torch_func(data):
    model = torch.nn.Sequential(torch.nn.Linear(40, 8), torch.nn.Tanh(), torch.nn.Linear(8, 10))
    dilated = torch.nn.Sequential(torch.nn.Unflatten(1, (1, 40)),
                                  torch.nn.Conv1d(1, 2, 3, dilation=2), torch.nn.Flatten(),
                                  torch.nn.Linear(72, 10))
    for net in (model, dilated):
        assert BatchedProgram.try_build(net, data.task) is None
        plan = ruled_strategy(net, data.task, data.input_shape, 8, 2)
        assert plan.name == "func" and isinstance(plan.program, FuncProgram)
