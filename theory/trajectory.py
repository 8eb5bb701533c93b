"""Probes along a training run: replay a trial and measure noise and smoothness at given steps.

The run is replayed with the plain reference trainer (``training.train_reference``: same data
order, learning-rate schedule and mask as the trial it reproduces), so the weights probed are the
run's own. At each probe step t, on the full training split by default (``examples`` for a
sample, estimates still unbiased for the split, :mod:`theory.sampling`):

- ``g_sq``, ``trace_sigma``: |G|^2 and tr(Sigma) averaged over ``average`` consecutive weights
  w_t .. w_{t+a-1} (shifted left so they end at the horizon), ``b_simple`` = the ratio of those
  averages (McCandlish et al. 2018, appendix A: average numerator and denominator separately);
- ``b_noise`` and ``g_h_g``: tr(H Sigma) / (G^T H G) and G^T H G at the window's first weights;
- ``hessian_top``: the top Hessian eigenvalue (Lanczos, ``theory.hessian_top_eigenvalues``);
- ``local_lipschitz``: Lee et al. (2021)'s local Lipschitz constant of the run's own update out
  of the window's first weights (max over their gamma grid 0.1..0.9; gradients over kept
  weights only, ``theory.local_lipschitz``);
- ``loss``: the mean training loss at the window's first weights.

Rows are long-format, with the columns of :data:`theory.summaries.PROBE_COLUMNS`; ``fraction`` =
t / ``horizon`` (H, the run's steps-to-result).

Cost: ``train_reference`` returns only its final weights, so every probed state is replayed from
step 0 (about 15 H steps for 10 points of 3 states); measured on the quickstart MLP, 3 batch sizes
x 10 points x 2 levels took 9.7 min on the full split (replay 148 s, measurements 436 s). Lee's L
is not corrected for sampling: measure it on the full split, as they do.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

import training
from training.data import Dataset

from .curvature import LEE_GAMMAS, hessian_top_eigenvalues, local_lipschitz
from .errors import TheoryError, check_int
from .noise import gradient_noise
from .sampling import noise_scale
from .summaries import PROBE_COLUMNS

QUANTITIES = ("g_sq", "trace_sigma", "b_simple", "b_noise", "g_h_g", "hessian_top",
              "local_lipschitz", "loss")
DEFAULT_AVERAGE = 3
DEFAULT_HESSIAN_EXAMPLES = 16
# Two significant digits are plenty to compare smoothness across levels and along the run.
DEFAULT_LANCZOS_TOL = 1e-3


def window(step: int, horizon: int, average: int) -> tuple[int, ...]:
    """The ``average`` consecutive steps probed for ``step``: ``step`` onwards, shifted left so
    they do not pass ``horizon`` (fewer when the horizon is shorter)."""
    start = max(0, min(step, horizon - average + 1))
    return tuple(range(start, min(start + average, horizon + 1)))


def replay_states(model: nn.Module, dataset: Dataset, replay: Mapping[str, Any],
                  steps: Sequence[int], mask: Mapping[str, torch.Tensor] | None = None
                  ) -> dict[int, dict[str, torch.Tensor]]:
    """Weights after each of ``steps`` updates of the run ``replay`` describes (keyword
    arguments of ``training.train_reference``: batch_size, lr, momentum, optimizer, seed,
    trial_index, decay_steps, end_factor, ...), one replay from the start per step."""
    states = {}
    for t in sorted(set(steps)):
        res = training.train_reference(model, dataset, steps=t, target=None, stop_at_goal=False,
                                       mask=mask, eval_schedule=training.EvalSchedule(every=max(t, 1)),
                                       **replay)
        if res.diverged:
            raise TheoryError(f"the replayed run diverged at step {res.diverged_step} "
                              f"before reaching step {t}")
        states[t] = res.state
    return states


def probe_trajectory(model: nn.Module, dataset: Dataset, replay: Mapping[str, Any],
                     steps: Sequence[int], horizon: int,
                     mask: Mapping[str, torch.Tensor] | None = None, sparsity: float = 0.0,
                     average: int = DEFAULT_AVERAGE, examples: int | None = None,
                     hessian_examples: int | None = DEFAULT_HESSIAN_EXAMPLES,
                     lanczos_tol: float = DEFAULT_LANCZOS_TOL,
                     gammas: Sequence[float] = LEE_GAMMAS, sample_seed: int = 0,
                     dtype: torch.dtype = torch.float64) -> pd.DataFrame:
    """Replay the run (``replay``: ``train_reference`` keywords, ``batch_size`` and ``seed``
    among them) and measure every quantity of :data:`QUANTITIES` at each of ``steps`` in
    [0, ``horizon``] (module docstring). ``model`` holds the run's initial weights, ``mask`` its
    pruning mask. ``examples``: a sample of that many training examples (seeded by
    ``sample_seed``) instead of the full split; ``hessian_examples``: examples of B_noise's
    tr(H Sigma) sample (None: all). ``dtype``: precision of the measurements (the replay itself
    runs as ``replay`` says, float32 by default, like the trial). Returns
    long-format rows with the columns of :data:`theory.summaries.PROBE_COLUMNS`."""
    horizon = check_int(horizon, "horizon")
    average = check_int(average, "average")
    for key in ("batch_size", "seed"):
        if key not in replay:
            raise TheoryError(f"replay must give {key!r} (a train_reference keyword)")
    if not steps or any(not 0 <= int(t) <= horizon for t in steps):
        raise TheoryError(f"steps must be non-empty and in [0, horizon={horizon}], got {list(steps)}")
    windows = {int(t): window(int(t), horizon, max(2, average)) for t in steps}
    states = replay_states(model, dataset, replay, [s for w in windows.values() for s in w], mask)
    common = dict(mask=mask, examples=examples, seed=sample_seed, dtype=dtype)
    rows = []
    for t, steps_t in sorted(windows.items()):
        nets = [_with_state(model, states[s]) for s in steps_t[:average]]
        noise = [gradient_noise(net, dataset, hessian_examples=hessian_examples if i == 0 else 0,
                                **common) for i, net in enumerate(nets)]
        g_sq = sum(n.g_sq for n in noise) / len(noise)
        trace = sum(n.trace_sigma for n in noise) / len(noise)
        first = noise[0]
        values = {
            "g_sq": g_sq, "trace_sigma": trace, "b_simple": noise_scale(trace, g_sq),
            "b_noise": first.b_noise, "g_h_g": first.g_h_g,
            "hessian_top": float(hessian_top_eigenvalues(nets[0], dataset, k=1, tol=lanczos_tol,
                                                         **common)[0]),
            "local_lipschitz": local_lipschitz(nets[0], dataset, states[steps_t[0]],
                                               states[steps_t[1]], gammas=gammas, **common).value,
            "loss": first.loss,
        }
        rows += [(float(sparsity), int(replay["seed"]), int(replay["batch_size"]), t, t / horizon,
                  q, float(values[q])) for q in QUANTITIES]
    return pd.DataFrame(rows, columns=list(PROBE_COLUMNS))


def _with_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    net = copy.deepcopy(model)
    net.load_state_dict(state, strict=False)
    return net
