"""The trainer's own weights handed out during a run: :class:`Watch`, the steps at which
:func:`training.train_trials` calls back with every trial's weights before and after one update.

A measurement along a run (Lee et al. (2021)'s local Lipschitz constant of the update into step
t, which needs w_{t-1} and w_t) can be taken from the run itself instead of a replay of it: the
loop stops its stacks at t - 1, copies their weights, takes update t - 1 (0-based) and calls
``callback(t, ids, before, after)``. Splitting the steps there changes nothing a trial computes
(each step is the same program call on the same batch; the losses are summed in the same order),
so the run is the one it would be without the watch. The callback's time is outside
``step_timer``; the replay of a hit (:func:`training.engine.loop.replay`) never calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from training.errors import ConfigError

Tensor = torch.Tensor
# callback(t, ids, before, after): after update t (1-based), the trials ``ids`` (indices in the
# call's list of trials) still training, with name -> [n, *shape] weights before and after it
Callback = Callable[[int, list[int], Mapping[str, Tensor], Mapping[str, Tensor]], None]


@dataclass(frozen=True)
class Watch:
    """Steps t >= 1 (distinct, ascending once checked) at which :func:`training.train_trials`
    calls ``callback(t, ids, before, after)``: ``ids`` the indices, in the call's list of trials,
    of the trials that took update t (not diverged, not ended before it), ``before`` / ``after``
    every parameter, then every module buffer the program keeps per trial (BatchNorm's running
    statistics), by name, stacked ``[n, *shape]`` in ``ids``' order: w_{t-1} (a copy) and w_t
    (the trainer's own tensors: read them, do not keep or change them). A trial in several
    stacks is called once per stack."""

    steps: Sequence[int]
    callback: Callback

    def checked(self) -> "Watch":
        """The watch with its steps as a sorted tuple of distinct ints >= 1."""
        steps = tuple(sorted({int(t) for t in self.steps}))
        if any(t < 1 for t in steps) or any(int(t) != t for t in self.steps):
            raise ConfigError(f"watch steps must be integers >= 1 (the update into step t), "
                              f"got {list(self.steps)[:5]}")
        if not callable(self.callback):
            raise ConfigError(f"watch callback must be callable, got "
                              f"{type(self.callback).__name__}")
        return Watch(steps, self.callback)


def watched_steps(runner, st, start: int, end: int, watch: Watch | None,
                  names: Sequence[str], buffer_names: Sequence[str]):
    """``runner.steps(st, start, end)`` (each part inside ``runner.step_timer``), stopping at
    every watched t in (start, end] to hand w_{t-1} and w_t to the watch (module docstring).
    Returns the stack and its diverged trials as ``runner.steps`` does."""
    dropped = []
    s = start
    for t in (() if watch is None else [t for t in watch.steps if start < t <= end]):
        st, lost = _timed(runner, st, s, t - 1)
        dropped += lost
        if not st.ids:
            return st, dropped
        ids, before = list(st.ids), _weights(st, names, buffer_names, copy=True)
        st, lost = _timed(runner, st, t - 1, t)
        dropped += lost
        if not st.ids:
            return st, dropped
        # a trial that diverged at update t - 1 has no w_t: the others' rows of ``before``
        rows = torch.tensor([ids.index(i) for i in st.ids], dtype=torch.long)
        watch.callback(t, list(st.ids),
                       {k: v.index_select(0, rows.to(v.device)) for k, v in before.items()},
                       _weights(st, names, buffer_names, copy=False))
        s = t
    st, lost = _timed(runner, st, s, end)
    return st, dropped + lost


def _timed(runner, st, start: int, end: int):
    """``runner.steps`` inside its step timer; nothing for an empty range."""
    if start >= end:
        return st, []
    with runner.step_timer:
        return runner.steps(st, start, end)


def _weights(st, names: Sequence[str], buffer_names: Sequence[str], copy: bool
             ) -> dict[str, Tensor]:
    """The stack's parameters, then its module buffers (where it keeps them), by name."""
    tensors = list(st.params) + ([] if st.module is None else list(st.module.buffers))
    keys = list(names) + (list(buffer_names) if st.module is not None else [])
    return {k: (v.clone() if copy else v) for k, v in zip(keys, tensors)}
