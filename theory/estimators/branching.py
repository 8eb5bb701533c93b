"""Critical batch size measured by branching from checkpoints (Merrill et al. 2025, "Critical
Batch Size Revisited"), and the batch-size warmup it suggests.

The measurement. A base run trains at batch B. At checkpoints t_1 < ... < t_K (``checkpoint_steps``:
K = 8 evenly spaced from initialization to the step where the base run reaches its goal) short
branch runs start from the base run's state at batch k B, k in ``ks`` (1, 2, 4, ..., k_max), with
the learning rate scaled by the batch-size rule (``lr_scale``: x k for SGD-type optimizers
``sgd`` / ``momentum`` / ``nesterov``, x sqrt(k) for Adam-type ``adam`` / ``adamw``) times each lr
multiplier m (default 0.5, 1, 2), for a window of W examples (W / (k B) steps; ``default_window``:
a fixed fraction of the examples the base run needs to reach its goal). Each branch runs with
several branch seeds (data orders).

The rule (``critical_batch``). With L_base(t) the base run's held-out loss W examples after t and
Lbar(t, k, m) the branch loss averaged over branch seeds (the averaging is the smoothing: it
estimates the expected loss, which is what the tolerance is about):

    CBS(t) = max { k B : min_m Lbar(t, k, m) <= (1 + eps) L_base(t) },   eps = 1 % by default,

and 0 when no k passes (the critical batch lies below the smallest batch tried). The tolerance is
one-sided: a branch that ends below the base is not worse. A diverged branch (NaN or inf loss in
any seed) fails. The largest passing k counts even when a smaller k fails (the definition); the
per-k gaps are kept in ``CriticalBatch.relative_gap`` to show such cases. CBS(t) = k_max B means
the tried range does not bound it from above.

Intervals: a bootstrap over branch seeds. CBS(t) is a function of seed-averaged losses, and the
seeds are independent draws of the branch noise, so resampling whole seeds (the same seeds for
every (k, m), and for the base loss when it is given per seed, keeping the comparison paired)
reproduces the estimator's sampling variability; percentile intervals suit a statistic that takes
only the values k B. Quantiles of per-seed CBS would instead describe single-seed estimates, whose
spread is wider than that of the seed-averaged rule and which fail more often by noise alone. With
few seeds the bootstrap distribution is enumerated exactly (every multiset of seeds with its
multinomial probability; 10 for 3 seeds), so intervals do not depend on a random stream; with more
it is sampled. One seed (exact expected losses, e.g. the noisy quadratic model) gives a zero-width
interval; two are refused as too few for an interval.

The warmup (``warmup_schedule``, Merrill et al. 2025's batch-size warmup): from checkpoint t_j on,
train at B(t_j) = the largest power of two <= max(CBS(t_j), min_batch), capped, with the learning
rate scaled by the same rule; the segments meet at the same numbers of examples as the
checkpoints, so the schedule takes fewer steps wherever B(t) > B.

How the trainer side uses this module (``experiments.run.branching``):

1. The base run (a given trial, or the best trial at a small B of a study) runs with
   ``train_trials`` to each checkpoint step in turn, resuming the state it stopped in
   (``start=``, ``return_state=True``): a frozen ``training.state.TrainState`` (stacked weights,
   optimizer buffers, step, data-order position).
2. For each checkpoint and each k, one vectorized group: ``train_trials(model, dataset, trials,
   run, start=state, data_seeds=...)`` at batch k B for ``window_steps(W, k B)`` steps, whose
   trials are the lr multipliers x branch seeds (lr = ``branch_lrs(lr, k, optimizer)``); every
   trial starts from the same state, and branch seed s picks the data order after the checkpoint
   (seed 0 continues the base run's order, so k = 1, m = 1, seed 0 is the base run itself). The
   held-out loss at the window's end fills ``branch_loss[t, k, m, seed]``; the k = 1, m = 1
   branches give the paired per-seed base loss.
3. ``experiments.branch_critical_batch(...)`` wires this up, calls ``critical_batch`` and counts
   the cost (the base run plus the branches, in trial-steps; ``branching_trial_steps`` is the
   plan); ``experiments.warmup_comparison`` runs ``warmup_schedule`` with the vectorized
   batch-size-schedule trainer (``training.schedule_trials``) against fixed batch sizes under the
   same examples budget; a study stores the rows (sparsity, seed, step, critical_batch, low,
   high) in its ``branching`` table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations_with_replacement

import numpy as np
from numpy.typing import ArrayLike

from training.schedules.batch_schedule import BatchSchedule, BatchSegment

from theory.errors import TheoryError, check_int

SGD_TYPE = ("sgd", "momentum", "nesterov")
ADAM_TYPE = ("adam", "adamw")
DEFAULT_MULTIPLIERS = (0.5, 1.0, 2.0)
DEFAULT_CHECKPOINTS = 8
DEFAULT_EPS = 0.01
DEFAULT_WINDOW_FRACTION = 0.1


class BranchingError(TheoryError):
    """Bad input to the branching measurement: names the argument and what is allowed."""


@dataclass(frozen=True, eq=False)
class CriticalBatch:
    """CBS(t) at each checkpoint with ``level`` bootstrap intervals over branch seeds.

    ``steps``: checkpoint steps of the base run (batch ``base_batch``); ``ks``: branch factors;
    ``critical_batch``, ``low``, ``high``: [K] (0 = below ``min(ks) * base_batch``);
    ``relative_gap``: [K, len(ks)] best-multiplier seed-mean loss / base loss - 1 (inf if every
    multiplier diverged); ``best_multiplier``: [K, len(ks)] index of that multiplier.
    """

    steps: np.ndarray
    base_batch: int
    ks: np.ndarray
    eps: float
    level: float
    n_seeds: int
    critical_batch: np.ndarray
    low: np.ndarray
    high: np.ndarray
    relative_gap: np.ndarray
    best_multiplier: np.ndarray

    @property
    def examples(self) -> np.ndarray:
        """Examples the base run has seen at each checkpoint."""
        return self.steps * self.base_batch

    @property
    def at_upper_end(self) -> np.ndarray:
        """Checkpoints where the largest branch passed: CBS is only a lower bound there."""
        return self.critical_batch >= self.ks[-1] * self.base_batch


def lr_scale(k: float, optimizer: str) -> float:
    """Learning-rate factor for a batch k times larger: k (SGD-type), sqrt(k) (Adam-type)."""
    if isinstance(k, bool) or not (isinstance(k, (int, float, np.integer, np.floating)) and math.isfinite(k)
                                   and k > 0):
        raise BranchingError(f"batch factor k must be a positive finite number, got {k!r}")
    if optimizer in SGD_TYPE:
        return float(k)
    if optimizer in ADAM_TYPE:
        return math.sqrt(k)
    raise BranchingError(f"optimizer must be one of {', '.join(SGD_TYPE + ADAM_TYPE)}, got {optimizer!r}")


def branch_lrs(lr: float, k: float, optimizer: str,
               multipliers: ArrayLike = DEFAULT_MULTIPLIERS) -> np.ndarray:
    """Learning rates of the branches at batch k B: lr * lr_scale(k) * m for each multiplier m."""
    if not (isinstance(lr, (int, float, np.floating)) and math.isfinite(lr) and lr > 0):
        raise BranchingError(f"lr must be a positive finite number, got {lr!r}")
    return lr * lr_scale(k, optimizer) * _positive(multipliers, "multipliers")


def branch_factors(k_max: int) -> np.ndarray:
    """k = 1, 2, 4, ..., k_max (``k_max`` a power of two)."""
    _power_of_two(k_max, "k_max")
    return 2 ** np.arange(int(math.log2(k_max)) + 1)


def checkpoint_steps(goal_step: int, count: int = DEFAULT_CHECKPOINTS) -> np.ndarray:
    """``count`` distinct steps evenly spaced from 0 to ``goal_step`` (both included, rounded)."""
    _int(count, "count", 2)
    _int(goal_step, "goal_step", 0)
    if goal_step < count - 1:
        raise BranchingError(f"goal_step ({goal_step}) must be >= count - 1 ({count - 1}) for "
                             f"{count} distinct checkpoints")
    return np.round(np.linspace(0, goal_step, count)).astype(np.int64)


def default_window(goal_examples: int, base_batch: int, k_max: int,
                   fraction: float = DEFAULT_WINDOW_FRACTION) -> int:
    """Window W in examples: ``fraction`` of the examples the base run needs to reach its goal,
    rounded up to a whole number of steps at every branch batch (a multiple of k_max B)."""
    _int(goal_examples, "goal_examples", 1)
    _int(base_batch, "base_batch", 1)
    _int(k_max, "k_max", 1)
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise BranchingError(f"window fraction must be in (0, 1], got {fraction!r}")
    unit = k_max * base_batch
    return unit * max(1, math.ceil(fraction * goal_examples / unit))


def window_steps(window: int, batch_size: int) -> int:
    """Steps a branch at ``batch_size`` takes for ``window`` examples (must divide evenly)."""
    _int(window, "window", 1)
    _int(batch_size, "batch_size", 1)
    if window % batch_size:
        raise BranchingError(f"window ({window} examples) must be a multiple of batch_size ({batch_size})")
    return window // batch_size


def branching_trial_steps(window: int, base_batch: int, ks: ArrayLike, n_multipliers: int,
                          n_seeds: int, n_checkpoints: int) -> int:
    """Cost of the branches in trial-steps: K * sum_k W / (k B) * multipliers * seeds."""
    per_checkpoint = sum(window_steps(window, int(k) * base_batch) for k in _ks(ks))
    return per_checkpoint * _int(n_multipliers, "n_multipliers", 1) * _int(n_seeds, "n_seeds", 1) \
        * _int(n_checkpoints, "n_checkpoints", 1)


def critical_batch(steps: ArrayLike, base_loss: ArrayLike, branch_loss: ArrayLike, *, base_batch: int,
                   ks: ArrayLike, eps: float = DEFAULT_EPS, level: float = 0.9, n_boot: int = 2000,
                   seed: int | np.random.Generator = 0) -> CriticalBatch:
    """CBS(t) by the rule in the module docstring, with ``level`` bootstrap intervals over seeds.

    ``branch_loss``: [K, len(ks), multipliers, seeds] held-out losses after the window (NaN or inf:
    diverged); ``base_loss``: [K] or [K, seeds] (paired with the branch seeds) base-run losses
    after the same number of examples. The bootstrap is exact when the seeds have at most
    ``n_boot`` distinct resamples, else ``n_boot`` draws seeded by ``seed`` (or a
    ``numpy.random.Generator``).
    """
    t = _steps(steps)
    ks_arr = _ks(ks)
    _int(base_batch, "base_batch", 1)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise BranchingError(f"eps must be a finite number >= 0, got {eps!r}")
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise BranchingError(f"level must be in (0, 1), got {level!r}")
    _int(n_boot, "n_boot", 1)
    branch = _branch_table(branch_loss, len(t), len(ks_arr))
    n_seeds = branch.shape[-1]
    base = _base_table(base_loss, len(t), n_seeds)

    counts, weights = _resamples(n_seeds, n_boot, seed)
    seed_mean = _seed_means(branch, np.ones((1, n_seeds)))[0]              # [K, nk, nm]
    best = seed_mean.min(-1)
    base_mean = base.mean(-1)
    cbs = _rule(best, base_mean, ks_arr, base_batch, eps)
    paired = base.shape[1] == n_seeds
    boot_base = counts @ base.T / n_seeds if paired else np.broadcast_to(base_mean, (len(counts), len(t)))
    boot = _rule(_seed_means(branch, counts).min(-1), boot_base, ks_arr, base_batch, eps)   # [R, K]
    alpha = (1.0 - level) / 2.0
    low = np.array([_weighted_quantile(boot[:, i], weights, alpha) for i in range(len(t))])
    high = np.array([_weighted_quantile(boot[:, i], weights, 1.0 - alpha) for i in range(len(t))])
    with np.errstate(invalid="ignore"):
        gap = best / base_mean[:, None] - 1.0
    best_index = np.where(np.isfinite(seed_mean).any(-1), np.argmin(seed_mean, -1), -1)
    return CriticalBatch(steps=t, base_batch=int(base_batch), ks=ks_arr, eps=float(eps), level=float(level),
                         n_seeds=n_seeds, critical_batch=cbs, low=low, high=high, relative_gap=gap,
                         best_multiplier=best_index)


def warmup_schedule(examples: ArrayLike, critical_batch: ArrayLike, *, base_batch: int, optimizer: str,
                    cap: int | None = None, min_batch: int | None = None) -> BatchSchedule:
    """Batch-size warmup from CBS(t) (Merrill et al. 2025): from the checkpoint at ``examples[j]``
    on, B_j = min(cap, the largest power of two <= max(CBS_j, min_batch)) (``min_batch``:
    ``base_batch`` by default), lr x ``lr_scale(B_j / base_batch, optimizer)``. Segment j + 1
    starts at the first step at which the schedule has consumed >= examples[j + 1] examples; the
    first segment starts at step 0. Consecutive equal batch sizes merge into one segment."""
    e = _steps(examples, "examples")
    cbs = np.asarray(critical_batch, dtype=float)
    if cbs.shape != e.shape or not np.all(np.isfinite(cbs) & (cbs >= 0)):
        raise BranchingError(f"critical_batch must be {len(e)} finite numbers >= 0 (one per checkpoint), "
                             f"got {critical_batch!r}")
    _int(base_batch, "base_batch", 1)
    floor = _int(base_batch if min_batch is None else min_batch, "min_batch", 1)
    top = None if cap is None else _int(cap, "cap", 1)
    batches = [warmup_batch(c, floor, top) for c in cbs]
    segments: list[BatchSegment] = []
    step = consumed = 0
    for j, b in enumerate(batches):
        if j:
            prev = segments[-1].batch_size
            n = max(0, math.ceil((e[j] - consumed) / prev))
            step, consumed = step + n, consumed + n * prev
        if segments and segments[-1].batch_size == b:
            continue
        if segments and segments[-1].start_step == step:
            # the previous segment ended before it began (its checkpoint was already passed)
            segments.pop()
            if segments and segments[-1].batch_size == b:
                continue
        segments.append(BatchSegment(step, b, lr_scale(b / base_batch, optimizer)))
    return BatchSchedule(tuple(segments))


def warmup_batch(critical: float, floor: int, cap: int | None = None) -> int:
    """The warmup's batch size at a checkpoint of CBS ``critical``: the largest power of two
    <= max(critical, ``floor``), at most ``cap``."""
    b = 1 << int(math.floor(math.log2(max(critical, floor))))
    return b if cap is None else min(b, cap)


def _rule(best, base, ks, base_batch, eps):
    """Largest k B whose best loss is within (1 + eps) of the base (0 if none), over the k axis."""
    ok = best <= (1.0 + eps) * base[..., None]
    return np.max(np.where(ok, ks * base_batch, 0), -1).astype(float)


def _seed_means(branch, counts):
    """Seed means under each resample's counts [R, S]: [R, K, nk, nm]; inf where a chosen seed
    diverged."""
    finite = np.isfinite(branch)
    total = np.einsum("...s,rs->r...", np.where(finite, branch, 0.0), counts)
    diverged = np.einsum("...s,rs->r...", (~finite).astype(float), counts) > 0
    return np.where(diverged, np.inf, total / counts.shape[1])


def _resamples(n_seeds, n_boot, seed):
    """Seed counts [R, S] of bootstrap resamples with probabilities [R]: every multiset when there
    are at most ``n_boot`` of them (C(2S - 1, S)), else ``n_boot`` multinomial draws."""
    if math.comb(2 * n_seeds - 1, n_seeds) <= n_boot:
        counts = np.array([np.bincount(c, minlength=n_seeds)
                           for c in combinations_with_replacement(range(n_seeds), n_seeds)], dtype=float)
        log_w = math.lgamma(n_seeds + 1) - np.sum([[math.lgamma(x + 1) for x in row] for row in counts], 1)
        return counts, np.exp(log_w - n_seeds * math.log(n_seeds))
    gen = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return gen.multinomial(n_seeds, np.full(n_seeds, 1.0 / n_seeds), size=n_boot).astype(float), \
        np.full(n_boot, 1.0 / n_boot)


def _weighted_quantile(values, weights, q):
    """Smallest value whose cumulative probability reaches ``q`` (values are discrete)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][np.searchsorted(cum, q - 1e-12)])


def _branch_table(values, n_checkpoints, n_ks):
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 4 or arr.shape[:2] != (n_checkpoints, n_ks) or arr.shape[2] < 1:
        raise BranchingError(f"branch_loss must have shape [checkpoints={n_checkpoints}, ks={n_ks}, "
                             f"multipliers, seeds], got {arr.shape}")
    if np.any(arr < 0):
        raise BranchingError("branch_loss must be >= 0 (NaN or inf mark a diverged branch)")
    if arr.shape[3] == 2:
        raise BranchingError("branch_loss has 2 seeds; intervals need >= 3 (or 1 for exact expected losses)")
    return arr


def _base_table(values, n_checkpoints, n_seeds):
    arr = np.asarray(values, dtype=float)
    arr = arr[:, None] if arr.ndim == 1 else arr
    if arr.ndim != 2 or arr.shape[0] != n_checkpoints or arr.shape[1] not in (1, n_seeds):
        raise BranchingError(f"base_loss must have shape [{n_checkpoints}] or [{n_checkpoints}, "
                             f"{n_seeds}] (checkpoints, seeds), got {np.shape(values)}")
    if not np.all(np.isfinite(arr) & (arr > 0)):
        raise BranchingError("base_loss must be positive finite numbers")
    return arr


def _steps(values, name="steps"):
    arr = np.asarray(values)
    if (arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.number)
            or not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr != np.round(arr))
            or np.any(np.diff(arr) <= 0)):
        raise BranchingError(f"{name} must be a non-empty increasing 1-D array of integers >= 0, got {values!r}")
    return arr.astype(np.int64)


def _ks(values):
    arr = _steps(values, "ks")
    if arr[0] < 1:
        raise BranchingError(f"ks must be integers >= 1, got {values!r}")
    return arr


def _positive(values, name):
    arr = np.atleast_1d(np.asarray(values, dtype=float))
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr) & (arr > 0)):
        raise BranchingError(f"{name} must be a non-empty 1-D array of positive finite numbers, got {values!r}")
    return arr


def _int(value, name, minimum):
    try:
        return check_int(value, name, minimum)
    except TheoryError as exc:
        raise BranchingError(str(exc)) from None


def _power_of_two(value, name):
    _int(value, name, 1)
    if value & (value - 1):
        raise BranchingError(f"{name} must be a power of two, got {value}")
