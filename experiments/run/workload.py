"""A study's workload: its data set, its model and the masks of its sparsity levels.

The runner's workers, the driver (masks) and the probes all build the workload's pieces here, so
the network a group trains, the network its mask was scored on and the network the probes
measure are the same, bit for bit:

- the data set is loaded once per process (every group of a study shares it), and copied onto
  a GPU once per process (:meth:`Workload.load_dataset` with ``device``);
- the model is ``training.models.build(model, dataset, seed=seed, init=init,
  **model_options)`` (``[workload] init``: ``"torch"``, or ``"lee"``, Lee et al. 2021's
  initialization, :mod:`training.models.initialization`);
- a data set or model named by import path (``"module:factory"``) is imported by each process
  itself, from its path and the spec's folders, and checked against the spec's digest of its
  source (:mod:`experiments.spec.factories`): the factory is never shipped, only its name;
- the mask of (sparsity, seed) is ``pruning.prune`` of that model's initialization with the
  study's pruning criterion (Lee et al. 2021 prune at initialization and keep the mask fixed),
  transformed by the series' sanity check if it has one (``experiments.spec.series.series_mask``),
  with the ``[pruning]`` options (``examples``, ``prune_biases``;
  :mod:`experiments.spec.tables.pruning`); every level of a seed from one scoring
  (``pruning.prune_levels``); a criterion named by import path is imported, and checked
  against its digest, as a factory is (its digest under the kind ``"criterion"``);
- with ``[pruning] mask_per_trial``, trial i of the group with seed s has its own
  initialization, of seed :meth:`Workload.init_seed` = ``training.models.initialization.
  trial_init_seed(s, i)``, and its own mask pruned from it: :meth:`Workload.masks` stacks the
  trials' masks ``[N, *shape]`` and :meth:`Workload.init_params` their initial weights, which
  ``training.train_trials`` takes as ``masks`` and ``init_params``; the probes and the
  branching measurement take the row of the trial they follow (:meth:`Workload.trial_mask`).

A :class:`Workload` is plain picklable data: it is shipped to worker processes with each group.

The stored-trial helpers the probes and the branching measurement share live here too: a group's
best trials from the store (:func:`best_trial`, :func:`best_trials`), a stored row's
:class:`training.Trial` (:func:`stored_trial`) and the workload on the study's device
(:func:`on_device`).
"""

from __future__ import annotations

import collections
import functools
import json
import os
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd
import torch

import pruning
import training
from training.config import ADAM_KEYS
from training.models.initialization import trial_init_seed

from experiments.spec import factories
from experiments.spec.tables.pruning import PruningOptions
from experiments.spec.series import record_masks, series_label, series_masks
from experiments.spec.study import Spec, canonical_json
from experiments.store.database import Store

Mask = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Workload:
    """Names (registered, or import paths) and options of a study's data set and model, its
    pruning criterion and the sanity check of its pruning series (None: the criterion's own
    masks); for factories by import path, their source digests by kind and the folders to
    search after ``sys.path``."""

    dataset: str
    model: str
    dataset_options: dict[str, Any] = field(default_factory=dict)
    model_options: dict[str, Any] = field(default_factory=dict)
    pruning_criterion: str = "snip"
    pruning_sanity: str | None = None
    digests: dict[str, str] = field(default_factory=dict)
    folders: tuple[str, ...] = ()
    init: str = "torch"
    pruning_options: PruningOptions = PruningOptions()
    trials: int = 1   # with mask_per_trial, trials per group: the rows of the per-trial masks

    @classmethod
    def of(cls, spec: Spec) -> "Workload":
        """The workload of a validated spec."""
        criterion = spec.criterion_digests.get(spec.pruning_criterion)
        digests = {**spec.digests, **({"criterion": criterion} if criterion else {})}
        return cls(spec.dataset, spec.model, dict(spec.dataset_options), dict(spec.model_options),
                   spec.pruning_criterion, spec.pruning_sanity, digests, spec.folders,
                   spec.init, spec.pruning_options,
                   spec.trials if spec.pruning_options.mask_per_trial else 1)

    @property
    def mask_per_trial(self) -> bool:
        """Whether every trial has its own initialization and mask."""
        return self.pruning_options.mask_per_trial

    def init_seed(self, seed: int, trial: int) -> int:
        """The initialization seed of trial ``trial`` of the groups with seed ``seed``:
        ``training.models.initialization.trial_init_seed(seed, trial)`` with ``mask_per_trial``, else
        ``seed`` (every trial of a group starts from the seed's initialization)."""
        return trial_init_seed(seed, trial) if self.mask_per_trial else int(seed)

    def load_dataset(self, device: str = "cpu") -> training.Dataset:
        """The data set (cached per process; a factory's by its digest too), on ``device``: a
        GPU's copy is made once per process and kept, so that no group copies it again (the
        trainers' ``Dataset.to`` of a data set already there returns it as it is)."""
        factory = ({"digest": self.digests.get("dataset"), "folders": list(self.folders)}
                   if factories.is_path(self.dataset) else {})
        key = canonical_json({"dataset": self.dataset, "options": self.dataset_options, **factory})
        return _dataset_cached(key) if device == "cpu" else _dataset_on(key, device)

    def build_model(self, dataset: training.Dataset, seed: int) -> torch.nn.Module:
        """The model initialized with ``seed`` by the workload's ``init``."""
        if factories.is_path(self.model):
            return factories.build_model(self.model, dataset, seed, self.model_options,
                                         self.folders, self.digests.get("model"), self.init)
        return training.models.build(self.model, dataset, seed=seed, init=self.init,
                                     **self.model_options)

    def init_params(self, dataset: training.Dataset, seed: int, n: int
                    ) -> dict[str, torch.Tensor] | None:
        """With ``mask_per_trial``: the initial weights of trials 0 .. n-1 of the groups with
        seed ``seed``, name -> ``[n, *shape]`` (``training.train_trials(init_params=...)``);
        otherwise None (every trial starts from ``build_model(dataset, seed)``)."""
        if not self.mask_per_trial:
            return None
        models = [self.build_model(dataset, self.init_seed(seed, i)) for i in range(n)]
        return {name: torch.stack([dict(m.named_parameters())[name].detach() for m in models])
                for name, _ in models[0].named_parameters()}

    def pruned(self, dataset: training.Dataset, sparsity: float, seed: int
               ) -> pruning.Mask | None:
        """The ``pruning.Mask`` of ``sparsity`` for the initialization
        ``build_model(dataset, seed)`` (None when dense): the pruning criterion's with the
        ``[pruning]`` options, transformed by the series' sanity check
        (``experiments.spec.series.series_mask``)."""
        return self.pruned_levels(dataset, [sparsity], seed)[0]

    def pruned_levels(self, dataset: training.Dataset, sparsities: list[float], seed: int
                      ) -> list[pruning.Mask | None]:
        """:meth:`pruned` of every level of ``sparsities`` (None for 0), from one scoring."""
        sparse = [s for s in sparsities if s > 0]
        if sparse and factories.is_path(self.pruning_criterion):   # from the spec's folders
            factories.resolve("criterion", self.pruning_criterion, self.folders,
                              self.digests.get("criterion"))
        made = dict(zip(sparse, series_masks(
            self.pruning_criterion, self.pruning_sanity, sparse, seed, dataset,
            functools.partial(self.build_model, dataset),
            **self.pruning_options.prune_kwargs()))) if sparse else {}
        return [made.get(s) for s in sparsities]

    def mask(self, dataset: training.Dataset, sparsity: float, seed: int) -> Mask | None:
        """The entries of :meth:`pruned` as plain tensors (None when dense)."""
        return _plain(self.pruned(dataset, sparsity, seed))

    def masks(self, dataset: training.Dataset, keys: Iterable[tuple[float, int]],
              record: str | os.PathLike | None = None, executor: Executor | None = None
              ) -> dict[tuple[float, int], Mask | None]:
        """One mask per distinct (sparsity, seed) of ``keys``, every level of a seed from one
        scoring; with ``mask_per_trial`` the masks of the seed's ``trials`` trials stacked,
        ``[trials, *shape]`` (trial i's pruned from its own initialization, seed
        :meth:`init_seed`; :meth:`trial_masks`). ``record``: a run folder to write the masks'
        recipes and diagnoses into (``masks.json``, ``experiments.spec.series.record_masks``;
        with ``mask_per_trial``, trial 0's mask of each (sparsity, seed)). ``executor``: where
        the per-trial masks are computed, one (seed, trial) a task."""
        keys = sorted(set(keys))
        if self.mask_per_trial:
            return self.trial_masks(dataset, keys, record, executor)
        made: dict[tuple[float, int], pruning.Mask | None] = {}
        for seed in sorted({seed for _, seed in keys}):
            levels = [s for s, k in keys if k == seed]
            made.update({(s, seed): m for s, m in zip(levels, self.pruned_levels(dataset,
                                                                                  levels, seed))})
        sparse = {key: m for key, m in made.items() if m is not None}
        if record is not None and sparse:
            record_masks(record, series_label(self.pruning_criterion, self.pruning_sanity), sparse,
                         functools.partial(self.build_model, dataset))
        return {key: _plain(m) for key, m in made.items()}

    def trial_masks(self, dataset: training.Dataset, keys: list[tuple[float, int]],
                    record: str | os.PathLike | None = None, executor: Executor | None = None
                    ) -> dict[tuple[float, int], Mask | None]:
        """:meth:`masks` with ``mask_per_trial``: name -> ``[trials, *shape]`` per (sparsity,
        seed), trial i's row the mask of the initialization of seed ``init_seed(seed, i)``,
        every level of a (seed, trial) from one scoring (in ``executor``'s workers when given:
        each loads the workload's data set itself). Kept for this process
        (``_TRIAL_MASKS``): the probes and the branching measurement after the training find
        the masks the groups trained under without scoring every trial again."""
        memo = {key: _memo_key(self, key) for key in keys if key[0] > 0}
        todo = sorted({key[1] for key, m in memo.items() if m not in _TRIAL_MASKS})
        jobs = [(seed, trial, sorted(s for s, k in memo if k == seed))
                for seed in todo for trial in range(self.trials)]
        args = [(self, levels, self.init_seed(seed, trial)) for seed, trial, levels in jobs]
        if executor is None:
            results = [self.pruned_levels(dataset, levels, init) for _, levels, init in args]
        else:
            results = list(executor.map(_trial_levels, *zip(*args))) if args else []
        made: dict[tuple[float, int], list[pruning.Mask]] = {}
        for (seed, trial, levels), masks in zip(jobs, results):
            for s, m in zip(levels, masks):
                m.info.update(mask_per_trial=True, trial=trial,
                              init_seed=self.init_seed(seed, trial))
                made.setdefault((s, seed), []).append(m)
        for key, ms in made.items():
            _TRIAL_MASKS[memo[key]] = (pruning.Mask.stack(ms), ms[0])
            while len(_TRIAL_MASKS) > TRIAL_MASKS_KEPT:
                _TRIAL_MASKS.popitem(last=False)
        if record is not None and memo:
            build = functools.partial(self.build_model, dataset)
            record_masks(record, series_label(self.pruning_criterion, self.pruning_sanity),
                         {key: _TRIAL_MASKS[m][1] for key, m in memo.items()},
                         lambda seed: build(self.init_seed(seed, 0)))
        return {key: _TRIAL_MASKS[memo[key]][0] if key in memo else None for key in keys}

    def trial_mask(self, mask: Mask | None, trial: int) -> Mask | None:
        """Trial ``trial``'s mask of a group's ``mask`` (one of :meth:`masks`): its row with
        ``mask_per_trial`` (a mask ``[N, *shape]``), else ``mask`` itself."""
        if mask is None or not self.mask_per_trial:
            return mask
        return {k: v[trial] for k, v in mask.items()}


# -- the stored trials a probe or a branching measurement follows -----------------------------

def base_group(groups: pd.DataFrame, sparsity: float, seed: int, batch_size: str | int) -> pd.Series | None:
    """The group the base run comes from: at ``batch_size`` (or the smallest that reached the
    goal, ``"smallest"``), among the done synchronous (delay 0) groups of (sparsity, seed) that
    reached it; None if there is none."""
    g = groups[(groups.sparsity == sparsity) & (groups.seed == seed) & (groups.status == "done")
               & groups.steps_to_result.notna() & (groups.delay == 0)]   # synchronous runs
    g = g if batch_size == "smallest" else g[g.batch_size == batch_size]
    return None if g.empty else g.sort_values("batch_size").iloc[0]


def best_trial(store: Store, key: str) -> pd.Series:
    """The stored row of group ``key``'s best (goal-reaching) trial."""
    return best_trials(store, key, 1)[0]


def best_trials(store: Store, key: str, k: int, unreached: bool = False) -> list[pd.Series]:
    """The stored rows of group ``key``'s best trial and then its other reached trials, fewest
    steps first (ties: lower index); with ``unreached`` then the trials that ended without
    meeting the goal (lowest index first; diverged trials never): at most ``k`` in all."""
    groups, trials = store.frame("groups"), store.frame("trials")
    g = groups[groups.key == key].iloc[0]
    t = trials[trials.group_key == key]
    reached = t[t.status == "reached"].sort_values(["hit_step", "trial"], kind="stable")
    if not pd.isna(g.best_trial):
        best = reached.trial == int(g.best_trial)
        reached = pd.concat([reached[best], reached[~best]])
    rows = [r for _, r in reached.iterrows()]
    if unreached:
        rows += [r for _, r in t[t.status == "not_reached"].sort_values("trial").iterrows()]
    return rows[:k]


def stored_trial(row: pd.Series) -> training.Trial:
    """The :class:`training.Trial` of a stored trial row; the Adam keys (beta1, beta2, eps,
    weight_decay) where the row holds them (an adam / adamw study's trials)."""
    decay = None if pd.isna(row.decay_steps) else int(row.decay_steps)
    adam = {k: float(row[k]) for k in ADAM_KEYS if not pd.isna(row[k])}
    return training.Trial(lr=float(row.lr), momentum=float(row.momentum), decay_steps=decay,
                          end_factor=float(row.end_factor), **adam)


def on_device(workload: Workload, device: str, dataset: training.Dataset | None, seed: int
              ) -> tuple[training.Dataset, torch.nn.Module]:
    """The data set on ``device`` (a worker's copy is made once per process; the driver's
    ``dataset`` is copied) and the model of ``seed``, built on the CPU from the same seed as
    everywhere, then moved there: the probes and the branching measurement run on the study's
    device."""
    cpu = workload.load_dataset() if dataset is None else dataset
    model = workload.build_model(cpu, seed)
    if device == "cpu":
        return cpu, model
    return (workload.load_dataset(device) if dataset is None else cpu.to(device),
            model.to(device))


# the per-trial masks this process made (Workload.trial_masks): stacked, and trial 0's
# pruning.Mask (with its recipe, for masks.json); the oldest dropped first
TRIAL_MASKS_KEPT = 64
_TRIAL_MASKS: collections.OrderedDict[str, tuple[Mask, pruning.Mask]] = collections.OrderedDict()


def _memo_key(workload: Workload, key: tuple[float, int]) -> str:
    """What identifies a (sparsity, seed)'s per-trial masks: the whole workload and the key."""
    return canonical_json([asdict(workload), float(key[0]), int(key[1])])


def _trial_levels(workload: Workload, levels: list[float], init: int
                  ) -> list[pruning.Mask | None]:
    """One trial's masks at every level of ``levels`` (a worker's task: the workload's own data
    set, loaded once per process)."""
    return workload.pruned_levels(workload.load_dataset(), levels, init)


def _plain(mask: pruning.Mask | None) -> Mask | None:
    """A mask's entries as plain tensors (what is shipped to the workers); None stays None."""
    return None if mask is None else {k: v.detach().clone() for k, v in mask.items()}


@functools.lru_cache(maxsize=2)
def _dataset_on(key: str, device: str) -> training.Dataset:
    return _dataset_cached(key).to(training.device.resolve_device(device))


@functools.lru_cache(maxsize=4)
def _dataset_cached(key: str) -> training.Dataset:
    d = json.loads(key)
    if factories.is_path(d["dataset"]):
        return factories.load_dataset(d["dataset"], d["options"], d["folders"], d["digest"])
    return training.data.load(d["dataset"], **d["options"])
