"""Noise scales beside :class:`theory.NoiseScaleMonitor`'s whole-model one: per layer, of the
normalization layers alone, and of Adam's preconditioned gradient (:class:`Parts`).

All rest on the monitor's identity (:mod:`theory.monitor.monitor`) restricted to some of the
coordinates, or taken after an elementwise map of them: the two averages of squared norms
u_small and u_big are split over the same coordinates, and each part solves its own pair

    tr(Sigma_S) ~ (u_small,S - u_big,S) / (c_small - c_big),   |G_S|^2 ~ u_big,S - c_big tr(Sigma_S)

with the whole model's coefficients c, so each part is unbiased where the whole is.

- **Per layer** (``per_layer=True``): S the parameters of one module, B_l = tr(Sigma_l) / |G_l|^2.
  The layers' |G_l|^2 and tr(Sigma_l) add up to the whole model's, so the combination is the
  weighted mean B_simple = sum_l w_l B_l with w_l = |G_l|^2 / |G|^2.
- **Normalization layers** (``norm_layers=True``): S the weights and biases of every LayerNorm,
  RMSNorm, GroupNorm and batch-normalization layer together. Gray et al. (2024, "Normalization
  layer per-example gradients are sufficient to predict gradient noise scale in transformers")
  find that this part's B_simple tracks the whole model's in transformers, and it is cheap:
  one weight and bias per feature. Under the per-example estimator it reads the same layers'
  per-example norms as the whole-model estimate; batch normalization in training mode mixes a
  batch's examples (an example's gradient is not defined alone), so a model with it gets the
  micro-batch estimator, whose micro-batch gradients are defined.
- **Preconditioned** (``optimizer=`` an ``Adam`` or ``AdamW``): every gradient scaled
  elementwise by P = 1 / (sqrt(v_hat) + eps), v_hat = v / (1 - beta2^t) the optimizer's
  bias-corrected second moment (``max_exp_avg_sq`` under ``amsgrad``), as AdaptDL / Pollux does
  for adaptive optimizers (Qiao et al. 2021, "Pollux: Co-adaptive Cluster Scheduling for
  Goodput-Optimized Deep Learning"): B_pre = tr(P Sigma P) / |P G|^2, from the same two averages
  as the whole model's: under the per-example estimator |P o g_i|^2 per example
  (:mod:`theory.monitor.preconditioned`, which forms each example's gradient of one layer at a
  time except for a Linear layer on one position), under the micro-batch one |P o g_j|^2 per
  micro-batch, as AdaptDL does. P is read from the optimizer's state at the step (at its first
  backward pass under micro-batches) and is the same for the whole step: the optimizer has not
  stepped since. Before the optimizer's first step there is no v_hat and the reading is nan.

Cost: the parts take their sums with torch operators (not the compiled kernel), one host read
per step under the per-example estimator, and one norm per parameter and backward under the
micro-batch one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from theory.errors import TheoryError
from theory.estimators.sampling import noise_scale
from theory.monitor.layer_norms import Terms
from theory.monitor.preconditioned import scaled_function
from theory.monitor.readings import PartReading, Smoother, solve_two_sizes

NORM_LAYERS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, _BatchNorm)
# the parts' names beside the layers' module names, which cannot take these (nor can a module
# name be empty, the model's own, whose parameters are named ROOT)
PRECONDITIONED, NORM, ROOT = "<preconditioned>", "<norm layers>", "<model>"


def owners(module: nn.Module, params: Sequence[nn.Parameter]
           ) -> list[tuple[str, nn.Module, list[int]]]:
    """The modules owning the trainable ``params``: (name, module, indices into ``params``)."""
    index = {id(p): i for i, p in enumerate(params)}
    found = []
    for name, m in module.named_modules():
        own = [index[id(p)] for p in m._parameters.values() if p is not None and id(p) in index]
        if own:
            found.append((name or ROOT, m, own))
    return found


def preconditioner(optimizer: torch.optim.Optimizer, params: Sequence[nn.Parameter]
                   ) -> list[torch.Tensor | None] | None:
    """P = 1 / (sqrt(v_hat) + eps) for each of ``params`` (None for one the optimizer does not
    hold), or None before the optimizer's first step (module docstring)."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    held, moments, corrections, eps = [], [], [], []
    for i, p in enumerate(params):
        state, group = optimizer.state.get(p), group_of.get(id(p))
        if group is None:
            continue
        if not state or "exp_avg_sq" not in state:
            return None
        held.append(i)
        moments.append(state["max_exp_avg_sq"] if group.get("amsgrad") else state["exp_avg_sq"])
        corrections.append(1.0 - group["betas"][1] ** float(state["step"]))
        eps.append(group["eps"])
    out: list[torch.Tensor | None] = [None] * len(params)
    if held:
        # (fused over the parameters: a per-parameter loop of four operators dominated)
        scales = torch._foreach_sqrt(torch._foreach_div(moments, corrections))
        torch._foreach_add_(scales, eps)
        torch._foreach_reciprocal_(scales)
        for i, s in zip(held, scales):
            out[i] = s
    return out


def check_optimizer(optimizer: object) -> None:
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise TheoryError(f"optimizer must be a torch.optim.Adam or AdamW (its second moment "
                          f"gives the preconditioner), got {type(optimizer).__name__}")


def _squares(grads: Sequence[torch.Tensor | None], scale: Sequence[torch.Tensor | None] | None
             ) -> torch.Tensor:
    """[|s_p g_p|^2 for each parameter p] in float64, 0 where g_p is None (s: ``scale``, or 1)."""
    held = [i for i, g in enumerate(grads)
            if g is not None and (scale is None or scale[i] is not None)]
    out = torch.zeros(len(grads), dtype=torch.float64)
    if held:
        tensors = [grads[i] for i in held]
        if scale is not None:
            tensors = torch._foreach_mul(tensors, [scale[i] for i in held])
        found = torch._foreach_norm(tensors)
        out[held] = torch.stack([n.double() for n in found]).square().cpu()
    return out


class Parts:
    """The parts a monitor reads (module docstring) and their smoothing; ``passes``: whether
    there is a preconditioned part."""

    def __init__(self, module: nn.Module, params: list[nn.Parameter], per_layer: bool,
                 norm_layers: bool, optimizer: torch.optim.Optimizer | None,
                 window: int | None, ema: float | None) -> None:
        self.params, self.optimizer = params, optimizer
        self.owners = owners(module, params)
        # each owner's parameters by their names in it (for the per-example preconditioner)
        index = {id(p): i for i, p in enumerate(params)}
        self.names = [{k: index[id(p)] for k, p in m._parameters.items()
                       if p is not None and id(p) in index} for _, m, _ in self.owners]
        self.groups: list[tuple[str, list[int]]] = []
        if per_layer:
            self.groups += [(name, [o]) for o, (name, _, _) in enumerate(self.owners)]
        if norm_layers:
            norms = [o for o, (_, m, _) in enumerate(self.owners) if isinstance(m, NORM_LAYERS)]
            if not norms:
                raise TheoryError(f"norm_layers=True: the model ({type(module).__name__}) has no "
                                  f"trainable LayerNorm, RMSNorm, GroupNorm or batch-norm layer")
            self.groups.append((NORM, norms))
        # the owners some group reads: only their per-example terms are taken
        self.needed = {o for _, group in self.groups for o in group}
        self.needed_params = {i for o in self.needed for i in self.owners[o][2]}
        if optimizer is not None:
            check_optimizer(optimizer)
        self.passes = optimizer is not None
        names = [name for name, _ in self.groups] + ([PRECONDITIONED] if self.passes else [])
        self.smoothers = {name: Smoother(window, ema) for name in names}
        self._last: dict[str, tuple[float, ...]] = {}
        self._scale: list[torch.Tensor | None] | None = None
        self._scale_read = False

    # -- what a step captures ----------------------------------------------------------------

    def scale(self) -> list[torch.Tensor | None] | None:
        """This step's P, read once per step (None before the optimizer's first step)."""
        if not self._scale_read:
            self._scale = preconditioner(self.optimizer, self.params)
            self._scale_read = True
        return self._scale

    def on_backward(self, grads: Sequence[torch.Tensor | None]
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One micro-batch backward pass's per-parameter squared norms, plain and preconditioned
        (None where there is no preconditioner)."""
        with torch.no_grad():
            p = self.scale() if self.passes else None
            return _squares(grads, None), None if p is None else _squares(grads, p)

    def reset(self) -> None:
        self._scale, self._scale_read = None, False

    # -- per-owner sums ------------------------------------------------------------------------

    def owner_sums(self, squares: torch.Tensor) -> list[float]:
        """Per-parameter squares summed over each owner's parameters."""
        values = squares.tolist()
        return [math.fsum(values[i] for i in own) for _, _, own in self.owners]

    def grad_squares(self, scaled: bool = False) -> torch.Tensor:
        """Per-parameter squared norms of ``.grad``: preconditioned with ``scaled``, else those
        of the needed owners' parameters only (0 for the others)."""
        grads = [p.grad if scaled or i in self.needed_params else None
                 for i, p in enumerate(self.params)]
        grads = [g.coalesce().to_dense() if g is not None and g.is_sparse else g for g in grads]
        with torch.no_grad():
            return _squares(grads, self.scale() if scaled else None)

    def example_sums(self, capture: Any, calls: list) -> tuple[list[list[float]],
                                                                  list[float] | None]:
        """Per pass, each needed owner's sum over the pass's examples of their squared gradient
        norms (0 for the others), from the capture's per-example terms (the functions of
        :meth:`theory.monitor.capture.Capture.pass_terms`, one layer at a time); and per pass
        the sum of the preconditioned ones (:mod:`theory.monitor.preconditioned`), or None
        where there is no preconditioner."""
        owner_of = {name: o for o, (name, _, _) in enumerate(self.owners)}
        layers, terms_of = capture.layer_list, capture.terms_of
        scales = self.scale() if self.passes else None
        found, where = [], []           # where: (pass, owner), owner -1 the preconditioned sum
        with torch.no_grad():
            for j, run in enumerate(calls):
                for index, pairs in run:
                    name, module = layers[index]
                    owner = owner_of[name or ROOT]
                    jobs = [(owner, terms_of[index], ())] if owner in self.needed else []
                    if scales is not None:
                        own = {k: scales[i] for k, i in self.names[owner].items()}
                        jobs.append((-1, scaled_function(module), (own,)))
                    for key, function, extra in jobs:
                        terms = Terms()
                        function(terms, module, pairs, *extra)
                        found.append(terms.per_example(pairs[0][0].shape[0], pairs[0][1])
                                     .double().sum())
                        where.append((j, key))
            # (one host read for all of them)
            values = torch.stack(found).tolist() if found else []
        out = [[0.0] * len(self.owners) for _ in calls]
        pre = None if scales is None else [0.0] * len(calls)
        for (j, key), value in zip(where, values):
            if key < 0:
                pre[j] += value
            else:
                out[j][key] += value
        return out, pre

    # -- readings ------------------------------------------------------------------------------

    def _reading(self, name: str, g: float, t: float) -> PartReading:
        if math.isfinite(g) and math.isfinite(t):
            self._last[name] = self.smoothers[name].add(g, t)
        # a step without a reading (no preconditioner yet) keeps the smoothed values as they were
        g_s, t_s, b_s, g_se, t_se, b_se = self._last.get(name, (math.nan,) * 6)
        return PartReading(b_s, g_s, t_s, b_se, g_se, t_se, noise_scale(t, g), g, t, name=name)

    def read(self, u_small: list[float], c_small: float, u_big: list[float], c_big: float,
             pre: tuple[float, float, float, float] | None) -> tuple[PartReading, ...]:
        """The parts' readings from the owners' two averages with their coefficients, and the
        preconditioned whole model's (u_small, c_small, u_big, c_big), or None where there is
        no preconditioner yet."""
        out = []
        for name, group in self.groups:
            g, t = solve_two_sizes(math.fsum(u_small[o] for o in group), c_small,
                                   math.fsum(u_big[o] for o in group), c_big)
            out.append(self._reading(name, g, t))
        if self.passes:
            g, t = (math.nan, math.nan) if pre is None else \
                solve_two_sizes(*pre)
            out.append(self._reading(PRECONDITIONED, g, t))
        return tuple(out)
