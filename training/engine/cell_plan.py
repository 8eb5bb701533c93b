"""Per-cell choices of the vectorized trainer: which program computes a stack's step, how many
trials share a stack, and how many examples a chunk of one trial holds, for one (model, batch
size) cell.

The choice follows rules, each with the measurements behind it:

- ``fused`` (:mod:`training.engine.fused`): an ``nn.Sequential`` of Linear / Conv1d / ReLU
  (``mlp``, ``linear``, ``cnn1d``) on the CPU with the compiled kernel. Its work per trial is
  independent of the other trials and its activations live only per chunk, so a stack holds up
  to MAX_STACK trials (fewer Python calls per trial-step); a chunk holds as many examples as fit
  in half the L2 cache (``L2_SHARE``). One call takes a trial through many steps before the
  next trial (:meth:`training.engine.fused.FusedProgram.train_steps`), so the stack's size
  does not decide what stays in cache.
- ``per_trial`` (:mod:`training.engine.per_trial`): models with Conv2d (``simple_cnn``,
  ``resnet8``): trials one after another through oneDNN, so only one trial's activations are
  alive; a chunk holds the examples whose activations fit in CHUNK_BUDGET bytes. Also every
  model the batched programs cannot run (:func:`runs_per_trial`): batch statistics (BatchNorm:
  per-trial running statistics), random draws (Dropout: a generator per trial), recurrent
  layers (``torch.func`` has no batching rule for them); the first two take the mini-batch in
  one chunk, as the plain loop does. A stack keeps
  its parameters and optimizer state, with one trial's gradients, within RESIDENT_BUDGET bytes
  of the last-level cache (:func:`resident_limit`, at most MAX_STACK trials): between two
  evaluations a stack's trials take their steps in turn, so a stack that does not fit streams
  every trial's state from memory at every step, and at small B that traffic is the step.
- ``batched`` (:class:`training.engine.batched.BatchedProgram`, the eager fallback of ``fused``) and
  ``func`` (:class:`training.engine.func.FuncProgram`, any other module): all activations of a stack
  are alive at once, so a stack holds the trials whose activations fit in ACTIVATION_BUDGET
  floats (:func:`default_chunk`).
- Precision and device (:mod:`training.device`): the compiled kernel computes float32 (or
  float64) on the CPU only, so a CUDA cell, or a ``bf16`` cell on any device, never gets
  ``fused``: the same model then runs ``batched`` (hand-batched matmuls, autocast under bf16).
  The other programs take the precision and apply it to their forward passes and losses.
  ``tf32`` is fp32 on the CPU and keeps ``fused`` there. (The rules' measurements are the
  CPU's; on CUDA they choose by the same model features, not yet by measurement.)
- Every program: a stack's parameters and optimizer state fit in SNAPSHOT_BUDGET bytes
  (:func:`snapshot_limit`), since a run with a goal keeps a copy of one stack per evaluation
  interval to find the exact step of a hit; the trials are then split into stacks of equal size.

Where the update runs (``CellPlan.update_in_step``): the compiled kernel and the per-trial
program apply every optimizer's update (the SGD rules, Adam, AdamW) to each trial right after
its backward pass, while its gradients are in cache and only one trial's are alive; the kernel's
Adam reads and writes the moments of :class:`training.engine.adam.AdamState`, so resuming, branching
and the other programs see one state. ``batched`` and ``func`` compute the stack's gradients,
then update it (:class:`training.engine.updates.StackUpdate`). Adam used to run after the kernel's
``loss_and_grads``, as torch's fused Adam over the stack: those extra passes over the stacked
state made the MLP's Adam step 2.2x momentum's at B = 8; inside the kernel it costs one
vectorized pass per trial, bound by its square root and division (see the README's Adam
section for the measured slowdowns).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from training.engine import compiled_kernel as kernels
from training.engine import fused as stacked_fused
from training import randomness
from training.models import activation_floats
from training.config import ADAM_OPTIMIZERS
from training.device import lowers
from training.errors import ConfigError
from training.engine.batched import BatchedProgram
from training.engine.func import FuncProgram
from training.engine.per_trial import (
    PerTrialProgram, batch_dependent, has_conv2d,
)

PROGRAMS = ("fused", "per_trial", "batched", "func", "plain")
# How a cell's program was chosen: by the rules below, or by timing the candidates
# (:mod:`training.engine.choice`; a cached measurement is "measured" too), forced by
# SPARSESCALE_PROGRAM_CHOICE=<program>, or given by the caller (a study's recorded program).
CHOICES = ("ruled", "measured", "forced", "given")
MAX_STACK = 128
# Share of the per-core L2 cache a chunk of the fused kernel may fill: the rest holds the
# weights and BLAS's packed panels. Measured (1 thread, 32 trials, GFLOP/s by examples per chunk
# 1 / 4 / 16 / 32 / 64 / 128 / 512 / B; the rule picks 85 for cnn1d and the batch for mlp up to
# 582 with a 2 MiB L2): cnn1d B = 512: 36 / 56 / 60 / 60 / 61 / 65 / 56; B = 4096: 35 / 57 / 65 /
# 64 / 67 / 68 / 61 / 33; mlp B = 4096: 17 / 47 / 77 / 86 / 96 / 99 / 101 / 92.
L2_SHARE = 0.5
# Activation bytes of one chunk of one trial on the per_trial path.
CHUNK_BUDGET = 128 << 20
# Bytes of one stack's parameters and optimizer state, which a run with a goal copies at every
# evaluation interval (the replay snapshot, training.trials). simple_cnn holds 26 MB a trial
# with momentum: 32 trials in one stack copied 840 MB, and a B = 4096 group peaked at 2.1 GB.
SNAPSHOT_BUDGET = 256 << 20
# Bytes of one ``batched`` / ``func`` stack's activations, counted STACK_SAVED times (the forward
# outputs, autograd's saved tensors and their gradients): the speed rule's floor of 8 trials a
# stack ignores memory, and a byte-level LM branched at B = 16,384 (43k weights, about 40k
# activation floats an example) held 8 trials of about 3 GB each and was killed for memory.
STACK_MEMORY = 2 << 30
STACK_SAVED = 4
# Bytes of a per_trial stack's state (plus one trial's gradients) that stay in the last-level
# cache from one step to the next. Measured on the 2-core machine (one thread): copy bandwidth
# 27 GB/s up to 2 x 32 MB, 20 at 2 x 64, 13 from 2 x 128 MB (sysfs reports the host's 480 MiB
# L3, shared with other tenants); simple_cnn at B = 8, 39 MB a trial with momentum: 8.2 ms a
# trial-step in stacks of 1, 11.0 in stacks of 2, 12.4 in one stack of 32 (the plain loop,
# one model, 8.3 ms).
RESIDENT_BUDGET = 48 << 20


class Program(Protocol):
    """What the trainer needs of a stack's program; parameters are stacked ``[N, *shape]``.
    Programs that update in place also have ``train_step`` and ``supports(optimizer)``
    (:class:`training.engine.fused.FusedProgram`, :class:`PerTrialProgram`); the compiled
    kernel's also ``train_steps``, many steps a call (``training.trials._Runner.steps``)."""

    def forward(self, params: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Outputs [N, B, ...] for inputs [N, B, ...] (or one input expanded over the trials)."""

    def loss_and_grads(self, params: Sequence[torch.Tensor], x: torch.Tensor, y: torch.Tensor
                       ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Per-trial mini-batch loss [N] and gradients, one per parameter, stacked."""


@dataclass(frozen=True)
class CellPlan:
    """How ``train_trials`` runs one cell: ``name`` (the program's, one of PROGRAMS), ``trials_per_stack``,
    ``examples_per_chunk`` (examples of one trial processed together in a training step; the
    batch size when the program does not chunk; evaluations use chunks up to the rules'
    limit, whatever the batch size), and the ``program`` computing a stack's steps."""

    name: str
    trials_per_stack: int
    examples_per_chunk: int
    program: Program = field(repr=False, compare=False)
    update_in_step: bool = False  # the program's train_step applies the update (module doc)
    choice: str = "ruled"         # one of CHOICES


@functools.cache
def l2_bytes() -> int:
    """Per-core L2 cache size from sysfs (1 MiB when unknown)."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2":
                text = (index / "size").read_text().strip().upper()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
                return int(text.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return 1 << 20


def even_chunks(batch_size: int, limit: int) -> int:
    """Examples per chunk: the fewest chunks of at most ``limit`` examples, of equal size (64
    examples in chunks of at most 56 run as 2 x 32, not 56 + 8)."""
    chunks = -(-batch_size // max(1, min(limit, batch_size)))
    return -(-batch_size // chunks)


def weight_bytes(model: nn.Module, itemsize: int) -> int:
    """Bytes of one copy of a trial's parameters (or of its gradients)."""
    return itemsize * sum(p.numel() for p in model.parameters())


def state_bytes(model: nn.Module, optimizer: str, itemsize: int) -> int:
    """Bytes of one trial's parameters and ``optimizer`` state (momentum buffer; Adam's two
    moments; none for sgd)."""
    copies = 1 + (0 if optimizer == "sgd" else 2 if optimizer in ADAM_OPTIMIZERS else 1)
    return copies * weight_bytes(model, itemsize)


def snapshot_limit(model: nn.Module, optimizer: str, itemsize: int, n_trials: int) -> int:
    """Trials per stack whose state fits in SNAPSHOT_BUDGET, split evenly (at most MAX_STACK)."""
    limit = SNAPSHOT_BUDGET // max(1, state_bytes(model, optimizer, itemsize))
    return min(MAX_STACK, even_chunks(max(1, n_trials), limit))


def memory_limit(batch_size: int, floats_per_example: int, itemsize: int) -> int:
    """Trials per vectorized stack whose activations fit in STACK_MEMORY (at least 1)."""
    per_trial = batch_size * max(1, floats_per_example) * itemsize * STACK_SAVED
    return max(1, STACK_MEMORY // per_trial)


def resident_limit(model: nn.Module, optimizer: str, itemsize: int, n_trials: int) -> int:
    """Trials per ``per_trial`` stack whose state, with one trial's gradients, fits in
    RESIDENT_BUDGET (at least 1), split evenly."""
    fits = ((RESIDENT_BUDGET - weight_bytes(model, itemsize))
            // max(1, state_bytes(model, optimizer, itemsize)))
    return even_chunks(max(1, n_trials), max(1, fits))


def plan_cell(model: nn.Module, task: str, input_shape: Sequence[int], batch_size: int,
              n_trials: int, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu", optimizer: str = "momentum",
              loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
              random: bool | None = None, precision: str = "fp32") -> CellPlan:
    """The rules' plan for training ``n_trials`` trials of ``model`` at ``batch_size``
    with ``optimizer`` (see the module docstring). A per-example ``loss`` of the user's rules out
    ``fused`` and ``batched``, whose backward passes are written for the task's own losses.
    ``random``: whether a training step of the model draws random numbers
    (``training.randomness.draws``, which can also find randomness no layer type declares; None:
    as its layer types declare): such a model runs per_trial, whole batches, with a generator per
    trial. ``precision`` (:data:`training.device.PRECISIONS`): ``bf16`` rules out ``fused``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    stack = snapshot_limit(model, optimizer, itemsize, n_trials)
    encoding = stacked_fused.encode(model, input_shape) if loss is None else None
    if encoding is not None and not lowers(precision):   # the kernel is float32 C++
        per_example = stacked_fused.working_set(encoding, math.prod(input_shape)) * itemsize
        limit = max(1, int(L2_SHARE * l2_bytes()) // per_example)
        chunk = even_chunks(batch_size, limit)
        fused = stacked_fused.try_build(model, input_shape, dtype, device, chunk, limit)
        if fused is not None:
            return CellPlan("fused", stack, chunk, fused,
                            fused.supports(optimizer))
    random = randomness.draws(model, None) if random is None else random
    if runs_per_trial(model) or random:
        limit = max(1, CHUNK_BUDGET // max(activation_floats(model, input_shape) * itemsize, 1))
        # batch statistics and random draws see the whole mini-batch at once, as in the plain loop
        whole = batch_dependent(model) or random
        chunk = batch_size if whole else even_chunks(batch_size, limit)
        program = PerTrialProgram(model, task, chunk, limit, loss, random, precision,
                                  device=device)
        stack = min(stack, resident_limit(model, optimizer, itemsize, n_trials))
        return CellPlan("per_trial", stack, chunk, program, updates_per_trial(device))
    return eager_plan(model, task, input_shape, batch_size, stack, itemsize, loss, precision)


def eager_plan(model: nn.Module, task: str, input_shape: Sequence[int], batch_size: int,
               stack: int, itemsize: int,
               loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
               precision: str = "fp32", program: str | None = None) -> CellPlan:
    """The ``batched`` plan (``func`` where the model or an own ``loss`` rules it out, or
    ``program="func"``), in stacks of at most ``stack`` trials whose activations fit."""
    floats = activation_floats(model, input_shape)
    stack = min(stack, default_chunk(batch_size, floats), memory_limit(batch_size, floats, itemsize))
    eager = (build_program(model, task, precision) if loss is None and program != "func"
             else FuncProgram(model, task, loss, precision))
    name = "batched" if isinstance(eager, BatchedProgram) else "func"
    return CellPlan(name, stack, batch_size, eager)


def named_plan(name: str, model: nn.Module, task: str, input_shape: Sequence[int],
               batch_size: int, n_trials: int, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", optimizer: str = "momentum",
               loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
               random: bool | None = None, precision: str = "fp32") -> CellPlan:
    """The plan of program ``name`` for the cell (the arguments of :func:`plan_cell`): the
    rules' plan, one of its :func:`alternatives` (also where the rules chose ``fused``: a study
    that recorded ``per_trial`` on a machine without the compiled kernel keeps it where the
    kernel exists), or, where the rules chose ``fused``, its eager ``batched`` or ``func``
    equivalent. A program that cannot run the cell here raises
    :class:`training.errors.ConfigError` naming why (e.g. ``fused`` without the compiled
    kernel): a study's store recorded it, and no other program may take its place."""
    args = (model, task, input_shape, batch_size, n_trials, dtype, device, optimizer, loss,
            random, precision)
    ruled = plan_cell(*args)
    if ruled.name == name:
        return ruled
    if ruled.name == "fused" and name in ("batched", "func"):
        itemsize = torch.empty((), dtype=dtype).element_size()
        plan = eager_plan(model, task, input_shape, batch_size, ruled.trials_per_stack,
                          itemsize, loss, precision, name)
        if plan.name == name:
            return plan
    found = next((c for c in alternatives(ruled, *args) if c.name == name), None)
    if found is None:
        why = ("the compiled kernel is unavailable here" if name == "fused" and
               kernels.fused_sequential() is None else f"the rules choose {ruled.name!r}")
        raise ConfigError(f"program {name!r} cannot train this cell (batch size {batch_size}, "
                          f"{optimizer}): {why}; allowed: {ruled.name!r} or a candidate of "
                          f"training.engine.cell_plan.candidate_plans")
    return found


def candidate_plans(model: nn.Module, task: str, input_shape: Sequence[int], batch_size: int,
                    n_trials: int, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu", optimizer: str = "momentum",
                    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                    random: bool | None = None, precision: str = "fp32") -> list[CellPlan]:
    """The programs that can run a cell no rule covers, to be timed
    (:mod:`training.engine.choice`); empty where the compiled kernel's rule (``fused``) covers
    it. First the rules' plan (:func:`plan_cell`), then, where they are not it:

    - ``per_trial``: trials side by side on torch's threads, channels-last, in chunks;
    - ``plain``: the plain loop's program, always a candidate: one trial after another on all
      threads, inputs as given (NCHW), the whole mini-batch at once (with the update in one
      pass of the compiled kernel, or torch's);
    - ``func`` (vmap over the trials) for a model ``torch.func`` can batch (no batch statistics,
      random draws, recurrent or attention layers), in stacks whose activations fit in
      ACTIVATION_BUDGET floats (down to one trial).
    """
    ruled = plan_cell(model, task, input_shape, batch_size, n_trials, dtype, device, optimizer,
                      loss, random, precision)
    if ruled.name == "fused":
        return []
    return [ruled, *alternatives(ruled, model, task, input_shape, batch_size, n_trials, dtype,
                                 device, optimizer, loss, random, precision)]


def alternatives(ruled: CellPlan, model: nn.Module, task: str, input_shape: Sequence[int],
                 batch_size: int, n_trials: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", optimizer: str = "momentum",
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 random: bool | None = None, precision: str = "fp32") -> list[CellPlan]:
    """The candidates of :func:`candidate_plans` besides the rules' plan ``ruled``, whatever it
    is (the compiled kernel's too)."""
    random = randomness.draws(model, None) if random is None else random
    itemsize = torch.empty((), dtype=dtype).element_size()
    floats = activation_floats(model, input_shape)
    limit = max(1, CHUNK_BUDGET // max(floats * itemsize, 1))
    whole = batch_dependent(model) or random
    resident = min(snapshot_limit(model, optimizer, itemsize, n_trials),
                   resident_limit(model, optimizer, itemsize, n_trials))
    plans = []
    if ruled.name != "per_trial":
        chunk = batch_size if whole else even_chunks(batch_size, limit)
        program = PerTrialProgram(model, task, chunk, limit, loss, random, precision,
                                  device=device)
        plans.append(CellPlan("per_trial", resident, chunk, program, updates_per_trial(device)))
    plain = PerTrialProgram(model, task, batch_size, limit, loss, random, precision,
                            layout="nchw", spread=False, device=device)
    plans.append(CellPlan("plain", resident, batch_size, plain, updates_per_trial(device)))
    batchable = not (batch_dependent(model) or random or any(
        isinstance(m, (nn.RNNBase, nn.MultiheadAttention)) for m in model.modules()))
    if batchable and ruled.name not in ("func", "batched"):
        stack = 128
        while stack > 1 and stack * batch_size * floats > ACTIVATION_BUDGET:
            stack //= 2
        stack = min(stack, snapshot_limit(model, optimizer, itemsize, n_trials),
                    memory_limit(batch_size, floats, itemsize))
        plans.append(CellPlan("func", stack, batch_size,
                              FuncProgram(model, task, loss, precision)))
    return plans


def updates_per_trial(device: str | torch.device) -> bool:
    """Whether the ``per_trial`` and ``plain`` programs update each trial right after its own
    gradients (``CellPlan.update_in_step``): on the CPU, yes (one trial's gradients alive at a
    time, the compiled kernel's one-pass update, and a diverged trial found by one read of its
    loss). On CUDA, no: a read of a trial's loss waits for the GPU's queue, so that every
    trial-step would wait for the GPU and the host could never launch ahead of it; there all
    trials' gradients are computed first, their losses read once per step, and one stacked
    update applied (the trainer's loss_and_grads path)."""
    return torch.device(device).type == "cpu"


def kernels_ready(model: nn.Module, input_shape: Sequence[int]) -> bool:
    """Whether the compiled kernel ``model`` would run on is usable, built now if need be (once
    per process, with the one warning of a failed build); True for a model that needs none. A
    study's driver calls it before its workers start, so that they neither build nor warn.
    The per-trial program of Conv2d models uses the kernel's one-pass update
    (:meth:`training.engine.updates.StackUpdate.apply_trial_`) and the torch update without it."""
    if stacked_fused.encode(model, input_shape) is None and not runs_per_trial(model):
        return True
    return kernels.fused_sequential() is not None


def runs_per_trial(model: nn.Module) -> bool:
    """Whether the ``per_trial`` program runs ``model``: Conv2d layers (oneDNN per trial), batch
    statistics or random draws (per-trial buffers and generators), recurrent layers (no
    batching rule over trials in ``torch.func``) or attention layers (``torch.func`` falls back
    to a slow loop over the fused attention kernel, with a warning per call)."""
    return (has_conv2d(model) or batch_dependent(model) or randomness.draws(model, None)
            or any(isinstance(m, (nn.RNNBase, nn.MultiheadAttention)) for m in model.modules()))


def build_program(model: nn.Module, task: str, precision: str = "fp32"
                  ) -> BatchedProgram | FuncProgram:
    """The fast hand-batched program when the model allows it, else the torch.func fallback
    (both computing in ``precision``)."""
    return (BatchedProgram.try_build(model, task, precision)
            or FuncProgram(model, task, precision=precision))


# Activation floats (trials x examples x floats per example) one stack may hold: the trial
# count per stack is the largest power of two from 8 to 128 within it.
ACTIVATION_BUDGET = 1 << 22


def default_chunk(batch_size: int, floats_per_example: int) -> int:
    """Trials per stack: more trials amortise per-kernel overhead at small batches, fewer keep
    the activations in cache at large ones; the limit is ACTIVATION_BUDGET floats. Measured
    (MNIST-1D, one thread, trial-steps/s with 8 / 16 / 32 / 64 / 128 trials per stack):
    mlp (450 floats per example), B = 8: 14.0k / 17.2k / 18.0k / 14.0k / 22.6k; B = 64: 5.3k /
    6.7k / 7.8k / 6.9k; B = 512: 1074 / 1020 / 947 / 873; B = 4096: 125 / 106 / 76 / 68.
    cnn1d (3095 floats), B = 8: 5.9k / 6.7k / 7.7k / 8.9k; B = 64 (4 / 8 / 16 / 32 trials):
    1023 / 1205 / 1519 / 1385; B = 512: 198 / 182 / 148 / 125."""
    n = 128
    while n > 8 and n * batch_size * floats_per_example > ACTIVATION_BUDGET:
        n //= 2
    return n
