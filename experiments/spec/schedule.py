"""The keys of a study spec that measure Lee et al. (2021)'s L at their stage, and the trial rules
that decide which trials a group counts.

In ``[probes]`` (all optional; without ``lipschitz_every`` nothing here is measured)::

    lipschitz_every = 1000        # N: L and the gradient noise at steps N, 2N, ... up to the goal
    lipschitz_examples = 8000     # L's gradients on a fixed sample, along [0, H] too (default: the split)
    lipschitz_trials = 3          # reached trials probed per probed group (fewest steps first)
    lipschitz_check = [0.0]       # levels whose first run also measures L on the whole split

Lee et al.'s released code (``namhoonlee/effect-dps-public``, ``edps/train.py``) measures L inside
each run at every multiple of ``lipschitz_interval`` (default 1,000, ``edps/main.py``) until the
goal ends the run, on the whole training split (``edps/check.py``, batches of 1,000). Here the
probed runs are replayed bit for bit (``theory.probe_trajectory``) and measured at the same
steps; ``lipschitz_examples`` is a stated reduction, and ``lipschitz_check`` measures its effect
against the whole split at the first point of one run per listed level.

At the top level::

    stop = "all"                  # "first" (default): a group stops at its first hit
    complete_trials = true        # count only trials that did not diverge toward ``trials``

``stop = "all"`` trains every trial to its own first hit (``training.RunConfig.stop``), so each
reached trial has its own steps-to-result to probe up to; ``"first"`` (Shallue et al. 2019's
steps-to-result of a study) stops the group when any trial meets the goal, so one trial reaches
it by construction. ``complete_trials``: Shallue et al. count "the first 100 complete trials"
at each batch size; a diverged trial is replaced by the next point of the search's Sobol
sequence until ``trials`` trials completed (:mod:`experiments.run.complete`).

``lipschitz_examples`` applies to every L of the study (along [0, H] too), so it may be set
alone; the other three need ``lipschitz_every``. Every key enters the spec's canonical JSON (hence its hash) only when it is set, so the hashes
of studies without them do not move.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiments.spec.checks import Checker

STOPS = ("first", "all")
# the Probes fields this module owns, with their defaults (omitted from the canonical JSON)
LIPSCHITZ_DEFAULTS: dict[str, Any] = {"lipschitz_every": None, "lipschitz_examples": None,
                                      "lipschitz_trials": 1, "lipschitz_check": ()}


def lipschitz_keys(ck: Checker, table: Mapping[str, Any], sparsities: tuple[float, ...] | None,
                   trials: int | None, stop: str | None, seeds: int) -> dict[str, Any]:
    """The ``[probes]`` lipschitz keys of ``table`` checked (module docstring), as Probes
    fields; their defaults where a value is bad (recorded in ``ck``)."""
    out = dict(LIPSCHITZ_DEFAULTS)
    every = table.get("lipschitz_every")
    if every is not None:
        out["lipschitz_every"] = ck.integer(every, "probes.lipschitz_every", 1)
    for key in ("lipschitz_trials", "lipschitz_check"):
        if key in table and every is None:
            ck.add(f"probes.{key}", "only used with probes.lipschitz_every; allowed: set "
                                    "lipschitz_every = N (steps between L's points) or remove it")
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


def trial_rules(ck: Checker, raw: Mapping[str, Any]) -> tuple[str, bool]:
    """The top-level ``stop`` and ``complete_trials`` (module docstring)."""
    stop = ck.choice(raw.get("stop", "first"), "stop", STOPS) or "first"
    complete = raw.get("complete_trials", False)
    if not isinstance(complete, bool):
        ck.add("complete_trials", f"found {complete!r}; allowed: true or false")
        complete = False
    return stop, complete


def trial_rules_canonical(stop: str, complete: bool) -> dict[str, Any]:
    """``stop`` and ``complete_trials`` for the canonical JSON and group keys: only when set."""
    return {**({"stop": stop} if stop != "first" else {}),
            **({"complete_trials": True} if complete else {})}
