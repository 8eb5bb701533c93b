"""``prune(model, method, sparsity, ...) -> Mask``: a registered criterion applied.

Every criterion (:mod:`pruning.registry`; the built-in ones in :mod:`pruning.criteria`) ranks
the prunable weights (``mask.prunable_parameters``) by a keep-priority, and ``prune`` keeps
exactly round(N * (1 - sparsity)) of them (``select.top_k_mask``), in one round or in several
with the exponential schedule (``iterative.prune_in_rounds``). ``keep="lowest"`` inverts any
criterion (keeps what it ranks lowest: Frankle et al. 2021's sanity check). The caller's model
is never modified: scores are computed on a copy. Every mask is checked for layer collapse
(``diagnostics.check``: a ``LayerCollapseWarning`` when a layer is >= 99 % pruned or no input
reaches an output).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from training.data import Dataset
from training.models import check_model, check_output

from pruning import criteria
from pruning.diagnostics import check
from pruning.errors import PruningError
from pruning.iterative import ScoreFn, prune_in_rounds
from pruning.mask import Mask, prunable_parameters
from pruning.registry import Context, Criterion, TrainFn, criterion
from pruning.select import check_scope, check_sparsity

KEEP = ("highest", "lowest")


def prune(model: nn.Module, method: str | Criterion, sparsity: float,
          dataset: Dataset | None = None,
          scope: str = "global", rounds: int | None = None, seed: int = 0,
          prune_biases: bool = False, *, per_class: int | None = None,
          temperature: float = criteria.GRASP_TEMPERATURE,
          input_shape: tuple[int, ...] | None = None,
          train_fn: TrainFn | None = None, keep: str = "highest") -> Mask:
    """Mask keeping exactly round(N * (1 - sparsity)) of ``model``'s N prunable weights.

    - ``method``: one of :func:`list_methods` (see ``criteria`` for the formulas), a criterion
      registered with :func:`pruning.register`, or the import path of a score function,
      ``"package.module:function"`` (:mod:`pruning.registry`).
    - ``dataset``: a ``training.Dataset``; required by snip, grasp, imp, iterative_snip and
      force. SNIP (and iterative SNIP, FORCE) score on the first 10 training examples of every
      class, GraSP on 25 per class (``per_class`` overrides both), see
      ``criteria.pruning_batch``. ``temperature``: GraSP's logit temperature (200).
    - ``scope``: ``"global"`` (one ranking across layers), ``"layer"`` (every layer at the same
      sparsity, within one weight) or ``"even"`` (every layer keeps the same number of weights,
      ``select.even_quotas``), among those the criterion allows. With ``method="random"`` these
      are the three random baselines: uniform over all weights, uniform per-layer density, and
      an even split of the kept count.
    - ``rounds``: pruning rounds with the exponential schedule (default 100 for synflow, 10 for
      force, 5 for imp and iterative_snip, 1 otherwise). iterative_snip with one round is SNIP.
    - ``keep``: ``"highest"`` (the criterion's own choice) or ``"lowest"`` (inverted scores:
      keep what the criterion would prune first, every round).
    - ``seed``: random scores (random) and IMP's default training data order.
    - ``prune_biases``: also prune Linear / Conv biases (default: weights only).
    - ``input_shape``: SynFlow's input shape without batch (default ``dataset.input_shape``).
    - ``train_fn(model, mask) -> trained model``: IMP's training run per round (default
      :func:`iterative.default_train_fn`); it receives the initial weights with the mask applied.

    The returned mask's ``info`` records the method and options (and ``input_shape`` when
    known, which ``pruning.report`` uses to count FLOPs). Bad arguments raise
    :class:`pruning.PruningError`; a ``dataset`` that is not a ``training.Dataset`` raises
    ``training.DataError`` naming ``Dataset.from_torch`` / ``from_tensors``, and a ``model`` that
    is not an ``nn.Module``, or does not fit ``dataset`` (checked on one example,
    ``training.models.check_output``), ``training.ModelError``, before anything is scored.
    """
    spec = criterion(method)
    if keep not in KEEP:
        raise PruningError(f"keep must be one of {', '.join(KEEP)}, got {keep!r}")
    sparsity = check_sparsity(sparsity)
    check_scope(scope)
    if scope not in spec.scopes:
        raise PruningError(f"pruning method {spec.name!r} allows scope "
                           f"{', '.join(spec.scopes)}; got {scope!r}")
    if dataset is None:
        check_model(model, "prune")
    else:
        check_output(model, dataset, "prune")
    if input_shape is None and dataset is not None:
        input_shape = tuple(dataset.input_shape)
    context = Context(dataset, int(seed), per_class or spec.per_class, float(temperature),
                      input_shape, train_fn)
    missing = spec.missing(context)
    if missing is not None:
        raise PruningError(f"pruning method {spec.name!r} needs {missing}")
    rounds = spec.rounds if rounds is None else rounds
    work = spec.work(model)
    params = prunable_parameters(work, prune_biases)
    if spec.revives:
        context = replace(context, initial={k: p.detach().clone() for k, p in params.items()})

    def score_fn(work: nn.Module, params, current) -> dict[str, torch.Tensor]:
        return dict(spec.score(work, params, replace(context, current=current)))

    entries = prune_in_rounds(work, params, score_fn if keep == "highest" else _inverted(score_fn),
                              sparsity, rounds, scope, revive=spec.revives)
    info: dict[str, Any] = {"method": spec.name, "sparsity": sparsity, "scope": scope,
                            "rounds": rounds, "seed": int(seed), "prune_biases": prune_biases,
                            "keep": keep}
    if input_shape is not None:
        info["input_shape"] = list(input_shape)
    for name in (("per_class",) if spec.per_class is not None else ()) + spec.records:
        info[name] = getattr(context, name)
    if dataset is not None:
        info["data"] = dataset.name
    mask = Mask(entries, info)
    check(model, mask, stacklevel=2)
    return mask


def _inverted(score_fn: ScoreFn) -> ScoreFn:
    """Negated keep-priorities: the lowest-ranked weights are kept."""
    def inverted(work, params, cur):
        return {k: -v.detach().to(torch.float64) for k, v in score_fn(work, params, cur).items()}
    return inverted
