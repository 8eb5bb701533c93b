"""theory.NoiseScaleMonitor inside plain training loops: each estimator against an independent
float64 ground truth on the same batches (per-example gradients from torch.func; micro-batch
gradients from separate backward passes), the windowed B_simple against theory.gradient_noise
on the whole training split at fixed weights, smoothing, logging and bad input."""

import csv
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

import theory
import training
from theory import NoiseReading, NoiseScaleMonitor, TheoryError, two_batch_estimates
from theory.estimators.sampling import to_split

from .monitor_models import TinyTransformer, token_dataset

# -- ground truth ------------------------------------------------------------------------------

def example_gradients(model, x, y):
    """Per-example gradients ``[n, dim]`` of the cross-entropy over trainable parameters."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([g.reshape(x.shape[0], -1) for g in grads.values()], 1)


def sample_estimate(model, x, y, population=None):
    """Unbiased (|G|^2, tr Sigma) from one batch's per-example gradients (theory.estimators.sampling)."""
    g = example_gradients(model, x, y)
    n = g.shape[0]
    mean = g.mean(0)
    t_n = float((g - mean).pow(2).sum()) / n
    return to_split(float(mean.pow(2).sum()), t_n, n, population) if population \
        else (float(mean.pow(2).sum()) - t_n / (n - 1), t_n * n / (n - 1))


def batch_gradient(model, x, y):
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad()
    return grads


class Mixed(nn.Module):
    """Every supported layer kind in one network over token inputs: Embedding, Conv1d, Conv2d,
    LayerNorm, RMSNorm and Linear on 2-d and 3-d inputs."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 6)
        self.conv1 = nn.Conv1d(6, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(1, 2, (2, 3), stride=(1, 2))
        self.norm = nn.LayerNorm(4)
        self.rms = nn.RMSNorm(4)
        self.seq = nn.Linear(4, 5)
        self.head = nn.Linear(5 + 2 * 3 * 2, 3)

    def forward(self, x):
        h = self.emb(x.long())                             # [b, 8, 6]
        c = torch.tanh(self.conv1(h.transpose(1, 2)))      # [b, 4, 8]
        z = self.rms(self.norm(c.transpose(1, 2)))         # [b, 8, 4]
        s = torch.tanh(self.seq(z)).mean(1)                # [b, 5]
        m = torch.tanh(self.conv2(c.unsqueeze(1)))         # [b, 2, 3, 3]
        return self.head(torch.cat([s, m[..., :2].flatten(1)], 1))


def exact_step(monitor, net, x, y, population=None):
    """One step of the loop on (x, y); the monitor's reading, checked against the sample
    estimate of the same batch (float64, 1e-10)."""
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    r = monitor.step()
    g_ref, t_ref = sample_estimate(net, x, y, population)
    assert r.step_g_sq == pytest.approx(g_ref, rel=1e-10, abs=1e-14)
    assert r.step_trace_sigma == pytest.approx(t_ref, rel=1e-10)
    return r


def token_batch(n, seed, vocab=7, length=8, classes=3):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(vocab, (n, length), generator=gen).double(),
            torch.randint(classes, (n,), generator=gen))


# -- exactness on given batches ------------------------------------------------------------------

@pytest.mark.parametrize("population", [None, 500])
def test_per_example_step_equals_the_sample_estimate(population):
    torch.manual_seed(0)
    net = Mixed().double()
    monitor = NoiseScaleMonitor(net, window=5, population=population)
    for step in range(3):
        r = exact_step(monitor, net, *token_batch(16, step), population)
        assert r.method == "per_example" and r.batch_size == 16 and r.step == step + 1


def check_pooled(r, net, parts):
    """The reading ``r`` of two accumulated micro-batches of 8 and 12 (loss halved each) against
    every example's gradient and the accumulated gradient, v = (m_1 + m_2) / 2, with
    E|v|^2 = |G|^2 + (1/8 + 1/12) / 4 tr."""
    grads = [example_gradients(net, x, y) for x, y in parts]
    u_small = float(torch.cat(grads).pow(2).sum(1).mean())
    u_big = float(((grads[0].mean(0) + grads[1].mean(0)) / 2).pow(2).sum())
    c_big = (1 / 8 + 1 / 12) / 4
    trace = (u_small - u_big) / (1 - c_big)
    assert r.method == "per_example" and r.batch_size == 20
    assert r.step_trace_sigma == pytest.approx(trace, rel=1e-10)
    assert r.step_g_sq == pytest.approx(u_big - c_big * trace, rel=1e-10)


def test_per_example_under_accumulation_pools_the_micro_batches():
    """Micro-batches of 8 and 12 (loss halved each): every example's gradient against the
    accumulated gradient, v = (m_1 + m_2) / 2, with E|v|^2 = |G|^2 + (1/8 + 1/12) / 4 tr."""
    torch.manual_seed(0)
    net = Mixed().double()
    monitor = NoiseScaleMonitor(net, window=5)
    parts = [token_batch(8, 10), token_batch(12, 11)]
    net.zero_grad()
    for x, y in parts:
        (F.cross_entropy(net(x), y) / 2).backward()
    r = monitor.step(loss_scale=0.5)
    check_pooled(r, net, parts)


def test_interleaved_forwards_and_an_in_place_activation_are_read_exactly():
    """Two micro-batches whose forwards both run before either backward, through a network
    whose Linear outputs are modified in place (ReLU(inplace=True)): the hooks see each call's
    own output gradient, so the step equals the ground truth on the pooled examples."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 6), nn.ReLU(inplace=True), nn.Linear(6, 3)).double()
    monitor = NoiseScaleMonitor(net, window=5)
    gen = torch.Generator().manual_seed(7)
    parts = [(torch.randn(n, 5, generator=gen, dtype=torch.float64),
              torch.randint(3, (n,), generator=gen)) for n in (8, 12)]
    net.zero_grad()
    losses = [F.cross_entropy(net(x), y) / 2 for x, y in parts]
    for loss in reversed(losses):
        loss.backward()
    r = monitor.step(loss_scale=0.5)
    check_pooled(r, net, parts)


def test_forwards_without_a_backward_pin_a_bounded_number_of_inputs():
    """An evaluation with gradients enabled between steps: at most MAX_PENDING_FORWARDS
    forwards keep their inputs, the step after it is exact, and a backward that reaches a
    released forward is refused rather than left out."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    monitor = NoiseScaleMonitor(net, window=5)
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        net(torch.randn(4, 5, generator=gen, dtype=torch.float64))
    assert len(monitor.capture.passes) == theory.monitor.capture.MAX_PENDING_FORWARDS
    x = torch.randn(16, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(3, (16,), generator=gen)
    exact_step(monitor, net, x, y)
    net.zero_grad()
    first = F.cross_entropy(net(x), y)
    for _ in range(theory.monitor.capture.MAX_PENDING_FORWARDS):
        net(x)
    first.backward()
    with pytest.raises(TheoryError, match="reached a forward that had been released after 8"):
        monitor.step()


def test_a_summed_loss_with_its_scale_reads_as_the_mean():
    torch.manual_seed(0)
    net = Mixed().double()
    x, y = token_batch(16, 3)
    readings = []
    for reduction, scale in (("mean", 1.0), ("sum", 16.0)):
        monitor = NoiseScaleMonitor(net, window=2)
        net.zero_grad()
        F.cross_entropy(net(x), y, reduction=reduction).backward()
        readings.append(monitor.step(loss_scale=scale))
        monitor.close()
    assert readings[1].step_g_sq == pytest.approx(readings[0].step_g_sq, rel=1e-10)
    assert readings[1].step_trace_sigma == pytest.approx(readings[0].step_trace_sigma, rel=1e-10)


@pytest.mark.parametrize("method", ["micro_batch", "auto"])
def test_micro_batches_give_the_two_batch_estimate(method):
    """Four accumulated micro-batches of 8: McCandlish's two-batch estimator with B_small = 8,
    B_big = 32 (theory.two_batch_estimates) on gradients from separate backward passes. With
    batch normalization (no per-example norms) ``auto`` falls back to it."""
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(),
                             nn.Linear(8, 3)).double()

    net, twin = build(), build()        # the twin (no monitor) gives the reference gradients
    monitor = NoiseScaleMonitor(net, window=3, method=method)
    gen = torch.Generator().manual_seed(4)
    for step in range(2):
        parts = [(torch.randn(8, 6, generator=gen, dtype=torch.float64),
                  torch.randint(3, (8,), generator=gen)) for _ in range(4)]
        small = [batch_gradient(twin, x, y) for x, y in parts]
        for x, y in parts:
            (F.cross_entropy(net(x), y) / 4).backward()
        r = monitor.step(loss_scale=0.25)
        net.zero_grad()
        big = torch.stack(small).mean(0)
        ref = two_batch_estimates(float(np.mean([float(g.pow(2).sum()) for g in small])),
                                  float(big.pow(2).sum()), 8, 32)
        assert r.method == "micro_batch" and r.batch_size == 32
        assert r.step_g_sq == pytest.approx(ref.g_sq, rel=1e-10)
        assert r.step_trace_sigma == pytest.approx(ref.trace_sigma, rel=1e-10)


def test_unsupported_layers_without_micro_batches_are_named():
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    monitor = NoiseScaleMonitor(net)
    F.cross_entropy(net(torch.randn(8, 4)), torch.randint(2, (8,))).backward()
    with pytest.raises(TheoryError, match=r"no per-example gradient norms here: 1 \(BatchNorm1d"
                                          r".*accumulate at least 2 micro-batches"):
        monitor.step()
    attn = nn.MultiheadAttention(4, 2, batch_first=True)
    monitor = NoiseScaleMonitor(attn)
    x = torch.randn(3, 5, 4)
    attn(x, x, x)[0].sum().backward()
    with pytest.raises(TheoryError, match=r"model \(MultiheadAttention\)"):
        monitor.step()


class PositionTable(nn.Module):
    """Tokens plus positions: ``read`` reads the position table as ``pos.weight[:t]`` (as
    ``training.models``' ``transformer_lm`` does), ``tied`` reuses the token table as the output
    head; otherwise every parameter goes through its layer's own call."""

    def __init__(self, read=False, tied=False):
        super().__init__()
        self.read, self.tied = read, tied
        self.emb, self.pos, self.mix = nn.Embedding(7, 6), nn.Embedding(8, 6), nn.Linear(6, 6)
        self.head = nn.Linear(6, 7)

    def forward(self, x):
        t = x.shape[1]
        pos = self.pos.weight[:t] if self.read else self.pos(torch.arange(t).expand_as(x))
        h = torch.tanh(self.mix(self.emb(x) + pos)).mean(1)
        return h @ self.emb.weight.T if self.tied else self.head(h)


@pytest.mark.parametrize("read, tied, named", [(True, False, "pos.weight"),
                                               (False, True, "emb.weight")])
def test_a_parameter_used_outside_its_layer_is_refused_by_name(read, tied, named):
    torch.manual_seed(0)
    net = PositionTable(read, tied).double()
    monitor = NoiseScaleMonitor(net)
    x, y = torch.randint(7, (16, 8)), torch.randint(7, (16,))
    F.cross_entropy(net(x), y).backward()
    with pytest.raises(TheoryError, match=rf"parameter\(s\) {named} are used outside their "
                                          rf"layer's own call.*method='micro_batch'"):
        monitor.step()


def test_every_parameter_through_its_layer_passes_the_check_and_is_exact():
    torch.manual_seed(0)
    net = PositionTable().double()
    monitor = NoiseScaleMonitor(net, window=5)
    for step in range(2):
        gen = torch.Generator().manual_seed(step)
        exact_step(monitor, net, torch.randint(7, (16, 8), generator=gen),
                   torch.randint(7, (16,), generator=gen))
    assert monitor.capture._root_hook is None       # the check ran once, at the first step


# -- accuracy at fixed weights ---------------------------------------------------------------------

def windowed(net, ds, steps, batch, population, seed=0):
    """The monitor's windowed reading over ``steps`` random batches of the training split at
    fixed weights (no optimizer step): without replacement within a batch when ``population``
    is given, else with replacement."""
    monitor = NoiseScaleMonitor(net, window=steps, population=population)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = (torch.randperm(ds.n_train, generator=gen)[:batch] if population
               else torch.randint(ds.n_train, (batch,), generator=gen))
        net.zero_grad()
        F.cross_entropy(net(ds.x_train[idx]), ds.y_train[idx]).backward()
        reading = monitor.step()
    monitor.close()
    return reading


def check_agrees(reading, ref):
    assert reading.steps == reading.step and reading.smoothing == f"window {reading.step}"
    assert math.isfinite(reading.b_simple_se) and reading.b_simple_se > 0
    err = abs(reading.b_simple - ref.b_simple)
    assert err <= 2 * reading.b_simple_se, (reading, ref.b_simple)
    assert err <= 0.1 * ref.b_simple, (reading, ref.b_simple)


def test_windowed_b_simple_matches_the_full_split_on_the_mnist1d_mlp():
    ds = training.data.load("mnist1d")              # 7,200 training examples
    net = training.models.build("mlp", ds, seed=0)
    ref = theory.gradient_noise(net, ds, hessian_examples=0)      # exact on the split
    assert ref.n == ds.n_train
    check_agrees(windowed(net, ds, 300, 64, population=ds.n_train), ref)


def test_windowed_b_simple_matches_the_full_split_on_a_transformer():
    ds = token_dataset()
    torch.manual_seed(0)
    net = TinyTransformer()
    ref = theory.gradient_noise(net, ds, hessian_examples=0)
    reading = windowed(net, ds, 300, 64, population=None)
    assert reading.method == "per_example"
    check_agrees(reading, ref)


# -- smoothing ---------------------------------------------------------------------------------

def feed(monitor, values):
    """Drive a monitor's smoother with given per-step estimates."""
    return [monitor.smoother.add(g, t) for g, t in values]


def test_window_and_ema_average_numerator_and_denominator_separately():
    rng = np.random.default_rng(0)
    values = rng.uniform(0.5, 2.0, size=(12, 2))
    net = nn.Linear(2, 2)
    out = feed(NoiseScaleMonitor(net, window=5), values)[-1]
    last = values[-5:]
    assert out[0] == pytest.approx(last[:, 0].mean()) and out[1] == pytest.approx(last[:, 1].mean())
    assert out[2] == pytest.approx(last[:, 1].mean() / last[:, 0].mean())   # ratio of means
    assert out[3] == pytest.approx(last[:, 0].std(ddof=1) / math.sqrt(5))
    decay = 0.8
    out = feed(NoiseScaleMonitor(net, ema=decay), values)[-1]
    w = decay ** np.arange(11, -1, -1)
    assert out[0] == pytest.approx(w @ values[:, 0] / w.sum())
    assert out[2] == pytest.approx((w @ values[:, 1]) / (w @ values[:, 0]))
    # the same weighted standard error as theory.NoiseStream's
    stream = theory.NoiseStream(1, 2, decay=decay)
    small = values[:, 0] + values[:, 1]                 # E|G_1|^2 = g + t, E|G_2|^2 = g + t / 2
    stream = stream.update(small, values[:, 0] + values[:, 1] / 2)
    assert out[3] == pytest.approx(stream.g_sq_se) and out[5] == pytest.approx(stream.b_simple_se)
    assert NoiseScaleMonitor(net).smoother.label == "ema 0.99"


# -- logging -----------------------------------------------------------------------------------

def run_steps(monitor, net, steps=3):
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        net.zero_grad()
        x = torch.randn(8, 3, generator=gen)
        F.cross_entropy(net(x), torch.randint(2, (8,), generator=gen)).backward()
        last = monitor.step()
    return last


def test_csv_and_tensorboard_logs(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    with NoiseScaleMonitor(net, window=2, csv=tmp_path / "noise.csv",
                           log_dir=tmp_path / "tb") as monitor:
        last = run_steps(monitor, net)
    rows = list(csv.DictReader(open(tmp_path / "noise.csv")))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert float(rows[-1]["b_simple"]) == pytest.approx(last.b_simple)
    assert rows[-1]["smoothing"] == "window 2" and rows[-1]["method"] == "per_example"
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    series = events.Scalars("noise/step_g_sq")
    assert [e.step for e in series] == [1, 2, 3]
    assert series[-1].value == pytest.approx(last.step_g_sq, rel=1e-6)
    # a second monitor appends to the same CSV without a second header
    with NoiseScaleMonitor(net, window=2, csv=tmp_path / "noise.csv") as monitor:
        run_steps(monitor, net, 1)
    assert len(list(csv.DictReader(open(tmp_path / "noise.csv")))) == 4


def test_close_removes_the_hooks():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    monitor = NoiseScaleMonitor(net)
    monitor.close()
    F.cross_entropy(net(torch.randn(8, 3)), torch.randint(2, (8,))).backward()
    assert monitor.capture.backwards == [] and net._forward_pre_hooks == {}


# -- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"window": 3, "ema": 0.9}, "give window or ema, not both"),
    ({"window": 0}, "window must be an integer >= 1"),
    ({"ema": 1.0}, r"ema must be a decay in \(0, 1\)"),
    ({"method": "fast"}, "method 'fast'; allowed: auto, per_example, micro_batch, ddp"),
    ({"method": "ddp"}, "method='ddp' needs a DistributedDataParallel model"),
    ({"population": 1}, "population must be an integer >= 2"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(TheoryError, match=match):
        NoiseScaleMonitor(nn.Linear(2, 2), **kwargs)


def test_bad_models():
    with pytest.raises(TheoryError, match="needs an nn.Module, got function"):
        NoiseScaleMonitor(lambda x: x)
    with pytest.raises(TheoryError, match=r"the model \(ReLU\) has no parameters that require"):
        NoiseScaleMonitor(nn.ReLU())
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(TheoryError, match="no parameters that require gradients"):
        NoiseScaleMonitor(frozen)


def test_step_before_backward_and_bad_loss_scale():
    net = nn.Linear(3, 2)
    monitor = NoiseScaleMonitor(net)
    with pytest.raises(TheoryError, match=r"step\(\) called before any backward pass"):
        monitor.step()
    net(torch.randn(4, 3)).sum().backward()
    with pytest.raises(TheoryError, match="loss_scale must be a positive number, got 0"):
        monitor.step(loss_scale=0)
    assert monitor.step().step == 1      # a refused argument keeps the step's backward
    with pytest.raises(TheoryError, match=r"step\(\) called before any backward pass"):
        monitor.step()


def test_bad_batches():
    net = nn.Linear(3, 2)
    monitor = NoiseScaleMonitor(net, population=6)
    net(torch.randn(8, 3)).sum().backward()
    with pytest.raises(TheoryError, match="a step saw 8 examples, more than population=6"):
        monitor.step()
    net.zero_grad()
    net(torch.randn(1, 3)).sum().backward()
    with pytest.raises(TheoryError, match="a step needs at least 2 examples to estimate the noise, got 1"):
        monitor.step()


def test_sequence_first_inputs_are_refused_with_the_layer_named():
    class SeqFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Embedding(5, 3)
            self.out = nn.Linear(3, 2)

        def forward(self, x):                      # x [b, 5, 3]; positions without a batch dim
            return self.out((x + self.pos(torch.arange(5))).mean(1))

    net = SeqFirst()
    monitor = NoiseScaleMonitor(net)
    F.cross_entropy(net(torch.randn(4, 5, 3)), torch.randint(2, (4,))).backward()
    with pytest.raises(TheoryError, match=r"layer pos \(Embedding\) got an input of shape \(5,\) "
                                          r"whose first dimension is not the batch \(4\)"):
        monitor.step()


def test_stale_gradients_are_refused_by_the_micro_batch_estimator():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    net(torch.randn(4, 3)).sum().backward()           # a gradient left from before, not zeroed
    monitor = NoiseScaleMonitor(net, method="micro_batch")
    for _ in range(2):
        F.cross_entropy(net(torch.randn(4, 3)), torch.randint(2, (4,))).backward()
    with pytest.raises(TheoryError, match=r"\.grad held a gradient before the first backward"):
        monitor.step()


def test_readings_are_frozen():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    reading = run_steps(NoiseScaleMonitor(net), net)
    assert isinstance(reading, NoiseReading)
    with pytest.raises(AttributeError):
        reading.b_simple = 1.0


def test_every_measures_one_step_in_n_without_hooks_in_between():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    monitor = NoiseScaleMonitor(net, window=10, every=3)
    steps, hooked = [], []
    gen = torch.Generator().manual_seed(0)
    for _ in range(7):
        hooked.append(bool(net._forward_pre_hooks))
        net.zero_grad()
        F.cross_entropy(net(torch.randn(8, 3, generator=gen)),
                        torch.randint(2, (8,), generator=gen)).backward()
        steps.append(monitor.step().step)
    assert steps == [1, 1, 1, 4, 4, 4, 7]               # the last measured step's reading
    assert hooked == [True, False, False, True, False, False, True]
    assert monitor.last.steps == 3
    monitor.close()
    with pytest.raises(TheoryError, match=r"step\(\) after close\(\)"):
        monitor.step()
