"""Asynchronous data parallelism in the wall-clock cost model: no barrier, stragglers drawn from
a stated distribution, the delays they induce, and where asynchrony reaches the goal sooner.

Workers. W workers each compute the gradient of a batch of b examples. One gradient's compute
time is c (1 + s X) with c = t_fixed + t_example b from a fitted
:class:`~training.distributed.costmodel.CostModel`, a straggler scale s and X >= 0 of mean 1 drawn
independently per gradient (:class:`Stragglers`: exponential, X ~ Exp(1); lognormal,
X = exp(N(-v/2, v)) with v = shape^2; or none, X = 1), seeded.

Synchronous mode (barrier): every step waits for the slowest worker, then ring all-reduces:

    t_sync = c (1 + s max_w X_w) + t_allreduce(W),   E[max_w X_w] = H_W for exponentials
                                                    (H_W = 1 + 1/2 + ... + 1/W),

one update of global batch W b per step.

Asynchronous mode (no barrier, a parameter server): a worker pushes its gradient, the server
applies it at once as one update of batch b, the worker pulls the new weights and starts again,

    t_async = c (1 + s X) + 2 (alpha + beta n_bytes)   (push the gradient, pull the weights),

so updates arrive at rate W / E[t_async] (renewal theory). The server's own time and its
bandwidth limit are not modelled (Koloskova et al. 2022 make the same assumption), and the
push and the pull each pay the cost model's alpha, fitted per ring round inside a DDP step, as
their latency. The fitted alpha also holds the waiting for the slower worker on the machine it
was measured on, so the straggler scale s is the slowdown beyond that machine's own. The delay of
an update is the number of updates applied between its worker's pull and its own application
(every worker starts from w_0); with equal speeds and no stragglers the workers take turns and
every delay is W - 1 once the first round is applied; with stragglers the delays spread, with
long-run mean W - 1.

:func:`compare` puts the two modes side by side for a measured S(B, tau): synchronous with W
workers needs S(W b, 0) steps; asynchronous needs S(b, W - 1) updates, the fixed delay standing
for the spread one it induces (whose mean, 95th percentile and maximum are reported beside it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from training.distributed.costmodel import CostModel, CostModelError

DISTRIBUTIONS = ("none", "exponential", "lognormal")
# rounds of W updates simulated for the delay columns where the asynchronous side was not measured
_ROUNDS = 64


@dataclass(frozen=True)
class Stragglers:
    """Per-gradient slowdown 1 + ``scale`` X, X of mean 1 (module docstring); ``shape`` is the
    lognormal's sigma."""

    distribution: str = "exponential"
    scale: float = 0.0
    shape: float = 1.0

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise CostModelError(f"stragglers distribution {self.distribution!r} unknown; "
                                 f"allowed: {', '.join(DISTRIBUTIONS)}")
        for key in ("scale", "shape"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise CostModelError(f"stragglers {key} must be a finite number >= 0, got {v!r}")

    def draw(self, rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
        """Slowdown factors 1 + s X of the given shape."""
        if self.distribution == "none" or self.scale == 0:
            return np.ones(size)
        if self.distribution == "exponential":
            x = rng.exponential(1.0, size)
        else:
            x = rng.lognormal(-self.shape ** 2 / 2.0, self.shape, size)
        return 1.0 + self.scale * x


@dataclass(frozen=True, eq=False)
class AsyncRun:
    """``steps`` asynchronous updates: ``time`` of the last, ``delays[u]`` of update u, the
    ``worker`` that sent it."""

    workers: int
    steps: int
    time: float
    delays: np.ndarray
    worker: np.ndarray

    def delay_quantile(self, q: float) -> float:
        return float(np.quantile(self.delays, q))


def compute_time(cost: CostModel, per_worker_batch: int) -> float:
    """c = t_fixed + t_example b: one gradient of b examples without communication."""
    if not isinstance(per_worker_batch, (int, np.integer)) or per_worker_batch < 1:
        raise CostModelError(f"per_worker_batch must be an integer >= 1, got {per_worker_batch!r}")
    return cost.t_fixed + cost.t_example * per_worker_batch


def push_pull_time(cost: CostModel) -> float:
    """2 (alpha + beta n_bytes): push one gradient to the server and pull the weights back."""
    return 2.0 * (cost.alpha + cost.beta * cost.n_params * cost.bytes_per_param)


def simulate_sync(cost: CostModel, workers: int, per_worker_batch: int, steps: int,
                  stragglers: Stragglers = Stragglers(), seed: int = 0) -> float:
    """Modelled seconds for ``steps`` synchronous steps: sum over steps of the slowest worker's
    compute plus the ring all-reduce."""
    _check(workers, "workers")
    _check(steps, "steps", 0)
    rng = np.random.default_rng(seed)
    c = compute_time(cost, per_worker_batch)
    slow = stragglers.draw(rng, (steps, workers)).max(axis=1) if steps else np.zeros(0)
    return float(c * slow.sum() + steps * cost.allreduce_time(workers))


def simulate_async(cost: CostModel, workers: int, per_worker_batch: int, steps: int,
                   stragglers: Stragglers = Stragglers(), seed: int = 0) -> AsyncRun:
    """Event order of ``steps`` asynchronous updates from ``workers`` workers that never wait:
    the time of the last update and every update's delay (module docstring). Ties (equal
    finishing times) are applied in worker order."""
    _check(workers, "workers")
    _check(steps, "steps")
    base, comm = compute_time(cost, per_worker_batch), push_pull_time(cost)
    jobs = max(1, -(-steps // workers))
    while True:
        # drawn afresh from the seed at every size: the run depends only on (seed, final size)
        rng = np.random.default_rng(seed)
        durations = base * stragglers.draw(rng, (workers, jobs)) + comm
        finish = np.cumsum(durations, axis=1)
        order = np.lexsort((np.repeat(np.arange(workers), jobs), finish.ravel()))[:steps]
        # enough jobs per worker when none could still finish before the last update taken
        if finish.ravel()[order[-1]] <= finish[:, -1].min():
            break
        jobs *= 2
    worker, job = np.divmod(order, jobs)
    update = np.empty(workers * jobs, dtype=np.int64)
    update[order] = np.arange(steps)
    # a job starts from the weights after its worker's previous update (w_0 for the first job)
    prev = np.where(job > 0, update[np.maximum(order - 1, 0)] + 1, 0)
    delays = np.arange(steps) - prev
    return AsyncRun(workers, steps, float(finish.ravel()[order[-1]]), delays, worker)


def expected_sync_step(cost: CostModel, workers: int, per_worker_batch: int,
                       stragglers: Stragglers) -> float | None:
    """E t_sync in closed form where one is known: no stragglers, or exponential ones
    (E max of W Exp(1) = H_W); None for lognormal."""
    c = compute_time(cost, per_worker_batch)
    if stragglers.distribution == "lognormal" and stragglers.scale:
        return None
    harmonic = sum(1.0 / i for i in range(1, workers + 1))
    slow = 1.0 + (stragglers.scale * harmonic if stragglers.distribution == "exponential" else 0.0)
    return c * slow + cost.allreduce_time(workers)


def expected_async_interval(cost: CostModel, workers: int, per_worker_batch: int,
                            stragglers: Stragglers) -> float:
    """Long-run seconds per asynchronous update: E[t_async] / W (renewal theory)."""
    slow = 1.0 + (stragglers.scale if stragglers.distribution != "none" else 0.0)
    return (compute_time(cost, per_worker_batch) * slow + push_pull_time(cost)) / workers


@dataclass(frozen=True)
class Comparison:
    """Synchronous (W workers, global batch W b) against asynchronous (W workers of batch b,
    delay W - 1) for one (b, W); times in modelled seconds, None where a side did not reach the
    goal."""

    per_worker_batch: int
    workers: int
    sync_steps: int | None
    sync_time: float | None
    async_steps: int | None
    async_time: float | None
    mean_delay: float
    p95_delay: float
    max_delay: int

    @property
    def winner(self) -> str:
        """"async", "sync", "tie" or "-" (neither side reached the goal)."""
        if self.sync_time is None and self.async_time is None:
            return "-"
        if self.sync_time is None:
            return "async"
        if self.async_time is None:
            return "sync"
        return "tie" if self.async_time == self.sync_time else (
            "async" if self.async_time < self.sync_time else "sync")


def compare(steps: Mapping[tuple[int, int], int | None], cost: CostModel,
            workers: Sequence[int] = (2, 4, 8), stragglers: Stragglers = Stragglers(),
            seed: int = 0) -> list[Comparison]:
    """For every measured per-update batch b and worker count W in ``workers``: synchronous time
    to S(W b, 0) steps against asynchronous time to S(b, W - 1) updates (``steps`` maps
    (batch size, delay) to measured steps to the goal, None where not reached), both with the
    same stragglers and seed. A pair is listed when both sides are measured; a side that did not
    reach the goal loses."""
    if not steps:
        raise CostModelError("steps is empty: give (batch size, delay) -> steps to the goal")
    for key, s in steps.items():
        integers = isinstance(key, tuple) and all(isinstance(v, (int, np.integer)) for v in key)
        if not (integers and len(key) == 2 and key[0] >= 1 and key[1] >= 0):
            raise CostModelError(f"steps keys must be (batch size >= 1, delay >= 0) integer pairs, "
                                 f"got {key!r}")
        if s is not None and (not isinstance(s, (int, np.integer)) or s < 0):
            raise CostModelError(f"steps[{key}] must be an integer >= 0 or None, got {s!r}")
    ws = sorted({_check(w, "workers") for w in workers})
    rows = []
    for b in sorted({k[0] for k in steps}):
        for w in ws:
            s_sync, s_async = steps.get((w * b, 0)), steps.get((b, w - 1))
            if (w * b, 0) not in steps or (b, w - 1) not in steps:
                continue
            t_sync = None if s_sync is None else simulate_sync(cost, w, b, s_sync, stragglers, seed)
            # the delays asynchrony induces, over the measured run or a few rounds where none is
            run = simulate_async(cost, w, b, s_async or _ROUNDS * w, stragglers, seed)
            t_async = None if s_async is None else run.time if s_async else 0.0
            rows.append(Comparison(b, w, s_sync, t_sync, s_async, t_async, float(run.delays.mean()),
                                   run.delay_quantile(0.95), int(run.delays.max())))
    return rows


def format_comparison(rows: Sequence[Comparison], stragglers: Stragglers) -> str:
    """Markdown table: per (b, W), both modes' steps and modelled time, the delays asynchrony
    induces, and which reaches the goal sooner."""
    head = (f"Modelled time to the goal, synchronous (barrier, global batch W b) against "
            f"asynchronous (W workers of batch b, delay W - 1); stragglers: "
            f"{stragglers.distribution}, scale {stragglers.scale:g}"
            + (f", shape {stragglers.shape:g}" if stragglers.distribution == "lognormal" else "")
            + ".")
    lines = [head, "",
             "| b | W | sync steps | sync time | async steps | async time "
             "| delay mean / p95 / max | sooner |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        lines.append(f"| {r.per_worker_batch} | {r.workers} | {cell(r.sync_steps, 'd')} | "
                     f"{cell(r.sync_time, '.3g')} s | {cell(r.async_steps, 'd')} | "
                     f"{cell(r.async_time, '.3g')} s | {r.mean_delay:.2f} / {r.p95_delay:.0f} / "
                     f"{r.max_delay} | {r.winner} |")
    return "\n".join(lines)


def _check(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise CostModelError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
