"""sparsescale.pruning: sparsity masks by published criteria, sanity checks, layer-collapse
diagnostics, and structured channel pruning.

Public API::

    mask = pruning.prune(net, "snip", sparsity=0.9, dataset=ds)   # -> pruning.Mask
    mask.sparsity(); mask.apply(net)
    pruning.list_criteria()  # random, magnitude, snip, grasp, synflow, imp, iterative_snip, force
    @pruning.register("mine", needs=("dataset",))  # your own criterion: (model, params, context)
    pruning.prune(net, "mymodule:mine", 0.9, dataset=ds)        # ... or named by import path
    pruning.prune(net, "snip", 0.9, dataset=ds, keep="lowest") # inverted criterion
    pruning.prune(net, "snip", 0.9, dataset=ds, examples="all", prune_biases=True)  # Lee et al.
    pruning.prune_levels(net, "snip", [0.5, 0.9], dataset=ds)  # one scoring, several levels
    pruning.shuffle_layers(mask, seed=1); pruning.matched_random(mask, seed=1)
    pruning.reinitialize(net, seed=1, mask=mask)               # same mask, another init
    pruning.diagnose(net, mask)   # per-layer density, dead units, input-output paths
    pruning.report(net, mask)     # per-layer kept / total weights and FLOPs (pandas DataFrame)
    small, rep = pruning.structured.prune_channels(net, x[:1], param_fraction=0.5)

Bad arguments raise :class:`PruningError`, bad masks :class:`MaskError` (both
``training.SparsescaleError`` and ``ValueError``), a mask file that cannot be read or written
:class:`MaskIOError` (an ``OSError``); a mask that empties a layer warns with
:class:`LayerCollapseWarning` (a ``training.SparsescaleWarning``). ``import pruning`` needs only
torch: torch-pruning is imported by the structured-pruning functions that use it.
"""

from training.errors import renamed_names

from pruning import accounting, criteria, diagnostics, iterative, sanity, select, structured
from pruning.accounting import report
from pruning.apply import prune, prune_levels
from pruning.diagnostics import Diagnosis, LayerCollapseWarning, density_figure, diagnose
from pruning.errors import MaskError, MaskIOError, PruningError
from pruning.mask import Mask, prunable_parameters
from pruning.registry import CRITERIA, Context, Criterion, list_criteria, register, whole_split
from pruning.sanity import matched_random, reinitialize, shuffle_layers
from pruning.structured import StructuredReport, prune_channels

__all__ = ["accounting", "criteria", "diagnostics", "iterative", "sanity", "select", "structured",
           "report", "Diagnosis", "LayerCollapseWarning", "density_figure", "diagnose", "Mask",
           "MaskError", "MaskIOError", "PruningError", "prunable_parameters", "Context",
           "CRITERIA", "Criterion", "list_criteria", "register", "whole_split", "prune", "prune_levels",
           "matched_random", "reinitialize", "shuffle_layers", "StructuredReport",
           "prune_channels"]

# names renamed to the glossary's words, kept as deprecated aliases for a while
__getattr__ = renamed_names("pruning", {"list_methods": list_criteria})
