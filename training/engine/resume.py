"""Stacked trials that start from a :class:`training.state.TrainState`, and the state they end in:
the seams of ``train_trials(..., start=, return_state=, data_seeds=)``.

A start state fixes, for every trial of a group, the weights, the optimizer buffers (momentum, or
Adam's m and v), the step (which drives the lr schedule and Adam's bias corrections), the
divergence reference and the position in the data order; a state of one trial seeds every trial
of the group (the branches of a checkpoint, Merrill et al. 2025). The trials keep their own
metaparameters and data seeds.

Data order from a position. :class:`training.state.DataStream` reads a batch of b examples at
(epoch, offset) as ``perm[offset:offset + b]`` of that epoch's permutation, starting the next
epoch when fewer than b remain. For one constant batch size B from position (e0, o0) at step
t0, update t0 + j therefore reads epoch e0 at offset o0 + j B while j < r = (n - o0) // B, then
epoch e0 + 1 + q at offset k B with (q, k) = divmod(j - r, n // B). From (0, 0) at step 0 this
is :class:`training.schedules.order.BatchOrder`'s divmod(step, n // B), so a run without a start state
reads exactly the batches it always did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from training.config import is_int
from training.errors import ConfigError
from training.masks import mask_
from training.state import DataPosition, TrainState

Tensor = torch.Tensor


@dataclass(frozen=True)
class DataOrigin:
    """Where a run's data order starts: update ``step`` reads from (``epoch``, ``offset``)."""

    step: int = 0
    epoch: int = 0
    offset: int = 0

    @classmethod
    def of(cls, start: TrainState | None) -> "DataOrigin":
        """The origin of a run from ``start`` (None: the beginning)."""
        return cls() if start is None else cls(start.step, start.position.epoch, start.position.offset)

    def locate(self, step: int, batch_size: int, n: int) -> tuple[int, int]:
        """(epoch, offset) of the batch of update ``step`` (>= ``self.step``) at ``batch_size``
        from a training set of ``n`` examples (module docstring)."""
        j = step - self.step
        left = (n - self.offset) // batch_size
        if j < left:
            return self.epoch, self.offset + j * batch_size
        q, k = divmod(j - left, n // batch_size)
        return self.epoch + 1 + q, k * batch_size

    def position(self, step: int, batch_size: int, n: int) -> DataPosition:
        """The data position after the updates before ``step`` (as DataStream leaves it)."""
        if step == self.step:
            return DataPosition(self.epoch, self.offset)
        epoch, offset = self.locate(step - 1, batch_size, n)
        return DataPosition(epoch, offset + batch_size)


def check_start(start: Any, model: torch.nn.Module, optimizer: str, n_trials: int,
                max_steps: int) -> TrainState | None:
    """``start`` as a state the group can resume: None, or a TrainState of ``model``'s
    parameters, of ``optimizer``'s family, with one trial or ``n_trials``, not past
    ``max_steps``."""
    if start is None:
        return None
    if not isinstance(start, TrainState):
        raise ConfigError(f"start must be a training.state.TrainState or None, got {type(start).__name__}")
    if start.n_trials not in (1, n_trials):
        raise ConfigError(f"start holds {start.n_trials} trials; allowed: 1 (shared by every trial) "
                          f"or {n_trials} (one per trial)")
    start.check_model(model)
    start.check_optimizer(optimizer)
    if max_steps < start.step:
        raise ConfigError(f"max_steps ({max_steps}) must be >= the start state's step ({start.step})")
    return start


def check_data_seeds(seeds: Any, n_trials: int) -> list[int] | None:
    """``seeds`` as one data seed (an integer >= 0) per trial, or None."""
    if seeds is None:
        return None
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or len(seeds) != n_trials \
            or not all(is_int(s) and s >= 0 for s in seeds):
        raise ConfigError(f"data_seeds must be {n_trials} integers >= 0 (one per trial), got {seeds!r}")
    return [int(s) for s in seeds]


def _rows(t: Tensor, ids: list[int], like: Tensor) -> Tensor:
    """Rows ``ids`` of a state tensor [1 or N, ...] (one row: repeated) as a copy like ``like``."""
    if t.shape[0] == 1:
        return t.to(device=like.device, dtype=like.dtype).expand(len(ids), *t.shape[1:]).clone()
    return t.index_select(0, torch.tensor(ids, device=t.device)).to(device=like.device, dtype=like.dtype)


def load_stack(st: Any, start: TrainState, names: list[str], buffer_names: Sequence[str] = ()
               ) -> None:
    """Put ``start``'s weights (masked with the stack's masks), momentum buffers or Adam moments
    and divergence reference into the stack ``st`` of :mod:`training.trials` (its trials
    ``st.ids``). A buffer the state lacks (a state before the first update) stays zero, as
    ``torch.optim`` starts it. The module's buffers (``buffer_names``) and generator states come
    from the state when it holds them."""
    ids = st.ids
    st.params = [_rows(start.params[name], ids, p) for name, p in zip(names, st.params)]
    mask_(st.params, st.masks)

    def buffers(table, current):
        return [_rows(table[name], ids, b) if name in table else b for name, b in zip(names, current)]

    if st.bufs is not None:
        st.bufs = buffers(start.buffers, st.bufs)
    if getattr(st, "adam", None) is not None:
        st.adam.exp_avg = buffers(start.buffers, st.adam.exp_avg)
        st.adam.exp_avg_sq = buffers(start.moments, st.adam.exp_avg_sq)
    if st.module is not None:
        if start.model_buffers:
            st.module.buffers = [_rows(start.model_buffers[name], ids, b)
                                 for name, b in zip(buffer_names, st.module.buffers)]
        if start.rng_states and st.module.rng is not None:
            st.module.rng = [start.rng_states[0 if len(start.rng_states) == 1 else i] for i in ids]
    losses = start.initial_loss
    st.init_loss = torch.tensor([losses[0] if len(losses) == 1 else losses[i] for i in ids],
                                dtype=torch.float64, device=st.init_loss.device)


def end_state(stacks: Sequence[Any], names: list[str], step: int, origin: DataOrigin,
              batch_size: int, n: int, buffer_names: Sequence[str] = ()
              ) -> tuple[TrainState | None, tuple[int, ...]]:
    """The state of the trials still in ``stacks`` after ``step`` updates, and their indices in
    the group (increasing); (None, ()) when no trial is left."""
    live = [st for st in stacks if st.ids]
    if not live:
        return None, ()

    def cat(get, keys=names) -> dict[str, Tensor]:
        return {name: torch.cat([get(st)[j] for st in live]).clone() for j, name in enumerate(keys)}

    adam = getattr(live[0], "adam", None) is not None
    buffers = (cat(lambda st: st.adam.exp_avg) if adam else
               {} if live[0].bufs is None else cat(lambda st: st.bufs))
    moments = cat(lambda st: st.adam.exp_avg_sq) if adam else {}
    module = live[0].module is not None
    state = TrainState(cat(lambda st: st.params), buffers, int(step), origin.position(step, batch_size, n),
                       tuple(float(v) for st in live for v in st.init_loss.tolist()), moments,
                       cat(lambda st: st.module.buffers, buffer_names) if module else {},
                       tuple(s for st in live for s in st.module.rng)
                       if module and live[0].module.rng is not None else ())
    return state, tuple(i for st in live for i in st.ids)


def check_init_params(init_params: Any, model: torch.nn.Module, n_trials: int) -> dict[str, Tensor]:
    """``init_params`` as name -> ``[n_trials, *shape]`` floating-point tensor for exactly
    ``model``'s parameters ({} for None), else one :class:`ConfigError` line."""
    if init_params is None:
        return {}
    if not isinstance(init_params, Mapping):
        raise ConfigError(f"init_params must be a mapping name -> [N, *shape] tensor (one row "
                          f"per trial), got {type(init_params).__name__}")
    shapes = {k: tuple(p.shape) for k, p in model.named_parameters()}
    if set(init_params) != set(shapes):
        missing = sorted(set(shapes) - set(init_params))
        extra = sorted(set(init_params) - set(shapes))
        raise ConfigError(f"init_params must hold every parameter of the model and no other; "
                          f"missing {missing}, not parameters {extra}")
    out = {}
    for name, shape in shapes.items():
        t = init_params[name]
        if not isinstance(t, Tensor) or not t.is_floating_point() \
                or tuple(t.shape) != (n_trials, *shape):
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ConfigError(f"init_params[{name!r}] must be a floating-point tensor of shape "
                              f"{(n_trials, *shape)} (one row per trial), got {got}")
        out[name] = t.detach()
    return out
