"""The ``[probes]`` table: noise and smoothness along the best trial's run, and Lee et al.
(2021)'s L at their stage.

The keys of a study spec that measure Lee et al. (2021)'s L at their stage, and the trial rules
that decide which trials a group counts.

In ``[probes]`` (all optional; without ``lipschitz_every`` nothing here is measured)::

    lipschitz_every = 1000        # N: L and the gradient noise at steps N, 2N, ... up to the run's end
    lipschitz_start = 1000        # ... from this step on (default N; Lee's stage starts at 1,000)
    lipschitz_until = 5750        # ... up to this step in every run, whatever its goal
    lipschitz_examples = 8000     # L's gradients on a fixed sample, along [0, H] too (default: the split)
    lipschitz_trials = 3          # runs probed per probed group (reached first, fewest steps)
    lipschitz_check = [0.0]       # levels whose first run also measures L on the whole split
    lipschitz_in_run = true       # L taken inside the training runs, not by a replay of them

Lee et al.'s released code (``namhoonlee/effect-dps-public``, ``edps/train.py``) measures L inside
each run at every multiple of ``lipschitz_interval`` (default 1,000, ``edps/main.py``) until the
goal or the step budget (``train_iterations``) ends the run, on the whole training split
(``edps/check.py``, batches of 1,000). Here the probed runs are replayed bit for bit
(``theory.probe_trajectory``) and measured at the same steps; ``lipschitz_examples`` is a stated reduction, and ``lipschitz_check`` measures its effect
against the whole split at the first point of one run per listed level.

``lipschitz_in_run = true`` takes L at the same steps inside the training runs
(:mod:`experiments.measures.stage.inside`: the trainer hands each update's weights to the
measurement, no replay): every trial that did not diverge is measured at the probed batch sizes
(explicit ones, ``"smallest"`` or ``"largest"``: the trainer cannot wait for the fitted
``"b_crit"``), so ``lipschitz_trials`` is not used; with a sample, the whole-split check runs at
every level (``lipschitz_check`` defaults to, and must list, all of them). The noise at Lee's
stage is then not measured (the replay measured it beside L).

``lipschitz_examples`` applies to every L of the study (along [0, H] too), so it may be set
alone; the others need ``lipschitz_every``. ``lipschitz_start`` skips the points before it
(a dense schedule, N = 250, need not pay for points before Lee's stage). ``lipschitz_until``
measures every probed run over the same window, the replay continuing past the run's goal (or
its budget): Lee's code stops at the goal, so a level that meets it early gets few points;
a fixed window gives every run of every level the same points (issue 47's decisive study). Every key enters the spec's canonical JSON (hence its hash) only when it is set, so the hashes
of studies without them do not move.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from theory.verdicts.probe_points import BATCH_RULES
from training.config import is_int

from experiments.spec.checks import Checker

# the Probes fields this module owns, with their defaults (omitted from the canonical JSON)
LIPSCHITZ_DEFAULTS: dict[str, Any] = {"lipschitz_every": None, "lipschitz_start": None,
                                      "lipschitz_examples": None, "lipschitz_trials": 1,
                                      "lipschitz_check": (), "lipschitz_in_run": False,
                                      "lipschitz_until": None}


def lipschitz_keys(ck: Checker, table: Mapping[str, Any], sparsities: tuple[float, ...] | None,
                   trials: int | None, stop: str | None, seeds: int) -> dict[str, Any]:
    """The ``[probes]`` lipschitz keys of ``table`` checked (module docstring), as Probes
    fields; their defaults where a value is bad (recorded in ``ck``)."""
    out = dict(LIPSCHITZ_DEFAULTS)
    every = table.get("lipschitz_every")
    if every is not None:
        out["lipschitz_every"] = ck.integer(every, "probes.lipschitz_every", 1)
    for key in ("lipschitz_start", "lipschitz_trials", "lipschitz_check", "lipschitz_in_run",
                "lipschitz_until"):
        if key in table and every is None:
            ck.add(f"probes.{key}", "only used with probes.lipschitz_every; allowed: set "
                                    "lipschitz_every = N (steps between L's points) or remove it")
    if "lipschitz_start" in table and every is not None:
        out["lipschitz_start"] = ck.integer(table["lipschitz_start"], "probes.lipschitz_start", 1)
    if "lipschitz_until" in table and every is not None:
        first = out["lipschitz_start"] or out["lipschitz_every"] or 1
        out["lipschitz_until"] = ck.integer(table["lipschitz_until"], "probes.lipschitz_until",
                                            first)
    if "lipschitz_examples" in table:
        out["lipschitz_examples"] = ck.integer(table["lipschitz_examples"],
                                               "probes.lipschitz_examples", 2)
    if "lipschitz_trials" in table:
        k = ck.integer(table["lipschitz_trials"], "probes.lipschitz_trials", 1, trials)
        if k is not None and k > 1 and stop == "first":
            ck.add("probes.lipschitz_trials",
                   f"found {k} with stop = \"first\": a group stops at its first hit, so one "
                   "trial reaches the goal; allowed: 1, or stop = \"all\" (each trial to its "
                   f"own goal; or more seeds: this study has {seeds})")
            k = None
        out["lipschitz_trials"] = k or 1
    if "lipschitz_check" in table:
        out["lipschitz_check"] = _check_levels(ck, table["lipschitz_check"], sparsities,
                                               "lipschitz_examples" in table)
    if every is not None and "lipschitz_in_run" in table:
        out |= _in_run(ck, table, sparsities, out["lipschitz_check"])
    return out


def _in_run(ck: Checker, table: Mapping[str, Any], sparsities: tuple[float, ...] | None,
            check: tuple[float, ...]) -> dict[str, Any]:
    """``lipschitz_in_run`` and what it changes (module docstring): the check at every level
    with a sample; no ``lipschitz_trials``, no ``"b_crit"`` batch size."""
    path = "probes.lipschitz_in_run"
    value = table["lipschitz_in_run"]
    if not isinstance(value, bool):
        ck.add(path, f"found {value!r}; allowed: true or false")
        return {}
    if not value:
        return {}
    if "lipschitz_trials" in table:
        ck.add("probes.lipschitz_trials", "not used with lipschitz_in_run = true (every run of "
                                          "the probed groups is measured); allowed: remove it")
    if "b_crit" in table.get("batch_sizes", ("b_crit",)):
        ck.add("probes.batch_sizes", "\"b_crit\" is known only once the sweep is trained, and "
                                     "lipschitz_in_run measures L while it trains; allowed: "
                                     "\"smallest\", \"largest\" or batch sizes")
    out: dict[str, Any] = {"lipschitz_in_run": True}
    if "lipschitz_examples" in table and sparsities is not None:
        missing = [s for s in sparsities if "lipschitz_check" in table and s not in check]
        if missing:
            ck.add("probes.lipschitz_check", f"lacks {', '.join(f'{s:g}' for s in missing)}: "
                                             "with lipschitz_in_run the whole-split check runs "
                                             "at every level; allowed: every sparsity, or "
                                             "remove the key (its default then)")
        out["lipschitz_check"] = tuple(sorted(sparsities))
    return out


def _check_levels(ck: Checker, raw: Any, sparsities: tuple[float, ...] | None,
                  sampled: bool) -> tuple[float, ...]:
    """``lipschitz_check``: distinct sparsity levels of the study (needs a sample to check)."""
    path = "probes.lipschitz_check"
    levels = sparsities or ()
    allowed = ", ".join(f"{s:g}" for s in levels)
    if not isinstance(raw, list) or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) for s in raw):
        ck.add(path, f"found {raw!r}; allowed: a list of the study's sparsities ({allowed})")
        return ()
    bad = [s for s in raw if float(s) not in levels]
    if bad and sparsities is not None:
        ck.add(path, f"found {bad[0]!r}; allowed: the study's sparsities ({allowed})")
        return ()
    if raw and not sampled:
        ck.add(path, "L is measured on the whole split already (no lipschitz_examples); "
                     "allowed: [] or set probes.lipschitz_examples")
        return ()
    return tuple(sorted({float(s) for s in raw}))


def lipschitz_canonical(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The lipschitz fields of a Probes' ``asdict`` for the canonical JSON: only those set."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in fields.items()
            if k in LIPSCHITZ_DEFAULTS and v != LIPSCHITZ_DEFAULTS[k]}


@dataclass(frozen=True)
class Probes:
    """The ``[probes]`` table: noise and smoothness along the best trial's run, for every
    sparsity level and seed at the batch sizes ``batch_sizes`` chooses
    (``theory.probe_batch_sizes`` rules or batch sizes), at ``points`` evenly spaced steps of
    [0, H] (``theory.probe_trajectory``). ``examples`` / ``curvature_examples``: sample sizes of
    the noise and the Hessian quantities (None: the full training split; the noise estimates
    are unbiased for the split either way); Lee's L uses the full split. ``lipschitz_*``: L at
    Lee et al.'s own stage, every ``lipschitz_every`` steps up to each run's end
    (module docstring)."""

    enabled: bool = True
    batch_sizes: tuple[str | int, ...] = ("smallest", "b_crit", "largest")
    points: int = 10
    average: int = 3
    examples: int | None = None
    curvature_examples: int | None = None
    hessian_examples: int = 16
    lanczos: int = 20
    lipschitz_every: int | None = None
    lipschitz_start: int | None = None
    lipschitz_examples: int | None = None
    lipschitz_trials: int = 1
    lipschitz_check: tuple[float, ...] = ()
    lipschitz_in_run: bool = False
    lipschitz_until: int | None = None

    def pairs_per_seed(self, trials: int | None) -> int | None:
        """The runs a seed gives at Lee's stage (each paired across levels): the probed
        ``lipschitz_trials``, or inside the run every one of the ``trials``; None without
        the stage."""
        if not self.lipschitz_every:
            return None
        return trials if self.lipschitz_in_run else self.lipschitz_trials

    def canonical(self) -> dict[str, Any]:
        """JSON-able form (the spec hash): the lipschitz keys only when set, so the hashes of
        studies without them stay those of earlier versions."""
        plain = {k: v for k, v in asdict(self).items() if k not in LIPSCHITZ_DEFAULTS}
        return (plain | {"batch_sizes": list(self.batch_sizes)}
                | lipschitz_canonical(asdict(self)))


def probes_table(ck: Checker, raw: Mapping[str, Any], sparsities: tuple[float, ...] | None,
                 trials: int | None, stop: str | None, seeds: int,
                 batch_sizes: tuple[int, ...] | None) -> Probes:
    """The ``[probes]`` table (its batch sizes among the study's ``batch_sizes``)."""
    pb = ck.table(raw, "probes", "probes") or {}
    ck.keys(pb, "probes", tuple(f.name for f in fields(Probes)))
    enabled = pb.get("enabled", True)
    if not isinstance(enabled, bool):
        ck.add("probes.enabled", f"found {enabled!r}; allowed: true or false")
    pb_bs = pb.get("batch_sizes", list(Probes.batch_sizes))
    if not isinstance(pb_bs, list) or not pb_bs or not all(
            b in BATCH_RULES or (is_int(b) and b >= 1) for b in pb_bs):
        ck.add("probes.batch_sizes", f"found {pb_bs!r}; allowed: a non-empty list of "
                                     f"{', '.join(map(repr, BATCH_RULES))} or batch sizes")
        pb_bs = list(Probes.batch_sizes)
    for b in pb_bs:
        if is_int(b) and batch_sizes is not None and b not in batch_sizes:
            ck.add("probes.batch_sizes", f"found {b}; allowed: one of the study's batch sizes "
                                         f"({', '.join(map(str, batch_sizes))})")
    sizes = {"examples": None, "curvature_examples": None}
    for key in sizes:
        if key in pb:
            sizes[key] = ck.integer(pb[key], f"probes.{key}", 2)
    return Probes(enabled=enabled, batch_sizes=tuple(pb_bs),
                  points=ck.integer(pb.get("points", Probes.points), "probes.points", 1),
                  average=ck.integer(pb.get("average", Probes.average), "probes.average", 1),
                  hessian_examples=ck.integer(pb.get("hessian_examples", Probes.hessian_examples),
                                              "probes.hessian_examples", 0),
                  lanczos=ck.integer(pb.get("lanczos", Probes.lanczos), "probes.lanczos", 1),
                  **sizes, **lipschitz_keys(ck, pb, sparsities, trials, stop, seeds))
