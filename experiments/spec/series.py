"""Pruning series of a study: each criterion of ``[pruning] criterion`` and its sanity checks.

``criterion = ["snip", "grasp"]`` with ``sanity = ["shuffle", "reinit"]`` gives the series snip,
snip-shuffle, snip-reinit, grasp, grasp-shuffle, grasp-reinit. Each series runs as a sub-study of
its own (``Spec.variants``, as several optimizers do): its store in ``RUN_DIR/<series>``
(``RUN_DIR/<optimizer>/<series>`` with several optimizers), one report comparing them all in
``RUN_DIR``. Only the first series (per optimizer) trains the dense level: the dense network is
the same in every series, and the report measures every series against that one.

The sanity checks (Frankle et al. 2021; Su et al. 2020) transform the criterion's mask of every
(sparsity, seed):

- ``shuffle``: ``pruning.shuffle_layers(mask, seed)``, each layer's mask permuted;
- ``matched_random``: ``pruning.matched_random(mask, seed)``, a random mask with the same count
  per layer;
- ``invert``: ``pruning.prune(..., keep="lowest")``, the weights the criterion ranks lowest;
- ``reinit``: the criterion's mask computed on the initialization of seed ``seed +
  REINIT_SEED_OFFSET`` and trained from the initialization of ``seed`` (what
  ``pruning.reinitialize(model, seed, mask)`` gives): the mask of one init, the weights of another.

Beside each store the runner writes ``masks.json``: every mask's recipe (``Mask.info``) and its
layer-collapse diagnosis (``pruning.diagnose``: per-layer density, dead units, paths), which the
report draws as the per-layer density figure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

import pruning
import training

SANITY = ("shuffle", "reinit", "matched_random", "invert")
# Seed offset of the initialization a "reinit" mask is computed on.
REINIT_SEED_OFFSET = 1_000_003
MASKS_FILE = "masks.json"


def series_names(criteria: tuple[str, ...], sanity: tuple[str, ...]
                 ) -> list[tuple[str, str | None]]:
    """(criterion, sanity transform or None) of every series, criterion first then its checks."""
    return [(c, t) for c in criteria for t in (None, *sanity)]


def series_label(criterion: str, transform: str | None) -> str:
    """``snip``, ``snip-shuffle``, ...: the series' name and its sub-study folder."""
    return criterion if transform is None else f"{criterion}-{transform}"


def control_variants(spec: Any) -> list[Any]:
    """The specs of a study with ``[pruning] bias_controls`` (Lee et al.'s bias confound,
    issue 47): the study itself without the key (its store in ``RUN_DIR``), then one sub-study
    per control in ``RUN_DIR/<control>``: ``no_bias``, the dense level of the model built with
    ``bias = false``; ``dense_biases``, the sparse levels pruned with ``prune_biases = false``.
    Every one keeps the study's seeds, trials and tuning: trial i of each starts from the same
    weights (Lee's initialization draws no bias) and sees the same data order, so the controls'
    runs pair with the study's. A control carries no stopping rule (its levels are not the
    rule's)."""
    options = spec.pruning_options
    base = replace(options, bias_controls=())
    out = [replace(spec, pruning_options=base)]
    for control in options.bias_controls:
        if control == "no_bias":
            change = dict(model_options={**spec.model_options, "bias": False}, sparsities=(0.0,),
                          pruning_options=base)
        else:
            change = dict(sparsities=tuple(x for x in spec.sparsities if x > 0),
                          pruning_options=replace(base, prune_biases=False))
        # the whole-split check of L at the control's own levels only (its spec is checked
        # again when its store is read)
        probes = replace(spec.probes, lipschitz_check=tuple(
            s for s in spec.probes.lipschitz_check if s in change["sparsities"]))
        out.append(replace(spec, name=f"{spec.name}-{control}", series=control, subdir=control,
                           stopping=None, probes=probes, **change))
    return out


def series_mask(criterion: str, transform: str | None, sparsity: float, seed: int,
                dataset: training.Dataset, build: Callable[[int], nn.Module],
                **options: Any) -> pruning.Mask:
    """The mask of series (``criterion``, ``transform``) at (``sparsity``, ``seed``) for the model
    ``build(seed)`` trains (see the module docstring for each transform). ``options``: further
    arguments of ``pruning.prune`` (a study's ``[pruning]`` options: ``examples``,
    ``prune_biases``). An unknown transform raises ``pruning.PruningError``."""
    return series_masks(criterion, transform, [sparsity], seed, dataset, build, **options)[0]


def series_masks(criterion: str, transform: str | None, sparsities: list[float], seed: int,
                 dataset: training.Dataset, build: Callable[[int], nn.Module],
                 **options: Any) -> list[pruning.Mask]:
    """:func:`series_mask` at every level of ``sparsities``, the criterion scored once
    (``pruning.prune_levels``)."""
    if transform not in (None, *SANITY):
        raise pruning.PruningError(f"unknown sanity check {transform!r}; allowed: "
                                   f"{', '.join(SANITY)}")
    init_seed = seed + REINIT_SEED_OFFSET if transform == "reinit" else seed
    keep = "lowest" if transform == "invert" else "highest"
    masks = pruning.prune_levels(build(init_seed), criterion, sparsities, dataset=dataset,
                                 seed=seed, keep=keep, **options)
    return [_transformed(m, transform, seed, init_seed) for m in masks]


def _transformed(mask: pruning.Mask, transform: str | None, seed: int, init_seed: int
                 ) -> pruning.Mask:
    """The criterion's ``mask`` under the series' sanity check."""
    if transform == "shuffle":
        return pruning.shuffle_layers(mask, seed)
    if transform == "matched_random":
        return pruning.matched_random(mask, seed)
    if transform == "reinit":
        mask.info.update(transform="reinit", mask_init_seed=init_seed)
    return mask


def record_masks(run_dir: str | os.PathLike, label: str, masks: Mapping[tuple[float, int], Any],
                 build: Callable[[int], nn.Module]) -> Path:
    """Write (merge into) ``run_dir/masks.json``: per (sparsity, seed) the series ``label``,
    the mask's ``info`` and its diagnosis on the trained model ``build(seed)``."""
    path = Path(run_dir) / MASKS_FILE
    entries = {(e["sparsity"], e["seed"]): e for e in load_masks(run_dir)}
    for (sparsity, seed), mask in masks.items():
        if mask is None:
            continue
        entries[(float(sparsity), int(seed))] = {
            "series": label, "sparsity": float(sparsity), "seed": int(seed),
            "info": dict(getattr(mask, "info", {})),
            "diagnosis": pruning.diagnose(build(seed), mask).to_dict()}
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"masks": [entries[k] for k in sorted(entries)]}
    path.write_text(json.dumps(body, indent=1, sort_keys=True, default=str) + "\n")
    return path


def load_masks(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The entries of ``run_dir/masks.json`` (none if the file is absent or unreadable)."""
    try:
        return list(json.loads((Path(run_dir) / MASKS_FILE).read_text())["masks"])
    except (OSError, ValueError, KeyError, TypeError):
        return []

