"""The ``[pruning]`` table's options of how a mask is made: Lee et al. (2021)'s protocol as keys.

::

    [pruning]
    method = "snip"
    examples = "all"          # SNIP on the whole training split, in chunks of 100
    prune_biases = true       # biases are scored and pruned too
    mask_per_trial = true     # every trial its own initialization and its own mask

Lee et al.'s released code (``namhoonlee/effect-dps-public``): ``edps/prune.py`` sums SNIP's
saliency over the whole training split in batches of 100; ``edps/model.py`` scores (and masks)
every weight and bias in one global top-k; ``edps/main.py`` re-initializes every run with its
own seed and prunes it again. The defaults keep what this library did before (the criterion's
own batch, 10 examples per class for SNIP; weights only; one initialization and one mask per
(sparsity, seed), shared by a group's trials), and a spec that leaves the keys out keeps its
hash and group keys (:meth:`PruningOptions.canonical` is empty then).

``mask_per_trial``: trial i of the group with seed s starts from the initialization of seed
``training.initialization.trial_init_seed(s, i)`` and trains under the mask pruned from it
(the same at every batch size, as trial i's metaparameters are); the dense level too starts
each trial from its own initialization. How the runner does it: :mod:`experiments.run.workload`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pruning.methods import EXAMPLES, WHOLE_SPLIT

from experiments.spec.checks import PRUNING_OPTION_KEYS as KEYS, Checker, did_you_mean


@dataclass(frozen=True)
class PruningOptions:
    """How a study's masks are made (module docstring): ``examples`` (None: the criterion's own
    batch; ``"all"``: the whole training split), ``prune_biases``, ``mask_per_trial``."""

    examples: str | None = None
    prune_biases: bool = False
    mask_per_trial: bool = False

    def canonical(self) -> dict[str, Any]:
        """The keys that differ from their defaults (none: older hashes stay valid)."""
        out: dict[str, Any] = {}
        if self.examples is not None:
            out["examples"] = self.examples
        if self.prune_biases:
            out["prune_biases"] = True
        if self.mask_per_trial:
            out["mask_per_trial"] = True
        return out

    def prune_kwargs(self) -> dict[str, Any]:
        """The arguments of ``pruning.prune`` these options set."""
        return {"examples": self.examples, "prune_biases": self.prune_biases}


def pruning_options(ck: Checker, raw: Mapping[str, Any],
                    methods: tuple[str, ...]) -> PruningOptions:
    """The options of the ``[pruning]`` table (its keys are checked by
    ``checks.pruning_series``); ``examples = "all"`` needs every listed method to be one that
    scores on data batches (``pruning.methods.WHOLE_SPLIT``)."""
    table = raw.get("pruning")
    table = table if isinstance(table, Mapping) else {}
    examples = table.get("examples")
    if examples is not None:
        if examples not in EXAMPLES:
            near = did_you_mean(str(examples), EXAMPLES)
            ck.add("pruning.examples", f"found {examples!r}{near}; allowed: 'all' (the whole "
                                       f"training split, in chunks of 100), or leave it out "
                                       f"(the criterion's own batch)")
            examples = None
        else:
            wrong = [m for m in methods if m not in WHOLE_SPLIT]
            if wrong:
                ck.add("pruning.examples", f"'all' does not apply to method {wrong[0]!r}; "
                                           f"allowed with: {', '.join(WHOLE_SPLIT)}")
    flags = {}
    for key in ("prune_biases", "mask_per_trial"):
        value = table.get(key, False)
        if not isinstance(value, bool):
            ck.add(f"pruning.{key}", f"found {value!r}; allowed: true or false")
            value = False
        flags[key] = value
    return PruningOptions(examples, **flags)
