"""Probes along a training run: replay a trial once and measure noise and smoothness at given steps.

The run is replayed ONCE, to its last probed step, by the plain reference loop
(``training.replay.replay_snapshots``: bit for bit ``training.train_schedule_reference``, same data
order, learning-rate schedule and mask as the trial it reproduces), snapshotting the weights at
every probed step on the way, so the weights probed are the run's own. At each probe step t,
on the full training split by default (``examples`` for a sample, estimates still unbiased for
the split, :mod:`theory.estimators.sampling`):

- ``g_sq``, ``trace_sigma``: |G|^2 and tr(Sigma) averaged over ``average`` consecutive weights
  w_t .. w_{t+a-1} (shifted left so they end at the horizon), ``b_simple`` = the ratio of those
  averages (McCandlish et al. 2018, appendix A: average numerator and denominator separately);
- ``b_noise`` and ``g_h_g``: tr(H Sigma) / (G^T H G) and G^T H G at the window's first weights;
- ``hessian_top``: the top Hessian eigenvalue, ``lanczos`` Lanczos steps (:func:`theory.lanczos_top`);
- ``local_lipschitz``: Lee et al. (2021)'s local Lipschitz constant of the run's own update out
  of the window's first weights (max over their gamma grid 0.1..0.9; gradients over kept
  weights only, ``theory.local_lipschitz``), reusing the noise pass's mean gradient;
- ``loss``: the mean training loss at the window's first weights.

Rows are long-format, with the columns of :data:`theory.verdicts.summaries.PROBE_COLUMNS`; ``fraction`` =
t / ``horizon`` (H, the run's steps-to-result).

Lee et al.'s own schedule (``theory.stage_steps``: every N steps from N on) asks for two
options. ``lipschitz_update="into"``: L of the update that ENDS at t, from w_{t-1} to w_t, as
their ``edps/train.py`` logs it at iteration t (it keeps w_{t-1} and its gradient one step
before, when ``(itr+1) % lipschitz_interval == lipschitz_interval - 1``, and measures after
update t); the default ``"from"`` measures the update out of w_t. ``lipschitz_examples``: L's
gradients on a fixed sample of the training split (seeded by ``lipschitz_seed``, the same for
every run) instead of the whole split, where the whole split costs too much. ``quantities``
picks what is measured (the schedule skips the Hessian's). ``states`` takes the states of a
replay already made (:func:`replay_states` at :func:`needed_steps`), so one run probed twice is
replayed once.

The replay trains as the trial did (train mode); every measurement is of the eval-mode network
(:mod:`theory.estimators.functional`). Its buffers, batch normalization's running statistics, are those the
replayed state carries (``load_state_dict(strict=False)``); a state that holds only parameters
leaves the model's own, those of step 0.

Cost: one replay of H steps per run (one pass, no evaluations; for the SGD family without
``torch.optim``'s per-step machinery), and per probe point ``average`` per-example gradient-norm
passes over the split, one pass of the 9 gradients of L (batched over the gammas), and
``hessian_examples`` + ``lanczos`` + 1 Hessian-vector products on one Hessian graph of the
curvature sample, in float32 by default. On the quickstart (MNIST-1D MLP, 7,200 training
examples, 1,024-example curvature sample) a point is about 14 GFLOP: L 5.3, the noise passes
2.4, the 37 Hessian-vector products 5.9; 10 points x 6 runs are about a quarter of the
training's FLOPs (docs/benchmarks/log.md#probe-replay-floor). A plain ReLU MLP, the
quickstart's network, takes :mod:`theory.estimators.mlp_passes`: the noise passes and L's gradients are
ONE batched pass over the split for all ``average`` + 9 points, and the Hessian products of
Lanczos and tr(H Sigma) come from its R-operator (G^T H G stays on the autograd graph); its
replay writes the backward pass out (``training.replay``, bit for bit). The values move within
float32 rounding; the quickstart's six probed runs took 48-51 -> 27-34 s of CPU, 45 % of the
training's time (docs/benchmarks/log.md#probe-mlp-passes). Lee's L is not corrected for sampling:
measure it on the full split, as they do.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

from training.config import RunConfig, Trial
from training.data import Dataset
from training.models import check_output
from training.replay import replay_snapshots

from theory.estimators.curvature import (
    LEE_GAMMAS, check_gammas, lanczos_top, lipschitz_of, lipschitz_step, local_lipschitz,
)
from theory.errors import TheoryError, check_int
from theory.estimators.functional import FlatLoss, flat_loss, parameter_vector, split_size
from theory.estimators.noise import NoiseEstimate, curvature_noise, gradient_noise
from theory.estimators.mlp_passes import mlp_hessian, mlp_pass, plain_mlp
from theory.estimators.sampling import GroupMoments, noise_scale, split_estimate
from theory.verdicts.summaries import PROBE_COLUMNS

QUANTITIES = ("g_sq", "trace_sigma", "b_simple", "b_noise", "g_h_g", "hessian_top",
              "local_lipschitz", "loss")
DEFAULT_AVERAGE = 3
DEFAULT_HESSIAN_EXAMPLES = 16
# 20 Lanczos steps put the top Ritz value of the MNIST-1D MLP's Hessian within a few per cent of
# lambda_max: plenty to compare smoothness across levels and along the run, at a fixed cost.
DEFAULT_LANCZOS = 20
# the quantities of the Hessian's sample (lambda_max, and B_noise's tr(H Sigma) and G^T H G)
CURVATURE = ("b_noise", "g_h_g", "hessian_top")
# which update L is measured on at step t: out of w_t, or into w_t (Lee et al.'s train.py)
LIPSCHITZ_UPDATES = ("from", "into")


def window(step: int, horizon: int, average: int) -> tuple[int, ...]:
    """The ``average`` consecutive steps probed for ``step``: ``step`` onwards, shifted left so
    they do not pass ``horizon`` (fewer when the horizon is shorter)."""
    start = max(0, min(step, horizon - average + 1))
    return tuple(range(start, min(start + average, horizon + 1)))


def probe_windows(steps: Sequence[int], horizon: int, average: int,
                  lipschitz_update: str = "from") -> dict[int, tuple[int, ...]]:
    """Per probe step t, the noise window it averages over (:func:`window`, at least two steps:
    L's update out of t needs w_{t+1}); steps >= 1 with ``lipschitz_update="into"``."""
    if lipschitz_update not in LIPSCHITZ_UPDATES:
        raise TheoryError(f"lipschitz_update {lipschitz_update!r}; allowed: "
                          f"{', '.join(LIPSCHITZ_UPDATES)}")
    out = {}
    for t in map(int, steps):
        if lipschitz_update == "into" and t < 1:
            raise TheoryError(f"the update into step {t} does not exist: probe steps >= 1 with "
                              "lipschitz_update='into'")
        out[t] = window(t, horizon, max(2, average))
    return out


def needed_steps(steps: Sequence[int], horizon: int, average: int,
                 lipschitz_update: str = "from") -> tuple[int, ...]:
    """Every step a replay must keep for :func:`probe_trajectory` at ``steps``: each noise
    window and, with ``lipschitz_update="into"``, t - 1 (where the update into w_t starts)."""
    windows = probe_windows(steps, horizon, average, lipschitz_update)
    into = {t - 1 for t in windows} if lipschitz_update == "into" else set()
    return tuple(sorted({s for w in windows.values() for s in w} | into))


def replay_states(model: nn.Module, dataset: Dataset, trial: Trial | Mapping[str, Any],
                  run: RunConfig, steps: Sequence[int],
                  mask: Mapping[str, torch.Tensor] | None = None, trial_index: int = 0
                  ) -> dict[int, dict[str, torch.Tensor]]:
    """Weights, and the module's buffers (BatchNorm's running statistics), after each of
    ``steps`` updates of trial ``trial_index`` of the run ``trial``, ``run`` describe
    (``run.max_steps``, goal and stopping ignored), from ONE replay to the last step
    (``training.replay.replay_snapshots``: bit for bit the states of the reference loop
    stopped at those steps)."""
    check_output(model, dataset, "replay_states")
    states, diverged = replay_snapshots(model, dataset, trial, run, steps, mask, trial_index)
    if diverged is not None:
        missing = min(int(s) for s in steps if int(s) not in states)
        raise TheoryError(f"the replayed run diverged at step {diverged} "
                          f"before reaching step {missing}")
    return states


def probe_trajectory(model: nn.Module, dataset: Dataset, trial: Trial | Mapping[str, Any],
                     run: RunConfig, steps: Sequence[int], horizon: int,
                     mask: Mapping[str, torch.Tensor] | None = None, sparsity: float = 0.0,
                     trial_index: int = 0, average: int = DEFAULT_AVERAGE,
                     examples: int | None = None, curvature_examples: int | None = None,
                     hessian_examples: int | None = DEFAULT_HESSIAN_EXAMPLES,
                     lanczos: int = DEFAULT_LANCZOS, gammas: Sequence[float] = LEE_GAMMAS,
                     sample_seed: int = 0, dtype: torch.dtype = torch.float32,
                     quantities: Sequence[str] = QUANTITIES, lipschitz_update: str = "from",
                     lipschitz_examples: int | None = None, lipschitz_seed: int = 0,
                     states: Mapping[int, Mapping[str, torch.Tensor]] | None = None
                     ) -> pd.DataFrame:
    """Replay trial ``trial_index`` of the run (``trial``, ``run``: its batch size, optimizer and
    seed) once and measure every quantity of :data:`QUANTITIES` at each of ``steps`` in
    [0, ``horizon``] (module docstring). ``model`` holds the run's initial weights, ``mask`` its
    pruning mask. ``examples``: a sample of that many training examples (seeded by
    ``sample_seed``) instead of the full split for the noise; ``curvature_examples`` the same
    for lambda_max and B_noise (L uses the full split unless ``lipschitz_examples`` is given);
    ``hessian_examples``: examples of B_noise's tr(H Sigma) sample (None: all); ``lanczos``:
    Lanczos steps for lambda_max. ``dtype``: precision of the measurements (the replay runs in
    ``run.dtype``, like the trial). ``quantities``: those of :data:`QUANTITIES` to measure (the
    Hessian's sample is built only for :data:`CURVATURE`); ``lipschitz_update``,
    ``lipschitz_examples``, ``lipschitz_seed`` and ``states``: module docstring. Returns
    long-format rows with the columns of :data:`theory.verdicts.summaries.PROBE_COLUMNS`, quantities in
    :data:`QUANTITIES`' order."""
    check_output(model, dataset, "probe_trajectory")
    horizon = check_int(horizon, "horizon")
    average = check_int(average, "average")
    if not isinstance(run, RunConfig):
        raise TheoryError(f"run must be a training.RunConfig, got {type(run).__name__}")
    if not steps or any(not 0 <= int(t) <= horizon for t in steps):
        raise TheoryError(f"steps must be non-empty and in [0, horizon={horizon}], got {list(steps)}")
    if not quantities or any(q not in QUANTITIES for q in quantities):
        raise TheoryError(f"quantities {list(quantities)}; allowed: a non-empty list of "
                          f"{', '.join(QUANTITIES)}")
    if lipschitz_examples is not None:
        check_int(lipschitz_examples, "lipschitz_examples", minimum=2)
    windows = probe_windows(steps, horizon, average, lipschitz_update)
    wanted = needed_steps(steps, horizon, average, lipschitz_update)
    if states is None:
        states = replay_states(model, dataset, trial, run, wanted, mask, trial_index)
    elif missing := [s for s in wanted if s not in states]:
        raise TheoryError(f"states lacks the replayed step(s) {missing[:5]}: replay the run at "
                          "theory.verdicts.trajectory.needed_steps(...)")
    common = dict(mask=mask, seed=sample_seed, dtype=dtype)
    same = curvature_examples == examples
    curvature = any(q in quantities for q in CURVATURE)
    # L comes from the noise pass (its mean gradient, or the MLP's joint pass) only when it is
    # the update out of the window's first weights, on the whole split
    own_lipschitz = (lipschitz_update == "into" or lipschitz_examples is not None
                     or "local_lipschitz" not in quantities)
    rows = []
    gammas = check_gammas(gammas)
    for t, steps_t in sorted(windows.items()):
        net = _with_state(model, states[steps_t[0]])
        joint = _joint_pass(model, dataset, net, [states[s] for s in steps_t[:average]],
                            states[steps_t[1]], () if own_lipschitz else gammas, common
                            ) if examples is None else None
        if joint is None:
            nets = [net] + [_with_state(model, states[s]) for s in steps_t[1:average]]
            noise = [gradient_noise(other, dataset, examples=examples,
                                    hessian_examples=(hessian_examples if i == 0 and same
                                                      and curvature else 0),
                                    **common) for i, other in enumerate(nets)]
            first = noise[0]
            g_sq, trace, loss = _mean(n.g_sq for n in noise), _mean(
                n.trace_sigma for n in noise), first.loss
        else:
            g_sq, trace, loss, mean, lipschitz = joint
        values = {"g_sq": g_sq, "trace_sigma": trace, "b_simple": noise_scale(trace, g_sq),
                  "loss": loss}
        if curvature:
            sample = flat_loss(net, dataset, examples=curvature_examples, **common)
            values |= _curvature(sample, dataset, first if joint is None else None,
                                 None if joint is None else mean, same, hessian_examples,
                                 lanczos, sample_seed)
        if "local_lipschitz" not in quantities:
            pass
        elif own_lipschitz:
            start, end = (t - 1, t) if lipschitz_update == "into" else steps_t[:2]
            values["local_lipschitz"] = local_lipschitz(
                model, dataset, states[start], states[end], mask=mask, gammas=gammas,
                examples=lipschitz_examples, seed=lipschitz_seed, dtype=dtype).value
        elif joint is None:
            values["local_lipschitz"] = local_lipschitz(
                net, dataset, states[steps_t[0]], states[steps_t[1]], gammas=gammas,
                grad_prev=first.gradient if examples is None else None, **common).value
        else:
            values["local_lipschitz"] = lipschitz
        rows += [(float(sparsity), int(run.seed), int(run.batch_size), t, t / horizon,
                  q, float(values[q])) for q in QUANTITIES if q in quantities]
    return pd.DataFrame(rows, columns=list(PROBE_COLUMNS))


def _curvature(sample: FlatLoss, dataset: Dataset, first: NoiseEstimate | None,
               mean: torch.Tensor | None, same: bool, hessian_examples: int | None,
               lanczos: int, sample_seed: int) -> dict[str, float]:
    """B_noise, G^T H G and lambda_max on the Hessian's ``sample`` (the window's first weights).
    ``first``: the noise pass there when it ran per network (its B_noise is the split's when
    ``same``); ``mean``: the split's mean gradient from the joint MLP pass."""
    # lambda_max and B_noise on the same set share its loss and Hessian graph; B_noise needs
    # only that set's mean gradient, not the noise pass's moments, jackknife and loss
    hess = sample.hessian()
    # a plain MLP's Hessian products by its R-operator (theory.estimators.mlp_passes), tr(H Sigma)'s
    # all at once; G^T H G stays on the autograd graph (a near-cancellation at some weights)
    products = mlp_hessian(sample) if plain_mlp(sample) is not None else None
    if not same:
        curved = curvature_noise(sample, sample.gradient(), split_size(dataset),
                                 hessian_examples, sample_seed, hessian=hess, products=products)
    elif first is not None:
        curved = first
    else:   # the sample is the split: B_noise as gradient_noise gives it
        curved = curvature_noise(sample, mean, split_size(dataset), hessian_examples,
                                 sample_seed, hessian=hess, products=products)
    return {"b_noise": curved.b_noise, "g_h_g": curved.g_h_g,
            "hessian_top": lanczos_top(sample, lanczos, seed=sample_seed,
                                       hessian=products or hess)}


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


def _joint_pass(model: nn.Module, dataset: Dataset, net: nn.Module,
                averaged: Sequence[Mapping[str, torch.Tensor]], w_next: Mapping[str, torch.Tensor],
                gammas: tuple[float, ...], common: Mapping[str, Any]
                ) -> tuple[float, float, float, torch.Tensor, float] | None:
    """|G|^2 and tr(Sigma) averaged over the weights ``averaged`` (the first is ``net``'s), the
    mean loss and the mean gradient at the first, and Lee et al.'s L of the step from it to
    ``w_next``, all on the full training split from ONE pass over it for every point
    (:func:`theory.estimators.mlp_passes.mlp_pass`); None when the network is not a plain ReLU MLP with
    the classification loss (the caller then takes the separate passes of
    :func:`gradient_noise` and :func:`local_lipschitz`, which give the same values up to the
    order of float sums)."""
    fl = flat_loss(net, dataset, **common)
    if plain_mlp(fl) is None:
        return None
    check_output(model, dataset, "local_lipschitz")
    prev = fl.theta
    # without gammas (L measured elsewhere) the step is not needed, and may be zero
    step, step_norm = lipschitz_step(fl, model, w_next) if gammas else (prev, 0.0)
    points = torch.stack([prev] + [fl.restrict(parameter_vector(model, w).to(prev)) for w in
                                   averaged[1:]] + [prev + g * step for g in gammas])
    k = len(averaged)
    joint = mlp_pass(fl, points, k=k)
    population = split_size(dataset)
    estimates = [split_estimate(GroupMoments.of_parts([parts]), population)
                 for parts in joint.parts]
    lipschitz = (lipschitz_of(joint.gradients[k:], joint.gradients[0], gammas, step_norm).value
                 if gammas else math.nan)
    return (_mean(e.g_sq for e in estimates), _mean(e.trace_sigma for e in estimates),
            sum(joint.losses[0]) / fl.n, GroupMoments.of_parts([joint.parts[0]]).total()[1],
            lipschitz)


def _with_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    net = copy.deepcopy(model)
    net.load_state_dict(state, strict=False)
    return net
