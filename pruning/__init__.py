"""sparsescale.pruning: sparsity masks by published criteria, and structured channel pruning.

Public API::

    mask = pruning.prune(net, "snip", sparsity=0.9, dataset=ds)   # -> pruning.Mask
    mask.sparsity(); mask.apply(net)
    pruning.list_methods()        # random, magnitude, snip, grasp, synflow, imp
    pruning.report(net, mask)     # per-layer kept / total weights and FLOPs (pandas DataFrame)
    small, rep = pruning.structured.prune_channels(net, x[:1], param_fraction=0.5)

Bad arguments raise :class:`PruningError`, bad masks :class:`MaskError` (both
``training.SparsescaleError``). ``import pruning`` needs only torch: torch-pruning is imported
by the structured-pruning functions that use it.
"""

from . import accounting, criteria, iterative, select, structured
from .accounting import report
from .errors import MaskError, PruningError
from .mask import Mask, prunable_parameters
from .methods import list_methods, prune
from .structured import StructuredReport, prune_channels

__all__ = ["accounting", "criteria", "iterative", "select", "structured", "report", "Mask",
           "MaskError", "PruningError", "prunable_parameters", "list_methods", "prune",
           "StructuredReport", "prune_channels"]
