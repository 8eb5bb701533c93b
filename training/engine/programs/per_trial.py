"""The ``per_trial`` program: trials one after another through the module's own forward pass
and autograd. It runs image models (``simple_cnn``, ``resnet8``, any module with ``Conv2d``
layers) through oneDNN's convolutions, and any module the batched programs cannot take: batch
statistics (BatchNorm), random draws (Dropout), recurrent layers.

:class:`PerTrialProgram` has the interface of the ``batched`` and ``func`` programs: per-trial
mini-batch losses and gradients of parameters stacked as ``[N, *shape]``. For each trial it
calls the module through ``torch.func.functional_call`` with that trial's parameters and runs
autograd, on channels-last (NHWC) inputs, in chunks of ``examples_per_chunk`` examples whose
gradients accumulate. Why this and not a batched kernel over trials (measured on a 2-core
Xeon with AVX-512, fp32, 32 trials, training FLOPs of the layer / wall time):

- oneDNN's direct convolutions on channels-last data run at or above the fp32 GEMM peak of
  this machine for these shapes (``simple_cnn``'s second convolution, 32 -> 64 channels 5x5 on
  14x14: 322 GFLOP/s forward + both gradients at B = 64 on 2 threads, against a 297 GFLOP/s
  1024^3 matmul); an im2col + GEMM convolution cannot beat the GEMM it is made of.
- A grouped convolution with one group per trial (what ``torch.func.vmap`` of a convolution
  becomes) was as fast at B = 8 but slower from B = 64 on (``resnet8``'s first block: 208 vs
  229 GFLOP/s at B = 64, 107 vs 141 at B = 512).
- A trial's work is large (``simple_cnn`` on MNIST: 82 MFLOP per example; ``resnet8`` on
  CIFAR-10: 75 MFLOP), so the Python loop over trials costs a few percent even at B = 8.
- Channels-last activations avoid oneDNN's layout reorders: ``resnet8`` at B = 512 went from
  67 to 115 GFLOP/s (2 threads) against contiguous NCHW; chunking the examples keeps a chunk's
  activations in cache (115 -> 142 GFLOP/s with 64 examples per chunk).

Chunks: every layer of a batch-norm-free model acts on each example on its own, so a chunked
mini-batch gives the mini-batch gradient exactly (up to summation order). A module with batch
statistics or random draws takes its mini-batch in one piece (the strategy gives it chunks of
the batch size), as the plain loop does.

The module's state per trial (:class:`training.engine.module_state.ModuleState`): a training step
runs the module in train mode with the trial's own buffers (BatchNorm normalizes with the batch
statistics and updates the trial's running statistics in place) and with the device's generator
set to the trial's state (:mod:`training.randomness`); a forward pass for evaluation runs it in
eval mode (running statistics, no Dropout), drawing nothing. This is what the plain loop does:
``model.train()`` for its steps, ``model.eval()`` to evaluate.

Devices and precision (:mod:`training.device`): the same code runs on CUDA (cuDNN's
convolutions in place of oneDNN's); the compiled kernel's one-pass update is CPU code, so on
CUDA the update is torch's (:meth:`training.engine.updates.StackUpdate.apply_`, the same rules).
Under ``bf16`` each forward pass and loss runs in autocast and the backward pass outside it, as
``torch.autocast``'s documentation asks; the gradients of the float32 parameters are float32.
On the CPU the divergence check of a trial's loss is one read per trial-step: a diverged trial
must not take its update, and the update of the next trial follows at once. On CUDA the cell
strategy runs every trial's forward and backward first (:meth:`PerTrialProgram.loss_and_grads`), then
one read of all the losses and one stacked update (:meth:`PerTrialProgram.updates_in_step`), so the host
launches a whole step's kernels without waiting for the GPU; trials are not spread over host
threads there.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Sequence

import torch
from torch import nn

from training import randomness
from training.engine import compiled_kernel as kernels
from training.engine import threads
from training.device import autocast
from training.engine.programs.base import Cell, Program
from training.engine.programs.common import widen
from training.engine.module_state import ModuleState
from training.engine.updates import StackUpdate
from training.goal import loss_fn
from training.models.features import batch_dependent

Tensor = torch.Tensor


class PerTrialProgram(Program):
    """Trials one after another through the module's own autograd (see module docstring)."""

    takes_module_state = True

    def __init__(self, model: nn.Module, task: str, examples_per_chunk: int,
                 eval_chunk: int | None = None,
                 loss: Callable[[Tensor, Tensor], Tensor] | None = None,
                 random: bool | None = None, precision: str = "fp32", layout: str = "auto",
                 spread: bool = True, device: str | torch.device = "cpu"):
        """Chunks of ``examples_per_chunk`` in a training step (the strategy gives a module with
        batch statistics or random draws its whole batch), ``eval_chunk`` (default the same) in
        a forward pass; ``loss``: the data set's own per-example loss; ``random``: whether the
        model draws random numbers in train mode (None: as its layer types declare); only then
        does each trial step with its own generator. ``precision``: that of the forward passes
        and losses (:data:`training.device.PRECISIONS`). ``layout``: "auto" (4-D inputs
        channels-last where that was measured, see below) or "nchw" (as given, the plain
        loop's). ``spread``: trials side by side on torch's threads, one intra-op thread each
        (:mod:`training.engine.threads`; never for a model that draws random numbers), else
        one after another on all threads, as the plain loop runs its one model. ``device``: where
        the stacks will live; the compiled kernel's one-pass update is CPU code, built (20-60 s
        the first time on a machine) only for a CPU program."""
        self.precision = precision
        # a copy: the program sets its train / eval mode, never the caller's module's
        self.model, self.task = copy.deepcopy(model), task
        self._local = threading.local()   # each worker thread's own copy (functional_call
        # swaps the parameters into the module it calls, so threads cannot share one)
        self.examples_per_chunk = max(1, int(examples_per_chunk))
        self.eval_chunk = max(1, int(eval_chunk or examples_per_chunk))
        self.names = [name for name, _ in model.named_parameters()]
        self.buffer_names = [name for name, _ in model.named_buffers()]
        # NHWC only where it was measured (batch-norm-free models without random draws): a random
        # op fills its tensor in memory order, so NHWC would give other Dropout masks than the
        # plain loop's NCHW; and BatchNorm's sums in another order, amplified by Adam's
        # 1 / sqrt(v) on the near-zero gradients of its shift, moved weights by 8e-10 in float64
        random = randomness.draws(model, None) if random is None else random
        self.random = random
        self.channels_last = layout == "auto" and not (random or batch_dependent(model))
        self.spread = spread and not random
        self.buffers = [b.detach() for _, b in model.named_buffers()]
        self.criterion = loss_fn(task, loss)
        # the compiled kernel's one-pass update (training.engine.compiled_kernel), or None: the
        # torch update. Not on a GPU: the first GPU check's profile phase, on a fresh machine,
        # spent its 35 s compiling CPU code it would never run
        on_cpu = torch.device(device).type == "cpu"
        self.kernel = kernels.fused_sequential() if on_cpu else None

    def _buffers(self, module: ModuleState | None, i: int) -> list[Tensor]:
        """Trial ``i``'s buffers: rows of the stacked ones (updated in place), or the module's."""
        return self.buffers if module is None else [b[i] for b in module.buffers]

    def _module(self) -> nn.Module:
        """The module this thread calls: the program's own, or a worker thread's copy."""
        if not threads.in_worker():
            return self.model
        module = getattr(self._local, "model", None)
        if module is None:
            module = self._local.model = copy.deepcopy(self.model)
        return module

    def workers(self, n_trials: int, device: torch.device) -> int:
        """Threads the ``n_trials`` trials of a call are spread over (1: one after another).
        Only on the CPU: a GPU runs one stream's kernels in order whichever host thread
        launches them."""
        spread = self.spread and device.type == "cpu"
        return min(n_trials, torch.get_num_threads()) if spread else 1

    def _call(self, params: Sequence[Tensor], x: Tensor, buffers: Sequence[Tensor]) -> Tensor:
        if x.dim() == 4 and self.channels_last:
            # explicit NHWC strides: with one channel, NCHW data also passes as channels-last
            # contiguous, the convolution then keeps NCHW, and max pooling on NCHW was 10x
            # slower than on NHWC (forward with indices, 8 x 32 x 28 x 28: 2.2 ms vs 0.26 ms)
            x = torch.empty(x.shape, dtype=x.dtype, device=x.device,
                            memory_format=torch.channels_last).copy_(x)
        return torch.func.functional_call(
            self._module(), {**dict(zip(self.names, params)), **dict(zip(self.buffer_names, buffers))},
            (x,))

    @torch.no_grad()
    def forward(self, params: Sequence[Tensor], x: Tensor, module: ModuleState | None = None
                ) -> Tensor:
        """Outputs [N, B, ...] for inputs [N, B, ...] (an input shared by all trials may be
        passed expanded, stride 0 on the trial dim), in chunks of ``eval_chunk``, in eval mode."""
        step = self.eval_chunk

        def trial(i: int) -> Tensor:
            self._module().eval()
            # autocast is thread-local: entered in the thread that runs the trial
            with autocast(self.precision, x.device):
                return torch.cat([widen(self._call([p[i] for p in params], x[i, start:start + step],
                                                   self._buffers(module, i)))
                                  for start in range(0, x.shape[1], step)])

        return torch.stack(threads.spread(trial, range(x.shape[0]),
                                          self.workers(x.shape[0], x.device)))

    def _trial(self, params: Sequence[Tensor], x: Tensor, y: Tensor,
               grads: Sequence[Tensor] | None = None, module: ModuleState | None = None,
               i: int = 0) -> tuple[Tensor, list[Tensor]]:
        """Mini-batch loss and gradients of trial ``i`` (parameters ``[*shape]``, inputs
        [B, ...]), into ``grads`` when given, in train mode with the trial's buffers and
        generator. The loss of a chunk of m of the B examples is weighted m / B, so the chunks'
        gradients add up to the gradient of the batch mean."""
        batch = x.shape[0]
        # ``.data``, not ``detach()``: a detached view shares the stack's version counter, so
        # another thread's in-place update of its own trial's rows (the eager update) would fail
        # this trial's backward with "modified by an inplace operation" (kernels off only: the
        # compiled update does not bump the counter); trials never write each other's rows
        leaves = [p.data.requires_grad_() for p in params]
        for leaf, g in zip(leaves, grads or ()):
            leaf.grad = g  # autograd accumulates into it in place
        total = torch.zeros((), dtype=params[0].dtype, device=params[0].device)
        buffers = self._buffers(module, i)
        self._module().train()
        draws = (contextlib.nullcontext() if module is None or module.rng is None
                 else randomness.drawing(module.rng, i, params[0].device))
        with draws:
            for start in range(0, batch, self.examples_per_chunk):
                stop = min(batch, start + self.examples_per_chunk)
                with torch.enable_grad():
                    with autocast(self.precision, x.device):
                        loss = self.criterion(widen(self._call(leaves, x[start:stop], buffers)),
                                              y[start:stop])
                    loss = loss * ((stop - start) / batch)
                    loss.backward()
                total += loss.detach()
        return total, [leaf.grad for leaf in leaves]

    def loss_and_grads(self, params: Sequence[Tensor], x: Tensor, y: Tensor,
                       module: ModuleState | None = None) -> tuple[Tensor, list[Tensor]]:
        """Per-trial mini-batch loss [N] and gradients (one per parameter, stacked)."""
        grads = [torch.zeros_like(p) for p in params]
        losses = torch.stack(threads.spread(
            lambda i: self._trial([p[i] for p in params], x[i], y[i], [g[i] for g in grads],
                                  module, i)[0],
            range(x.shape[0]), self.workers(x.shape[0], x.device)))
        return losses, grads

    def updates_in_step(self, optimizer: str, device: str | torch.device) -> bool:
        """Whether :meth:`train_step` updates each trial right after its own gradients (every
        optimizer's update, :mod:`training.engine.updates`): on the CPU, yes (one trial's
        gradients alive at a time, the compiled kernel's one-pass update, and a diverged trial
        found by one read of its loss). On CUDA, no: a read of a trial's loss waits for the GPU's
        queue, so that every trial-step would wait for the GPU and the host could never launch
        ahead of it; there all trials' gradients are computed first, their losses read once per
        step, and one stacked update applied (the loop's loss_and_grads path)."""
        return torch.device(device).type == "cpu"

    def train_step(self, params: Sequence[Tensor], x_train: Tensor, y_train: Tensor,
                   idx: Tensor, update: StackUpdate, limit: Tensor,
                   module: ModuleState | None = None) -> Tensor:
        """One step of every trial on its batch ``x_train[idx[i]]``: the losses [N], and
        ``update`` (any optimizer, :class:`training.engine.updates.StackUpdate`) applied in place to
        every trial whose loss is at most ``limit`` (float64 [N]). Trial by trial, so that only
        one trial's gradients are alive (``simple_cnn``'s are 13 MB a trial), never a stack of
        them."""
        def trial(i: int) -> Tensor:
            rows = idx[i]
            loss, grads = self._trial([p[i] for p in params], x_train.index_select(0, rows),
                                      y_train.index_select(0, rows), module=module, i=i)
            if not bool(loss.double() <= limit[i]):
                return loss  # diverged: no update
            if self.kernel is not None and params[0].device.type == "cpu":
                update.apply_trial_(self.kernel, i, params, grads)
                return loss
            one = slice(i, i + 1)  # a trial's own rows: trials never write each other's
            update.rows(one, params).apply_([p[one] for p in params],
                                            [g.unsqueeze(0) for g in grads])
            return loss

        return torch.stack(threads.spread(trial, range(idx.shape[0]),
                                          self.workers(idx.shape[0], idx.device)))


def build(cell: Cell, examples_per_chunk: int, eval_chunk: int) -> PerTrialProgram:
    """The registry's builder (:mod:`training.engine.programs.registry`): any module, trials
    side by side on torch's threads, channels-last where that was measured, in chunks."""
    return PerTrialProgram(cell.model, cell.task, examples_per_chunk, eval_chunk, cell.loss,
                           cell.random, cell.precision, device=cell.device)
