"""training.updates: the update of a whole stack equals that of its trials one at a time (the
per-trial program's way), for every optimizer, with shared and per-trial masks; the SGD rules
against torch.optim.SGD on one trial."""

import pytest
import torch

from training import Trial
from training.adam import AdamState
from training.updates import StackUpdate

F64 = torch.float64
OPTIMIZERS = ["sgd", "momentum", "nesterov", "adam", "adamw"]
N = 3


def state(optimizer, seed=0):
    """Stacked parameters, gradients, masks and optimizer state of N trials."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(N, 4, 5, generator=g, dtype=F64), torch.randn(N, 5, generator=g,
                                                                          dtype=F64)]
    grads = [torch.randn(p.shape, generator=g, dtype=F64) for p in params]
    masks = [(torch.rand(N, 4, 5, generator=g) > 0.4).double(),  # one per trial
             (torch.rand(5, generator=g) > 0.4).double()]        # shared
    for p, m in zip(params, masks):
        p.mul_(m)
    bufs = None if optimizer in ("sgd", "adam", "adamw") else [
        torch.randn(p.shape, generator=g, dtype=F64) * m for p, m in zip(params, masks)]
    trials = [Trial(lr=0.1, weight_decay=0.1), Trial(lr=0.2, beta1=0.5, weight_decay=0.0),
              Trial(lr=0.3, beta2=0.9, eps=1e-3, weight_decay=0.3)]
    adam = AdamState.zeros(params, trials, optimizer == "adamw") if optimizer in (
        "adam", "adamw") else None
    lr = torch.tensor([0.1, 0.2, 0.3], dtype=F64)
    mu = torch.tensor([0.9, 0.5, 0.0], dtype=F64)
    return params, grads, StackUpdate(optimizer, 4, lr, mu, masks, bufs, adam)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_rows_one_at_a_time_equal_the_whole_stack(optimizer):
    params, grads, update = state(optimizer)
    rows_params, rows_grads, rows_update = state(optimizer)
    for _ in range(3):  # several steps: the buffers and moments carry over
        update.apply_(params, [g.clone() for g in grads])
        for i in range(N):
            one = slice(i, i + 1)
            rows_update.rows(one, rows_params).apply_([p[one] for p in rows_params],
                                                      [g[one].clone() for g in rows_grads])
    for a, b in zip(params, rows_params):
        torch.testing.assert_close(a, b, rtol=1e-15, atol=0)
    buffers = {"adam": lambda u: u.adam.exp_avg + u.adam.exp_avg_sq,
               "adamw": lambda u: u.adam.exp_avg + u.adam.exp_avg_sq}.get(
        optimizer, lambda u: u.bufs or [])
    for a, b in zip(buffers(update), buffers(rows_update)):
        torch.testing.assert_close(a, b, rtol=1e-15, atol=0)
    # masked weights stayed exactly zero, kept ones moved
    assert torch.all(params[0][update.masks[0] == 0] == 0)
    assert torch.all(params[1][:, update.masks[1] == 0] == 0)
    assert not torch.equal(params[0], state(optimizer)[0][0])


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov"])
def test_sgd_rules_equal_torch_optim(optimizer):
    params, grads, update = state(optimizer)
    i = 1
    w = [torch.nn.Parameter(p[i].clone()) for p in params]
    opt = torch.optim.SGD(w, lr=0.2, momentum=0.0 if optimizer == "sgd" else 0.5,
                          nesterov=optimizer == "nesterov")
    if update.bufs is not None:
        for p, b in zip(w, update.bufs):
            opt.state[p]["momentum_buffer"] = b[i].clone()
    masks = [update.masks[0][i], update.masks[1]]
    for p, g, m in zip(w, grads, masks):
        p.grad = g[i] * m
    opt.step()
    update.apply_(params, [g.clone() for g in grads])
    for p, q in zip(w, params):
        torch.testing.assert_close(q[i], p.detach(), rtol=1e-15, atol=1e-16)
