"""Lee et al. (2021)'s initialization (``init="lee"``) against the distribution it claims to draw:
TensorFlow's VarianceScaling (scale 1, fan_in, truncated normal), biases zero.

Ground truth is independent of the code: scipy's truncated normal for the constant, the
moments and the CDF; fan-ins written out by hand from each layer's shape. Tolerances come from
the sampling distribution of the statistics (stated at each assertion)."""

import math

import numpy as np
import pytest
import scipy.stats
import torch
from torch import nn

import training
from training.models.initialization import (
    INITS, TF_TRUNCATED_STD, InitError, initialize, lee_init_, rules_of, trial_init_seed,
)

# the standard normal truncated to [-2, 2]: its moments (scipy, independent of the code)
TRUNC = scipy.stats.truncnorm(-2.0, 2.0)
KURTOSIS = float(TRUNC.moment(4) / TRUNC.moment(2) ** 2)   # about 2.36 (3 untruncated)
Z = 5.0   # tolerance in standard errors: P(|N(0,1)| > 5) = 6e-7 per check


def std_tolerance(std: float, n: int) -> float:
    """Z standard errors of the sample standard deviation of n draws with standard deviation
    ``std`` and kurtosis KURTOSIS: Var(s^2) = (mu4 - std^4) / n, so by the delta method
    SE(s) = std sqrt((KURTOSIS - 1) / (4 n))."""
    return Z * std * math.sqrt((KURTOSIS - 1) / (4 * n))


def check_variance_scaling(w: torch.Tensor, fan_in: int, name: str = "") -> None:
    """``w`` drawn from N(0, sigma^2) cut at +-2 sigma, sigma = sqrt(1/fan_in) / 0.8796...: its
    standard deviation sqrt(1 / fan_in) within sampling error, its mean 0 within Z standard
    errors (std / sqrt(n)), and no value beyond two untruncated standard deviations."""
    x = w.detach().double().flatten()
    n = x.numel()
    want = math.sqrt(1.0 / fan_in)
    sigma = want / TF_TRUNCATED_STD
    assert abs(float(x.std()) - want) <= std_tolerance(want, n), name
    assert abs(float(x.mean())) <= Z * want / math.sqrt(n), name
    assert float(x.abs().max()) <= 2 * sigma * (1 + 1e-6), name   # float32 rounding of the cut


def test_tf_constant_is_the_std_of_the_standard_normal_truncated_at_two():
    assert TF_TRUNCATED_STD == pytest.approx(TRUNC.std(), rel=1e-15)


def test_a_large_layer_has_tf_variance_scaling_distribution():
    """One million draws of a Linear(1000, 1000): the standard deviation sqrt(1/1000) within 5
    standard errors (0.29 % of it), the cut exactly at two untruncated standard deviations
    (reached to 0.1 %: about 226 of the draws lie in its last 0.1 %), the whole distribution by
    Kolmogorov-Smirnov against scipy's truncated normal (critical value at p = 1e-6, 2.63 /
    sqrt(n)), and zero biases."""
    layer = nn.Linear(1000, 1000)
    lee_init_(layer, seed=0)
    check_variance_scaling(layer.weight, 1000)
    sigma = math.sqrt(1 / 1000) / TF_TRUNCATED_STD
    x = layer.weight.detach().double().flatten().numpy()
    assert np.abs(x).max() <= 2 * sigma * (1 + 1e-6)
    assert np.abs(x).max() >= 2 * sigma * 0.999
    ks = scipy.stats.kstest(x / sigma, TRUNC.cdf).statistic
    assert ks <= 2.63 / math.sqrt(x.size)
    assert torch.count_nonzero(layer.bias) == 0


def test_seeded_reproducible_and_the_callers_generator_untouched():
    ds = training.data.load("teacher", n=100, dim=8, num_classes=3, seed=1)
    state = torch.get_rng_state()
    a = training.models.build("mlp", ds, seed=4, init="lee")
    b = training.models.build("mlp", ds, seed=4, init="lee")
    c = training.models.build("mlp", ds, seed=5, init="lee")
    assert torch.equal(torch.get_rng_state(), state)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q)
        assert name.endswith("bias") or not torch.equal(p, r)
    # float64 and float32 copies of one seed: the same draws up to float32 rounding
    d = lee_init_(training.models.build("mlp", ds, seed=4).double(), seed=4)
    for p, q in zip(a.parameters(), d.parameters()):
        torch.testing.assert_close(p.double(), q, rtol=1e-7, atol=0)


def test_torch_init_leaves_the_model_as_built():
    ds = training.data.load("teacher", n=100, dim=8, num_classes=3, seed=1)
    a = training.models.build("mlp", ds, seed=2)
    b = training.models.build("mlp", ds, seed=2, init="torch")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert any(torch.count_nonzero(p) for n, p in a.named_parameters() if n.endswith("bias"))


def test_lee_cnn_every_layer_by_its_fan_in():
    """Lee et al.'s Simple-CNN (their network.py's shapes): conv 5x5x1 -> fan_in 25, conv 5x5x32
    -> 800, dense 1024 -> 1024; biases zero."""
    x = torch.zeros(2, 1, 28, 28)
    ds = training.Dataset("img", "classification", x, torch.zeros(2, dtype=torch.long), x,
                          torch.zeros(2, dtype=torch.long), 10, (1, 28, 28))
    net = training.models.build("lee_cnn", ds, seed=0, init="lee")
    fans = {"0.weight": 25, "3.weight": 800, "7.weight": 1024}
    for name, p in net.named_parameters():
        if name in fans:
            check_variance_scaling(p, fans[name], name)
        else:
            assert name.endswith("bias") and torch.count_nonzero(p) == 0, name
    assert {k: r.fan_in for k, r in rules_of(net).items() if r.fan_in} == fans


class UserNet(nn.Module):
    """A model the rule was not written for: embedding, GRU, attention, batch and layer norm,
    1-D and transposed convolutions, grouped convolution."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(300, 48, padding_idx=0)
        self.gru = nn.GRU(48, 64, num_layers=2, batch_first=True)
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True, add_bias_kv=True)
        self.norm = nn.LayerNorm(64)
        self.conv = nn.Conv1d(64, 96, 3, groups=2)
        self.bn = nn.BatchNorm1d(96)
        self.up = nn.ConvTranspose1d(96, 40, 4, stride=2)
        self.head = nn.Linear(40, 5)

    def forward(self, tokens):
        h, _ = self.gru(self.embed(tokens.long()))
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0])
        h = self.up(torch.relu(self.bn(self.conv(h.transpose(1, 2)))))
        return self.head(h.mean(-1))


def test_a_users_module_with_gru_attention_and_batch_norm():
    net = lee_init_(UserNet(), seed=3)
    # fan-ins from each layer's shape, written out
    fans = {"embed.weight": 300, "gru.weight_ih_l0": 48, "gru.weight_hh_l0": 64,
            "gru.weight_ih_l1": 64, "gru.weight_hh_l1": 64, "attn.in_proj_weight": 64,
            "attn.out_proj.weight": 64, "conv.weight": 32 * 3, "up.weight": 40 * 4,
            "head.weight": 40}
    ones = {"norm.weight", "bn.weight"}
    params = dict(net.named_parameters())
    for name, p in params.items():
        if name in fans:
            w = p[1:] if name == "embed.weight" else p   # the padding row is zero
            check_variance_scaling(w, fans[name], name)
        elif name in ones:
            assert torch.equal(p, torch.ones_like(p)), name
        else:   # every bias, GRU's and attention's included (bias_k, bias_v)
            assert "bias" in name and torch.count_nonzero(p) == 0, name
    assert torch.count_nonzero(params["embed.weight"][0]) == 0
    assert set(params) == set(fans) | ones | {n for n in params if "bias" in n}
    assert net(torch.randint(0, 300, (3, 11)).float()).shape == (3, 5)


@pytest.mark.parametrize("module, name", [
    (nn.Sequential(nn.Linear(4, 4), nn.PReLU()), "1.weight"),
    (nn.Sequential(nn.Bilinear(3, 3, 2)), "0.weight"),
])
def test_a_parameter_without_a_rule_is_refused_before_anything_changes(module, name):
    before = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(InitError, match=rf"parameter '{name}' .* no rule.*allowed: init = 'torch'"):
        lee_init_(module, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_a_users_own_parameter_is_refused():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x):
            return self.scale * self.lin(x)

    with pytest.raises(InitError, match="'scale' of Scaled has no rule"):
        initialize(Scaled(), "lee", 0)


def test_unknown_init_names_the_allowed_values():
    ds = training.data.load("teacher", n=100, dim=8, num_classes=3, seed=1)
    with pytest.raises(InitError, match="unknown initialization 'tf'; allowed: torch, lee"):
        training.models.build("mlp", ds, init="tf")
    assert INITS == ("torch", "lee")


def test_trial_init_seeds_are_fixed_distinct_and_not_the_group_seed():
    seeds = [trial_init_seed(0, i) for i in range(100)]
    assert len(set(seeds)) == 100 and 0 not in seeds
    assert seeds[:3] == [trial_init_seed(0, 0), trial_init_seed(0, 1), trial_init_seed(0, 2)]
    assert trial_init_seed(1, 0) != trial_init_seed(0, 1)
    # pinned: a change would re-initialize every stored per-trial study
    assert trial_init_seed(0, 0) == int(np.random.SeedSequence([0, 0, 0x1417])
                                        .generate_state(1, dtype=np.uint32)[0])


def test_a_lazy_layer_is_refused_in_one_line():
    with pytest.raises(InitError, match=r"'0.weight' of LazyLinear is uninitialized \(lazy\)"):
        lee_init_(nn.Sequential(nn.LazyLinear(3)), seed=0)


def test_lee_cnn_without_biases_has_the_biased_networks_weights():
    """The bias control's dense network (issue 47): ``bias=False`` drops the three biases (106
    parameters) and, under Lee's initialization (no bias is drawn), keeps every weight of the
    biased network of the same seed, so the two are paired runs."""
    x = torch.zeros(2, 1, 28, 28)
    ds = training.Dataset("img", "classification", x, torch.zeros(2, dtype=torch.long), x,
                          torch.zeros(2, dtype=torch.long), 10, (1, 28, 28))
    biased = training.models.build("lee_cnn", ds, seed=5, init="lee")
    bare = training.models.build("lee_cnn", ds, seed=5, init="lee", bias=False)
    weights = {n: p for n, p in biased.named_parameters() if n.endswith("weight")}
    assert {n for n, _ in bare.named_parameters()} == set(weights)
    assert sum(p.numel() for p in bare.parameters()) == 62_346 - (32 + 64 + 10)
    assert all(torch.equal(p, weights[n]) for n, p in bare.named_parameters())
    with pytest.raises(training.errors.ModelError, match="bias must be true or false"):
        training.models.build("lee_cnn", ds, bias="no")
