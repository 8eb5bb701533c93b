"""The ``[tuning]`` table: Lee et al. (2021)'s protocol of a study, search then repeat.

Lee et al. tune every metaparameter at every batch size and sparsity level ("while tuning all
metaparameters involved in the optimization": a quasi-random search, the best point by steps to
the goal), then read the tuned runs. A study with ``[tuning]`` runs in two phases::

    trials = 8               # phase 2: runs at each (level, B)'s best point, paired across levels
    [tuning]
    points = 8               # phase 1: quasi-random points of [search] per (level, B)
    seed = 1000              # phase 1's seed (initializations, masks, data orders)

1. **Search** (a sub-study in ``RUN_DIR/search``, :mod:`experiments.run.tuning`): at every
   (sparsity, batch size) the first ``points`` Sobol points of ``[search]`` (learning rate and
   momentum where they are ranges), one group per cell with ``seed``, each trial its own
   initialization and mask under ``[pruning] mask_per_trial``; no probes.
2. **Repeat**: the cell's best point (the fewest steps to the goal; where no point met it, the
   best final metric) trained ``trials`` times in one group per seed of ``seeds``: trial i of
   every level shares its initialization seed and data order, so the runs are paired, and the
   probes measure L on them at the batch size of the step ratio.

``seed`` must differ from every seed of ``seeds``: a repeat that shared the search's
initialization and data order would replay the run that won the search, and carry its luck.
The table enters the spec's canonical JSON (hence its hash) only when present.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from experiments.spec.checks import Checker

KEYS = ("points", "seed")


@dataclass(frozen=True)
class Tuning:
    """The ``[tuning]`` table (module docstring)."""

    points: int
    seed: int

    def canonical(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One sentence: the protocol as declared (the report prints it)."""
        return (f"tuned per sparsity level and batch size: {self.points} quasi-random points of "
                f"the search space (seed {self.seed}; stored in RUN_DIR/search), the best by "
                "steps to the goal (the best final metric where none met it), then the "
                "study's trials repeated at that point")


def tuning_table(ck: Checker, raw: Mapping[str, Any], seeds: tuple[int | None, ...] | None
                 ) -> Tuning | None:
    """The ``[tuning]`` table checked (module docstring); None when absent or bad."""
    table = ck.optional_table(raw, "tuning", KEYS)
    if table is None:
        return None
    points = ck.integer(table.get("points"), "tuning.points", 1)
    seed = ck.integer(table.get("seed"), "tuning.seed", 0)
    if seed is not None and seed in (seeds or ()):
        ck.add("tuning.seed", f"found {seed}, one of the study's seeds; allowed: a seed not in "
                              "seeds (the repeats must not replay the search's runs)")
        seed = None
    if points is None or seed is None:
        return None
    return Tuning(points, seed)
