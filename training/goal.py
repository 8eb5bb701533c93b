"""Losses, goal metrics and divergence: one definition shared by every trainer and probe.

Classification: mean cross-entropy loss, goal metric ``error`` (fraction misclassified).
Per-token classification (labels ``[n, T]``, outputs ``[n, T, classes]``, e.g. next-byte
prediction): an example's loss is the mean over its T positions of the cross-entropy, the batch
loss the mean over examples (the mean over every position, all examples having T), and
``error`` the fraction of positions misclassified.
Regression: loss 1/2 mean (f(x) - y)^2, goal metric ``loss``.
A goal is met when ``metric < target`` (``strict=True``, Shallue et al. 2019) or ``<=``
(``strict=False``, Lee et al. 2021).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training.errors import ConfigError

METRICS = ("error", "loss")

# A trial whose training loss exceeds this multiple of its initial loss (or is not finite) has
# diverged: its weights are no longer meaningful and it is frozen.
DIVERGENCE_FACTOR = 1e3


def loss_fn(task: str, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
            ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Per-batch mean loss for ``task``: cross-entropy or half squared error; with a per-example
    ``loss`` of the user's (``training.Dataset.loss``), its mean."""
    if loss is not None:
        return lambda out, y: loss(out, y).mean()
    if task == "classification":
        return classification_loss
    if task == "regression":
        return lambda out, y: 0.5 * (out - y).pow(2).mean()
    raise ConfigError(f"unknown task {task!r}; allowed: classification, regression")


def classification_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits ``out`` ``[B, ..., classes]`` against labels ``y``
    ``[B, ...]``: over examples, and over positions for per-token labels (an example's loss is
    the mean over its positions)."""
    if out.dim() == 2:
        return F.cross_entropy(out, y)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


@dataclass(frozen=True)
class Goal:
    """Target on a validation metric, e.g. ``Goal("error", 0.1)``."""

    metric: str = "error"
    target: float = 0.1
    strict: bool = True

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ConfigError(f"goal metric {self.metric!r}; allowed: {', '.join(METRICS)}")
        if not (isinstance(self.target, (int, float)) and math.isfinite(self.target)):
            raise ConfigError(f"goal target must be a finite number, got {self.target!r}")

    def met(self, value: float | torch.Tensor) -> bool | torch.Tensor:
        """True where ``value`` meets the goal (floats or tensors)."""
        return value < self.target if self.strict else value <= self.target


def unreachable(metric: str, target: float, strict: bool) -> str | None:
    """Why no trial can ever meet the goal, or None. Both goal metrics are >= 0 (a fraction
    misclassified; cross-entropy or half squared error), so ``metric < target`` needs target > 0
    and ``metric <= target`` needs target >= 0. Study specs refuse such targets; :class:`Goal`
    accepts them (a goal never met runs the whole budget)."""
    if target > 0 or (target == 0 and not strict):
        return None
    op = "<" if strict else "<="
    return f"{target!r} is unreachable: the {metric} is never {op} {target!r} (it is >= 0)"


def default_metric(task: str) -> str:
    """The goal metric of a bare target: ``error`` for classification, ``loss`` otherwise."""
    return "error" if task == "classification" else "loss"


def goal_metric(goal: Goal | None, task: str) -> str:
    """The metric a trainer evaluates: the goal's, or without a goal :func:`default_metric`."""
    return goal.metric if goal else default_metric(task)


def as_goal(target: "Goal | float | None", task: str) -> Goal | None:
    """A Goal from a bare target (metric :func:`default_metric` of the task)."""
    if target is None or isinstance(target, Goal):
        return target
    return Goal(default_metric(task), float(target))


def metric_value(metric: str, out: torch.Tensor, y: torch.Tensor, task: str,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                 ) -> torch.Tensor:
    """Goal metric of outputs ``out`` against labels ``y`` (leading dims are kept for batched
    outputs of shape [..., n, classes], or [..., n, T, classes] for per-token labels [n, T]:
    the mean runs over the labels' dimensions). With a per-example ``loss`` of the user's,
    ``out`` holds one trial's outputs (no leading dims) and the metric ``loss`` is its mean."""
    if metric == "loss" and loss is not None:
        return loss(out, y).mean()
    dims = tuple(range(-y.dim(), 0))   # the examples' (and positions') dimensions
    if metric == "error":
        if task != "classification":
            raise ConfigError("goal metric 'error' needs a classification data set; use 'loss'")
        return (out.argmax(-1) != y).to(out.dtype).mean(dims)
    if task == "classification":
        logp = out.log_softmax(-1)
        return -logp.gather(-1, y.expand(out.shape[:-1]).unsqueeze(-1)).squeeze(-1).mean(dims)
    return 0.5 * (out - y).pow(2).mean(-1)


def is_diverged(loss: float, initial_loss: float) -> bool:
    """True if ``loss`` is not finite or above DIVERGENCE_FACTOR * initial loss."""
    return not math.isfinite(loss) or loss > DIVERGENCE_FACTOR * max(initial_loss, 1e-12)
