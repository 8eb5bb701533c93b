"""The registry of pruning criteria: every criterion :func:`pruning.prune` accepts, the built-in ones
and a researcher's own, by one decorator.

A criterion is a score function and its rules (:class:`Criterion`)::

    @pruning.register("grad_norm", needs=("dataset",), per_class=10)
    def grad_norm(model, params, context):
        x, y = context.batch(model)                 # 10 training examples per class
        loss = torch.nn.functional.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, list(params.values()))
        return {k: g.abs() for k, g in zip(params, grads)}   # larger = kept first

``score(model, params, context)`` gets the working copy of the model (the caller's is never
touched; in a later round of the schedule its pruned weights are zero), its prunable parameters
by name and the :class:`Context` of the call; it returns one keep-priority per weight, shaped
like its parameter. The rules say what the criterion needs (``needs``), which scopes it allows
(``scopes``), its rounds by default, and how the working copy is made.

A criterion is named by its registered name, or by the import path of its score function,
``"package.module:function"`` (as a study's ``[pruning] criterion`` names one in a module beside
the spec): the module is imported, which registers the criteria it defines; a plain function
there is a criterion with the default rules.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from training.data import Dataset
from training.registry import Registry, import_path

from pruning.errors import PruningError
from pruning.select import SCOPES

Params = Mapping[str, nn.Parameter]
Scores = Mapping[str, torch.Tensor]
TrainFn = Callable[[nn.Module, Any], nn.Module]   # (model, pruning.Mask) -> trained model
# what a context value must be for a criterion that needs it, as its error names it
# Examples per class of a scoring batch when neither the call nor the criterion says (SNIP's).
DEFAULT_PER_CLASS = 10
# Scoring on the whole training split (``examples="all"``): gradients summed over chunks of this
# many examples, Lee et al. (2021)'s (edps/prune.py: batch_size = 100)
SNIP_CHUNK = 100
EXAMPLES = ("all",)
NEEDS = {"dataset": "dataset=training.Dataset",
         "input_shape": "input_shape=(...) or dataset=training.Dataset",
         "train_fn": "train_fn=f(model, mask) -> trained model"}


@dataclass(frozen=True)
class Context:
    """What one call of :func:`pruning.prune` gives a criterion's score function: the data set
    (or None), the seed, the examples per class of its scoring batch (``per_class``, the call's
    or the criterion's), GraSP's ``temperature``, one example's ``input_shape``, IMP's
    ``train_fn``, ``examples`` (``"all"``: score on the whole training split, in chunks of
    :attr:`chunk` examples; None: the scoring batch), and, per round, the ``current`` 0/1 mask;
    for a criterion that ``revives`` pruned weights, the weights before the first round
    (``initial``)."""

    dataset: Dataset | None = None
    seed: int = 0
    per_class: int | None = None
    temperature: float = 200.0
    input_shape: tuple[int, ...] | None = None
    train_fn: TrainFn | None = None
    examples: str | None = None
    current: Mapping[str, torch.Tensor] = field(default_factory=dict)
    initial: Mapping[str, torch.Tensor] = field(default_factory=dict)

    @property
    def chunk(self) -> int | None:
        """Examples per chunk whose gradients are summed (whole split), or None (one batch)."""
        return SNIP_CHUNK if self.examples == "all" else None

    def batch(self, like: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples a criterion scores on: the whole training split with ``examples="all"``,
        else the scoring batch (:func:`pruning_batch`) of ``per_class`` examples per class; on
        the device and in the dtype of ``like``'s parameters when given."""
        if self.examples == "all":
            x, y = self.dataset.x_train, self.dataset.y_train
        else:
            x, y = pruning_batch(self.dataset, self.per_class or DEFAULT_PER_CLASS)
        if like is None:
            return x, y
        p = next(like.parameters())
        return x.to(device=p.device, dtype=p.dtype), y.to(p.device)


def pruning_batch(dataset: Dataset, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic batch data-driven criteria score on: for classification, the first
    ``per_class`` examples of every class in ``dataset.x_train`` order (fewer if a class has
    fewer), classes in increasing order; for regression, the first ``per_class * 10`` examples."""
    if per_class < 1:
        raise PruningError(f"examples per class must be >= 1, got {per_class}")
    if dataset.task == "classification":
        idx = torch.cat([torch.nonzero(dataset.y_train == c).flatten()[:per_class]
                         for c in range(dataset.num_classes)])
    else:
        idx = torch.arange(min(per_class * 10, dataset.n_train))
    if idx.numel() == 0:
        raise PruningError(f"data set {dataset.name!r} has no training examples to score on")
    return dataset.x_train[idx], dataset.y_train[idx]


Score = Callable[[nn.Module, Params, Context], Scores]


@dataclass(frozen=True)
class Criterion:
    """A pruning criterion: its ``name``, its ``score`` function (see the module docstring) and
    its rules: ``needs``, context values it cannot score without (``"dataset"``,
    ``"input_shape"``; ``"a|b"``: either); ``scopes``, the scopes it allows
    (``pruning.select.SCOPES``); ``rounds``, its rounds with the exponential schedule by
    default; ``per_class``, the examples per class of its scoring batch (None: it scores on no
    batch; else a mask's ``info`` records it); ``records``, other context values a mask's
    ``info`` records;
    ``work``, how the working copy is made from the caller's model; ``revives``: every round
    ranks every weight again, pruned ones included, from the original weights
    (``iterative.prune_in_rounds``); ``whole_split``: it can score on the whole training split
    (``examples="all"``: its batch is then the split, its gradients summed over
    :attr:`Context.chunk`-example chunks); ``summary``, one line for ``sparsescale list``."""

    name: str
    score: Score
    needs: tuple[str, ...] = ()
    scopes: tuple[str, ...] = SCOPES
    rounds: int = 1
    per_class: int | None = None
    records: tuple[str, ...] = ()
    work: Callable[[nn.Module], nn.Module] = copy.deepcopy
    revives: bool = False
    whole_split: bool = False
    summary: str = ""

    def missing(self, context: Context) -> str | None:
        """The first of :attr:`needs` that ``context`` lacks, as the argument to give."""
        for need in self.needs:
            if all(getattr(context, name) is None for name in need.split("|")):
                return NEEDS.get(need.split("|")[0], need)
        return None


CRITERIA: Registry[Criterion] = Registry("pruning criterion", PruningError,
                                        hint='"package.module:function"')


def register(name: str, *, needs: tuple[str, ...] = (), scopes: tuple[str, ...] = SCOPES,
             rounds: int = 1, per_class: int | None = None, records: tuple[str, ...] = (),
             work: Callable[[nn.Module], nn.Module] = copy.deepcopy, revives: bool = False,
             whole_split: bool = False, summary: str = "") -> Callable[[Score], Score]:
    """Decorator: register the score function as criterion ``name`` with these rules
    (:class:`Criterion`); the function is returned as it is. A name already taken by another
    function raises :class:`pruning.PruningError` (the same function again, from the same file
    and name, as a module imported twice or a script also imported by name defines it,
    replaces its entry; :class:`training.registry.Registry`)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise PruningError(f"a criterion's name must be a Python identifier, got {name!r}")
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise PruningError(f"criterion {name!r}: scopes {list(scopes)!r}; allowed: a non-empty "
                           f"subset of {', '.join(SCOPES)}")
    unknown = [n for need in needs for n in need.split("|") if n not in Context.__dataclass_fields__]
    if unknown:
        raise PruningError(f"criterion {name!r}: needs {unknown[0]!r}; allowed: "
                           f"{', '.join(NEEDS)} (or any field of pruning.Context)")

    def add(score: Score) -> Score:
        CRITERIA.add(name, Criterion(name, score, tuple(needs), tuple(scopes), rounds, per_class,
                                     tuple(records), work, revives, whole_split, summary),
                     defined_by=score)
        return score

    return add


def list_criteria() -> list[str]:
    """Names accepted by :func:`pruning.prune`: the built-in criteria, then those registered
    since, in order of registration."""
    return CRITERIA.names()


def whole_split() -> list[str]:
    """The registered criteria that can score on the whole training split (``examples="all"``)."""
    return [name for name, c in CRITERIA.items() if c.whole_split]


def is_path(name: str) -> bool:
    """Whether ``name`` is an import path (``"module:function"``) rather than a name."""
    return ":" in name


def criterion(name: str | Criterion) -> Criterion:
    """The criterion ``name`` names: a registered name, or the import path of a score function
    (its module imported from ``sys.path``; the criterion then bears the path as its name); a
    :class:`Criterion` as it is. An unknown name or
    a path that does not import raises :class:`pruning.PruningError`."""
    if isinstance(name, Criterion):
        return name
    if not isinstance(name, str):
        raise PruningError(f"criterion must be a criterion's name or import path, got "
                           f"{type(name).__name__} {name!r}")
    if not is_path(name):
        return CRITERIA.get(name)
    score = _imported(name)
    found = next((c for _, c in CRITERIA.items() if c.score is score), None)
    # named as the caller named it: a mask records the path it can be imported back from
    return Criterion(name, score) if found is None else replace(found, name=name)


def _imported(path: str) -> Score:
    """The callable at ``path`` (``module:attribute``, the attribute may be dotted)."""
    obj = import_path(path, "pruning criterion", PruningError)
    if not callable(obj):
        raise PruningError(f"pruning criterion {path!r} is {type(obj).__name__}, not a score "
                           f"function")
    return obj

