"""``prune(model, criterion, sparsity, ...) -> Mask``: a registered criterion applied.

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

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from training.data import Dataset
from training.errors import renamed_keyword
from training.models import check_model, check_output

from pruning import criteria, registry
from pruning.diagnostics import FX_LOCK, check
from pruning.errors import PruningError
from pruning.iterative import ScoreFn, prune_in_rounds
from pruning.mask import PRUNABLE_MODULES, Mask, prunable_parameters
from pruning.registry import EXAMPLES, Context, Criterion, TrainFn, whole_split
from pruning.select import check_scope, check_sparsity

KEEP = ("highest", "lowest")


@renamed_keyword("method", "criterion")
def prune(model: nn.Module, criterion: str | Criterion, sparsity: float,
          dataset: Dataset | None = None,
          scope: str = "global", rounds: int | None = None, seed: int = 0,
          prune_biases: bool = False, *, per_class: int | None = None,
          temperature: float = criteria.GRASP_TEMPERATURE,
          input_shape: tuple[int, ...] | None = None,
          train_fn: TrainFn | None = None, keep: str = "highest",
          examples: str | None = None) -> Mask:
    """Mask keeping exactly round(N * (1 - sparsity)) of ``model``'s N prunable weights.

    - ``criterion``: one of :func:`list_criteria` (see ``criteria`` for the formulas), a
      criterion registered with :func:`pruning.register`, or the import path of a score
      function, ``"package.module:function"`` (:mod:`pruning.registry`). ``method=``, its
      name before 2026-12, is a deprecated alias.
    - ``dataset``: a ``training.Dataset``; required by snip, grasp, imp, iterative_snip and
      force. SNIP (and iterative SNIP, FORCE) score on the first 10 training examples of every
      class, GraSP on 25 per class (``per_class`` overrides both), see
      ``criteria.pruning_batch``. ``temperature``: GraSP's logit temperature (200).
    - ``examples``: ``"all"``: a criterion that can (snip, iterative_snip and force;
      ``Criterion.whole_split``) scores on the whole training split instead, its gradients
      summed over chunks of 100 examples, as Lee et al. (2021)'s code runs SNIP
      (``criteria.summed_gradients``); None (default): the batch above.
    - ``scope``: ``"global"`` (one ranking across layers), ``"layer"`` (every layer at the same
      sparsity, within one weight) or ``"even"`` (every layer keeps the same number of weights,
      ``select.even_quotas``), among those the criterion allows. With ``criterion="random"`` these
      are the three random baselines: uniform over all weights, uniform per-layer density, and
      an even split of the kept count.
    - ``rounds``: pruning rounds with the exponential schedule (default 100 for synflow, 10 for
      force, 5 for imp and iterative_snip, 1 otherwise). iterative_snip with one round is SNIP.
    - ``keep``: ``"highest"`` (the criterion's own choice) or ``"lowest"`` (inverted scores:
      keep what the criterion would prune first, every round).
    - ``seed``: random scores (random) and IMP's default training data order.
    - ``prune_biases``: also prune Linear / Conv biases (default: weights only); N then counts
      them, and with ``scope="global"`` every weight ranks before every bias of an equal score,
      as ``tf.nn.top_k`` ranks Lee et al.'s vector of all weights, then all biases
      (``edps/model.py``; with their initialization every bias scores 0).
    - ``input_shape``: SynFlow's input shape without batch (default ``dataset.input_shape``).
    - ``train_fn(model, mask) -> trained model``: IMP's training run per round (default
      :func:`iterative.default_train_fn`); it receives the initial weights with the mask applied.

    The returned mask's ``info`` records the criterion and options (and ``input_shape`` when
    known, which ``pruning.report`` uses to count FLOPs). Bad arguments raise
    :class:`pruning.PruningError`; a ``dataset`` that is not a ``training.Dataset`` raises
    ``training.DataError`` naming ``Dataset.from_torch`` / ``from_tensors``, and a ``model`` that
    is not an ``nn.Module``, or does not fit ``dataset`` (checked on one example,
    ``training.models.check_output``), ``training.ModelError``, before anything is scored.
    """
    options = dict(scope=scope, rounds=rounds, seed=seed, prune_biases=prune_biases,
                   per_class=per_class, temperature=temperature, input_shape=input_shape,
                   train_fn=train_fn, keep=keep, examples=examples)
    with FX_LOCK:   # its forward passes never meet another thread's trace
        return _prune(model, criterion, [sparsity], dataset, options)[0]


@renamed_keyword("method", "criterion")
def prune_levels(model: nn.Module, criterion: str | Criterion, sparsities: Sequence[float],
                 dataset: Dataset | None = None, **options: Any) -> list[Mask]:
    """``[prune(model, criterion, s, dataset, **options) for s in sparsities]``, the same masks,
    with a one-round criterion's scores computed once for every level (SNIP on the whole split
    costs one pass over it, whatever the number of levels)."""
    with FX_LOCK:   # its forward passes never meet another thread's trace
        return _prune(model, criterion, list(sparsities), dataset, options)


_DEFAULTS: dict[str, Any] = dict(scope="global", rounds=None, seed=0, prune_biases=False,
                                 per_class=None, temperature=criteria.GRASP_TEMPERATURE,
                                 input_shape=None, train_fn=None, keep="highest", examples=None)


def _prune(model: nn.Module, criterion: str | Criterion, sparsities: list[float],
           dataset: Dataset | None, options: dict[str, Any]) -> list[Mask]:
    """The masks of :func:`prune` at every level of ``sparsities``."""
    unknown = sorted(set(options) - set(_DEFAULTS))
    if unknown:
        raise PruningError(f"unknown pruning option {unknown[0]!r}; allowed: "
                           f"{', '.join(_DEFAULTS)}")
    o = {**_DEFAULTS, **options}
    spec = registry.criterion(criterion)
    if o["keep"] not in KEEP:
        raise PruningError(f"keep must be one of {', '.join(KEEP)}, got {o['keep']!r}")
    check_examples(o["examples"], spec)
    if o["examples"] == "all" and o["per_class"] is not None:
        raise PruningError("per_class and examples='all' exclude each other; allowed: one of "
                           "them")
    sparsities = [check_sparsity(s) for s in sparsities]
    scope = check_scope(o["scope"])
    if scope not in spec.scopes:
        raise PruningError(f"pruning criterion {spec.name!r} allows scope "
                           f"{', '.join(spec.scopes)}; got {scope!r}")
    if dataset is None:
        check_model(model, "prune")
    else:
        check_output(model, dataset, "prune")
    input_shape = o["input_shape"]
    if input_shape is None and dataset is not None:
        input_shape = tuple(dataset.input_shape)
    context = Context(dataset, int(o["seed"]), o["per_class"] or spec.per_class,
                      float(o["temperature"]), input_shape, o["train_fn"], o["examples"])
    missing = spec.missing(context)
    if missing is not None:
        raise PruningError(f"pruning criterion {spec.name!r} needs {missing}")
    rounds = spec.rounds if o["rounds"] is None else o["rounds"]
    if spec.revives:   # every level's working copy starts from these weights
        start = prunable_parameters(spec.work(model), o["prune_biases"])
        context = replace(context, initial={k: p.detach().clone() for k, p in start.items()})

    def score_fn(work: nn.Module, params, current) -> dict[str, torch.Tensor]:
        return dict(spec.score(work, params, replace(context, current=current)))

    scores = score_fn if o["keep"] == "highest" else _inverted(score_fn)
    if rounds == 1 and len(sparsities) > 1:
        scores = _once(scores)
    info: dict[str, Any] = {"criterion": spec.name, "scope": scope, "rounds": rounds,
                            "seed": int(o["seed"]), "prune_biases": o["prune_biases"],
                            "keep": o["keep"]}
    if input_shape is not None:
        info["input_shape"] = list(input_shape)
    if spec.per_class is not None and o["examples"] == "all":
        info.update(examples="all", chunk=context.chunk)
    elif spec.per_class is not None:
        info["per_class"] = context.per_class
    for name in spec.records:
        info[name] = getattr(context, name)
    if dataset is not None:
        info["data"] = dataset.name
    masks = []
    for sparsity in sparsities:
        work = spec.work(model)
        params = prunable_parameters(work, o["prune_biases"])
        named = list(params)
        if o["prune_biases"] and scope == "global":
            params = weights_first(work, params)
        entries = prune_in_rounds(work, params, scores, sparsity, rounds, scope,
                                  revive=spec.revives)
        mask = Mask({k: entries[k] for k in named}, {**info, "sparsity": sparsity})
        check(model, mask, stacklevel=4)   # prune's (or prune_levels') caller, past renamed_keyword
        masks.append(mask)
    return masks


def check_examples(examples: object, spec: Criterion) -> None:
    """``examples`` is None or ``"all"``, the latter only for a criterion that can score on the
    whole split (``Criterion.whole_split``); else one :class:`PruningError` line."""
    if examples is None:
        return
    if examples not in EXAMPLES:
        raise PruningError(f"examples must be 'all' (the whole training split) or None (the "
                           f"criterion's own batch), got {examples!r}")
    if not spec.whole_split:
        scores = "its own batch" if spec.per_class is not None else "no data"
        raise PruningError(f"examples='all' applies to {', '.join(whole_split())}; criterion "
                           f"{spec.name!r} scores {scores}")


def weights_first(model: nn.Module, params: dict[str, nn.Parameter]) -> dict[str, nn.Parameter]:
    """``params`` with every weight before every bias (each in its own order): the order ties
    are broken in (``select``: the first entry wins), which is Lee et al.'s (``edps/model.py``:
    the saliency vector holds all weights, then all biases, and ``tf.nn.top_k`` prefers the
    lower index)."""
    biases = {id(m.bias) for m in model.modules()
              if isinstance(m, PRUNABLE_MODULES) and m.bias is not None}
    return {**{k: p for k, p in params.items() if id(p) not in biases},
            **{k: p for k, p in params.items() if id(p) in biases}}


def _once(score_fn: ScoreFn) -> ScoreFn:
    """``score_fn`` computed on its first call and returned again after (one-round criteria on
    several levels: every level starts from the same network)."""
    memo: list[Mapping[str, torch.Tensor]] = []

    def once(work, params, cur):
        if not memo:
            memo.append({k: v.detach().clone() for k, v in score_fn(work, params, cur).items()})
        return memo[0]
    return once


def _inverted(score_fn: ScoreFn) -> ScoreFn:
    """Negated keep-priorities: the lowest-ranked weights are kept."""
    def inverted(work, params, cur):
        return {k: -v.detach().to(torch.float64) for k, v in score_fn(work, params, cur).items()}
    return inverted
