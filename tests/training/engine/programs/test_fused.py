"""The fused kernel's losses, gradients and outputs against autograd through torch.func
(float64), for every chunking of the examples."""

import pytest
import torch
from torch import nn

import training
from training import Trial
from training.engine.adam import AdamState
from training.masks import mask_
from training.engine.programs.batched import BatchedProgram
from training.engine.programs.func import FuncProgram
from training.engine.programs.fused import CONV1D, LINEAR, RELU, TRANSPOSE, encode, try_build, working_set
from training.engine.updates import StackUpdate

F64 = torch.float64
# skipped without the kernel; failed instead under SPARSESCALE_REQUIRE_KERNEL=1 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compiled_kernel")


@pytest.fixture(scope="module")
def data():
    return training.data.load("mnist1d", num_samples=1000)


def fused(model, input_shape, chunk):
    program = try_build(model, input_shape, F64, "cpu", chunk, chunk + 1)
    assert program is not None
    return program


def assert_matches_autograd(stacked, model, task, input_shape, x, y, chunk):
    params = stacked(model, x.shape[0])
    loss_f, grads_f = fused(model, input_shape, chunk).loss_and_grads(params, x, y)
    loss_s, grads_s = FuncProgram(model, task).loss_and_grads(params, x, y)
    torch.testing.assert_close(loss_f, loss_s, rtol=1e-12, atol=0)
    for gf, gs in zip(grads_f, grads_s):
        torch.testing.assert_close(gf, gs, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name, options", [("mlp", {}), ("cnn1d", {"channels": 5}),
                                           ("linear", {})])
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_models_match_autograd_for_every_chunking(data, stacked, name, options, chunk):
    model = training.models.build(name, data, seed=0, **options).double()
    x = data.x_train[:21].double().view(3, 7, -1)
    y = data.y_train[:21].view(3, 7)
    assert_matches_autograd(stacked, model, data.task, data.input_shape, x, y, chunk)


def test_regression_loss_gradient(stacked):
    ds = training.data.load("linreg", n=100, dim=4)
    model = training.models.build("mlp", ds, hidden=[6], seed=1).double()
    x, y = ds.x_train[:10].double().view(2, 5, 4), ds.y_train[:10].double().view(2, 5)
    assert_matches_autograd(stacked, model, ds.task, ds.input_shape, x, y, 2)


def test_multichannel_conv_and_flatten_permutations(stacked):
    """Channel-major input unflattened to 2 channels, padding wider than a tap, stride 3, a
    conv after a conv, and a Linear on a flattened channels-last activation."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Unflatten(1, (2, 20)), nn.Conv1d(2, 3, 3, 1, 1), nn.ReLU(),
                          nn.Conv1d(3, 4, 4, 3, 2), nn.Flatten(), nn.Linear(28, 5)).double()
    enc = encode(model, (40,))
    kinds = enc[::10]
    assert kinds == [TRANSPOSE, CONV1D, RELU, CONV1D, LINEAR]
    assert enc[40:50] == [LINEAR, 28, 5, 4, 0, 0, 7, 0, 1, 4]  # weight read as [5, 7 x 4]
    x = torch.randn(3, 6, 40, dtype=F64)
    y = torch.randint(0, 5, (3, 6))
    assert_matches_autograd(stacked, model, "classification", (40,), x, y, 4)


@pytest.mark.parametrize("name", ["mlp", "cnn1d"])
def test_forward_matches_eager_for_shared_and_per_trial_inputs(data, stacked, name):
    model = training.models.build(name, data, seed=0).double()
    params = stacked(model, 3)
    eager = BatchedProgram.try_build(model, data.task)
    program = fused(model, data.input_shape, 4)
    shared = data.x_val[:13].double()
    expanded = shared.unsqueeze(0).expand(3, *shared.shape)
    own = data.x_train[:21].double().view(3, 7, -1)
    for x in (expanded, own):
        torch.testing.assert_close(program.forward(params, x), eager.forward(params, x),
                                   rtol=1e-12, atol=1e-14)


def test_regression_outputs_are_squeezed(stacked):
    ds = training.data.load("linreg", n=100, dim=4)
    model = training.models.build("mlp", ds, hidden=[6], seed=1).double()
    x = ds.x_val[:5].double()
    out = fused(model, ds.input_shape, 2).forward(stacked(model, 2), x.expand(2, *x.shape))
    assert out.shape == (2, 5)


@pytest.mark.parametrize("model", [
    nn.Sequential(nn.Linear(40, 8), nn.Tanh(), nn.Linear(8, 10)),
    nn.Sequential(nn.Unflatten(1, (1, 40)), nn.Conv1d(1, 2, 3, dilation=2), nn.Flatten(),
                  nn.Linear(72, 10)),
    nn.Sequential(nn.Unflatten(1, (4, 10)), nn.Linear(10, 10)),  # Linear over a 2-D input
    nn.Sequential(nn.Unflatten(1, (1, 40)), nn.Conv1d(1, 2, 3)),  # no row of outputs
])
def test_layers_outside_the_kernel_are_refused(model):
    assert encode(model, (40,)) is None


def test_working_set_counts_buffers_per_example(data):
    model = training.models.build("cnn1d", data)  # lengths 40 -> 19 -> 10 -> 5, 25 channels
    outputs = 25 * (19 + 10 + 5) + 10
    patches = 19 * 5 + 10 * 75 + 5 * 75
    assert working_set(encode(model, (40,)), 40) == 40 + outputs + patches + 2 * 25 * 19


def test_bad_labels_and_shapes_are_refused(data, stacked):
    model = training.models.build("mlp", data).double()
    program = fused(model, data.input_shape, 4)
    params = stacked(model, 2)
    x = data.x_train[:8].double().view(2, 4, -1)
    with pytest.raises(RuntimeError, match=r"class labels must lie in \[0, 10\)"):
        program.loss_and_grads(params, x, torch.full((2, 4), 10))
    with pytest.raises(RuntimeError, match="x must be"):
        program.loss_and_grads(params, x, torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov"])
def test_train_step_updates_in_place_below_the_limit(data, stacked, optimizer):
    """train_step equals loss_and_grads on the gathered batch followed by the masked
    torch.optim.SGD update, except for a trial whose loss is above its limit: untouched."""
    model = training.models.build("cnn1d", data, channels=3, seed=0).double()
    program = fused(model, data.input_shape, 3)
    params, bufs = stacked(model, 3), stacked(model, 3, seed=1)
    g = torch.Generator().manual_seed(2)
    masks = [(torch.rand(3, *params[0].shape[1:], generator=g) > 0.5).double(), None,
             (torch.rand(*params[2].shape[1:], generator=g) > 0.5).double()] + [None] * 5
    idx = torch.randint(0, data.n_train, (3, 7), generator=g)
    x, y = data.x_train.double(), data.y_train
    neg_lr, mu = torch.tensor([-0.1, -0.2, -0.3], dtype=F64), torch.tensor([0.9, 0.5, 0.0],
                                                                          dtype=F64)
    loss, grads = program.loss_and_grads(params, x[idx], y[idx])
    limit = loss.clone()
    limit[1] = loss[1] / 2  # trial 1 "diverged"
    expected_w, expected_a = [], []
    for w, a, gr, m in zip(params, bufs, grads, masks):
        gr = gr * (1 if m is None else m)
        a_new = gr + a * mu.view(-1, *[1] * (w.dim() - 1))
        step = {"sgd": gr, "momentum": a_new,
                "nesterov": gr + a_new * mu.view(-1, *[1] * (w.dim() - 1))}[optimizer]
        expected_w.append(w + step * neg_lr.view(-1, *[1] * (w.dim() - 1)))
        expected_a.append(a if optimizer == "sgd" else a_new)
        for t in (expected_w[-1], expected_a[-1]):
            t[1] = (w if t is expected_w[-1] else a)[1]
    before = [p.clone() for p in params]
    update = StackUpdate(optimizer, 0, -neg_lr, mu, masks, None if optimizer == "sgd" else bufs)
    got = program.train_step(params, x, y, idx, update, limit)
    torch.testing.assert_close(got, loss, rtol=1e-15, atol=0)
    for w, a, ew, ea, b in zip(params, bufs, expected_w, expected_a, before):
        torch.testing.assert_close(w, ew, rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(a, ea, rtol=1e-13, atol=1e-15)
        assert torch.equal(w[1], b[1])


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
# float32: a few ulps of the weights and of the step lr * u (lr <= 0.1, |u| <= about 1)
@pytest.mark.parametrize("dtype, rtol, atol", [(torch.float64, 1e-13, 1e-16),
                                               (torch.float32, 1e-5, 1e-7)])
def test_train_step_applies_adam_as_adam_state_below_the_limit(data, stacked, optimizer, dtype,
                                                               rtol, atol):
    """train_step with adam / adamw equals loss_and_grads on the gathered batch, the mask, then
    training.engine.adam.AdamState.step (the rule tested against torch.optim), at step 3 from nonzero
    moments, with per-trial lr, betas, eps and weight decay that all differ; a trial whose loss
    is above its limit keeps its weights and moments; masked weights and moments stay zero."""
    model = training.models.build("cnn1d", data, channels=3, seed=0)
    program = try_build(model, data.input_shape, dtype, "cpu", 3, 4)
    n = 4
    params = [p.to(dtype) for p in stacked(model, n)]
    g = torch.Generator().manual_seed(3)
    masks = [(torch.rand(n, *params[0].shape[1:], generator=g) > 0.5).to(dtype), None,
             (torch.rand(*params[2].shape[1:], generator=g) > 0.5).to(dtype)] + [None] * 5
    trials = [Trial(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0),
              Trial(lr=3e-3, beta1=0.5, beta2=0.99, eps=1e-3, weight_decay=0.1),
              Trial(lr=1e-1, beta1=0.0, beta2=0.9, eps=1e-6, weight_decay=0.5),
              Trial(lr=2e-2, beta1=0.8, beta2=0.95, eps=1e-4, weight_decay=0.01)]
    state = AdamState.zeros(params, trials, optimizer == "adamw")
    for m, v in zip(state.exp_avg, state.exp_avg_sq):
        m.copy_(0.01 * torch.randn(m.shape, generator=g, dtype=torch.float64))
        v.copy_(1e-4 * torch.rand(v.shape, generator=g, dtype=torch.float64))
    mask_(params, masks)
    mask_(state.exp_avg, masks)
    mask_(state.exp_avg_sq, masks)
    idx = torch.randint(0, data.n_train, (n, 7), generator=g)
    x, y = data.x_train.to(dtype), data.y_train
    lr = torch.tensor([t.lr for t in trials], dtype=torch.float64)
    loss, grads = program.loss_and_grads(params, x[idx], y[idx])
    limit = loss.double().clone()
    limit[2] = float("nan")  # trial 2 "diverged"
    keep = torch.tensor([0, 1, 3])
    expected, expected_state = [p.index_select(0, keep) for p in params], state.select(keep)
    kept = [gr.index_select(0, keep) for gr in grads]
    mask_(kept, [m if m is None or m.dim() < p.dim() else m.index_select(0, keep)
                 for m, p in zip(masks, params)])
    expected_state.step(expected, kept, lr[keep], 3)
    before = [[t.clone() for t in ts] for ts in (params, state.exp_avg, state.exp_avg_sq)]
    update = StackUpdate(optimizer, 3, lr, torch.zeros(n, dtype=dtype), masks, adam=state)
    got = program.train_step(params, x, y, idx, update, limit)
    torch.testing.assert_close(got, loss, rtol=0, atol=0)
    for now, was, want in zip((params, state.exp_avg, state.exp_avg_sq), before,
                              (expected, expected_state.exp_avg, expected_state.exp_avg_sq)):
        for t, b, e, m in zip(now, was, want, masks):
            torch.testing.assert_close(t.index_select(0, keep), e, rtol=rtol, atol=atol)
            assert torch.equal(t[2], b[2])
            if m is not None:
                assert not bool((t * (1 - m)).any())  # masked entries exactly zero


@pytest.mark.parametrize("optimizer", ["nesterov", "adamw"])
def test_train_steps_equal_one_step_at_a_time_until_each_trial_stops(data, stacked, optimizer):
    """K = 6 steps in one call (each trial's steps back to back) equal six calls of train_step,
    per-step learning rates included, where a trial whose loss exceeded its limit takes no
    further update: the same weights and optimizer state bit for bit, the same losses up to
    each trial's last step (NaN after it), and ``taken`` the step where it stopped. Trial 1's
    learning rate makes it blow up within the six steps; trial 0 takes all of them."""
    model = training.models.build("cnn1d", data, channels=3, seed=0).double()
    program = fused(model, data.input_shape, 3)
    n, k = 3, 6
    trials = [Trial(lr=0.05, momentum=0.9, weight_decay=0.01),
              Trial(lr=50.0, momentum=0.9, weight_decay=0.01),
              Trial(lr=0.01, momentum=0.5, weight_decay=0.0)]
    g = torch.Generator().manual_seed(4)
    masks = [(torch.rand(n, *stacked(model, 1)[0].shape[1:], generator=g) > 0.5).double()]
    masks += [None] * 7

    def fresh():
        params = stacked(model, n)
        mask_(params, masks)
        if optimizer == "adamw":
            return params, None, AdamState.zeros(params, trials, True)
        return params, [torch.zeros_like(p) for p in params], None

    def updates(bufs, adam):
        lr = torch.tensor([t.lr for t in trials], dtype=F64)
        mu = torch.tensor([t.momentum for t in trials], dtype=F64)
        # a decaying schedule: every step's learning rates differ
        return [StackUpdate(optimizer, s, lr * (1 - 0.1 * s), mu, masks, bufs, adam)
                for s in range(k)]

    idx = torch.randint(0, data.n_train, (k, n, 7), generator=g)
    x, y = data.x_train.double(), data.y_train
    limit = 3 * program.loss_and_grads(stacked(model, n), x[idx[0]], y[idx[0]])[0]
    params, bufs, adam = fresh()
    loss, taken = program.train_steps(params, x, y, idx, updates(bufs, adam), limit)
    ref_params, ref_bufs, ref_adam = fresh()
    ref_loss = torch.full((k, n), float("nan"), dtype=F64)
    ref_taken = torch.full((n,), k)
    lim = limit.clone()
    for s, update in enumerate(updates(ref_bufs, ref_adam)):
        out = program.train_step(ref_params, x, y, idx[s], update, lim)
        live = ~torch.isnan(lim)
        ref_loss[s, live] = out[live]
        stopped = live & ~(out <= lim)
        ref_taken[stopped] = s
        lim[stopped] = float("nan")  # no update can pass a NaN limit
    assert taken.tolist() == ref_taken.tolist()
    assert ref_taken[0] == k and ref_taken[1] < k  # the cases the test is about
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0, equal_nan=True)
    state = (lambda b, a: b if a is None else a.exp_avg + a.exp_avg_sq)
    for got, want in zip(params + state(bufs, adam), ref_params + state(ref_bufs, ref_adam)):
        assert torch.equal(got, want)
