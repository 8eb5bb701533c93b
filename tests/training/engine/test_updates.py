"""training.engine.updates: the update of a whole stack equals that of its trials one at a time (the
per-trial program's way), for every optimizer, with shared and per-trial masks; the SGD rules
against torch.optim.SGD on one trial."""

from dataclasses import replace

import pytest
import torch

from training import Trial
from training.engine.adam import AdamState
from training.engine.updates import StackUpdate

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


def buffers(update):
    """The optimizer state of ``update``: momentum buffers or Adam's two moments."""
    if update.adam is not None:
        return update.adam.exp_avg + update.adam.exp_avg_sq
    return update.bufs or []


@pytest.mark.parametrize("dtype, tol", [(F64, 1e-15), (torch.float32, 1e-6)])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_the_kernels_one_pass_update_equals_the_stack_update(optimizer, dtype, tol,
                                                            compiled_kernel):
    """StackUpdate.apply_trial_ (compiled, one trial at a time) against apply_ (torch, whole
    stack), three steps in a row, with per-trial and shared masks."""
    kernel = compiled_kernel

    def cast(params, grads, update):
        to = [t.to(dtype) for t in params], [t.to(dtype) for t in grads]
        adam = update.adam
        if adam is not None:
            adam = AdamState([m.to(dtype) for m in adam.exp_avg],
                             [v.to(dtype) for v in adam.exp_avg_sq], adam.beta1, adam.beta2,
                             adam.eps, adam.weight_decay, adam.decoupled)
        return *to, StackUpdate(optimizer, update.step, update.lr, update.mu.to(dtype),
                                [m.to(dtype) for m in update.masks],
                                None if update.bufs is None else [b.to(dtype) for b in update.bufs],
                                adam)

    params, grads, update = cast(*state(optimizer))
    one_params, one_grads, one_update = cast(*state(optimizer))
    for step in range(3):
        update = replace(update, step=step)
        one_update = replace(one_update, step=step)
        update.apply_(params, [g.clone() for g in grads])
        for i in range(N):
            one_update.apply_trial_(kernel, i, one_params, [g[i].clone() for g in one_grads])
    for a, b in zip(params + buffers(update), one_params + buffers(one_update)):
        torch.testing.assert_close(b, a, rtol=tol, atol=tol * float(a.abs().max()))
    assert torch.all(one_params[0][one_update.masks[0] == 0] == 0)
    assert not torch.equal(one_params[0], state(optimizer)[0][0].to(dtype))


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
