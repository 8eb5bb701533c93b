"""The ``[schedules]`` table of a study spec: the shoot-out of batch-size policies against the
best fixed batch size of the same study's sweep (:mod:`experiments.measures.schedules`)::

    [schedules]
    enabled = true
    policies = ["fixed", "goodput", "noise_ramp", "cbs_warmup", "seesaw"]   # or "module:Name"
    replicates = 5               # data orders per policy and for the best fixed B (>= 5: intervals)
    batch_size = "smallest"      # where the policies start: the best trial at this B
    every = 50                   # updates between decisions (default: the [eval] interval)
    measure_steps = 4            # batches per noise reading (theory.policies.read_noise)
    max_batch = 1024             # the policies' largest B (default: the study's largest)
    [schedules.options.goodput]  # a policy's own options (theory.policies.builtin)
    min_gain = 0.05

Defaults a policy gets unless its options say otherwise: the grid [start B, max_batch], the
time model fitted to the sweep's own step times (goodput), the optimizer's lr rule (noise ramp:
linear for SGD-type, sqrt for Adam-type), Seesaw's milestones at 1/4 and 1/2 of the base run's
examples to its goal, CBS warmup from the study's ``[branching]`` rows (the policy is left out,
with a note, when the study has none). Validation through
:class:`experiments.spec.checks.Checker`: one line per problem, naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from theory.errors import TheoryError
from theory.policies import POLICIES, make_policy
from training.config import is_int

from experiments.spec.checks import Checker

DEFAULT_POLICIES = ("fixed", "goodput", "noise_ramp", "cbs_warmup", "seesaw")
MIN_REPLICATES = 5


@dataclass(frozen=True)
class Schedules:
    """The ``[schedules]`` table (module docstring); disabled unless ``enabled = true``."""

    enabled: bool = False
    policies: tuple[str, ...] = DEFAULT_POLICIES
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    replicates: int = MIN_REPLICATES
    batch_size: str | int = "smallest"
    every: int | None = None
    measure_steps: int = 4
    max_batch: int | None = None

    def canonical(self) -> dict[str, Any]:
        """JSON-able form (the spec hash)."""
        return {f.name: (list(v) if isinstance(v, tuple) else
                         {k: dict(o) for k, o in sorted(v.items())} if isinstance(v, Mapping)
                         else v)
                for f in fields(self) for v in [getattr(self, f.name)]}


KEYS = tuple(f.name for f in fields(Schedules))


def schedules(ck: Checker, raw: Mapping[str, Any], batch_sizes: tuple[int, ...] | None) -> Schedules:
    """The validated ``[schedules]`` table of ``raw`` (defaults where a key is missing)."""
    table = ck.table(raw, "schedules", "schedules") or {}
    ck.keys(table, "schedules", KEYS)
    out: dict[str, Any] = {}
    if "enabled" in table:
        if isinstance(table["enabled"], bool):
            out["enabled"] = table["enabled"]
        else:
            ck.add("schedules.enabled", f"found {table['enabled']!r}; allowed: true or false")
    names = table.get("policies", list(DEFAULT_POLICIES))
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)
            and len(set(names)) == len(names)):
        ck.add("schedules.policies", f"found {names!r}; allowed: a list of distinct policy names "
                                     f"({', '.join(POLICIES.names())}) or import paths")
        names = []
    options = table.get("options", {})
    if not isinstance(options, Mapping) or not all(isinstance(v, Mapping) for v in options.values()):
        ck.add("schedules.options", "allowed: one table of options per policy name")
        options = {}
    for name in options:
        if name not in names:
            ck.add(f"schedules.options.{name}", f"options for a policy not listed; listed: "
                                                f"{', '.join(names)}")
    for name in names:
        if ":" in name or name in ("cbs_warmup", "seesaw"):
            continue   # built at run time (an import path, or options from the sweep)
        try:
            make_policy(name, options.get(name, {}))
        except TheoryError as exc:
            ck.add("schedules.policies", str(exc))
    out["policies"], out["options"] = tuple(names), {k: dict(v) for k, v in options.items()}
    for key, lo in (("replicates", MIN_REPLICATES), ("every", 1), ("measure_steps", 1),
                    ("max_batch", 1)):
        if key in table:
            out[key] = ck.integer(table[key], f"schedules.{key}", lo)
    base = table.get("batch_size", "smallest")
    if base == "smallest" or (is_int(base) and batch_sizes is not None and base in batch_sizes):
        out["batch_size"] = base
    else:
        ck.add("schedules.batch_size", f"found {base!r}; allowed: 'smallest' or one of the "
                                       f"study's batch sizes ({', '.join(map(str, batch_sizes or ()))})")
    return Schedules(**{k: v for k, v in out.items() if v is not None})
