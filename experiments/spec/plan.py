"""The plan of a study: its groups, derived from a validated :class:`~experiments.spec.study.Spec` in
this one place (the runner trains them, the report lists what is planned but not stored).

A *group* is one (sparsity, batch size, seed) cell, and with a delay axis (``delays``) one
(sparsity, batch size, delay, seed) cell: ``spec.trials`` metaparameter points (the same Sobol
points at every cell, :func:`experiments.spec.search.sample`, so the learning rate is tuned per
(B, tau) as per B; with ``[tuning]``, the cell's best point of a search, repeated:
:func:`tuned_points`) trained as one vectorized computation, every trial with the cell's delay. Its key is the hash of its canonical config (:func:`group_config`), so a rerun skips
every group the store already holds and a changed setting never reuses a stored result.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from experiments.spec import search
from experiments.spec.checks import delay_fields, trial_rules_canonical
from experiments.spec.study import Spec, canonical_json


@dataclass(frozen=True)
class GroupPlan:
    """One group to run: everything a worker needs except the workload and the mask.
    ``reserve``: with ``complete_trials``, the next points of the search's sequence, trained in
    place of diverged trials (:mod:`experiments.run.complete`); empty otherwise."""

    key: str
    sparsity: float
    batch_size: int
    seed: int
    max_steps: int
    trials: tuple[dict[str, Any], ...]
    config_json: str
    reserve: tuple[dict[str, Any], ...] = ()
    delay: int = 0   # the gradient delay of every trial (experiments.spec.checks.delays)

    @property
    def cost(self) -> int:
        """Upper bound on trial-steps (every trial runs the whole budget)."""
        return self.max_steps * len(self.trials)


def group_config(spec: Spec, sparsity: float, batch_size: int, seed: int, max_steps: int,
                 trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything that determines a group's results (its key is this dict's hash). With
    ``[pruning] mask_per_trial`` every trial starts from its own initialization, the dense
    level's too: its groups say so (``mask_per_trial``, absent otherwise, so that older keys
    stay valid); the trial rules (``stop``, ``complete_trials``) only when set, so other groups
    keep their keys."""
    c = spec.canonical()
    per_trial = {"mask_per_trial": True} if spec.pruning_options.mask_per_trial else {}
    return {"workload": c["workload"], "optimizer": spec.optimizer, "goal": c["goal"],
            "pruning": c["pruning"] if sparsity > 0 else None, "sparsity": sparsity,
            "batch_size": batch_size, "seed": seed, "max_steps": max_steps, "eval": c["eval"],
            "trials": trials, **per_trial,
            **trial_rules_canonical(spec.stop, spec.complete_trials)}


def plan(spec: Spec) -> list[GroupPlan]:
    """All groups of ``spec`` in a stable order (sparsity, batch size, delay, seed). A delay
    goes into every trial's fields (:func:`experiments.spec.checks.delay_fields`; none at delay
    0), hence into the group's key."""
    groups = []
    for sparsity in spec.sparsities:
        for b in spec.batch_sizes:
            max_steps = spec.budget.steps(b)
            # a Sobol sequence's first N points do not depend on how many are drawn: the
            # reserve is the same sequence continued (as many points again)
            drawn = (tuned_points(spec, sparsity, b) if spec.tuning else search.sample(
                spec.search, spec.trials * (2 if spec.complete_trials else 1), spec.search_seed,
                max_steps, momentum_used=spec.optimizer != "sgd"))
            for tau in spec.delays:
                extra = delay_fields(tau, spec.delay_kind)
                delayed = [{**t, **extra} for t in drawn]
                trials, reserve = delayed[:spec.trials], delayed[spec.trials:]
                for seed in spec.seeds:
                    cfg = group_config(spec, sparsity, b, seed, max_steps, trials)
                    text = canonical_json(cfg)
                    groups.append(GroupPlan(key=hashlib.sha256(text.encode()).hexdigest()[:20],
                                            sparsity=sparsity, batch_size=b, seed=seed,
                                            max_steps=max_steps, trials=tuple(trials),
                                            config_json=text, reserve=tuple(reserve),
                                            delay=tau))
    return groups


# the trials of a tuned study's group before its search has run (``sparsescale plan``, the
# report's planned cells): a placeholder, never a stored group's key
PENDING = {"tuned": "pending"}


def tuned_points(spec: Spec, sparsity: float, batch_size: int) -> list[dict[str, Any]]:
    """A tuned study's trials at one cell (:mod:`experiments.spec.tables.tuning`): the cell's
    best point of the search (``spec.tuned``, set by :mod:`experiments.run.tuning`) repeated
    ``spec.trials`` times; :data:`PENDING` points until the search has run."""
    point = spec.tuned.get((float(sparsity), int(batch_size)), PENDING)
    return [dict(point) for _ in range(spec.trials)]


def run_order(groups: list[GroupPlan]) -> list[GroupPlan]:
    """``groups`` longest expected first, so that a pool's last wave is short (LPT scheduling).

    A group stops at the goal, not at its budget, so the budget is a poor guide. The expected
    time is S(B) t(B) with McCandlish et al. (2018)'s S(B) = S_min (1 + B_noise / B), B_noise
    guessed as the geometric middle of the study's batch sizes, and a time per step
    t(B) = B + 32 (a step's fixed cost, in examples), times 1 / sqrt(1 - sparsity) (sparse
    networks take more steps: 2-5x at 90 % in the bundled studies). Measured: quickstart, B = 8
    .. 4096, the longest groups 0.9 at B = 4096 (10.5 s) and at B = 8 (9.7 s), which ordering by
    B alone trained last; lee_sparsity_mnist1d, 0.9 at B = 4096 (810 s), then 0.9 at 2048 and
    the other levels at 4096 (374-444 s)."""
    if not groups:
        return []
    sizes = sorted({g.batch_size for g in groups})
    middle = math.sqrt(sizes[0] * sizes[-1])

    def expected(g: GroupPlan) -> float:
        # a delay tau adds tau / (1 + B_noise / B) of the undelayed steps (the delayed-SGD
        # bound of theory.models.delay, without additive noise)
        return ((1 + middle / g.batch_size + g.delay) * (g.batch_size + 32)
                / math.sqrt(max(1e-6, 1 - g.sparsity)))

    return sorted(groups, key=lambda g: (-expected(g), g.key))


def format_plan(spec: Spec, groups: list[GroupPlan], stored: set[str] | None = None) -> str:
    """The plan as text: one line per (sparsity, batch size) with its step budget, and the total
    cost in trial-steps (an upper bound: every trial running its whole budget). A factory or
    pruning criterion named by import path is listed with its source digest, a delay axis as a
    column. ``stored``: the keys of the groups a run
    folder holds; each line then says whether its group is ``new`` (to train) or ``stored``."""
    axis = len(spec.delays) > 1
    lines = [f"study {spec.name!r}: {spec.dataset} / {spec.model} / {spec.optimizer}, goal "
             f"{spec.metric} {'<' if spec.strict else '<='} {spec.target}",
             *(f"{kind} factory {getattr(spec, kind)}: source sha256 {digest[:12]}"
               for kind, digest in sorted(spec.digests.items())),
             *(f"pruning criterion {path}: source sha256 {digest[:12]}"
               for path, digest in sorted(spec.criterion_digests.items())),
             *([f"init {spec.init}"] if spec.init != "torch" else []),
             *([f"pruning {spec.pruning_criterion}: " + ", ".join(
                 f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}"
                 for k, v in spec.pruning_options.canonical().items())]
               if spec.pruning_options.canonical() else []),
             f"{len(groups)} groups = {len(spec.sparsities)} sparsities x "
             f"{len(spec.batch_sizes)} batch sizes x "
             + (f"{len(spec.delays)} delays ({spec.delay_kind}) x " if axis else "")
             + f"{len(spec.seeds)} seeds, {spec.trials} trials each",
             f"{'sparsity':>8} {'batch':>6}" + (f" {'delay':>5}" if axis else "")
             + f" {'max_steps':>9} {'trial-steps':>12}"
             + (f" {'group':>6}" if stored is not None else "")]
    for g in groups:
        lines.append(f"{g.sparsity:>8g} {g.batch_size:>6}" + (f" {g.delay:>5}" if axis else "")
                     + f" {g.max_steps:>9} {g.cost:>12,}"
                     + (f" {'stored' if g.key in stored else 'new':>6}"
                        if stored is not None else ""))
    todo = [g for g in groups if stored is None or g.key not in stored]
    total = sum(g.cost for g in todo)
    examples = sum(g.cost * g.batch_size for g in todo)
    if stored is not None:
        lines.append(f"{len(todo)} new, {len(groups) - len(todo)} stored")
    lines.append(f"estimated cost: at most {total:,} trial-steps ({examples:,} examples)")
    return "\n".join(lines)
