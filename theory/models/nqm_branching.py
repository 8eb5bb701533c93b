"""Branching on the noisy quadratic model, exactly in expectation: a known answer for
:mod:`theory.estimators.branching`.

The NQM (Zhang et al. 2019; :mod:`theory.models.nqm`) gives the expected loss after any number of SGD or
heavy-ball steps from any state of the per-coordinate moments (E x^2, E v^2, E xv), so the whole
measurement runs without sampling: the base run at batch B and learning rate a to its goal, K
checkpoints, branches at k B with lr a * k * m for a window of W examples, and the rule of
:func:`theory.estimators.branching.critical_batch` on the expected losses (one "seed": the expectation).
A branch keeps the optimizer's momentum buffer, as a trainer resuming from a state does: torch's
buffer is -v / a, so changing the lr from a to a' scales the NQM velocity by a' / a
(E v^2 by (a' / a)^2, E xv by a' / a). A branch whose lr is unstable (a' max_i h_i p_i >= 2 (1 + b))
diverges and fails.

The analytic critical batch at a checkpoint is McCandlish et al. (2018)'s noise scale evaluated on
the NQM state:

    B_noise(t) = tr(H Sigma) / (G^T H G) = sum_i h_i c_i / sum_i h_i^3 E x_i(t)^2,

with G = H x and per-example gradient covariance Sigma = diag(c), the expectation taken over the
run's distribution of x (ratio of expectations, McCandlish et al.'s App. A convention). It is the
batch at which the optimal step's loss decrease per example halves: one step with lr e lowers the
expected loss by e |G|^2 - e^2 / 2 (G^T H G + tr(H Sigma) / B), so the best step gains
Delta_max / (1 + B_noise / B), and per example Delta_max / (B + B_noise), half the small-batch
rate at B = B_noise. Both of the usual definitions are therefore the same number, and it is the one
the branching rule probes: the linear lr rule keeps the per-example progress of the base run only
while the scaled lr stays below the best lr of the larger batch, which stops growing near
B = B_noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from theory.models import nqm
from theory.estimators.branching import (
    DEFAULT_CHECKPOINTS, DEFAULT_EPS, DEFAULT_MULTIPLIERS, DEFAULT_WINDOW_FRACTION, BranchingError,
    CriticalBatch, branch_factors, branch_lrs, checkpoint_steps, critical_batch, default_window,
    window_steps,
)


@dataclass(frozen=True, eq=False)
class NQMBranching:
    """The branching measurement on the NQM beside the analytic critical batch.

    ``result``: CBS(t) from :func:`theory.estimators.branching.critical_batch`; ``b_noise``: [K] analytic
    B_noise at each checkpoint; ``base_loss``: [K] and ``branch_loss``: [K, len(ks), multipliers]
    expected losses after the window; ``goal_step``: the base run's first step below the goal;
    ``window``: W in examples.
    """

    result: CriticalBatch
    b_noise: np.ndarray
    base_loss: np.ndarray
    branch_loss: np.ndarray
    goal_step: int
    window: int


def noise_scale(spectrum: nqm.Spectrum, second_moments: np.ndarray) -> np.ndarray:
    """B_noise = sum_i h_i c_i / sum_i h_i^3 E x_i^2 over the last axis (see module docstring)."""
    return np.sum(spectrum.h * spectrum.c) / np.sum(spectrum.h**3 * second_moments, axis=-1)


def branch_nqm(spectrum: nqm.Spectrum, *, lr: float, batch_size: int, goal_loss: float,
               momentum: float = 0.0, k_max: int = 64, multipliers=DEFAULT_MULTIPLIERS,
               checkpoints: int = DEFAULT_CHECKPOINTS, window_fraction: float = DEFAULT_WINDOW_FRACTION,
               eps: float = DEFAULT_EPS, precond: float = 0.0) -> NQMBranching:
    """Branch the NQM base run (SGD if ``momentum`` is 0, else heavy ball) at the default
    checkpoints and window, in expectation, and compare CBS(t) with B_noise(t)."""
    optimizer = "momentum" if momentum else "sgd"
    curve = nqm.steps_to_target(spectrum, goal_loss, [batch_size], optimizer=optimizer, lrs=[lr],
                                momenta=[momentum] if momentum else None, precond=precond)
    if not np.isfinite(curve.steps[0]):
        raise BranchingError(f"the base run (lr {lr}, batch {batch_size}) never reaches goal_loss {goal_loss}")
    goal_step = int(curve.steps[0])
    ks = branch_factors(k_max)
    steps = checkpoint_steps(goal_step, checkpoints)
    window = default_window(goal_step * batch_size, batch_size, k_max, window_fraction)
    mults = np.asarray(multipliers, dtype=float)

    def run(state, rate, batch, n_steps):
        """Moments [K, d] after ``n_steps`` from ``state``, one row per checkpoint."""
        return nqm.momentum_moments(spectrum, np.full(len(steps), rate), momentum, batch,
                                    np.broadcast_to(n_steps, steps.shape), state, precond)

    zeros = np.zeros(spectrum.dim)
    x2, v2, xv = run((spectrum.s0, zeros, zeros), lr, batch_size, steps)
    base = nqm.expected_loss(run((x2, v2, xv), lr, batch_size, window_steps(window, batch_size))[0], spectrum)
    curvature = np.max(spectrum.h ** (1.0 - precond))
    branch = np.full((len(steps), len(ks), len(mults)), np.inf)
    for i, k in enumerate(ks):
        for j, rate in enumerate(branch_lrs(lr, k, optimizer, mults)):
            if rate * curvature >= 2.0 * (1.0 + momentum):
                continue
            r = rate / lr
            end = run((x2, v2 * r * r, xv * r), rate, int(k) * batch_size, window_steps(window, int(k) * batch_size))
            branch[:, i, j] = nqm.expected_loss(end[0], spectrum)
    result = critical_batch(steps, base, branch[..., None], base_batch=batch_size, ks=ks, eps=eps)
    return NQMBranching(result=result, b_noise=noise_scale(spectrum, x2), base_loss=base, branch_loss=branch,
                        goal_step=goal_step, window=window)
