"""Per-cell choices of the vectorized trainer: which program computes a stack's step, how many
trials share a stack, and how many examples a chunk of one trial holds, for one (model, batch
size) cell.

The choice follows rules, each with the measurements behind it:

- ``fused`` (:mod:`training.engine.programs.fused`): an ``nn.Sequential`` of Linear / Conv1d / ReLU
  (``mlp``, ``linear``, ``cnn1d``) on the CPU with the compiled kernel. Its work per trial is
  independent of the other trials and its activations live only per chunk, so a stack holds up
  to MAX_STACK trials (fewer Python calls per trial-step); a chunk holds as many examples as fit
  in half the L2 cache (``L2_SHARE``). One call takes a trial through many steps before the
  next trial (:meth:`training.engine.programs.fused.FusedProgram.train_steps`), so the stack's size
  does not decide what stays in cache.
- ``per_trial`` (:mod:`training.engine.programs.per_trial`): models with Conv2d (``simple_cnn``,
  ``resnet8``): trials one after another through oneDNN, so only one trial's activations are
  alive; a chunk holds the examples whose activations fit in CHUNK_BUDGET bytes. Also every
  model the batched programs cannot run (:func:`per_trial_only`): batch statistics (BatchNorm:
  per-trial running statistics), random draws (Dropout: a generator per trial), recurrent
  layers (``torch.func`` has no batching rule for them); the first two take the mini-batch in
  one chunk, as the plain loop does. A stack keeps
  its parameters and optimizer state, with one trial's gradients, within RESIDENT_BUDGET bytes
  of the last-level cache (:func:`resident_limit`, at most MAX_STACK trials): between two
  evaluations a stack's trials take their steps in turn, so a stack that does not fit streams
  every trial's state from memory at every step, and at small B that traffic is the step.
- ``batched`` (:class:`training.engine.programs.batched.BatchedProgram`, the eager fallback of ``fused``) and
  ``func`` (:class:`training.engine.programs.func.FuncProgram`, any other module): all activations of a stack
  are alive at once, so a stack holds the trials whose activations fit in ACTIVATION_BUDGET
  floats (:func:`trials_per_stack`).
- Precision and device (:mod:`training.device`): the compiled kernel computes float32 (or
  float64) on the CPU only, so a CUDA cell, or a ``bf16`` cell on any device, never gets
  ``fused``: the same model then runs ``batched`` (hand-batched matmuls, autocast under bf16).
  The other programs take the precision and apply it to their forward passes and losses.
  ``tf32`` is fp32 on the CPU and keeps ``fused`` there. (The rules' measurements are the
  CPU's; on CUDA they choose by the same model features, not yet by measurement.)
- Every program: a stack's parameters and optimizer state fit in SNAPSHOT_BUDGET bytes
  (:func:`snapshot_limit`), since a run with a goal keeps a copy of one stack per evaluation
  interval to find the exact step of a hit; the trials are then split into stacks of equal size.

Where the update runs (``Strategy.update_in_step``): the compiled kernel and the per-trial
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from training import randomness
from training.config import ADAM_OPTIMIZERS
from training.device import lowers
from training.errors import ConfigError
from training.engine import compiled_kernel as kernels
from training.engine.programs import fused as stacked_fused
from training.engine.programs.base import Cell, Program
from training.engine.programs.registry import LIBRARY, build
from training.models.features import Features, features

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


@dataclass(frozen=True)
class Strategy:
    """How ``train_trials`` runs one cell: ``name`` (the program's, a key of
    :data:`~training.engine.programs.registry.PROGRAMS`), ``trials_per_stack``,
    ``examples_per_chunk`` (examples of one trial processed together in a training step; the
    batch size when the program does not chunk; evaluations use chunks up to the rules'
    limit, whatever the batch size), and the ``program`` computing a stack's steps."""

    name: str
    trials_per_stack: int
    examples_per_chunk: int
    program: Program = field(repr=False, compare=False)
    update_in_step: bool = False  # the program's train_step applies the update (Program.updates_in_step)
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


def state_bytes(parameters: int, optimizer: str, itemsize: int) -> int:
    """Bytes of one trial's ``parameters`` and ``optimizer`` state (momentum buffer; Adam's two
    moments; none for sgd)."""
    copies = 1 + (0 if optimizer == "sgd" else 2 if optimizer in ADAM_OPTIMIZERS else 1)
    return copies * parameters * itemsize


def snapshot_limit(parameters: int, optimizer: str, itemsize: int, n_trials: int) -> int:
    """Trials per stack whose state fits in SNAPSHOT_BUDGET, split evenly (at most MAX_STACK)."""
    limit = SNAPSHOT_BUDGET // max(1, state_bytes(parameters, optimizer, itemsize))
    return min(MAX_STACK, even_chunks(max(1, n_trials), limit))


def memory_limit(batch_size: int, floats_per_example: int, itemsize: int) -> int:
    """Trials per vectorized stack whose activations fit in STACK_MEMORY (at least 1)."""
    per_trial = batch_size * max(1, floats_per_example) * itemsize * STACK_SAVED
    return max(1, STACK_MEMORY // per_trial)


def resident_limit(parameters: int, optimizer: str, itemsize: int, n_trials: int) -> int:
    """Trials per ``per_trial`` stack whose state, with one trial's gradients, fits in
    RESIDENT_BUDGET (at least 1), split evenly."""
    fits = ((RESIDENT_BUDGET - parameters * itemsize)
            // max(1, state_bytes(parameters, optimizer, itemsize)))
    return even_chunks(max(1, n_trials), max(1, fits))


def cell(model: nn.Module, task: str, input_shape: Sequence[int], batch_size: int,
         n_trials: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
         optimizer: str = "momentum",
         loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
         random: bool | None = None, precision: str = "fp32") -> Cell:
    """The :class:`~training.engine.programs.base.Cell` of these arguments, with the model's
    features (``training.models.features``); ``random`` None: as the model's layer types
    declare (``training.randomness.draws``)."""
    random = randomness.draws(model, None) if random is None else random
    shape = tuple(int(s) for s in input_shape)
    return Cell(model, task, shape, int(batch_size), int(n_trials), dtype, device, optimizer,
                loss, bool(random), precision, features(model, shape))


def ruled_strategy(model: nn.Module, task: str, input_shape: Sequence[int], batch_size: int,
              n_trials: int, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu", optimizer: str = "momentum",
              loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
              random: bool | None = None, precision: str = "fp32") -> Strategy:
    """The rules' strategy (:func:`rules`) of the :func:`cell` of these arguments."""
    return rules(cell(model, task, input_shape, batch_size, n_trials, dtype, device, optimizer,
                      loss, random, precision))


def candidate_strategies(model: nn.Module, task: str, input_shape: Sequence[int], batch_size: int,
                    n_trials: int, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu", optimizer: str = "momentum",
                    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                    random: bool | None = None, precision: str = "fp32") -> list[Strategy]:
    """The :func:`candidates` of the :func:`cell` of these arguments."""
    return candidates(cell(model, task, input_shape, batch_size, n_trials, dtype, device,
                           optimizer, loss, random, precision))


def rules(c: Cell) -> Strategy:
    """The rules' strategy for training ``c.n_trials`` trials of ``c.model`` at ``c.batch_size``
    with ``c.optimizer`` (see the module docstring). A per-example ``loss`` of the user's rules
    out ``fused`` and ``batched``, whose backward passes are written for the task's own losses.
    A model that draws random numbers in a training step (``c.random``, which
    ``training.randomness.draws`` can also find where no layer type declares it) runs
    per_trial, whole batches, with a generator per trial. ``bf16`` rules out ``fused``."""
    f, batch_size = c.features, c.batch_size
    stack = snapshot_limit(f.parameters, c.optimizer, c.itemsize, c.n_trials)
    values = (stacked_fused.values_per_example(c.model, c.input_shape)
              if c.loss is None and not lowers(c.precision) else None)   # float32 C++
    if values is not None:
        limit = max(1, int(L2_SHARE * l2_bytes()) // (values * c.itemsize))
        fused = _strategy(c, "fused", stack, even_chunks(batch_size, limit), limit)
        if fused is not None:
            return fused
    if per_trial_only(f) or c.random:
        chunk, limit = _per_trial_chunks(c)
        stack = min(stack, resident_limit(f.parameters, c.optimizer, c.itemsize, c.n_trials))
        return _strategy(c, "per_trial", stack, chunk, limit)
    stack = _eager_stack(c, stack)
    # the hand-batched program where it takes the model, else torch.func's
    return (_strategy(c, "batched", stack, batch_size, batch_size)
            or _strategy(c, "func", stack, batch_size, batch_size))


def _eager_stack(c: Cell, stack: int) -> int:
    """Trials per stack of the eager programs (``batched``, ``func``): at most ``stack``, and
    their activations within ACTIVATION_BUDGET floats and STACK_MEMORY bytes."""
    floats = c.features.activation_floats
    return min(stack, trials_per_stack(c.batch_size, floats),
               memory_limit(c.batch_size, floats, c.itemsize))


def named(name: str, c: Cell) -> Strategy:
    """The strategy of program ``name`` for ``c`` (marked ``choice="given"``): the rules', one
    of their :func:`alternatives` (also where the rules chose ``fused``: a study that recorded
    ``per_trial`` on a machine without the compiled kernel keeps it where the kernel exists),
    or, where the rules chose ``fused``, its eager ``batched`` or ``func`` equivalent. A
    program that cannot run the cell here raises :class:`training.errors.ConfigError` naming
    why (e.g. ``fused`` without the compiled kernel): a study's store recorded it, and no other
    program may take its place. A program of the user's own (registered in
    :data:`~training.engine.programs.registry.PROGRAMS` after the library's) runs where it is
    named, one trial a stack, in the per-trial programs' chunks."""
    ruled = rules(c)
    found = ruled if ruled.name == name else None
    if found is None and ruled.name == "fused" and name in ("batched", "func"):
        found = _strategy(c, name, _eager_stack(c, ruled.trials_per_stack), c.batch_size,
                          c.batch_size)
    if found is None:
        found = next((s for s in alternatives(ruled, c) if s.name == name), None)
    if found is None and name not in LIBRARY:   # the user's own: one trial a stack
        found = _strategy(c, name, 1, *_per_trial_chunks(c))
    if found is None:
        why = ("the compiled kernel is unavailable here" if name == "fused" and
               kernels.fused_sequential() is None else f"the rules choose {ruled.name!r}")
        raise ConfigError(f"program {name!r} cannot train this cell (batch size "
                          f"{c.batch_size}, {c.optimizer}): {why}; allowed: {ruled.name!r} or "
                          f"a candidate of training.engine.strategy.candidates")
    return replace(found, choice="given")


def candidates(c: Cell) -> list[Strategy]:
    """The programs that can run a cell no rule covers, to be timed
    (:mod:`training.engine.choice`); empty where the compiled kernel's rule (``fused``) covers
    it. First the rules' strategy (:func:`rules`), then, where they are not it:

    - ``per_trial``: trials side by side on torch's threads, channels-last, in chunks;
    - ``plain``: the plain loop's program, always a candidate: one trial after another on all
      threads, inputs as given (NCHW), the whole mini-batch at once (with the update in one
      pass of the compiled kernel, or torch's);
    - ``func`` (vmap over the trials) for a model ``torch.func`` can batch (no batch statistics,
      random draws, recurrent or attention layers), in stacks whose activations fit in
      ACTIVATION_BUDGET floats (down to one trial).
    """
    ruled = rules(c)
    return [] if ruled.name == "fused" else [ruled, *alternatives(ruled, c)]


def alternatives(ruled: Strategy, c: Cell) -> list[Strategy]:
    """The candidates of :func:`candidates` besides the rules' strategy ``ruled``, whatever it
    is (the compiled kernel's too)."""
    f, batch_size = c.features, c.batch_size
    chunk, limit = _per_trial_chunks(c)
    resident = min(snapshot_limit(f.parameters, c.optimizer, c.itemsize, c.n_trials),
                   resident_limit(f.parameters, c.optimizer, c.itemsize, c.n_trials))
    found = []
    if ruled.name != "per_trial":
        found.append(_strategy(c, "per_trial", resident, chunk, limit))
    found.append(_strategy(c, "plain", resident, batch_size, limit))
    batchable = not (f.batch_statistics or c.random or f.sequence_layers)
    if batchable and ruled.name not in ("func", "batched"):
        floats = f.activation_floats
        stack = 128
        while stack > 1 and stack * batch_size * floats > ACTIVATION_BUDGET:
            stack //= 2
        stack = min(stack, snapshot_limit(f.parameters, c.optimizer, c.itemsize, c.n_trials),
                    memory_limit(batch_size, floats, c.itemsize))
        found.append(_strategy(c, "func", stack, batch_size, batch_size))
    return found


def _strategy(c: Cell, name: str, stack: int, chunk: int, eval_chunk: int) -> Strategy | None:
    """Program ``name`` of the registry built for ``c``, in a strategy of ``stack`` trials a stack and
    ``chunk`` examples a chunk; None where that program cannot run the cell."""
    program = build(name, c, chunk, eval_chunk)
    if program is None:
        return None
    return Strategy(name, stack, chunk, program, program.updates_in_step(c.optimizer, c.device))


def _per_trial_chunks(c: Cell) -> tuple[int, int]:
    """Examples per chunk of the per-trial programs in a training step and in a forward pass:
    those whose activations fit in CHUNK_BUDGET bytes; batch statistics and random draws see
    the whole mini-batch at once, as in the plain loop."""
    limit = max(1, CHUNK_BUDGET // max(c.features.activation_floats * c.itemsize, 1))
    whole = c.features.batch_statistics or c.random
    return (c.batch_size if whole else even_chunks(c.batch_size, limit)), limit


def kernels_ready(model: nn.Module, input_shape: Sequence[int]) -> bool:
    """Whether the compiled kernel ``model`` would run on is usable, built now if need be (once
    per process, with the one warning of a failed build); True for a model that needs none. A
    study's driver calls it before its workers start, so that they neither build nor warn.
    The per-trial program of Conv2d models uses the kernel's one-pass update
    (:meth:`training.engine.updates.StackUpdate.apply_trial_`) and the torch update without it."""
    if (stacked_fused.encode(model, input_shape) is None
            and not (per_trial_only(features(model, input_shape))
                     or randomness.draws(model, None))):
        return True
    return kernels.fused_sequential() is not None


def per_trial_only(f: Features) -> bool:
    """Whether only the per-trial programs run a model of features ``f`` (random draws aside,
    which the cell says): Conv2d layers (oneDNN per trial), batch statistics (per-trial
    buffers), recurrent layers (no batching rule over trials in ``torch.func``) or attention
    layers (``torch.func`` falls back to a slow loop over the fused attention kernel, with a
    warning per call)."""
    return f.conv2d or f.batch_statistics or f.sequence_layers


# Activation floats (trials x examples x floats per example) one stack may hold: the trial
# count per stack is the largest power of two from 8 to 128 within it.
ACTIVATION_BUDGET = 1 << 22


def trials_per_stack(batch_size: int, floats_per_example: int) -> int:
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
