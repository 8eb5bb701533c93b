"""Initialization schemes of a built model: PyTorch's own (``"torch"``) or Lee et al.'s (``"lee"``).

``"torch"`` leaves the model as its builder made it (for the registered models, PyTorch's
default: Kaiming-uniform with a = sqrt(5) for Linear / Conv weights, std 1 / sqrt(3 fan_in), and
non-zero uniform biases; ``transformer_lm``: GPT-2's).

``"lee"`` is Lee, Ajanthan, Torr & Jaggi (2021)'s initialization, read from their released code
(``namhoonlee/effect-dps-public``, ``edps/network.py``, ``Network.construct_weights``; their
README asks for TensorFlow >= 1.14): every weight variable (rank > 1) is drawn by TensorFlow
1.x's ``tf.variance_scaling_initializer()``
at its defaults, scale 1.0, mode ``"fan_in"``, distribution ``"truncated_normal"``, and every
bias (rank 1) is ``tf.zeros_initializer()``. TensorFlow's VarianceScaling draws
``tf.truncated_normal(shape, 0, sigma)`` with

    sigma = sqrt(scale / fan_in) / 0.87962566103423978,

and ``tf.truncated_normal`` drops and re-draws every value more than two standard deviations
(two sigma, the untruncated normal's) from the mean. 0.87962566103423978 is the standard
deviation of a standard normal truncated to [-2, 2], so the values drawn have standard deviation
sqrt(1 / fan_in) exactly. TensorFlow reads ``fan_in`` from the variable's shape
(``_compute_fans``): ``shape[0]`` of a matrix ``[in, out]``, ``prod(kernel) * shape[-2]`` of a
convolution filter ``[*kernel, in, out]``.

The rule for each layer kind, in PyTorch's layouts (:func:`rules_of`):

- ``nn.Linear`` (and its subclasses): weight ``[out, in]``, fan_in = in; bias zero.
- ``nn.Conv1d/2d/3d``: weight ``[out, in / groups, *kernel]``, fan_in = in / groups *
  prod(kernel), TF's filter ``[*kernel, in, out]``; bias zero.
- ``nn.ConvTranspose1d/2d/3d``: weight ``[in, out / groups, *kernel]``, fan_in = out / groups *
  prod(kernel): TF's transposed-convolution filter is ``[*kernel, out, in]`` and TF's rule reads
  the shape, not the direction of the layer (PyTorch's ``_calculate_fan_in_and_fan_out`` gives
  the same number). Bias zero.
- ``nn.Embedding`` / ``nn.EmbeddingBag``: weight ``[num_embeddings, dim]``, fan_in =
  num_embeddings (an embedding is a Linear layer on one-hot inputs, and TF's rule on a
  ``[num, dim]`` variable gives the same); the ``padding_idx`` row zero, as PyTorch keeps it.
- ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` and their cells: every ``weight_ih`` / ``weight_hh`` /
  ``weight_hr`` matrix ``[gates * hidden, in]`` as a Linear layer, fan_in = its column count;
  every bias zero.
- ``nn.MultiheadAttention``: ``in_proj_weight`` (or ``q/k/v_proj_weight``) as Linear layers,
  ``in_proj_bias``, ``bias_k``, ``bias_v`` zero; ``out_proj`` is a Linear layer.
- normalization layers (BatchNorm, InstanceNorm, LayerNorm, GroupNorm, RMSNorm): weight one,
  bias zero (TensorFlow's and PyTorch's defaults: gamma 1, beta 0).

Lee et al.'s networks have Linear and Conv2d layers only; the other rows are our reading of the
same rule. A module holding a parameter no rule covers (a user's own ``nn.Parameter``, PReLU,
...) is refused in one :class:`training.models.ModelError` line naming it, so that ``"lee"``
never leaves part of a network at another initialization unnoticed.

Draws come from a ``torch.Generator`` seeded with the model's seed, parameter by parameter in
``named_parameters()`` order, in float64 then rounded to the parameter's dtype (a float32 and a
float64 model of one seed hold the same values up to rounding); the caller's generators are
untouched. A trial's own initialization seed, where each trial of a group has its own
(``[pruning] mask_per_trial``), is :func:`trial_init_seed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from training.errors import SparsescaleError

INITS = ("torch", "lee")
# TF's VarianceScaling: the std of a standard normal truncated to [-2, 2]
# (tensorflow/python/ops/init_ops.py), and tf.truncated_normal's cut, in standard deviations.
TF_TRUNCATED_STD = 0.87962566103423978
TRUNCATION = 2.0
# tag of the initialization seeds in numpy's SeedSequence (data order and random draws have
# their own: training.schedules.order.trial_seed, training.randomness.randomness_seed)
_INIT_TAG = 0x1417

NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm,
         *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()))


class InitError(SparsescaleError, ValueError):
    """An initialization scheme is unknown or cannot cover a model's parameter."""


@dataclass(frozen=True)
class Rule:
    """How one parameter is initialized: ``kind`` ``"variance_scaling"`` (truncated normal of
    std ``sigma`` before truncation, cut at two sigma), ``"zeros"`` or ``"ones"``; ``fan_in``
    for variance scaling; ``padding_idx``: an embedding row kept zero."""

    kind: str
    fan_in: int | None = None
    padding_idx: int | None = None

    @property
    def sigma(self) -> float:
        """sqrt(1 / fan_in) / 0.87962566103423978: TF's VarianceScaling at scale 1, fan_in."""
        return variance_scaling_sigma(self.fan_in or 1)


def variance_scaling_sigma(fan_in: int, scale: float = 1.0) -> float:
    """TensorFlow's VarianceScaling (``distribution="truncated_normal"``, ``mode="fan_in"``):
    the standard deviation of the normal before its truncation at two of them,
    sqrt(scale / fan_in) / 0.87962566103423978, so that the truncated values have standard
    deviation sqrt(scale / fan_in)."""
    return math.sqrt(scale / fan_in) / TF_TRUNCATED_STD


def check_init(init: object, who: str = "init") -> str:
    """``init`` if it is one of :data:`INITS`, else one :class:`InitError` line."""
    if not isinstance(init, str) or init not in INITS:
        raise InitError(f"{who}: unknown initialization {init!r}; allowed: {', '.join(INITS)}")
    return init


def trial_init_seed(seed: int, index: int) -> int:
    """The initialization seed of trial ``index`` of a group with seed ``seed`` when every trial
    has its own (Lee et al. 2021's ``edps/main.py``: every run re-initializes with
    ``tf.set_random_seed(run)`` and prunes again): numpy's ``SeedSequence([seed, index,
    0x1417])``'s first 32-bit word. Independent of the group's size and batch size, so trial
    ``index`` starts from the same weights (and mask) at every batch size of a seed."""
    return int(np.random.SeedSequence([int(seed), int(index), _INIT_TAG])
               .generate_state(1, dtype=np.uint32)[0])


def _matrix(p: nn.Parameter) -> Rule:
    return Rule("variance_scaling", int(p.shape[1]))


def _rule(module: nn.Module, name: str, p: nn.Parameter) -> Rule | None:
    """The rule of ``module``'s own parameter ``name`` (module docstring), None: no rule."""
    if name == "bias" or name.startswith("bias_") or name.endswith("_bias"):
        return Rule("zeros")
    if isinstance(module, NORMS):
        return Rule("ones") if name == "weight" else None
    if isinstance(module, nn.Linear) and name == "weight":
        return _matrix(p)
    if isinstance(module, nn.modules.conv._ConvNd) and name == "weight":
        return Rule("variance_scaling", int(p.shape[1] * math.prod(p.shape[2:])))
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and name == "weight":
        return Rule("variance_scaling", int(p.shape[0]), module.padding_idx)
    if isinstance(module, (nn.RNNBase, nn.RNNCellBase)) and name.startswith("weight_") \
            and p.dim() == 2:
        return _matrix(p)
    if isinstance(module, nn.MultiheadAttention) and name.endswith("proj_weight"):
        return _matrix(p)
    return None


def rules_of(model: nn.Module) -> dict[str, Rule]:
    """The rule of every parameter of ``model`` (``named_parameters`` order; a shared parameter
    once, by its first owner), or one :class:`InitError` naming a parameter no rule covers."""
    owners: dict[int, tuple[nn.Module, str]] = {}
    for _, module in model.named_modules():
        for local, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), (module, local))
    out = {}
    for name, p in model.named_parameters():
        module, local = owners[id(p)]
        if isinstance(p, nn.parameter.UninitializedParameter):
            raise InitError(f"init 'lee': parameter {name!r} of {type(module).__name__} is "
                            f"uninitialized (lazy): call the model once on an example batch "
                            f"first, or use init = 'torch'")
        rule = _rule(module, local, p)
        if rule is None:
            raise InitError(
                f"init 'lee': parameter {name!r} of {type(module).__name__} has no rule; "
                f"Lee et al.'s initialization covers Linear, Conv, ConvTranspose, Embedding, "
                f"RNN / GRU / LSTM, MultiheadAttention and normalization layers; allowed: "
                f"init = 'torch', or hold it in one of those layers")
        if rule.kind == "variance_scaling" and not rule.fan_in:
            raise InitError(f"init 'lee': parameter {name!r} has fan_in 0 (shape "
                            f"{tuple(p.shape)}); allowed: layers with at least one input")
        out[name] = rule
    return out


@torch.no_grad()
def truncated_normal_(t: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """Fill ``t`` with N(0, sigma^2) truncated to [-2 sigma, 2 sigma] (``tf.truncated_normal``'s
    distribution; drawn in float64 on the CPU by inverse-CDF sampling, then copied)."""
    draw = torch.empty(t.shape, dtype=torch.float64)
    nn.init.trunc_normal_(draw, 0.0, sigma, -TRUNCATION * sigma, TRUNCATION * sigma,
                          generator=generator)
    return t.copy_(draw)


@torch.no_grad()
def lee_init_(model: nn.Module, seed: int) -> nn.Module:
    """Re-initialize ``model`` in place with Lee et al.'s rule (module docstring), from a
    generator seeded with ``seed``; returns it."""
    rules = rules_of(model)   # every parameter checked before any changes
    g = torch.Generator().manual_seed(int(seed))
    params = dict(model.named_parameters())
    for name, rule in rules.items():
        p = params[name]
        if rule.kind == "zeros":
            p.zero_()
        elif rule.kind == "ones":
            p.fill_(1.0)
        else:
            truncated_normal_(p, rule.sigma, g)
            if rule.padding_idx is not None:
                p[rule.padding_idx].zero_()
    return model


def initialize(model: nn.Module, init: str, seed: int) -> nn.Module:
    """``model`` initialized by scheme ``init`` (:data:`INITS`) with ``seed``: ``"torch"``
    leaves it as built, ``"lee"`` is :func:`lee_init_`."""
    if check_init(init) == "lee":
        lee_init_(model, seed)
    return model
