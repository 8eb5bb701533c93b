"""The errors pruning raises: :class:`PruningError` for a bad argument to a pruning function,
:class:`training.MaskError` (re-exported here as ``pruning.MaskError``) for a bad mask (both
``ValueError``), and :class:`MaskIOError` (an ``OSError``) for a mask file that cannot be read or
written."""

from training.errors import SparsescaleError, SparsescaleIOError
from training.masks import MaskError

__all__ = ["PruningError", "MaskError", "MaskIOError"]


class PruningError(SparsescaleError, ValueError):
    """Bad input to a pruning function (criterion, sparsity, scope, data, budget, ...): names the
    argument, what was found and what is allowed."""


class MaskIOError(SparsescaleIOError):
    """A mask file cannot be read or written (:meth:`pruning.Mask.load`,
    :meth:`~pruning.Mask.save`): names the path."""
