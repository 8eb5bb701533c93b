"""The module's own state in each trial of a stack, for the programs that run the module's own
forward pass (``per_trial``, ``plain``; ``Program.takes_module_state``): buffers such as
BatchNorm's running statistics, and the generator state of its random draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from training import randomness

Tensor = torch.Tensor


@dataclass
class ModuleState:
    """The module's own state in each trial of a stack: ``buffers`` in the order of
    ``named_buffers()``, stacked ``[n, *shape]`` (BatchNorm's running statistics and counts,
    updated in place by a training step's forward pass, read by evaluations), and ``rng``, each
    trial's generator state for the module's random draws (Dropout;
    :mod:`training.randomness`)."""

    buffers: list[Tensor]
    rng: list[Tensor] | None   # None: the model draws no random numbers

    def select(self, idx: Tensor) -> "ModuleState":
        rows = idx.tolist()
        return ModuleState([b.index_select(0, idx.to(b.device)) for b in self.buffers],
                           None if self.rng is None else [self.rng[r] for r in rows])

    def clone(self) -> "ModuleState":
        return ModuleState([b.clone() for b in self.buffers],
                           None if self.rng is None else list(self.rng))

    def rows(self, start: int, stop: int) -> "ModuleState":
        """Trials ``start`` .. ``stop - 1``: views of the buffers, the same generator states."""
        return ModuleState([b[start:stop] for b in self.buffers],
                           None if self.rng is None else self.rng[start:stop])

    @classmethod
    def initial(cls, model: nn.Module, seeds: list[int], device: str, dtype: torch.dtype,
                random: bool) -> "ModuleState":
        """``model``'s buffers repeated for every trial (floating ones cast to ``dtype``), and,
        for a ``random`` model, the generator states seeded by ``seeds``
        (:func:`training.randomness.randomness_seed`)."""
        buffers = [b.detach().to(device=device, dtype=dtype if b.is_floating_point() else b.dtype)
                   .unsqueeze(0).expand(len(seeds), *b.shape).clone()
                   for _, b in model.named_buffers()]
        return cls(buffers, [randomness.seeded_state(s, device) for s in seeds] if random
                   else None)
