"""Data order: which training examples each step uses.

A trial's mini-batches come only from its own data seed: each epoch is a fresh permutation of the
training set drawn from ``torch.Generator().manual_seed(data_seed(seed, epoch))``; an epoch has
``n // batch_size`` batches (the remainder is dropped). Both trainers (and the distributed one)
read batches from here, so they see identical data.
"""

from __future__ import annotations

import numpy as np
import torch

from training.errors import ConfigError


def trial_seed(seed: int, index: int) -> int:
    """Seed of trial ``index`` in a group with seed ``seed`` (independent of the group's size)."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1, dtype=np.uint32)[0])


def epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The order of the ``n`` training examples in ``epoch`` of the trial with data seed ``seed``."""
    s = int(np.random.SeedSequence([int(seed), int(epoch), 0x5EED]).generate_state(1, np.uint64)[0])
    return torch.randperm(n, generator=torch.Generator().manual_seed(s & (2**63 - 1)))


class BatchOrder:
    """Mini-batch indices for one trial: ``order.batch(step)`` -> LongTensor [batch_size]."""

    def __init__(self, seed: int, n: int, batch_size: int):
        if (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
                or not 1 <= batch_size <= n):
            raise ConfigError(f"batch size must be in [1, {n}] (training set size), got "
                             f"{batch_size!r}")
        self.seed, self.n, self.batch_size = int(seed), int(n), int(batch_size)
        self.per_epoch = n // batch_size
        self._epoch, self._perm = -1, None

    def batch(self, step: int) -> torch.Tensor:
        """Indices of the mini-batch of update ``step`` (0-based)."""
        epoch, k = divmod(int(step), self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, epoch_permutation(self.seed, epoch, self.n)
        return self._perm[k * self.batch_size:(k + 1) * self.batch_size]
