"""A trial's random draws inside the model: Dropout, and any other random torch operation a
module calls in its forward pass.

Each trial draws from a generator of its own, seeded by :func:`randomness_seed` from the group's
seed and the trial's index (as its data order is, :func:`training.schedules.order.trial_seed`, but a
different stream), so results are reproducible and trials independent, whichever trials share
a group. The trainers run a trial's training step with the device's default generator set to
that trial's state and keep the state it leaves; the plain loop that matches trial ``i`` of
``train_trials(..., run)`` is::

    torch.manual_seed(randomness_seed(run.seed, i))
    # ... the usual loop: model.train(), forward, loss.backward(), optimizer.step()

Evaluations and the divergence reference (the first mini-batch loss) run in eval mode and draw
nothing. The caller's generator state is restored when a trainer returns.

Torch's default generators are process-wide. Everything here that sets or restores them holds
:data:`LOCK` (so does seeded model building, ``training.models.seeded``), so the threads of one
process (a ``ThreadPoolExecutor`` running a study's groups) never interleave their seeds: a
trainer holds it for the whole run of a model that draws random numbers, and never takes it
for one that does not (:func:`draws`).
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

Tensor = torch.Tensor
LOCK = threading.RLock()


def randomness_seed(seed: int, index: int, rank: int = 0) -> int:
    """Seed of the model's random draws in trial ``index`` of a group with seed ``seed``; under
    data parallelism, of rank ``rank``'s (rank 0 draws as the single process does)."""
    entropy = [int(seed), int(index), 0xD50] + ([int(rank)] if rank else [])
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint32)[0])


def _cuda_index(device: str | torch.device) -> int | None:
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def get_state(device: str | torch.device) -> Tensor:
    """The state of ``device``'s default generator (the one torch's random operations use)."""
    index = _cuda_index(device)
    return torch.get_rng_state() if index is None else torch.cuda.get_rng_state(index)


def set_state(state: Tensor, device: str | torch.device) -> None:
    """Set ``device``'s default generator to ``state``."""
    index = _cuda_index(device)
    if index is None:
        torch.set_rng_state(state)
    else:
        torch.cuda.set_rng_state(state, index)


@contextlib.contextmanager
def preserved(device: str | torch.device) -> Iterator[None]:
    """Restore ``device``'s default generator (and the CPU's) on exit, holding :data:`LOCK`
    throughout: a trainer changes it trial by trial and gives the caller back the state it
    had."""
    index = _cuda_index(device)
    with LOCK, torch.random.fork_rng(devices=[] if index is None else [index]):
        yield


def seeded_state(seed: int, device: str | torch.device) -> Tensor:
    """The state ``device``'s default generator has after ``torch.manual_seed(seed)`` (that of
    a fresh generator seeded so: the default one is not touched)."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed)).get_state()


@contextlib.contextmanager
def drawing(states: list[Tensor], i: int, device: str | torch.device) -> Iterator[None]:
    """Within the block, random operations draw from trial ``i``'s generator state
    ``states[i]``, which is replaced by the state they leave."""
    set_state(states[i], device)
    try:
        yield
    finally:
        states[i] = get_state(device)


class RandomOps(TorchDispatchMode):
    """Records the random operations (ATen's ``nondeterministic_seeded`` tag) run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.seen.add(func.name())
        return func(*args, **(kwargs or {}))


def random_operations(model: nn.Module, x: Tensor) -> set[str]:
    """The random operations a training step of ``model`` draws from, seen in a train-mode
    forward pass on the example batch ``x`` (two examples or more for a model with batch
    statistics; a copy of the model, so its running statistics stay; the caller's generator
    restored). It finds randomness no layer type declares, such
    as ``F.dropout`` or ``F.scaled_dot_product_attention(..., dropout_p=...)`` in a forward
    method; attention runs on the math backend, since the fused kernels carry the random tag
    whatever their dropout."""
    probe = copy.deepcopy(model).train()
    like = next((t for t in probe.parameters() if t.is_floating_point()), None)
    if like is not None:
        x = x.to(device=like.device, dtype=like.dtype if x.is_floating_point() else x.dtype)
    with preserved(x.device), RandomOps() as ops, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        probe(x)
    return ops.seen


def advances_generator(model: nn.Module, x: Tensor) -> bool:
    """Whether a train-mode forward pass of ``model`` on the example batch ``x`` draws from the
    device's generator: its state after the pass differs from before (a copy of the model, so
    its running statistics stay; the generator restored, under :data:`LOCK`). What
    :func:`random_operations` finds, without its dispatch mode, whose first use imports
    ``torch._dynamo``: that import was most of a fresh process's first ``train_trials`` call
    (12.8 s of 13.7 on the loaded 2-core machine)."""
    probe = copy.deepcopy(model).train()
    like = next((t for t in probe.parameters() if t.is_floating_point()), None)
    if like is not None:
        x = x.to(device=like.device, dtype=like.dtype if x.is_floating_point() else x.dtype)
    with preserved(x.device), torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        before = get_state(x.device).clone()
        probe(x)
        return not torch.equal(get_state(x.device), before)


def draws(model: nn.Module, example: Tensor | None) -> bool:
    """Whether a training step of ``model`` draws random numbers: a layer type that declares it
    (Dropout with p > 0, a ``dropout`` probability above 0), or, when ``example`` (an input
    batch) is given, a train-mode forward pass on it that draws (:func:`advances_generator`)."""
    declared = any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
                   or isinstance(getattr(m, "dropout", None), float) and m.dropout > 0
                   for m in model.modules())
    return declared or (example is not None and advances_generator(model, example))
