"""theory.monitor.parts: the noise scale per layer, of the normalization layers and of Adam's
preconditioned gradient, each against a float64 ground truth from a plain loop of
torch.autograd.grad over the examples (or the micro-batches), on the library's MLP, a small
transformer block with LayerNorm and a CNN with BatchNorm."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import training
from theory import NoiseScaleMonitor, TheoryError
from theory.monitor.parts import NORM, PRECONDITIONED

from .monitor_models import TinyTransformer, token_dataset

# -- ground truth --------------------------------------------------------------------------------

def loop_gradients(make, net, parts):
    """Per batch in ``parts`` (x, y), the mean-loss gradient of each named trainable parameter,
    by torch.autograd.grad on a copy of ``net`` made by ``make`` without the monitor's hooks:
    ``{name: tensor}`` per batch."""
    ref = make().double()
    ref.load_state_dict(net.state_dict())
    named = [(k, p) for k, p in ref.named_parameters() if p.requires_grad]
    out = []
    for x, y in parts:
        grads = torch.autograd.grad(F.cross_entropy(ref(x), y), [p for _, p in named])
        out.append({k: g.detach() for (k, _), g in zip(named, grads)})
    return out


def examples(x, y):
    return [(x[i:i + 1], y[i:i + 1]) for i in range(x.shape[0])]


def unbiased(grads, names, sizes, scale=None, population=None):
    """(|G_S|^2, tr Sigma_S) over the parameters ``names`` from the gradients of disjoint
    batches of ``sizes`` examples, averaged with equal weights: u_small the mean of their squared
    norms (c = mean 1/b), u_big that of their mean (c = sum 1/(k^2 b)); ``scale`` multiplies each
    parameter's gradient elementwise first; with ``population`` N each c = x becomes
    N/(N-1) (x - 1/N) (drawn without replacement, Cochran 1977)."""
    def coef(x):
        return x if population is None else population / (population - 1) * (x - 1 / population)

    def vec(g):
        return torch.cat([(g[n] * (scale[n] if scale else 1)).reshape(-1) for n in names])
    vs = [vec(g) for g in grads]
    k = len(vs)
    u_small = sum(float(v.pow(2).sum()) for v in vs) / k
    u_big = float(torch.stack(vs).mean(0).pow(2).sum())
    c_small = sum(coef(1 / b) for b in sizes) / k
    c_big = coef(sum(1 / (k * k * b) for b in sizes))
    t = (u_small - u_big) / (c_small - c_big)
    return u_big - c_big * t, t


def pooled(grads, names, sizes, scale=None):
    """(|G_S|^2, tr Sigma_S) of the per-example estimator over micro-batches of ``sizes``
    (``grads`` their examples' gradients in order, each micro-batch's loss weighted 1/k):
    u_small the examples' mean squared norm (c = 1), u_big that of v = mean_j m_j
    (c = sum_j 1/(k^2 b_j)); ``scale`` multiplies each parameter's gradient first."""
    vs = [torch.cat([(g[n] * (scale[n] if scale else 1)).reshape(-1) for n in names])
          for g in grads]
    k, at, means = len(sizes), 0, []
    for b in sizes:
        means.append(torch.stack(vs[at:at + b]).mean(0))
        at += b
    u_small = sum(float(v.pow(2).sum()) for v in vs) / len(vs)
    u_big = float(torch.stack(means).mean(0).pow(2).sum())
    c_big = sum(1 / (k * k * b) for b in sizes)
    t = (u_small - u_big) / (1 - c_big)
    return u_big - c_big * t, t


def check(part, g, t):
    assert part.step_g_sq == pytest.approx(g, rel=1e-10, abs=1e-15)
    assert part.step_trace_sigma == pytest.approx(t, rel=1e-10, abs=1e-15)
    # (an unbiased |G|^2 estimate can dip below 0: B_simple is then inf)
    assert part.step_b_simple == (pytest.approx(t / g, rel=1e-8) if g > 0 else math.inf)


def module_params(net, module_name):
    prefix = "" if module_name == "<model>" else module_name + "."
    return [k for k, _ in net.named_parameters() if k.startswith(prefix) and
            "." not in k[len(prefix):]]


def norm_params(net):
    kinds = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.BatchNorm2d)
    return [f"{m}.{k}" for m, mod in net.named_modules() if isinstance(mod, kinds)
            for k, _ in mod.named_parameters(recurse=False)]


def check_layers(reading, net, grads, sizes, population=None):
    """Every layer's part and the norm layers' against the ground truth; the layers' |G|^2 and
    tr(Sigma) add up to the whole model's."""
    parts = {p.name: p for p in reading.parts}
    layers = [p for p in reading.parts if p.name not in (NORM, PRECONDITIONED)]
    for part in layers:
        check(part, *unbiased(grads, module_params(net, part.name), sizes, population=population))
    check(parts[NORM], *unbiased(grads, norm_params(net), sizes, population=population))
    g = math.fsum(p.step_g_sq for p in layers)
    t = math.fsum(p.step_trace_sigma for p in layers)
    assert g == pytest.approx(reading.step_g_sq, rel=1e-10)
    assert t == pytest.approx(reading.step_trace_sigma, rel=1e-10)
    # the combination: B_simple is the |G_l|^2-weighted mean of the layers' B_l
    assert math.fsum(p.step_g_sq * p.step_b_simple for p in layers) / g == \
        pytest.approx(reading.step_b_simple, rel=1e-8)
    return parts


def adam_state(net, opt, batches, monitor=None):
    """Take optimizer steps on ``batches`` (each as two micro-batches read by ``monitor``, if
    given); the closed-form P = 1 / (sqrt(v_hat) + eps) of Adam (or AMSGrad) after them, by
    parameter name, from the batches' gradients."""
    group = opt.param_groups[0]
    beta2, eps, ams = group["betas"][1], group["eps"], group.get("amsgrad", False)
    named = [(k, p) for k, p in net.named_parameters() if p.requires_grad]
    v = {k: torch.zeros_like(p) for k, p in named}
    vmax = {k: torch.zeros_like(p) for k, p in named}
    for x, y in batches:
        if monitor is None:
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
        else:
            half = x.shape[0] // 2
            micro_step(monitor, net, [(x[:half], y[:half]), (x[half:], y[half:])])
        for k, p in named:
            v[k] = beta2 * v[k] + (1 - beta2) * p.grad.detach() ** 2
            vmax[k] = torch.maximum(vmax[k], v[k])
        opt.step()
    t = len(batches)
    return {k: 1 / (((vmax if ams else v)[k] / (1 - beta2 ** t)).sqrt() + eps) for k, _ in named}


def micro_step(monitor, net, parts):
    net.zero_grad()
    for x, y in parts:
        (F.cross_entropy(net(x), y) / len(parts)).backward()
    return monitor.step(loss_scale=1 / len(parts))


def token_batch(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(12, (n, 8), generator=gen).double(), torch.randint(3, (n,), generator=gen)


class BatchNormCNN(nn.Module):
    """Conv2d, BatchNorm2d, ReLU, pooled into a Linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).mean((2, 3)))


# -- per example -------------------------------------------------------------------------------

@pytest.mark.parametrize("population", [None, 500])
def test_layers_and_norm_layers_per_example_on_a_transformer(population):
    """Each step against the ground truth; the parts' window averages their steps' values."""
    torch.manual_seed(0)
    net = TinyTransformer().double()
    monitor = NoiseScaleMonitor(net, window=3, per_layer=True, norm_layers=True,
                                population=population)
    history = []
    for step in range(2):
        x, y = token_batch(12, step)
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        r = monitor.step()
        assert r.method == "per_example"
        grads = loop_gradients(TinyTransformer, net, examples(x, y))
        parts = check_layers(r, net, grads, [1] * 12, population)
        assert set(parts) >= {"tok", "blocks.0.ln1", "blocks.0.ff.0", "ln_f", "head", NORM}
        history.append(parts[NORM])
    assert history[-1].trace_sigma == pytest.approx(
        (history[0].step_trace_sigma + history[1].step_trace_sigma) / 2, rel=1e-12)
    assert history[-1].g_sq == pytest.approx(
        (history[0].step_g_sq + history[1].step_g_sq) / 2, rel=1e-12)


def test_layers_per_example_on_the_library_mlp():
    ds = training.data.load("mnist1d")
    net = training.models.build("mlp", ds, seed=0).double()
    monitor = NoiseScaleMonitor(net, per_layer=True)
    x, y = ds.x_train[:10].double(), ds.y_train[:10]
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    r = monitor.step()
    grads = loop_gradients(lambda: training.models.build("mlp", ds, seed=0), net,
                           examples(x, y))
    layers = [p for p in r.parts]
    assert len(layers) >= 2
    for part in layers:
        check(part, *unbiased(grads, module_params(net, part.name), [1] * 10))


# -- micro-batches and the preconditioner ----------------------------------------------------------

@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW])
def test_preconditioned_on_a_transformer(kind):
    """Two optimizer steps give the state; a step of micro-batches of 5 and 7 is read per
    example with P = 1 / (sqrt(v_hat) + eps) from the closed form (Linear over positions,
    Embedding, LayerNorm)."""
    torch.manual_seed(1)
    net = TinyTransformer().double()
    opt = kind(net.parameters(), lr=1e-3, amsgrad=kind is torch.optim.AdamW)
    monitor = NoiseScaleMonitor(net, window=3, optimizer=opt, norm_layers=True)
    parts = [token_batch(5, 10), token_batch(7, 11)]
    first = micro_step(monitor, net, parts)
    assert math.isnan(first.parts[-1].step_b_simple)       # no second moment yet
    scale = adam_state(net, opt, [token_batch(10, 20), token_batch(10, 21)], monitor)
    r = micro_step(monitor, net, parts)
    assert r.method == "per_example"
    names = [k for k, _ in net.named_parameters()]
    pre = {p.name: p for p in r.parts}[PRECONDITIONED]
    examples_of = [e for x, y in parts for e in examples(x, y)]
    grads = loop_gradients(TinyTransformer, net, examples_of)
    check(pre, *pooled(grads, names, [5, 7], scale))
    check({p.name: p for p in r.parts}[NORM], *pooled(grads, norm_params(net), [5, 7]))
    assert pre.step_trace_sigma != pytest.approx(r.step_trace_sigma, rel=1e-3)


def test_a_batchnorm_cnn_gets_micro_batch_parts():
    """Batch normalization in training mode mixes a batch's examples, so only micro-batch
    gradients are defined: every part from 3 micro-batches (sizes 4, 6, 5) against their
    gradients by autograd, the preconditioned one after an AdamW step."""
    torch.manual_seed(2)
    net = BatchNormCNN().double()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    parts = [(torch.randn(b, 1, 6, 6, generator=gen, dtype=torch.float64),
              torch.randint(3, (b,), generator=gen)) for b in (4, 6, 5)]
    scale = adam_state(net, opt, [parts[0]])
    monitor = NoiseScaleMonitor(net, per_layer=True, norm_layers=True, optimizer=opt)
    r = micro_step(monitor, net, parts)
    assert r.method == "micro_batch"
    grads = loop_gradients(BatchNormCNN, net, parts)
    by_name = check_layers(r, net, grads, [4, 6, 5])
    assert set(by_name) == {"conv", "bn", "head", NORM, PRECONDITIONED}
    names = [k for k, _ in net.named_parameters()]
    check(by_name[PRECONDITIONED], *unbiased(grads, names, [4, 6, 5], scale))


def grouped_cnn():
    return nn.Sequential(nn.Conv2d(2, 4, 3, groups=2, padding=1), nn.Tanh(),
                         nn.Conv2d(4, 3, 2, stride=2), nn.Flatten(), nn.Linear(27, 3))


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_preconditioned_per_example_in_one_backward(name):
    """One backward per step: P o g_i per example on the library's MLP (Linear on one position)
    and a CNN with grouped and strided convolutions, after two Adam steps."""
    torch.manual_seed(3)
    if name == "mlp":
        ds = training.data.load("mnist1d")
        make = lambda: training.models.build("mlp", ds, seed=0)  # noqa: E731
        x, y = ds.x_train[:10].double(), ds.y_train[:10]
    else:
        gen = torch.Generator().manual_seed(0)
        make = grouped_cnn
        x = torch.randn(10, 2, 6, 6, generator=gen, dtype=torch.float64)
        y = torch.randint(3, (10,), generator=gen)
    net = make().double()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    monitor = NoiseScaleMonitor(net, optimizer=opt)
    scale = adam_state(net, opt, [(x[:6], y[:6]), (x[4:], y[4:])], monitor)
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    r = monitor.step()
    assert r.method == "per_example"
    names = [k for k, _ in net.named_parameters()]
    check(r.parts[0], *unbiased(loop_gradients(make, net, examples(x, y)), names, [1] * 10,
                                scale))


class OwnScale(nn.Module):
    """A layer named ``norm`` and a parameter the model owns itself (micro-batches only)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 4)
        self.norm = nn.LayerNorm(4)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.scale * self.norm(torch.tanh(self.lin(x))))


def test_part_names_do_not_collide_with_layer_names():
    torch.manual_seed(4)
    net = OwnScale().double()
    gen = torch.Generator().manual_seed(1)
    parts = [(torch.randn(b, 5, generator=gen, dtype=torch.float64),
              torch.randint(3, (b,), generator=gen)) for b in (3, 5)]
    monitor = NoiseScaleMonitor(net, per_layer=True, norm_layers=True)
    r = micro_step(monitor, net, parts)
    assert r.method == "micro_batch"
    by_name = check_layers(r, net, loop_gradients(OwnScale, net, parts), [3, 5])
    assert set(by_name) == {"<model>", "lin", "norm", "head", NORM}
    assert by_name["norm"].step_g_sq == by_name[NORM].step_g_sq


# -- logging and bad input -------------------------------------------------------------------------

def test_parts_are_logged_by_name(tmp_path):
    torch.manual_seed(0)
    net = TinyTransformer().double()
    path = tmp_path / "noise.csv"
    with NoiseScaleMonitor(net, norm_layers=True, csv=path) as monitor:
        x, y = token_batch(8, 0)
        F.cross_entropy(net(x), y).backward()
        r = monitor.step()
    header, row = path.read_text().splitlines()
    columns = dict(zip(header.split(","), row.split(",")))
    assert float(columns["step_b_simple[<norm layers>]"]) == pytest.approx(r.parts[0].step_b_simple)


def test_bad_parts_are_refused():
    net = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(TheoryError, match="Adam or AdamW.*SGD"):
        NoiseScaleMonitor(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(TheoryError, match="no trainable LayerNorm"):
        NoiseScaleMonitor(net, norm_layers=True)
