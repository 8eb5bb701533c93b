"""theory.monitor.kernel, the noise monitor's kernel (theory/monitor/csrc/example_norms.cpp):
each layer kind's sum of per-example squared gradient norms against a float64 loop over the
examples (one backward pass per example) and against the torch path (theory.monitor.layer_norms); the
monitor's readings with the routine and without it (compiled_kernel.disabled()) on models of
every layer kind, two models from the library that were not written for the monitor (ResNet8
and the byte-level TransformerLM), and the fallback when the routine cannot be built."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from theory import NoiseScaleMonitor
from theory.monitor import kernel as norms_kernel
from theory.monitor.layer_norms import job_function, layer_sq_norms
from training import extensions as kernels
from training.engine import compiled_kernel
from training.models import ResNet8, TransformerLM

from .monitor_models import TinyTransformer
from .test_monitor import Mixed, sample_estimate, token_batch


@pytest.fixture(scope="module")
def routine():
    """The kernel; skipped where it cannot be built, failed instead under
    SPARSESCALE_REQUIRE_KERNEL=1 (as the trainer's kernel tests)."""
    try:
        module = norms_kernel.load()
    except kernels.KernelError as exc:
        pytest.fail(f"{kernels.REQUIRE_ENV} is set and {exc}", pytrace=False)
    if module is None:
        if kernels.required():
            pytest.fail(f"{kernels.REQUIRE_ENV} is set but the kernels are switched off",
                        pytrace=False)
        pytest.skip("the kernel cannot be built here")
    return module


def loop_truth(module, inputs, grads):
    """sum_i |g_i|^2 by one backward pass per example i of sum_calls <out_i, d_i>, float64."""
    params = [p for p in module.parameters() if p.requires_grad]
    total = 0.0
    for i in range(inputs[0].shape[0]):
        module.zero_grad()
        loss = sum((module(x[i:i + 1]).double() * g[i:i + 1].double()).sum()
                   for x, g in zip(inputs, grads))
        loss.backward()
        total += sum(float(p.grad.double().pow(2).sum()) for p in params)
    module.zero_grad()
    return total


def seq(n, t, k, dt):
    return torch.randn(n, t, k, dtype=dt)


# name: (layer, the inputs of its calls for a dtype); the Linear cases take each of the
# routine's forms: one position, register-blocked small products, batched products, Gram
CASES = {
    "linear-2d": (lambda: nn.Linear(7, 9), lambda dt: [torch.randn(6, 7, dtype=dt)]),
    "linear-no-bias": (lambda: nn.Linear(7, 5, bias=False), lambda dt: [torch.randn(6, 7, dtype=dt)]),
    "linear-seq-small": (lambda: nn.Linear(16, 48), lambda dt: [seq(6, 8, 16, dt)]),
    "linear-seq-ragged": (lambda: nn.Linear(5, 7), lambda dt: [torch.randn(6, 3, 2, 5, dtype=dt)]),
    "linear-seq-batched": (lambda: nn.Linear(80, 90), lambda dt: [seq(5, 6, 80, dt)]),
    "linear-seq-gram": (lambda: nn.Linear(200, 300), lambda dt: [seq(4, 3, 200, dt)]),
    "linear-two-calls": (lambda: nn.Linear(6, 4), lambda dt: [seq(5, 3, 6, dt), seq(5, 2, 6, dt)]),
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, padding=1, stride=2),
               lambda dt: [torch.randn(5, 4, 11, dtype=dt)]),
    "conv2d-groups": (lambda: nn.Conv2d(4, 6, 3, groups=2, padding=1, padding_mode="circular"),
                      lambda dt: [torch.randn(5, 4, 7, 6, dtype=dt)]),
    "embedding-small-vocab": (lambda: nn.Embedding(10, 6, padding_idx=2),
                              lambda dt: [torch.randint(10, (6, 12))]),
    "embedding-two-calls": (lambda: nn.Embedding(100, 5),
                            lambda dt: [torch.randint(100, (6, 9)), torch.randint(100, (6, 3))]),
    "layernorm": (lambda: nn.LayerNorm((3, 4)), lambda dt: [torch.randn(5, 6, 3, 4, dtype=dt)]),
    "layernorm-no-bias": (lambda: nn.LayerNorm(6, bias=False),
                          lambda dt: [torch.randn(5, 6, dtype=dt), seq(5, 2, 6, dt)]),
    "rmsnorm": (lambda: nn.RMSNorm(6), lambda dt: [seq(5, 4, 6, dt)]),
}


def with_random_parameters(module, dt):
    torch.manual_seed(1)
    module = module.to(dt)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()    # (norm layers start at weight 1, bias 0: not a test of the bias)
    return module


@pytest.mark.parametrize("name", CASES)
def test_each_layer_kind_equals_a_per_example_loop(routine, name):
    make, inputs_of = CASES[name]
    for dt, rel in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        torch.manual_seed(0)
        module = with_random_parameters(make(), dt)
        inputs = inputs_of(dt)
        grads = [torch.randn_like(module(x)) for x in inputs]
        truth = loop_truth(module, inputs, grads)
        job = job_function(module)(module, list(zip(inputs, grads)))
        [got, grad_sq] = norms_kernel.sums(routine, 1, [(0, *job)], [])
        assert grad_sq == 0.0
        assert got == pytest.approx(truth, rel=rel), name
        torch_path = float(layer_sq_norms(module, inputs, grads).double().sum())
        assert torch_path == pytest.approx(truth, rel=rel), name


def test_passes_and_gradients_are_summed_apart(routine):
    """Two passes' jobs land in their own sums; the last value is sum |grad|^2 over tensors of
    both dtypes, in double precision."""
    torch.manual_seed(0)
    lin = with_random_parameters(nn.Linear(4, 3), torch.float64)
    a, b = torch.randn(5, 4, dtype=torch.float64), torch.randn(7, 4, dtype=torch.float64)
    ga, gb = torch.randn(5, 3, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    job = job_function(lin)
    grads = [torch.randn(1000), torch.randn(33, dtype=torch.float64)]
    values = norms_kernel.sums(routine, 2, [(0, *job(lin, [(a, ga)])), (1, *job(lin, [(b, gb)]))],
                               grads)
    assert values[0] == pytest.approx(loop_truth(lin, [a], [ga]), rel=1e-12)
    assert values[1] == pytest.approx(loop_truth(lin, [b], [gb]), rel=1e-12)
    assert values[2] == pytest.approx(sum(float(g.double().pow(2).sum()) for g in grads),
                                      rel=1e-12)


def test_sparse_or_foreign_tensors_are_refused(routine):
    with pytest.raises(RuntimeError, match="dense CPU"):
        norms_kernel.sums(routine, 1, [], [torch.eye(3).to_sparse()])


def readings(make, batches, loss=F.cross_entropy):
    """The monitor's per-step (|G|^2, tr Sigma) on a fresh copy of the model (seed 0) over the
    batches."""
    torch.manual_seed(0)
    net = make()
    monitor = NoiseScaleMonitor(net, window=3)
    out = []
    for x, y in batches:
        net.zero_grad()
        loss(net(x), y).backward()
        r = monitor.step()
        assert r.method == "per_example"
        out.append((r.step_g_sq, r.step_trace_sigma))
    monitor.close()
    return net, out


def image_batch(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 2, 8, 8, generator=gen, dtype=torch.float64),
            torch.randint(3, (n,), generator=gen))


def lm_loss(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def language_model():
    """The library's byte-level TransformerLM (attention through Linear layers, no batch norm),
    its position table frozen: the model reads it as ``position.weight[:t]``, outside the
    layer's call, which the monitor refuses."""
    lm = TransformerLM(11, 8, 16, 2, 2, 2).double()
    lm.position.weight.requires_grad_(False)
    return lm


MODELS = {
    "mixed": (lambda: Mixed().double(), lambda s: token_batch(12, s), F.cross_entropy),
    "tiny-transformer": (lambda: TinyTransformer(vocab=7).double(), lambda s: token_batch(12, s),
                         F.cross_entropy),
    "resnet8": (lambda: ResNet8(2, 3, (4, 6, 8)).double(), lambda s: image_batch(10, s),
                F.cross_entropy),
    "transformer-lm": (language_model,
                       lambda s: (token_batch(6, s, vocab=11)[0],
                                  torch.randint(11, (6, 8), generator=torch.Generator()
                                                .manual_seed(s))), lm_loss),
}


# torch.func's per-example gradients (the ground truth) of the tiny transformer's fused
# attention run through vmap's slow fallback, and torch says so: expected, not a defect
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("name", MODELS)
def test_the_monitor_reads_the_same_with_and_without_the_routine(routine, name):
    make, batch, loss = MODELS[name]
    batches = [batch(s) for s in range(3)]
    _, compiled = readings(make, batches, loss)
    with kernels.disabled():
        net, eager = readings(make, batches, loss)
    for (g, t), (g_ref, t_ref) in zip(compiled, eager):
        assert g == pytest.approx(g_ref, rel=1e-10) and t == pytest.approx(t_ref, rel=1e-10)
    if loss is F.cross_entropy:     # the last batch against per-example gradients (torch.func)
        g_ref, t_ref = sample_estimate(net, *batches[-1])
        assert compiled[-1][0] == pytest.approx(g_ref, rel=1e-10, abs=1e-14)
        assert compiled[-1][1] == pytest.approx(t_ref, rel=1e-10)


def test_without_the_routine_the_monitor_warns_once_and_reads_the_same(monkeypatch, tmp_path):
    """A build that fails: one KernelWarning naming the routine and why, then the torch path's
    exact readings."""
    def broken(**kwargs):
        raise RuntimeError("Error building extension 'x':\nx.cpp:1:10: fatal error: Python.h: "
                           "No such file or directory\n")

    monkeypatch.delenv(kernels.REQUIRE_ENV, raising=False)
    monkeypatch.delenv(kernels.DISABLE_ENV, raising=False)
    monkeypatch.setattr("torch.utils.cpp_extension.load", broken)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))   # no complete build there
    compiled_kernel._build.cache_clear()
    try:
        batches = [token_batch(12, s) for s in range(2)]
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            net, got = readings(lambda: Mixed().double(), batches)
            readings(lambda: Mixed().double(), batches)
    finally:
        compiled_kernel._build.cache_clear()
    [w] = [w for w in record if issubclass(w.category, kernels.KernelWarning)]
    assert "'example_norms' is unavailable" in str(w.message)
    assert "Python.h" in str(w.message) and "torch operators" in str(w.message)
    g_ref, t_ref = sample_estimate(net, *batches[-1])
    assert got[-1][0] == pytest.approx(g_ref, rel=1e-10, abs=1e-14)
    assert got[-1][1] == pytest.approx(t_ref, rel=1e-10)


class HooksItsOwnOutput(nn.Module):
    """A model that registers its own gradient hook on a layer's output (after the monitor's,
    which runs inside the layer's call) and removes another."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen
        self.lin = nn.Linear(5, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.lin(x)
        h.register_hook(lambda g: self.seen.append(g.clone()))
        h.register_hook(lambda g: g * 0).remove()
        return self.head(torch.tanh(h))


def test_a_model_hooking_its_layers_outputs_keeps_its_hooks_and_the_reading():
    seen = []
    torch.manual_seed(0)
    net = HooksItsOwnOutput(seen).double()
    monitor = NoiseScaleMonitor(net)
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(9, 5, generator=gen, dtype=torch.float64), torch.randint(3, (9,), generator=gen)
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    r = monitor.step()
    assert len(seen) == 1 and seen[0].shape == (9, 6)
    g_ref, t_ref = sample_estimate(net, x, y)
    assert r.step_g_sq == pytest.approx(g_ref, rel=1e-10, abs=1e-14)
    assert r.step_trace_sigma == pytest.approx(t_ref, rel=1e-10)
