"""What :class:`theory.NoiseScaleMonitor` reads from a step, and how it smooths the readings.

A step's unbiased pair (|G|^2, tr(Sigma)) comes from two averages of squared gradient norms with
different batch-size coefficients (:func:`solve_two_sizes`). Smoothing: |G|^2 and tr(Sigma) are
averaged *separately* over the last ``window`` steps or with an exponential moving average of
decay ``ema`` (bias-corrected), and B_simple is the ratio of the averages, never an average of
ratios (McCandlish et al. 2018, appendix A.1). Standard errors come from the spread of the
per-step estimates in the window (the weighted variance of the mean, B_simple's by the delta
method; :func:`theory.estimators.noise.weighted_mean_cov`): at fixed weights the steps' batches
are independent and they are honest; while training, the drift of the weights across the window
adds to them. ``NoiseReading.smoothing`` states the window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from theory.estimators.noise import ratio_se, weighted_mean_cov
from theory.estimators.sampling import noise_scale


@dataclass(frozen=True)
class Estimate:
    """A noise scale's values: ``g_sq`` ~ |G|^2, ``trace_sigma`` ~ tr(Sigma) smoothed,
    ``b_simple`` their ratio, ``*_se`` standard errors from the spread of the per-step estimates
    (nan until two steps); ``step_g_sq`` / ``step_trace_sigma`` / ``step_b_simple`` this step's
    own unbiased estimates."""

    b_simple: float
    g_sq: float
    trace_sigma: float
    b_simple_se: float
    g_sq_se: float
    trace_sigma_se: float
    step_b_simple: float
    step_g_sq: float
    step_trace_sigma: float


@dataclass(frozen=True)
class PartReading(Estimate):
    """One part's reading (:mod:`theory.monitor.parts`): ``name`` is a layer's module name,
    (``"<model>"`` for the model's own parameters), ``"<norm layers>"`` or
    ``"<preconditioned>"``."""

    name: str


@dataclass(frozen=True)
class NoiseReading(Estimate):
    """One step's reading of :class:`NoiseScaleMonitor`: the whole model's :class:`Estimate`,
    smoothed as ``smoothing`` says; ``batch_size`` the examples this step saw (all
    micro-batches and ranks), ``method`` the estimator that ran, ``steps`` how many steps the
    smoothing holds; ``parts`` the parts' readings (:mod:`theory.monitor.parts`), empty unless
    asked for.
    """

    step: int
    method: str
    batch_size: int
    smoothing: str
    steps: int
    parts: tuple[PartReading, ...] = ()


def solve_two_sizes(u_small: float, c_small: float, u_big: float, c_big: float
                    ) -> tuple[float, float]:
    """Unbiased (|G|^2, tr(Sigma)) from two averages with E u = |G|^2 + c tr(Sigma)
    (:mod:`theory.monitor.monitor`'s docstring): tr = (u_small - u_big) / (c_small - c_big),
    |G|^2 = u_big - c_big tr."""
    trace = (u_small - u_big) / (c_small - c_big)
    return u_big - c_big * trace, trace


class Smoother:
    """Per-step (|G|^2, tr Sigma) estimates averaged over a window or by a bias-corrected EMA
    (plain floats: it runs every step)."""

    def __init__(self, window: int | None, ema: float | None) -> None:
        self.window, self.ema = window, ema
        self.label = f"window {window}" if window else f"ema {ema:g}"
        self.recent: deque[tuple[float, float]] = deque(maxlen=window)
        self.sums = [0.0] * 7   # weight, weight^2, g, t, gg, tt, gt
        self.count = 0

    def add(self, g: float, t: float) -> tuple[float, float, float, float, float, float]:
        """Add one step; the smoothed (g, t, b_simple) and their standard errors."""
        self.count += 1
        w, w2, sg, st, sgg, stt, sgt = self.sums
        if self.window:
            if len(self.recent) == self.window:     # the oldest step leaves the window
                og, ot = self.recent[0]
                w, w2, sg, st = w - 1.0, w2 - 1.0, sg - og, st - ot
                sgg, stt, sgt = sgg - og * og, stt - ot * ot, sgt - og * ot
            self.recent.append((g, t))
            w, w2, sg, st = w + 1.0, w2 + 1.0, sg + g, st + t
            sgg, stt, sgt = sgg + g * g, stt + t * t, sgt + g * t
            if self.count % self.window == 0:       # bound the rounding of the running sums
                w = w2 = float(len(self.recent))
                sg, st, sgg, stt, sgt = map(math.fsum, zip(*((a, b, a * a, b * b, a * b)
                                                             for a, b in self.recent)))
        else:
            d = self.ema
            w, w2, sg, st = w * d + 1.0, w2 * (d * d) + 1.0, sg * d + g, st * d + t
            sgg, stt, sgt = sgg * d + g * g, stt * d + t * t, sgt * d + g * t
        self.sums = [w, w2, sg, st, sgg, stt, sgt]
        (g_mean, t_mean), cov = weighted_mean_cov(w, w2, sg, st, sgg, stt, sgt)
        return (g_mean, t_mean, noise_scale(t_mean, g_mean), math.sqrt(max(cov[0], 0.0)),
                math.sqrt(max(cov[1], 0.0)), ratio_se(g_mean, t_mean, cov))

    @property
    def steps(self) -> int:
        return len(self.recent) if self.window else self.count
