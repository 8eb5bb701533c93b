"""Delayed gradients: the model of an asynchronous worker, and the queue of past weights that
trains it, vectorized over the trials of a stack.

With delay tau_t at update t (0-based), trial weights w, learning rate schedule and optimizer
as without delay,

    w_{t+1} = w_t - update(g(w_{max(t - tau_t, 0)}; xi_t)),

the update at step t applies the gradient computed at the weights of step t - tau_t, on the
trial's own mini-batch xi_t of that step (its data order is the same as without delay).
``update`` is the optimizer's rule (SGD, momentum, Nesterov, Adam, AdamW, masks first), applied
to the current weights and optimizer state: only the gradient is stale. For the first steps,
where t - tau_t < 0, the gradient is taken at the initial weights w_0 (weights
w_t = w_0 for t < 0). This is what W workers of equal speed that
start together from w_0 do: each of the first W updates is a gradient at w_0, on another
worker's mini-batch, and no update is lost while the queue fills. With tau_t = 0 it is SGD.

Delay kinds (:data:`DELAY_KINDS`, ``training.Trial.delay_kind``):

- ``"fixed"``: tau_t = tau (``Trial.delay``) at every step. Stich, Mohtashami & Jaggi (2021)
  analyse SGD with delays bounded by a maximal delay tau; this kind is that model at its bound,
  and the other two stay within it;
- ``"uniform"``: tau_t drawn uniformly from {0, ..., tau_max} (``Trial.delay`` is tau_max) at
  every step, independently, from the trial's own data seed (:func:`uniform_delays`): the
  same draws whatever trials share its group, in a replay and on a rerun;
- ``"round_robin"``: W workers of equal speed taking turns (``Trial.workers``): every update
  comes from the worker that read the weights W - 1 updates earlier, tau_t = W - 1.

:class:`DelayQueue` keeps, for each parameter, a ring of S = max tau + 1 preallocated stacks
``[S, n, *shape]``: the weights of step s in slot s mod S. Each step the program's gradient is
taken at a slot (a view, no copy, when the stack's trials read the same step; one gather when
their delays differ). The eager programs' update then writes the weights after it straight into
the next slot (out of place, :meth:`training.engine.updates.StackUpdate.apply_`), and the
stack's weights become views of that slot: the current weights are kept without a copy. The
compiled kernel copies each trial's updated weights into the next slot itself
(:class:`DelaySteps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from training.errors import ConfigError

Tensor = torch.Tensor

DELAY_KINDS = ("fixed", "uniform", "round_robin")
# Steps of uniform delays drawn at once per trial (one numpy generator per block of steps, so
# that the delay of any step is found without drawing the steps before it).
BLOCK = 1024


def check_delay(delay: object, kind: object, workers: object) -> int:
    """The delay (maximal delay, for ``uniform``; W - 1 for ``round_robin``) of a trial with
    these fields, or a :class:`ConfigError` naming the field, the value and what is allowed."""
    def whole(value: object) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

    if kind not in DELAY_KINDS:
        near = [k for k in DELAY_KINDS if str(kind).replace("-", "_") in k]
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"trial delay_kind {kind!r}{hint}; allowed: {', '.join(DELAY_KINDS)}")
    if not whole(delay) or delay < 0:
        raise ConfigError(f"trial delay must be an integer >= 0 (updates between a gradient's "
                          f"weights and its update), got {delay!r}")
    if not whole(workers) or workers < 1:
        raise ConfigError(f"trial workers must be an integer >= 1, got {workers!r}")
    if kind != "round_robin":
        if workers != 1:
            raise ConfigError(f"trial workers={workers} is for delay_kind 'round_robin' only "
                              f"(delay W - 1); with delay_kind {kind!r} give the delay itself")
        return int(delay)
    if delay not in (0, workers - 1):
        raise ConfigError(f"trial delay {delay} disagrees with workers={workers}: round_robin "
                          f"over W workers has delay W - 1 = {workers - 1}; allowed: leave "
                          f"delay out, or {workers - 1} (did you mean workers={delay + 1}?)")
    return int(workers) - 1


def refuse(trials: Sequence, where: str, why: str) -> None:
    """A :class:`ConfigError` if a trial of ``trials`` has a delay: ``where`` cannot train it,
    for reason ``why``."""
    delayed = [i for i, t in enumerate(trials) if t.delay]
    if delayed:
        raise ConfigError(f"{where} does not train delayed gradients ({why}); trial "
                          f"{delayed[0]} has delay {trials[delayed[0]].delay}; allowed: delay 0, "
                          f"or training.train_trials")


def uniform_delays(seed: int, tau_max: int, start: int, stop: int) -> np.ndarray:
    """The uniform delays of steps ``start`` .. ``stop - 1`` of the trial with data seed
    ``seed``: draws from {0, ..., tau_max}, block by block of BLOCK steps, each block from its
    own ``numpy`` generator seeded by (seed, block), so a step's delay depends on nothing else."""
    out = []
    for block in range(start // BLOCK, (stop - 1) // BLOCK + 1):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), block, 0xDE1A]))
        draws = rng.integers(0, tau_max + 1, size=BLOCK)
        lo, hi = max(start, block * BLOCK), min(stop, (block + 1) * BLOCK)
        out.append(draws[lo - block * BLOCK:hi - block * BLOCK])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)  # tensors inside: no element-wise ==
class DelaySteps:
    """K consecutive delayed steps of a stack, for a program that takes them in one call (the
    compiled kernel): step k of trial i takes its gradient at ring slot ``read[k, i]`` and
    leaves its updated weights in slot ``write[k]`` (``ring``: the queue's own)."""

    ring: list[Tensor]
    read: Tensor   # [K, n] int64
    write: Tensor  # [K] int64


@dataclass(frozen=True, eq=False)  # tensors inside: no element-wise ==
class Reads:
    """Where the gradients of one block of BLOCK steps (from step ``block * BLOCK``) are read,
    worked out once a block rather than in Python every step: per step k of the block, the
    step whose weights the first trial reads (``first[k]``), whether every trial reads that
    step (``agree[k]``), and each trial's row in the ring viewed as ``[S * n, *shape]``
    (``rows[k]``, ``[BLOCK, n]``, for the gather)."""

    block: int
    first: np.ndarray  # [BLOCK] int64
    agree: np.ndarray  # [BLOCK] bool
    rows: Tensor       # [BLOCK, n] int64, on the ring's device


@dataclass(eq=False)  # tensors inside: no element-wise ==
class DelayQueue:
    """The past weights of one stack of n trials (see the module docstring): ``ring``, per
    parameter ``[S, n, *shape]`` with the weights of step s in slot s mod S; per trial its
    delay (``tau``, the maximal one for ``uniform``), whether it draws ``uniform`` delays, and
    its data ``seeds`` (the uniform draws')."""

    ring: list[Tensor]
    tau: list[int]
    uniform: list[bool]
    seeds: list[int]
    _block: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _reads: Reads | None = field(default=None, repr=False)
    # where a gather of past weights goes, reused step after step (a fresh 2 MB allocation a
    # step is an mmap and its page faults under glibc's defaults), and the ring's
    # [S * n, *shape] views it gathers from
    _gathered: list[Tensor] = field(default_factory=list, repr=False)
    _rows_of: list[Tensor] = field(default_factory=list, repr=False)

    @classmethod
    def start(cls, params: Sequence[Tensor], trials: Sequence, seeds: Sequence[int]
              ) -> "DelayQueue | None":
        """The queue of a stack whose weights at step 0 are ``params`` (``[n, *shape]``), for
        its ``trials`` (``training.Trial``: ``delay``, ``delay_kind``) and data ``seeds``; None
        where no trial has a delay (the step is then exactly the undelayed one)."""
        tau = [int(t.delay) for t in trials]
        if not any(tau):
            return None
        slots = max(tau) + 1
        ring = [torch.empty((slots, *p.shape), dtype=p.dtype, device=p.device) for p in params]
        for r, p in zip(ring, params):
            r[0].copy_(p)
        return cls(ring, tau, [t.delay_kind == "uniform" for t in trials], list(seeds))

    @property
    def slots(self) -> int:
        return self.ring[0].shape[0]

    def delay_block(self, block: int) -> np.ndarray:
        """Every trial's delays at the steps of ``block`` (``block * BLOCK`` onwards),
        ``[n, BLOCK]``; the last block asked for is kept."""
        if block not in self._block:
            self._block = {block: np.stack([
                uniform_delays(s, t, block * BLOCK, (block + 1) * BLOCK) if u else
                np.full(BLOCK, t) for s, t, u in zip(self.seeds, self.tau, self.uniform)])}
        return self._block[block]

    def delays(self, step: int) -> list[int]:
        """Every trial's delay at update ``step``."""
        if not any(self.uniform):
            return self.tau
        return self.delay_block(step // BLOCK)[:, step % BLOCK].tolist()

    def reads(self, block: int) -> Reads:
        """The :class:`Reads` of ``block`` (the last one asked for is kept): trial i's
        gradient at step t is read at step max(t - tau_t, 0), row (that step mod S) * n + i."""
        if self._reads is None or self._reads.block != block:
            steps = np.arange(block * BLOCK, (block + 1) * BLOCK)
            source = np.maximum(steps[:, None] - self.delay_block(block).T, 0)
            n = source.shape[1]
            rows = torch.from_numpy((source % self.slots) * n + np.arange(n))
            self._reads = Reads(block, source[:, 0], (source == source[:, :1]).all(1),
                                rows.to(self.ring[0].device))
        return self._reads

    def stale(self, params: Sequence[Tensor], step: int) -> list[Tensor]:
        """The weights each trial takes update ``step``'s gradient at: those of step
        max(step - tau, 0). ``params`` (the current weights) where every trial's delay is 0
        now, a slot of the ring (a view) where all read one step, else one gather."""
        reads, k = self.reads(step // BLOCK), step % BLOCK
        if reads.agree[k]:
            first = int(reads.first[k])
            return list(params) if first == step else [r[first % self.slots] for r in self.ring]
        if not self._gathered:
            self._gathered = [torch.empty_like(r[0]) for r in self.ring]
            self._rows_of = [r.view(-1, *r.shape[2:]) for r in self.ring]
        for r, out in zip(self._rows_of, self._gathered):
            torch.index_select(r, 0, reads.rows[k], out=out)
        return list(self._gathered)

    def steps(self, start: int, steps: int) -> "DelaySteps":
        """Updates ``start`` .. ``start + steps - 1`` as a program that takes many steps in one
        call reads them (:class:`DelaySteps`)."""
        read = [[max(s - d, 0) % self.slots for d in self.delays(s)]
                for s in range(start, start + steps)]
        write = [(s + 1) % self.slots for s in range(start, start + steps)]
        return DelaySteps(self.ring, torch.tensor(read, dtype=torch.long),
                          torch.tensor(write, dtype=torch.long))

    def slot(self, step: int) -> list[Tensor]:
        """Views of the ring slot that keeps the weights of step ``step``: where update
        ``step - 1`` writes them (the slot of step ``step - S``, which no later gradient reads)."""
        return [r[step % self.slots] for r in self.ring]

    def select(self, idx: Tensor) -> "DelayQueue":
        """The queue of stack positions ``idx`` (a copy)."""
        rows = idx.tolist()
        return DelayQueue([r.index_select(1, idx.to(r.device)) for r in self.ring],
                          [self.tau[i] for i in rows], [self.uniform[i] for i in rows],
                          [self.seeds[i] for i in rows])

    def clone(self) -> "DelayQueue":
        """A copy that can be advanced independently (a replay's snapshot)."""
        return DelayQueue([r.clone() for r in self.ring], list(self.tau), list(self.uniform),
                          list(self.seeds))
