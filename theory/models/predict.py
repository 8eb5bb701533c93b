"""Predicted steps-vs-batch curves per sparsity level from probe estimates, set beside measurements.

Model (the SGD bound of :mod:`theory.models.bounds`, Lee et al. 2021's explanation): a network with
smoothness L, per-example gradient variance sigma^2 and initial suboptimality Delta needs

    S(B) = c K*(B; L, sigma^2, Delta, eps),   K* = 8 L Delta sigma^2 / (eps^2 B)  (B <= 2 sigma^2/eps)
                                                  = 2 L Delta B / (eps B - sigma^2) (above),

steps, or by default its asymptotic form c (2 L Delta / eps) (1 + 4 sigma^2 / (eps B)). Two quantities are not probed:

- eps, the goal on the mean squared gradient norm: one goal for all sparsity levels (they share
  the validation target). It is set from the reference network's probes, not from any measured
  curve: eps = 4 sigma_ref^2 / B_simple_ref, so the bound's critical batch 4 sigma^2 / eps equals
  the reference's gradient noise scale (McCandlish et al. 2018: B_crit ~ B_noise ~ B_simple).
  Pass ``eps`` to fix it instead.
- c, the looseness of the bound: the ONE constant calibrated on a measured curve (the reference
  level's, least squares on log steps), then reused for every other level.

Predicted for every non-reference level, with no further fitting: the critical batch
4 sigma_s^2 / eps, the curve c K*_s(B), and the sparse/reference step ratio K*_s(B) / K*_ref(B)
(independent of c). The noise-scale route B_crit ~ B_simple_s is reported beside it. Measured
critical batches come from :func:`theory.models.scaling.fit_scaling` on each measured curve. On the
reference level the curve and critical batch are calibrated, not predicted
(``LevelPrediction.is_reference``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from theory.models import bounds
from theory.errors import TheoryError
from theory.estimators.noise import NoiseEstimate
from theory.models.scaling import ScalingFit, fit_scaling


@dataclass(frozen=True)
class ProbeSummary:
    """Probe estimates for one network: ``L`` smoothness (e.g. Lee et al.'s local Lipschitz
    constant or the top Hessian eigenvalue), ``sigma2`` = tr(Sigma) per example, ``delta`` =
    f(w_0) - f_inf, ``b_simple`` = tr(Sigma) / |G|^2 (optional)."""

    sparsity: float
    L: float
    sigma2: float
    delta: float
    b_simple: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.sparsity, (int, float)) and 0.0 <= self.sparsity < 1.0):
            raise TheoryError(f"ProbeSummary.sparsity must be in [0, 1), got {self.sparsity!r}")
        for name in ("L", "sigma2", "delta") + (("b_simple",) if self.b_simple is not None else ()):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise TheoryError(f"ProbeSummary.{name} must be positive and finite, got {value!r}")

    @classmethod
    def from_noise(cls, sparsity: float, noise: NoiseEstimate, L: float, delta: float | None = None) -> "ProbeSummary":
        """From a :class:`theory.estimators.noise.NoiseEstimate` (``trace_sigma``, ``b_simple``, ``loss``) at
        the initial weights; ``delta`` defaults to that loss, i.e. f_inf = 0 (cross-entropy)."""
        return cls(sparsity=sparsity, L=float(L), sigma2=float(noise.trace_sigma),
                   delta=float(noise.loss if delta is None else delta), b_simple=float(noise.b_simple))


@dataclass(frozen=True)
class MeasuredCurve:
    """Measured steps-to-result per batch size for one sparsity level (``seeds`` optional)."""

    sparsity: float
    batch_sizes: tuple[float, ...]
    steps: tuple[float, ...]
    seeds: tuple | None = None


@dataclass(frozen=True, eq=False)
class LevelPrediction:
    """Prediction against measurement for one sparsity level.

    Arrays run over ``batch_sizes`` (the measured ones). ``step_ratio_*`` are steps at this level
    over steps of the reference level at the same batch size (NaN where the reference has no
    point); ``*_error`` are relative errors (predicted / measured - 1). ``log_rmse``: root mean
    square of log(predicted / measured) steps. ``b_crit_predicted`` is fit_scaling's B_crit of the
    predicted curve at the measured batch sizes (the same estimator as ``b_crit_measured``);
    ``b_crit_formula`` = 4 sigma^2 / eps (equal to it for the asymptotic form).
    """

    sparsity: float
    is_reference: bool
    batch_sizes: np.ndarray
    measured_steps: np.ndarray
    predicted_steps: np.ndarray
    b_crit_measured: float
    b_crit_interval: tuple[float, float]
    b_crit_predicted: float
    b_crit_formula: float
    b_crit_error: float
    b_crit_noise_scale: float
    b_crit_noise_scale_error: float
    step_ratio_measured: np.ndarray
    step_ratio_predicted: np.ndarray
    step_ratio_error: np.ndarray
    log_rmse: float


@dataclass(frozen=True, eq=False)
class Prediction:
    """All levels. ``scale`` (the bound's looseness c) is the only constant fitted on a measured
    curve (the ``reference`` level's); ``eps`` comes from ``eps_source`` (``"reference probe"``
    or ``"given"``)."""

    reference: float
    scale: float
    eps: float
    eps_source: str
    form: str
    levels: tuple[LevelPrediction, ...]
    fitted: tuple[str, ...] = ("scale",)

    def level(self, sparsity: float) -> LevelPrediction:
        for lv in self.levels:
            if lv.sparsity == sparsity:
                return lv
        raise TheoryError(f"no level with sparsity {sparsity!r}; have {[lv.sparsity for lv in self.levels]}")

    def rows(self) -> list[dict]:
        """One summary row per level (for tables and reports)."""
        return [
            {
                "sparsity": lv.sparsity,
                "role": "calibrated" if lv.is_reference else "predicted",
                "b_crit_measured": lv.b_crit_measured,
                "b_crit_predicted": lv.b_crit_predicted,
                "b_crit_error": lv.b_crit_error,
                "b_crit_noise_scale": lv.b_crit_noise_scale,
                "b_crit_noise_scale_error": lv.b_crit_noise_scale_error,
                "median_step_ratio_error": float(np.nanmedian(np.abs(lv.step_ratio_error)))
                if np.any(np.isfinite(lv.step_ratio_error)) else math.nan,
                "log_rmse": lv.log_rmse,
            }
            for lv in self.levels
        ]


FORMS = ("asymptotic", "exact")


def predicted_steps(probe: ProbeSummary, eps: float, batch_sizes: ArrayLike, scale: float = 1.0,
                    form: str = "asymptotic") -> np.ndarray:
    """c K*(B) for one network (``scale`` = c): ``"exact"`` the piecewise optimum of the bound,
    ``"asymptotic"`` S_min (1 + B_crit / B) with S_min = 2 L Delta / eps, B_crit = 4 sigma^2 / eps
    (exact in both limits; the form :func:`theory.fit_scaling` fits, McCandlish et al. 2018)."""
    if form not in FORMS:
        raise TheoryError(f"form must be one of {', '.join(FORMS)}; got {form!r}")
    fn = bounds.sgd_steps if form == "exact" else bounds.approx_steps
    return scale * np.asarray(fn(probe.L, probe.sigma2, probe.delta, eps, batch_sizes), dtype=float)


def predict_levels(
    probes: Iterable[ProbeSummary],
    measured: Iterable[MeasuredCurve],
    reference: float = 0.0,
    eps: float | None = None,
    form: str = "asymptotic",
    n_boot: int = 200,
    seed: int = 0,
    *,
    fits: Mapping[float, ScalingFit] | None = None,
) -> Prediction:
    """Calibrate the scale c on the ``reference`` level's measured curve, predict every level
    from its probes, and compare with the measured curves (module docstring for the model).
    ``seed``: the bootstrap seed of every curve's fit.
    ``fits`` (sparsity -> :class:`ScalingFit`): fits the caller already made of those levels'
    measured curves (e.g. with more bootstrap replicates), used instead of fitting them again."""
    probe_by = _by_sparsity(probes, ProbeSummary, "probes")
    curve_by = _by_sparsity(measured, MeasuredCurve, "measured")
    missing = sorted(set(curve_by) - set(probe_by))
    if missing:
        raise TheoryError(f"measured curves at sparsity {missing} have no probe estimates")
    if reference not in curve_by:
        raise TheoryError(f"reference sparsity {reference!r} needs both probes and a measured curve; "
                          f"measured: {sorted(curve_by)}")
    ref_probe, ref_curve = probe_by[reference], curve_by[reference]
    if eps is None:
        if ref_probe.b_simple is None:
            raise TheoryError("eps is not given and the reference probe has no b_simple to set it from")
        eps, eps_source = 4.0 * ref_probe.sigma2 / ref_probe.b_simple, "reference probe"
    elif not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise TheoryError(f"eps must be positive and finite, got {eps!r}")
    else:
        eps_source = "given"

    ref_b, ref_s = _curve_arrays(ref_curve)
    scale = float(np.exp(np.mean(np.log(ref_s) - np.log(predicted_steps(ref_probe, eps, ref_b, 1.0, form)))))
    ref_steps = dict(zip(ref_b, ref_s))

    levels = []
    for sparsity in sorted(curve_by):
        probe, curve = probe_by[sparsity], curve_by[sparsity]
        b, s = _curve_arrays(curve)
        fit: ScalingFit = (fits[sparsity] if fits is not None and sparsity in fits else
                           fit_scaling(curve.batch_sizes, curve.steps, seeds=curve.seeds, n_boot=n_boot,
                                       seed=seed))
        pred = predicted_steps(probe, eps, b, scale, form)
        ref_meas = np.array([ref_steps.get(x, np.nan) for x in b])
        ratio_meas = s / ref_meas
        ratio_pred = pred / predicted_steps(ref_probe, eps, b, scale, form)
        # like with like: the predicted critical batch is the same fit applied to the predicted curve
        b_pred = fit_scaling(b, pred, n_boot=1).b_crit
        b_noise = probe.b_simple if probe.b_simple is not None else math.nan
        levels.append(LevelPrediction(
            sparsity=sparsity,
            is_reference=sparsity == reference,
            batch_sizes=b,
            measured_steps=s,
            predicted_steps=pred,
            b_crit_measured=fit.b_crit,
            b_crit_interval=fit.intervals["b_crit"],
            b_crit_predicted=b_pred,
            b_crit_formula=float(bounds.critical_batch(probe.sigma2, eps)),
            b_crit_error=b_pred / fit.b_crit - 1.0,
            b_crit_noise_scale=b_noise,
            b_crit_noise_scale_error=b_noise / fit.b_crit - 1.0,
            step_ratio_measured=ratio_meas,
            step_ratio_predicted=ratio_pred,
            step_ratio_error=ratio_pred / ratio_meas - 1.0,
            log_rmse=float(np.sqrt(np.mean(np.log(pred / s) ** 2))),
        ))
    return Prediction(reference=reference, scale=scale, eps=float(eps), eps_source=eps_source, form=form,
                      levels=tuple(levels))


def _curve_arrays(curve: MeasuredCurve) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(curve.batch_sizes, dtype=float)
    s = np.asarray(curve.steps, dtype=float)
    if b.shape != s.shape or b.ndim != 1:
        raise TheoryError(f"measured curve at sparsity {curve.sparsity}: batch_sizes and steps must be "
                          f"1-D of the same length, got {b.shape} and {s.shape}")
    if not np.all(np.isfinite(s) & (s > 0) & np.isfinite(b) & (b > 0)):
        raise TheoryError(f"measured curve at sparsity {curve.sparsity}: batch_sizes and steps must be positive "
                          "and finite (drop batch sizes that never met the goal)")
    if curve.seeds is not None:
        # replicates: compare predictions with the mean log steps per batch size
        ub = np.unique(b)
        return ub, np.exp(np.array([np.log(s[b == x]).mean() for x in ub]))
    return b, s


def _by_sparsity(items, kind, name: str) -> dict:
    out = {}
    for item in items:
        if not isinstance(item, kind):
            raise TheoryError(f"{name} must hold {kind.__name__} objects, got {type(item).__name__}")
        if item.sparsity in out:
            raise TheoryError(f"{name} has two entries for sparsity {item.sparsity}")
        out[item.sparsity] = item
    if not out:
        raise TheoryError(f"{name} is empty")
    return out
