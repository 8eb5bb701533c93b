"""The errors pruning raises: :class:`PruningError` for a bad argument to a pruning function, and
:class:`training.MaskError` (re-exported here as ``pruning.MaskError``) for a bad mask."""

from training.errors import SparsescaleError
from training.masks import MaskError

__all__ = ["PruningError", "MaskError"]


class PruningError(SparsescaleError):
    """Bad input to a pruning function (method, sparsity, scope, data, budget, ...): names the
    argument, what was found and what is allowed."""
