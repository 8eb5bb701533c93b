"""``prune(model, method, sparsity, ...) -> Mask``: the registry of pruning methods.

Every method ranks the prunable weights (``mask.prunable_parameters``) by a keep-priority and
keeps exactly round(N * (1 - sparsity)) of them (``select.top_k_mask``), in one round or in
several with the exponential schedule (``iterative.prune_in_rounds``). ``keep="lowest"`` inverts
any criterion (keeps what it ranks lowest: Frankle et al. 2021's sanity check). The caller's
model is never modified: scores are computed on a copy. Every mask is checked for layer collapse
(``diagnostics.check``: a ``LayerCollapseWarning`` when a layer is >= 99 % pruned or no input
reaches an output).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.data import Dataset
from training.models import check_model, check_output

from pruning import criteria
from pruning.diagnostics import check
from pruning.errors import PruningError
from pruning.iterative import ScoreFn, TrainFn, default_train_fn, imp_score_fn, prune_in_rounds
from pruning.mask import PRUNABLE_MODULES, Mask, prunable_parameters
from pruning.select import check_scope, check_sparsity


@dataclass(frozen=True)
class Method:
    """A pruning method: whether it needs a dataset, its default number of rounds, a summary."""

    name: str
    needs_data: bool
    default_rounds: int
    summary: str


METHODS = {m.name: m for m in (
    Method("random", False, 1, "uniformly random weights kept (seeded)"),
    Method("magnitude", False, 1, "largest |w| kept (Han et al. 2015)"),
    Method("snip", True, 1, "largest |dL/dw * w| on 10 examples per class kept (Lee et al. 2019)"),
    Method("grasp", True, 1, "smallest -w * (H g) on 25 examples per class, logits / 200, kept "
                             "(Wang et al. 2020)"),
    Method("synflow", False, 100, "largest |w * dR/dw|, R = sum f(1) on |w|, 100 rounds with the "
                                  "exponential schedule (Tanaka et al. 2020)"),
    Method("imp", True, 5, "iterative magnitude pruning with rewinding to init, trained between "
                           "rounds (Frankle & Carbin 2019)"),
    Method("iterative_snip", True, 5, "SNIP re-scored on the remaining weights every round, 5 "
                                      "rounds with the exponential schedule (Verdenius et al. "
                                      "2020)"),
    Method("force", True, 10, "largest |w0 * dL/dw| at the pruned network, pruned weights can "
                              "return, 10 rounds with the exponential schedule (de Jorge et al. "
                              "2021)"),
)}

KEEP = ("highest", "lowest")
# methods whose rounds rank every weight again, pruned ones included (iterative.prune_in_rounds)
REVIVING = ("force",)


def list_methods() -> list[str]:
    """Names accepted by :func:`prune`."""
    return list(METHODS)


@dataclass(frozen=True)
class _Context:
    dataset: Dataset | None
    seed: int
    per_class: int | None
    temperature: float
    input_shape: tuple[int, ...] | None
    train_fn: TrainFn | None
    examples: str | None = None


def _batch(ctx: _Context, work: nn.Module, default_per_class: int):
    """The examples a data-driven criterion scores on: the whole training split with
    ``examples="all"``, else ``criteria.pruning_batch``."""
    if ctx.examples == "all":
        x, y = ctx.dataset.x_train, ctx.dataset.y_train
    else:
        x, y = criteria.pruning_batch(ctx.dataset, ctx.per_class or default_per_class)
    p = next(work.parameters())
    return x.to(device=p.device, dtype=p.dtype), y.to(p.device)


def _chunk(ctx: _Context) -> int | None:
    """Lee et al. (2021)'s chunks of 100 on the whole split (``criteria.SNIP_CHUNK``), else one
    batch."""
    return criteria.SNIP_CHUNK if ctx.examples == "all" else None


def _scorer(name: str, ctx: _Context) -> tuple[Callable[[nn.Module], nn.Module], ScoreFn]:
    """(how to make the working copy, keep-priority score function) for method ``name``."""
    if name == "random":
        return copy.deepcopy, lambda work, params, cur: criteria.random_scores(params, ctx.seed)
    if name == "magnitude":
        return copy.deepcopy, lambda work, params, cur: criteria.magnitude_scores(params)
    if name in ("snip", "iterative_snip"):
        def snip(work, params, cur):
            x, y = _batch(ctx, work, criteria.SNIP_PER_CLASS)
            return criteria.snip_scores(work, params, x, y, ctx.dataset.task, ctx.dataset.loss,
                                        _chunk(ctx))
        return copy.deepcopy, snip
    if name == "force":
        original: dict[str, nn.Parameter] = {}

        def copy_and_remember(model: nn.Module) -> nn.Module:
            work = copy.deepcopy(model)
            original.update({k: p.detach().clone() for k, p in work.named_parameters()})
            return work

        def force(work, params, cur):
            x, y = _batch(ctx, work, criteria.SNIP_PER_CLASS)
            return criteria.force_scores(work, params, x, y, original, ctx.dataset.task,
                                         ctx.dataset.loss, _chunk(ctx))
        return copy_and_remember, force
    if name == "grasp":
        def grasp(work, params, cur):
            x, y = _batch(ctx, work, criteria.GRASP_PER_CLASS)
            scores = criteria.grasp_scores(work, params, x, y, ctx.dataset.task, ctx.temperature,
                                           ctx.dataset.loss)
            return {k: -v for k, v in scores.items()}  # GraSP removes the largest scores
        return copy.deepcopy, grasp
    if name == "synflow":
        return criteria.linearized_copy, lambda work, params, cur: criteria.synflow_scores(
            work, params, ctx.input_shape)
    if name == "imp":
        return copy.deepcopy, imp_score_fn(ctx.train_fn or default_train_fn(ctx.dataset, ctx.seed))
    raise AssertionError(name)  # unreachable: names are checked against METHODS first


def prune(model: nn.Module, method: str, sparsity: float, dataset: Dataset | None = None,
          scope: str = "global", rounds: int | None = None, seed: int = 0,
          prune_biases: bool = False, *, per_class: int | None = None,
          temperature: float = criteria.GRASP_TEMPERATURE,
          input_shape: tuple[int, ...] | None = None,
          train_fn: TrainFn | None = None, keep: str = "highest",
          examples: str | None = None) -> Mask:
    """Mask keeping exactly round(N * (1 - sparsity)) of ``model``'s N prunable weights.

    - ``method``: one of :func:`list_methods` (see ``criteria`` for the formulas).
    - ``dataset``: a ``training.Dataset``; required by snip, grasp, imp, iterative_snip and
      force. SNIP (and iterative SNIP, FORCE) score on the first 10 training examples of every
      class, GraSP on 25 per class (``per_class`` overrides both), see
      ``criteria.pruning_batch``. ``temperature``: GraSP's logit temperature (200).
    - ``examples``: ``"all"``: snip, iterative_snip and force score on the whole training
      split instead, their gradients summed over chunks of 100 examples, as Lee et al.
      (2021)'s code runs SNIP (``criteria.summed_gradients``); None (default): the batch above.
    - ``scope``: ``"global"`` (one ranking across layers), ``"layer"`` (every layer at the same
      sparsity, within one weight) or ``"even"`` (every layer keeps the same number of weights,
      ``select.even_quotas``). With ``method="random"`` these are the three random baselines:
      uniform over all weights, uniform per-layer density, and an even split of the kept count.
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

    The returned mask's ``info`` records the method and options (and ``input_shape`` when
    known, which ``pruning.report`` uses to count FLOPs). Bad arguments raise
    :class:`pruning.PruningError`; a ``dataset`` that is not a ``training.Dataset`` raises
    ``training.DataError`` naming ``Dataset.from_torch`` / ``from_tensors``, and a ``model`` that
    is not an ``nn.Module``, or does not fit ``dataset`` (checked on one example,
    ``training.models.check_output``), ``training.ModelError``, before anything is scored.
    """
    options = dict(scope=scope, rounds=rounds, seed=seed, prune_biases=prune_biases,
                   per_class=per_class, temperature=temperature, input_shape=input_shape,
                   train_fn=train_fn, keep=keep, examples=examples)
    return _prune(model, method, [sparsity], dataset, options)[0]


def prune_levels(model: nn.Module, method: str, sparsities: Sequence[float],
                 dataset: Dataset | None = None, **options: Any) -> list[Mask]:
    """``[prune(model, method, s, dataset, **options) for s in sparsities]``, the same masks,
    with a one-round criterion's scores computed once for every level (SNIP on the whole split
    costs one pass over it, whatever the number of levels)."""
    return _prune(model, method, list(sparsities), dataset, options)


def _prune(model: nn.Module, method: str, sparsities: list[float], dataset: Dataset | None,
           options: dict[str, Any]) -> list[Mask]:
    """The masks of :func:`prune` at every level of ``sparsities``."""
    o = {**_DEFAULTS, **options}
    unknown = sorted(set(options) - set(_DEFAULTS))
    if unknown:
        raise PruningError(f"unknown pruning option {unknown[0]!r}; allowed: "
                           f"{', '.join(_DEFAULTS)}")
    if method not in METHODS:
        raise PruningError(f"unknown pruning method {method!r}; allowed: {', '.join(METHODS)}")
    if o["keep"] not in KEEP:
        raise PruningError(f"keep must be one of {', '.join(KEEP)}, got {o['keep']!r}")
    check_examples(o["examples"], method)
    if o["examples"] == "all" and o["per_class"] is not None:
        raise PruningError("per_class and examples='all' exclude each other; allowed: one of "
                           "them")
    spec = METHODS[method]
    sparsities = [check_sparsity(s) for s in sparsities]
    scope = check_scope(o["scope"])
    if dataset is None:
        check_model(model, "prune")
    else:
        check_output(model, dataset, "prune")
    imp_without_data = method == "imp" and o["train_fn"] is not None
    if spec.needs_data and dataset is None and not imp_without_data:
        raise PruningError(f"pruning method {method!r} needs dataset=training.Dataset")
    input_shape = o["input_shape"]
    if input_shape is None and dataset is not None:
        input_shape = tuple(dataset.input_shape)
    if method == "synflow" and input_shape is None:
        raise PruningError("pruning method 'synflow' needs input_shape=(...) or "
                           "dataset=training.Dataset to build its all-ones input")
    rounds = spec.default_rounds if o["rounds"] is None else o["rounds"]
    ctx = _Context(dataset, int(o["seed"]), o["per_class"], float(o["temperature"]),
                   input_shape, o["train_fn"], o["examples"])
    make_work, score_fn = _scorer(method, ctx)
    if o["keep"] == "lowest":
        score_fn = _inverted(score_fn)
    if rounds == 1 and len(sparsities) > 1:
        score_fn = _once(score_fn)
    info: dict[str, Any] = {"method": method, "scope": scope, "rounds": rounds,
                            "seed": int(o["seed"]), "prune_biases": o["prune_biases"],
                            "keep": o["keep"]}
    if input_shape is not None:
        info["input_shape"] = list(input_shape)
    if method in ("snip", "grasp", "iterative_snip", "force"):
        if o["examples"] == "all":
            info.update(examples="all", chunk=criteria.SNIP_CHUNK)
        else:
            info["per_class"] = o["per_class"] or (criteria.GRASP_PER_CLASS if method == "grasp"
                                                   else criteria.SNIP_PER_CLASS)
    if method == "grasp":
        info["temperature"] = float(o["temperature"])
    if dataset is not None:
        info["data"] = dataset.name
    masks = []
    for sparsity in sparsities:
        work = make_work(model)
        params = prunable_parameters(work, o["prune_biases"])
        named = list(params)
        if o["prune_biases"] and scope == "global":
            params = weights_first(work, params)
        entries = prune_in_rounds(work, params, score_fn, sparsity, rounds, scope,
                                  revive=method in REVIVING)
        mask = Mask({k: entries[k] for k in named}, {**info, "sparsity": sparsity})
        check(model, mask, stacklevel=3)   # prune's (or prune_levels') caller
        masks.append(mask)
    return masks


_DEFAULTS: dict[str, Any] = dict(scope="global", rounds=None, seed=0, prune_biases=False,
                                 per_class=None, temperature=criteria.GRASP_TEMPERATURE,
                                 input_shape=None, train_fn=None, keep="highest", examples=None)
# the criteria that can score on the whole training split (``examples="all"``)
WHOLE_SPLIT = ("snip", "iterative_snip", "force")
EXAMPLES = ("all",)


def check_examples(examples: object, method: str) -> None:
    """``examples`` is None or ``"all"``, the latter only for :data:`WHOLE_SPLIT`; else one
    :class:`PruningError` line."""
    if examples is None:
        return
    if examples not in EXAMPLES:
        raise PruningError(f"examples must be 'all' (the whole training split) or None (the "
                           f"criterion's own batch), got {examples!r}")
    if method not in WHOLE_SPLIT:
        scores = "its own batch" if METHODS[method].needs_data else "no data"
        raise PruningError(f"examples='all' applies to {', '.join(WHOLE_SPLIT)}; method "
                           f"{method!r} scores {scores}")


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
