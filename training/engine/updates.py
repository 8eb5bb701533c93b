"""The update of the vectorized trainer, in place on trials stacked along dim 0.

One step's update of a stack is a :class:`StackUpdate`: per-trial learning rates (schedule
applied), momentum, masks and optimizer state. :meth:`StackUpdate.apply_` first masks the
gradient (:func:`training.masks.mask_`), so that pruned weights and their buffers stay exactly
zero, then applies the optimizer's rule:

- sgd / momentum / nesterov: ``torch.optim.SGD`` with dampening 0 (the rules of Shallue et al.
  2019): sgd: w <- w - lr g; momentum (heavy ball): a <- mu a + g, w <- w - lr a; nesterov:
  a <- mu a + g, w <- w - lr (g + mu a);
- adam / adamw: ``torch.optim.Adam`` / ``AdamW`` (Kingma & Ba 2015; Loshchilov & Hutter 2019),
  :meth:`training.engine.adam.AdamState.step`.

It updates the whole stack, after a program computed every trial's gradient
(:meth:`training.engine.programs.batched.BatchedProgram.loss_and_grads`), or the rows of one trial right
after its backward pass (:meth:`training.engine.programs.per_trial.PerTrialProgram.train_step`), so that only
one trial's gradients are alive; buffers are always updated in place, so a view of some rows
updates the stack. :meth:`StackUpdate.apply_trial_` applies the same rules to one trial in one
pass of the compiled kernel (:mod:`training.engine.compiled_kernel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from training.engine.adam import AdamState, add_product, per_trial
from training.config import OPTIMIZERS
from training.masks import mask_

Tensor = torch.Tensor


@dataclass(frozen=True, eq=False)  # tensors inside: no element-wise ==
class StackUpdate:
    """Update ``step`` (0-based) of a stack of n trials: ``optimizer``, per-trial ``lr`` [n]
    (float64, schedule applied) and ``mu`` [n] (model dtype), ``masks`` (per parameter: None,
    shared ``[*shape]`` or per trial ``[n, *shape]``), the momentum buffers ``bufs`` (None for
    sgd and Adam) and the Adam state ``adam`` (adam / adamw only)."""

    optimizer: str
    step: int
    lr: Tensor
    mu: Tensor
    masks: Sequence[Tensor | None]
    bufs: Sequence[Tensor] | None = None
    adam: AdamState | None = None

    def neg_lr(self, dtype: torch.dtype) -> Tensor:
        """-lr [n] in ``dtype``: the step factor of the SGD rules."""
        return self.lr.neg().to(dtype)

    def kernel_state(self) -> tuple[list[Tensor], list[Tensor]]:
        """The optimizer state as the compiled kernel reads it: the momentum buffers (or Adam's
        m) and Adam's v; empty lists where the optimizer has none."""
        if self.adam is None:
            return list(self.bufs or ()), []
        return list(self.adam.exp_avg), list(self.adam.exp_avg_sq)

    def rows(self, rows: slice, params: Sequence[Tensor]) -> "StackUpdate":
        """The update of trial positions ``rows`` of the stacked ``params`` only; its buffers
        are views of this one's, so applying it updates the stack."""
        def take(xs):
            return None if xs is None else [x[rows] for x in xs]

        return StackUpdate(
            self.optimizer, self.step, self.lr[rows], self.mu[rows],
            [m if m is None or m.dim() < p.dim() else m[rows] for m, p in zip(self.masks, params)],
            take(self.bufs), None if self.adam is None else self.adam.rows(rows))

    @torch.no_grad()
    def apply_(self, params: Sequence[Tensor], grads: Sequence[Tensor],
               out: Sequence[Tensor] | None = None) -> None:
        """Update the stacked ``params`` in place with their ``grads`` (overwritten); given
        ``out`` (tensors shaped as ``params``, not overlapping them), write the updated weights
        there instead and leave ``params`` as they were: a delayed stack writes them into its
        queue's next slot (:mod:`training.delay`). The optimizer state is updated in place."""
        params, grads = list(params), list(grads)
        mask_(grads, self.masks)
        if self.adam is not None:
            self.adam.step(params, grads, self.lr, self.step, out)
            return
        neg_lr = self.neg_lr(params[0].dtype)
        steps = [per_trial(neg_lr, p) for p in params]
        if self.bufs is None:
            add_product(params, grads, steps, out)
            return
        bufs = list(self.bufs)
        mus = [per_trial(self.mu, p) for p in params]
        torch._foreach_mul_(bufs, mus)
        torch._foreach_add_(bufs, grads)
        if self.optimizer == "nesterov":
            torch._foreach_addcmul_(grads, bufs, mus)
            add_product(params, grads, steps, out)
        else:
            add_product(params, bufs, steps, out)

    @torch.no_grad()
    def apply_trial_(self, kernel, i: int, params: Sequence[Tensor],
                     grads: Sequence[Tensor]) -> None:
        """Trial ``i``'s update of the stacked ``params`` in place with its ``grads`` (one
        trial's, overwritten), by the compiled kernel's ``update_trial``: the rules of
        :meth:`apply_` (mask, then the optimizer's), in one pass that reads each weight, its
        gradient and state once, where :meth:`apply_` makes three to four passes. The update is
        memory-bound: on simple_cnn's 3.3 M weights with momentum it took a third of a
        trial-step at B = 8 (see :mod:`training.engine.programs.per_trial`)."""
        first, second = self.kernel_state()
        kernel.update_trial(
            [p[i] for p in params], [g.contiguous() for g in grads], [b[i] for b in first],
            [v[i] for v in second],
            [m if m is None or m.dim() < p.dim() else m[i] for m, p in zip(self.masks, params)],
            float(self.lr[i]), float(self.mu[i]),
            [] if self.adam is None else self.adam.hyper[i].tolist(), self.step,
            OPTIMIZERS.index(self.optimizer))
