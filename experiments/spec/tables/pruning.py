"""The ``[pruning]`` table: its keys and their parser.

``criterion`` names the pruning criterion of every sparse level: a name from the pruning registry
(``pruning.list_criteria()``: the built-in criteria and those a ``pruning.register`` made), or
the import path of a score function, ``"package.module:function"``, in a module of the user's
(found as a ``[workload]`` factory is: on ``sys.path``, else in the spec's folder; see
:mod:`experiments.spec.factories`). Such a module's file is digested, and its digest enters the
spec hash (``pruning.method_digest`` in the canonical JSON), so editing the criterion makes a new
study. A list of criteria, and ``sanity`` checks, make one series each
(:mod:`experiments.spec.series`).

``method``, the key's name before 2026-12, is still read, with a ``DeprecationWarning`` naming
``criterion``; a table giving both is refused. The canonical JSON, hence every spec hash and
group key, keeps the old names (``pruning.method``, ``pruning.method_digest``: :data:`HASHED`),
so a study keeps its hash whichever name its TOML uses.

How a mask is made: Lee et al. (2021)'s protocol as keys (:class:`PruningOptions`)::

    [pruning]
    criterion = "snip"
    examples = "all"          # SNIP on the whole training split, in chunks of 100
    prune_biases = true       # biases are scored and pruned too
    mask_per_trial = true     # every trial its own initialization and its own mask
    bias_controls = ["no_bias", "dense_biases"]   # the controls of "biases removed"

SNIP with biases prunes every bias at every sparse level under Lee's initialization (biases
start at zero, so their saliency |g w| is zero): the dense network has biases and every sparse
one has none. ``bias_controls`` separates "weights pruned" from "biases removed" with extra
series, each a sub-study of its own (:func:`experiments.spec.series.control_variants`):
``no_bias``, the dense network built without biases (``model_options = {bias = false}``: the
model must take that option, as ``lee_cnn`` does); ``dense_biases``, every sparse level with
``prune_biases = false``. It needs ``prune_biases = true`` and the dense level, and one
optimizer and one pruning series.

Lee et al.'s released code (``namhoonlee/effect-dps-public``): ``edps/prune.py`` sums SNIP's
saliency over the whole training split in batches of 100; ``edps/model.py`` scores (and masks)
every weight and bias in one global top-k; ``edps/main.py`` re-initializes every run with its
own seed and prunes it again. The defaults keep what this library did before (the criterion's
own batch, 10 examples per class for SNIP; weights only; one initialization and one mask per
(sparsity, seed), shared by a group's trials), and a spec that leaves the keys out keeps its
hash and group keys (:meth:`PruningOptions.canonical` is empty then).

``mask_per_trial``: trial i of the group with seed s starts from the initialization of seed
``training.models.initialization.trial_init_seed(s, i)`` and trains under the mask pruned from it
(the same at every batch size, as trial i's metaparameters are); the dense level too starts
each trial from its own initialization. How the runner does it: :mod:`experiments.run.workload`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from training.errors import deprecated

import pruning
from pruning.registry import EXAMPLES

from experiments.spec.checks import Checker, did_you_mean
from experiments.spec.factories import is_path, path_key
from experiments.spec.series import SANITY

# the keys that say how a mask is made (PruningOptions)
OPTION_KEYS = ("examples", "prune_biases", "mask_per_trial", "bias_controls")
# the bias controls of Lee's stage (issue 47): the dense network without biases, and each
# sparse level with its biases kept dense (experiments.spec.series.control_variants)
BIAS_CONTROLS = ("no_bias", "dense_biases")
KEYS = ("criterion", "sanity", *OPTION_KEYS)
# the key's deprecated name: read as "criterion", and the name the canonical JSON (every stored
# spec and hash) gives it and its digest
DEPRECATED, HASHED = "method", {"criterion": "method", "criterion_digest": "method_digest"}


def pruning_table(ck: Checker, raw: Mapping[str, Any], sparsities: tuple[float, ...] | None,
                  folders: tuple[str, ...] = (), digests: Mapping[str, str] | None = None
                  ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """The ``[pruning]`` table: (criteria, sanity checks, the digest of each criterion named by
    import path). ``criterion`` is checked only when a sparsity level is > 0; a criterion by
    import path is imported (``sys.path``, then ``folders``) and its module digested, or, for a
    stored spec (``digests`` given, path -> digest), taken as recorded."""
    table = ck.table(raw, "pruning", "pruning") or {}
    ck.keys({k: v for k, v in table.items() if k != DEPRECATED}, "pruning", KEYS)
    sparse = bool(sparsities) and any(s > 0 for s in sparsities)
    named = _named(ck, table)
    found: dict[str, str] = {}
    criteria = _criteria(ck, named, folders, digests, found) if sparse else None
    sanity = _sanity(ck, table.get("sanity", []))
    if sparsities and not sparse and (isinstance(named, list) or table.get("sanity")):
        ck.add("pruning", "a list of criteria or sanity checks needs a sparsity level > 0; "
                          "allowed: add one to sparsities")
    fallback = (named,) if isinstance(named, str) else ("snip",)
    return criteria or fallback, sanity or (), found


def _named(ck: Checker, table: Mapping[str, Any]) -> Any:
    """What ``pruning.criterion`` (or its deprecated name ``pruning.method``) holds: "snip"
    when neither is given."""
    if DEPRECATED not in table:
        return table.get("criterion", "snip")
    if "criterion" in table:
        ck.add("pruning", f"found both criterion and its deprecated name {DEPRECATED}; "
                          f"allowed: criterion only")
        return table["criterion"]
    deprecated(f"pruning.{DEPRECATED}", "pruning.criterion", "the study spec", stacklevel=2)
    return table[DEPRECATED]


def stored_pruning(canonical: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The ``[pruning]`` table a stored spec's canonical ``pruning`` stands for (its keys under
    their own names again, without ``sanity`` and the digest), and the digest of a criterion
    named by import path (None: a registered name)."""
    back = {hashed: key for key, hashed in HASHED.items()}
    table = {back.get(k, k): v for k, v in canonical.items()
             if k not in ("sanity", HASHED["criterion_digest"])}
    return table, canonical.get(HASHED["criterion_digest"])


def _allowed() -> str:
    return f"{', '.join(pruning.list_criteria())}, or a criterion \"package.module:function\""


def _criteria(ck: Checker, raw: Any, folders: tuple[str, ...],
              digests: Mapping[str, str] | None, found: dict[str, str]) -> tuple[str, ...] | None:
    """The distinct criteria of ``pruning.criterion`` (a name, or a non-empty list), in the
    order given, or None after recording the problem."""
    values = raw if isinstance(raw, list) else [raw]
    if isinstance(raw, list) and not raw:
        ck.add("pruning.criterion", f"found []; allowed: a name or a non-empty list of "
                                    f"{_allowed()}")
        return None
    return _distinct(ck, "pruning.criterion", raw, tuple(
        _criterion(ck, v, "pruning.criterion" if not isinstance(raw, list)
                   else f"pruning.criterion[{i}]", folders, digests, found)
        for i, v in enumerate(values)))


def _criterion(ck: Checker, value: Any, path: str, folders: tuple[str, ...],
               digests: Mapping[str, str] | None, found: dict[str, str]) -> str | None:
    """One criterion: a registered name, or a criterion's import path whose digest goes into
    ``found``."""
    if not isinstance(value, str) or not is_path(value):
        if isinstance(value, str) and value in pruning.list_criteria():
            return value
        near = did_you_mean(str(value), pruning.list_criteria())
        ck.add(path, f"found {value!r}{near}; allowed: {_allowed()}")
        return None
    # the object at the path must be a score function
    return path_key(ck, value, path, "criterion", folders, digests, found,
                    accept=lambda _: pruning.registry.criterion(value),
                    errors=(pruning.PruningError,), digest_key="pruning.method_digest")


def _sanity(ck: Checker, raw: Any) -> tuple[str, ...] | None:
    """The distinct sanity checks of ``pruning.sanity`` (a list of SANITY), or None."""
    if not isinstance(raw, list):
        ck.add("pruning.sanity", f"found {raw!r}; allowed: a list of {', '.join(SANITY)}")
        return None
    return _distinct(ck, "pruning.sanity", raw,
                     tuple(ck.choice(v, f"pruning.sanity[{i}]", SANITY) for i, v in enumerate(raw)))


def _distinct(ck: Checker, path: str, raw: Any, names: tuple[str | None, ...]
              ) -> tuple[str, ...] | None:
    """``names`` when each was valid and none repeats, else None (a repeat recorded)."""
    if None in names:
        return None
    if len(set(names)) != len(names):
        ck.add(path, f"found duplicates in {raw}; allowed: distinct values")
        return None
    return names


@dataclass(frozen=True)
class PruningOptions:
    """How a study's masks are made (module docstring): ``examples`` (None: the criterion's own
    batch; ``"all"``: the whole training split), ``prune_biases``, ``mask_per_trial``."""

    examples: str | None = None
    prune_biases: bool = False
    mask_per_trial: bool = False
    bias_controls: tuple[str, ...] = ()

    def canonical(self) -> dict[str, Any]:
        """The keys that differ from their defaults (none: older hashes stay valid)."""
        out: dict[str, Any] = {}
        if self.examples is not None:
            out["examples"] = self.examples
        if self.prune_biases:
            out["prune_biases"] = True
        if self.mask_per_trial:
            out["mask_per_trial"] = True
        if self.bias_controls:
            out["bias_controls"] = list(self.bias_controls)
        return out

    def prune_kwargs(self) -> dict[str, Any]:
        """The arguments of ``pruning.prune`` these options set."""
        return {"examples": self.examples, "prune_biases": self.prune_biases}


def pruning_options(ck: Checker, raw: Mapping[str, Any],
                    criteria: tuple[str, ...]) -> PruningOptions:
    """The options of the ``[pruning]`` table (its keys are checked by :func:`pruning_table`);
    ``examples = "all"`` needs every listed criterion to be one that can score on the whole
    training split (``pruning.Criterion.whole_split``)."""
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
            wrong = [c for c in criteria if not _whole_split(c)]
            if wrong:
                ck.add("pruning.examples", f"'all' does not apply to criterion {wrong[0]!r}; "
                                           f"allowed with: {', '.join(pruning.whole_split())}")
    flags = {}
    for key in ("prune_biases", "mask_per_trial"):
        value = table.get(key, False)
        if not isinstance(value, bool):
            ck.add(f"pruning.{key}", f"found {value!r}; allowed: true or false")
            value = False
        flags[key] = value
    controls = table.get("bias_controls", [])
    if not isinstance(controls, list):
        ck.add("pruning.bias_controls", f"found {controls!r}; allowed: a list of "
                                        f"{', '.join(BIAS_CONTROLS)}")
        controls = []
    controls = _distinct(ck, "pruning.bias_controls", controls, tuple(
        ck.choice(v, f"pruning.bias_controls[{i}]", BIAS_CONTROLS) for i, v in enumerate(controls)))
    if controls and not flags["prune_biases"]:
        ck.add("pruning.bias_controls", "needs prune_biases = true (without it every level keeps "
                                        "its biases); allowed: set it, or remove bias_controls")
    if controls and (len(criteria) > 1 or table.get("sanity")):
        ck.add("pruning.bias_controls", "needs one criterion and no sanity checks; allowed: one "
                                        "pruning series")
    return PruningOptions(examples, **flags, bias_controls=controls or ())


def _whole_split(name: str) -> bool:
    """Whether ``name`` (checked already) is a criterion that can score on the whole split."""
    try:
        return pruning.registry.criterion(name).whole_split
    except pruning.PruningError:   # reported by pruning.criterion
        return True
