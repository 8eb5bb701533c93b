"""The ``[stopping]`` table: the study's stopping rule, declared before any data.

A claim compared on paired runs (the same initialization seed and data order at two sparsity
levels) is decided by one paired statistic: the mean over pairs of the difference of the runs'
mean ``log metric`` at Lee et al. (2021)'s stage. Its interval is the primary one wherever the
runs are paired. The rule says how many pairs the study takes, and never lets it stop on an
uncorrected look::

    [stopping]
    rule = "group_sequential"     # fixed | group_sequential
    metric = "local_lipschitz"    # a quantity at Lee's stage (the paired statistic's)
    sparsity = 0.9                # the level compared ...
    reference = 0.0               # ... with this one (default 0: dense)
    effect = 0.1                  # the resolution planned for: 10 % (sparsescale design)
    alpha = 0.1                   # two-sided: a 90 % interval
    rounds = 5                    # group_sequential: K looks, one after each round of seeds
    boundary = "obrien_fleming"   # obrien_fleming | pocock (theory.verdicts.sequential)

``rule = "fixed"`` takes every pair the spec plans (its seeds times ``[probes]
lipschitz_trials``) and looks once; ``pairs = N`` states that number, and must equal it.
``rule = "group_sequential"`` splits the seeds into ``rounds`` equal rounds (the seeds must
divide evenly); look k uses the pairs of the first k rounds against the boundary's c_k. The
runner trains round by round and stops at the first look that stops
(:mod:`experiments.run.rounds`), so the rule needs its metric from the rounds' own training:
L taken inside the run (``[probes] lipschitz_in_run = true``, ``metric = "local_lipschitz"``). The
table enters the spec's canonical JSON (hence its hash) only when present, so it is stored
with the study and the hashes of studies without it do not move.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from theory.verdicts.lee_stage import QUANTITY
from theory.verdicts.sequential import BOUNDARIES

from experiments.spec.checks import Checker

RULES = ("fixed", "group_sequential")
# the quantities measured at Lee's stage (experiments.measures.probes.tasks.STAGE_MEASURED)
METRICS = ("local_lipschitz", "g_sq", "trace_sigma", "b_simple", "loss")
KEYS = ("rule", "metric", "sparsity", "reference", "effect", "alpha", "pairs", "rounds",
        "boundary")


@dataclass(frozen=True)
class Stopping:
    """The ``[stopping]`` table (module docstring); ``rounds`` is 1 for a fixed rule."""

    rule: str
    metric: str
    sparsity: float
    reference: float
    effect: float
    alpha: float
    rounds: int = 1
    boundary: str = "obrien_fleming"
    pairs: int | None = None

    def canonical(self) -> dict[str, Any]:
        """JSON-able form: the keys its rule uses (so that it validates again as stored)."""
        unused = ("rounds", "boundary") if self.rule == "fixed" else ("pairs",)
        return {k: v for k, v in asdict(self).items() if v is not None and k not in unused}

    def describe(self) -> str:
        """One sentence: the rule as declared (the report prints it)."""
        what = (f"the paired difference of mean log {self.metric} at Lee's stage, sparsity "
                f"{self.sparsity:g} against {self.reference:g}, {1 - self.alpha:.0%} two-sided, "
                f"planned to resolve {self.effect:.0%}")
        if self.rule == "fixed":
            n = f" ({self.pairs} pairs)" if self.pairs else ""
            return f"fixed{n}: one look at {what}"
        return (f"group sequential, {self.rounds} looks with {self.boundary.replace('_', '-')} "
                f"boundaries at overall alpha {self.alpha:g}: {what}; the study stops only "
                f"where a look crosses its boundary, or its repeated interval is narrower than "
                f"the resolution")


def stopping_table(ck: Checker, raw: Mapping[str, Any], sparsities: tuple[float, ...] | None,
                   seeds: int, trials_per_seed: int | None, in_run: bool = False
                   ) -> Stopping | None:
    """The ``[stopping]`` table checked (module docstring); ``in_run``: L is taken inside the
    training runs; None when absent or bad."""
    st = ck.optional_table(raw, "stopping", KEYS)
    if st is None:
        return None
    rule = ck.choice(st.get("rule"), "stopping.rule", RULES)
    metric = ck.choice(st.get("metric", QUANTITY), "stopping.metric", METRICS)
    levels = sparsities or ()
    allowed = ", ".join(f"{s:g}" for s in levels)
    pair = []
    for key, default in (("sparsity", None), ("reference", 0.0)):
        value = ck.number(st.get(key, default), f"stopping.{key}", 0.0, 1.0, hi_open=True)
        if value is not None and sparsities is not None and value not in levels:
            ck.add(f"stopping.{key}", f"found {value:g}; allowed: one of the study's "
                                      f"sparsities ({allowed})")
            value = None
        pair.append(value)
    if None not in pair and pair[0] == pair[1]:
        ck.add("stopping.sparsity", f"found {pair[0]:g}, the reference too; allowed: another "
                                    f"of the study's sparsities ({allowed})")
    effect = ck.number(st.get("effect", 0.1), "stopping.effect", 0.0, lo_open=True)
    alpha = ck.number(st.get("alpha", 0.1), "stopping.alpha", 0.0, 0.5, lo_open=True,
                      hi_open=True)
    planned = seeds * (trials_per_seed or 1)
    rounds, boundary, pairs = 1, "obrien_fleming", None
    if rule == "fixed":
        for key in ("rounds", "boundary"):
            if key in st:
                ck.add(f"stopping.{key}", "only used with rule = \"group_sequential\"; "
                                          "allowed: remove it, or set that rule")
        if "pairs" in st:
            pairs = ck.integer(st["pairs"], "stopping.pairs", 2)
            if pairs is not None and pairs != planned:
                ck.add("stopping.pairs", f"found {pairs}; the spec plans {planned} pairs "
                                         f"({seeds} seed(s) x {trials_per_seed or 1} probed "
                                         f"run(s)); allowed: {planned}, or change seeds or "
                                         "probes.lipschitz_trials")
    elif rule == "group_sequential":
        if "pairs" in st:
            ck.add("stopping.pairs", "only used with rule = \"fixed\"; allowed: remove it "
                                     "(the rounds split the seeds)")
        rounds = ck.integer(st.get("rounds"), "stopping.rounds", 2)
        if rounds is not None and seeds % rounds:
            ck.add("stopping.rounds", f"found {rounds}; the study has {seeds} seed(s), which "
                                      "must split into equal rounds; allowed: a divisor of the "
                                      "number of seeds (>= 2)")
            rounds = None
        boundary = ck.choice(st.get("boundary", "obrien_fleming"), "stopping.boundary",
                             BOUNDARIES)
        if trials_per_seed is not None and not (in_run and metric == QUANTITY):
            ck.add("stopping.rule", "group_sequential looks after each round of training, at L "
                                    "taken inside the rounds' runs; allowed: [probes] "
                                    "lipschitz_in_run = true with metric = \"local_lipschitz\", "
                                    "or rule = \"fixed\"")
    if trials_per_seed is None:
        ck.add("stopping", "needs paired runs at Lee's stage; allowed: set probes.lipschitz_every "
                           "(and lipschitz_trials)")
    if None in (rule, metric, *pair, effect, alpha, rounds, boundary):
        return None
    return Stopping(rule, metric, pair[0], pair[1], effect, alpha, rounds, boundary, pairs)
