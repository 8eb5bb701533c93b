"""A wall-clock cost model of one data-parallel training step, fitted to measurements.

    t(B, k) = t_fixed + t_example * B / k + t_allreduce(P, k)

B is the global batch, k the number of workers, P the number of parameters (gradient message of
P * bytes_per_param bytes). The all-reduce follows the alpha-beta (latency-bandwidth) model of a
ring all-reduce (Thakur, Rabenseifner & Gropp, 2005; Patarasuk & Yuan, 2009): 2 (k - 1) rounds,
each paying a latency alpha and sending n / k bytes at beta seconds per byte,

    t_allreduce(P, k) = 2 (k - 1) alpha + 2 (k - 1) / k * beta * P * bytes_per_param,   (0 at k = 1)

The fit (non-negative least squares on relative errors, as times span orders of magnitude) has
two stages. (1) alpha and beta from bare all-reduce times over message sizes: beta, the
bandwidth term, is kept. (2) t_fixed, t_example and alpha from the DDP step times with that beta:
inside a training step the latency term also pays for waiting on the slowest worker and for
DDP's bookkeeping, so this "in-step" alpha is the one that predicts step times; the bare
all-reduce alpha is kept as ``meta["alpha_allreduce"]``. Without step times at k > 1, alpha is
the bare one. DDP overlaps the all-reduce with the backward pass; the additive model ignores
that overlap, and the fit residuals show how far it is off on the machine at hand.

``cost_model.json`` (written by :func:`save_cost_model`, read by :func:`load_cost_model`; a study
report adds a time-to-result section when its run folder holds one)::

    {"format": "sparsescale-cost-model", "version": 1,
     "formula": "<the formula above>",
     "t_fixed": s, "t_example": s per example, "alpha": s per round, "beta": s per byte,
     "n_params": P, "bytes_per_param": 4,
     "meta": {"backend": "gloo", "device": "cpu", "workload": "mnist1d/mlp", "threads": 1, ...},
     "measurements": {"steps": [{"workers", "per_worker_batch", "seconds"}, ...],
                      "allreduce": [{"workers", "bytes", "seconds"}, ...]}}   (optional)
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from training.errors import SparsescaleError, SparsescaleIOError

FORMAT = "sparsescale-cost-model"
VERSION = 1
FORMULA = ("t(B, k) = t_fixed + t_example * B / k + [k > 1] * (2 (k - 1) alpha "
           "+ 2 (k - 1) / k * beta * n_params * bytes_per_param)")


class CostModelError(SparsescaleError, ValueError):
    """A cost model or its JSON file is invalid: names the key and what is allowed."""


class CostModelIOError(SparsescaleIOError):
    """A cost model file cannot be read or written: names the path."""


@dataclass(frozen=True)
class StepTime:
    """Median wall time of one DDP training step with ``workers`` k and per-worker batch B / k."""

    workers: int
    per_worker_batch: int
    seconds: float


@dataclass(frozen=True)
class AllReduceTime:
    """Median wall time of one all-reduce of ``bytes`` bytes over ``workers`` ranks."""

    workers: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class Measurements:
    """What :func:`fit` fits: step times, bare all-reduce times, and the gradient's size."""

    steps: tuple[StepTime, ...]
    allreduce: tuple[AllReduceTime, ...]
    n_params: int
    bytes_per_param: int = 4


def ring_rounds(k: int) -> tuple[float, float]:
    """Coefficients (of alpha, of beta * bytes) of a ring all-reduce over k ranks:
    (2 (k - 1), 2 (k - 1) / k)."""
    return 2.0 * (k - 1), 2.0 * (k - 1) / k


@dataclass(frozen=True)
class CostModel:
    """Fitted constants of t(B, k) (see the module docstring); times in seconds, beta in seconds
    per byte."""

    t_fixed: float
    t_example: float
    alpha: float
    beta: float
    n_params: int
    bytes_per_param: int = 4
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("t_fixed", "t_example", "alpha", "beta"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise CostModelError(f"cost model {key} must be a finite number >= 0, got {v!r}")
        for key in ("n_params", "bytes_per_param"):
            v = getattr(self, key)
            if not (isinstance(v, int) and v >= 1):
                raise CostModelError(f"cost model {key} must be an integer >= 1, got {v!r}")

    def allreduce_time(self, workers: int, n_bytes: float | None = None) -> float:
        """t_allreduce for a message of ``n_bytes`` (default: the model's gradient)."""
        _check_workers(workers)
        n = self.n_params * self.bytes_per_param if n_bytes is None else n_bytes
        a, b = ring_rounds(workers)
        return a * self.alpha + b * self.beta * n

    def step_time(self, batch_size: int, workers: int) -> float:
        """t(B, k): seconds per training step with global batch B on k workers."""
        _check_workers(workers)
        if batch_size < workers or batch_size % workers:
            raise CostModelError(f"batch_size {batch_size} must be a multiple of workers {workers}")
        return self.t_fixed + self.t_example * batch_size / workers + self.allreduce_time(workers)


def _check_workers(workers: int) -> None:
    if not isinstance(workers, (int, np.integer)) or workers < 1:
        raise CostModelError(f"workers must be an integer >= 1, got {workers!r}")


def _relative_nnls(a: np.ndarray, y: np.ndarray, target: np.ndarray) -> np.ndarray:
    """c >= 0 minimising sum_i ((a_i . c - y_i) / target_i)^2, columns scaled to unit max for
    conditioning. ``target`` is the measured time, so every measurement weighs by its relative
    error instead of the slowest one dominating."""
    # imported here: scipy.optimize costs a second at import, and every DDP worker imports this
    from scipy.optimize import nnls

    a = a / target[:, None]
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, y / target)
    return coef / scale


def fit(meas: Measurements, **meta: Any) -> CostModel:
    """Fit the cost model in the two stages of the module docstring; ``meta`` is stored with it
    (plus the host name and CPU count)."""
    if not meas.steps:
        raise CostModelError("measurements hold no step times: measure at least one batch size")
    multi = [r for r in meas.allreduce if r.workers > 1]
    alpha_bare = beta = 0.0
    if multi:
        a = np.array([[ring_rounds(r.workers)[0], ring_rounds(r.workers)[1] * r.bytes]
                      for r in multi])
        t = np.array([r.seconds for r in multi])
        alpha_bare, beta = (float(c) for c in _relative_nnls(a, t, t))
    grad_bytes = meas.n_params * meas.bytes_per_param
    t = np.array([s.seconds for s in meas.steps])
    bandwidth = np.array([ring_rounds(s.workers)[1] * beta * grad_bytes for s in meas.steps])
    if any(s.workers > 1 for s in meas.steps):
        a = np.array([[1.0, s.per_worker_batch, ring_rounds(s.workers)[0]] for s in meas.steps])
        t_fixed, t_example, alpha = (float(c) for c in _relative_nnls(a, t - bandwidth, t))
    else:
        a = np.array([[1.0, s.per_worker_batch] for s in meas.steps])
        (t_fixed, t_example), alpha = (float(c) for c in _relative_nnls(a, t, t)), alpha_bare
    meta = dict(meta, alpha_allreduce=alpha_bare, host=platform.node(), cpu_count=os.cpu_count())
    return CostModel(t_fixed=t_fixed, t_example=t_example, alpha=alpha, beta=beta,
                     n_params=meas.n_params, bytes_per_param=meas.bytes_per_param, meta=meta)


def format_report(cost: CostModel, meas: Measurements | None = None) -> str:
    """The fitted constants and, with measurements, measured against modelled times."""
    lines = [FORMULA,
             f"t_fixed   = {cost.t_fixed * 1e3:.4f} ms",
             f"t_example = {cost.t_example * 1e6:.3f} us per example",
             f"alpha     = {cost.alpha * 1e6:.2f} us per ring round in a training step"
             + (f" (bare all-reduce: {cost.meta['alpha_allreduce'] * 1e6:.2f} us)"
                if "alpha_allreduce" in cost.meta else ""),
             f"beta      = {cost.beta * 1e9:.4f} ns per byte "
             f"({1 / cost.beta / 1e9 if cost.beta else float('inf'):.2f} GB/s)",
             f"P         = {cost.n_params} parameters "
             f"({cost.n_params * cost.bytes_per_param} bytes)"]
    if meas is None:
        return "\n".join(lines)
    lines += ["", "| k | B/k | B | measured ms | model ms | model / measured |",
              "|---|---|---|---|---|---|"]
    for s in meas.steps:
        b = s.per_worker_batch * s.workers
        model = cost.step_time(b, s.workers)
        lines.append(f"| {s.workers} | {s.per_worker_batch} | {b} | {s.seconds * 1e3:.3f} | "
                     f"{model * 1e3:.3f} | {model / s.seconds:.2f} |")
    if meas.allreduce:
        bare = CostModel(cost.t_fixed, cost.t_example, cost.meta.get("alpha_allreduce", cost.alpha),
                         cost.beta, cost.n_params, cost.bytes_per_param)
        lines += ["", "| k | all-reduce bytes | measured ms | model ms (bare alpha) |",
                  "|---|---|---|---|"]
        for r in meas.allreduce:
            lines.append(f"| {r.workers} | {r.bytes} | {r.seconds * 1e3:.4f} | "
                         f"{bare.allreduce_time(r.workers, r.bytes) * 1e3:.4f} |")
    return "\n".join(lines)


def save_cost_model(cost: CostModel, path: str | os.PathLike,
                    measurements: Measurements | None = None) -> Path:
    """Write ``cost`` (and optionally its measurements) as ``cost_model.json`` (format above)."""
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "formula": FORMULA}
    doc.update(asdict(cost))
    if measurements is not None:
        doc["measurements"] = {"steps": [asdict(s) for s in measurements.steps],
                               "allreduce": [asdict(r) for r in measurements.allreduce]}
    path = Path(path)
    if path.is_dir():
        path = path / "cost_model.json"
    try:
        path.write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        raise CostModelIOError(f"cannot write the cost model {path} "
                               f"({exc.strerror or exc})") from None
    return path


def load_cost_model(path: str | os.PathLike) -> CostModel:
    """Read a file written by :func:`save_cost_model` (or a run folder holding cost_model.json)."""
    return _read(path)[2]


def _read(path: str | os.PathLike) -> tuple[Path, dict[str, Any], CostModel]:
    """The cost model file's path, its JSON document and the cost model it holds."""
    path = Path(path)
    if path.is_dir():
        path = path / "cost_model.json"
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise CostModelIOError(f"{path}: cannot read a cost model "
                               f"({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:   # not JSON text (json.JSONDecodeError, UnicodeDecodeError)
        raise CostModelError(f"{path}: cannot read a cost model ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CostModelError(f"{path}: 'format' must be {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise CostModelError(f"{path}: 'version' {doc.get('version')!r} unsupported; "
                             f"allowed: {VERSION}")
    keys = ("t_fixed", "t_example", "alpha", "beta", "n_params", "bytes_per_param")
    missing = [k for k in keys if k not in doc]
    if missing:
        raise CostModelError(f"{path}: missing keys {missing}; a cost model needs {list(keys)}")
    return path, doc, CostModel(**{k: doc[k] for k in keys}, meta=dict(doc.get("meta", {})))


def load_measurements(path: str | os.PathLike) -> Measurements | None:
    """The measurements stored beside a cost model by :func:`save_cost_model` (None if absent)."""
    path, doc, cost = _read(path)
    if "measurements" not in doc:
        return None
    m = doc["measurements"]
    try:
        return Measurements(tuple(StepTime(**s) for s in m["steps"]),
                            tuple(AllReduceTime(**r) for r in m["allreduce"]),
                            cost.n_params, cost.bytes_per_param)
    except (KeyError, TypeError) as exc:
        raise CostModelError(f"{path}: bad 'measurements' ({exc}); expected 'steps' with "
                             f"workers, per_worker_batch, seconds and 'allreduce' with workers, "
                             f"bytes, seconds") from None
