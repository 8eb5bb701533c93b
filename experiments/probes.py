"""Theory probes of a study: gradient noise and smoothness per sparsity level.

For every sparsity level (first seed of the study), on a seeded subsample of ``probes.examples``
training examples:

- at initialization (phase ``init``, step 0): |G|^2, tr(Sigma), B_simple, B_noise (McCandlish et
  al. 2018, ``theory.gradient_noise``), the top Hessian eigenvalue (Lanczos on Hessian-vector
  products, ``theory.hessian_top_eigenvalues``) and the loss;
- along the best trial's trajectory at the reference batch size (phase ``trajectory``): the best
  trial of that group is replayed with the plain reference trainer (``training.train_reference``,
  same data order, same mask) to ``probes.points`` geometrically spaced steps t up to its
  steps-to-result; at each, the same quantities at w_t plus Lee et al. (2021)'s local Lipschitz
  constant of the step w_{t-1} -> w_t (``theory.local_lipschitz``).

Rows go to the store's ``probes`` table, one transaction per sparsity level; a rerun skips levels
already probed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

import theory
import training
from training.masks import apply_mask

from .executors import torch_threads
from .schema import ProbeRow
from .spec import Spec
from .store import Store
from .workload import Workload

# Hessian-weighted noise (B_noise) costs one Hessian-vector product per sampled example: cap it.
HESSIAN_EXAMPLES = 16
# Lanczos tolerance: two significant digits are plenty for a smoothness comparison across levels.
LANCZOS_TOL = 1e-3
# Torch threads while probing. The probes' operations are small (512 examples, ~15k parameters):
# a second intra-op thread barely helps on an idle machine, and on a loaded 2-core machine it
# multiplied the probes' CPU time by 8 (spinning workers; 63 s instead of 7 s for the quickstart).
PROBE_THREADS = 1


def probe_network(model: torch.nn.Module, dataset: training.Dataset,
                  mask: Mapping[str, torch.Tensor] | None = None, examples: int = 512,
                  seed: int = 0) -> dict[str, float]:
    """Noise and smoothness of ``model`` at its current weights on ``examples`` training examples:
    ``g_sq``, ``trace_sigma``, ``b_simple``, ``b_noise``, ``hessian_top``, ``loss``."""
    examples = min(int(examples), dataset.n_train)
    noise = theory.gradient_noise(model, dataset, mask=mask, examples=examples, seed=seed,
                                  hessian_examples=min(HESSIAN_EXAMPLES, examples))
    top = theory.hessian_top_eigenvalues(model, dataset, k=1, mask=mask, examples=examples,
                                         seed=seed, tol=LANCZOS_TOL)
    return {"g_sq": noise.g_sq, "trace_sigma": noise.trace_sigma, "b_simple": noise.b_simple,
            "b_noise": noise.b_noise, "hessian_top": float(top[0]), "loss": noise.loss}


def snapshot_steps(horizon: int, points: int) -> list[int]:
    """``points`` distinct steps in [1, horizon], geometrically spaced (fewer if horizon is small)."""
    if horizon < 1:
        return []
    return sorted({int(s) for s in np.round(np.geomspace(1, horizon, points))})


def reference_batch_size(spec: Spec) -> int:
    """The probes' reference batch size: ``probes.batch_size`` or the middle of the sweep."""
    if spec.probes.batch_size is not None:
        return spec.probes.batch_size
    return spec.batch_sizes[len(spec.batch_sizes) // 2]


def _best_trial(store: Store, sparsity: float, batch_size: int, seed: int):
    """(trial row, horizon) of the group's best trial: the goal-hitting one, else the
    non-diverged trial with the lowest final metric; None if the group is missing."""
    groups = store.frame("groups")
    g = groups[(groups.sparsity == sparsity) & (groups.batch_size == batch_size)
                & (groups.seed == seed) & (groups.status == "done")]
    if g.empty:
        return None
    g = g.iloc[0]
    trials = store.frame("trials")
    t = trials[trials.group_key == g.key]
    if not pd.isna(g.best_trial):
        row = t[t.trial == int(g.best_trial)].iloc[0]
        return row, int(g.steps_to_result)
    ok = t[t.status != "diverged"].dropna(subset=["final_metric"])
    if ok.empty:
        return None
    return ok.sort_values(["final_metric", "trial"]).iloc[0], int(g.max_steps)


def _rows(values: dict[str, float], sparsity: float, phase: str, step: int,
          batch_size: int | None) -> list[ProbeRow]:
    return [ProbeRow(sparsity, phase, step, batch_size, q, float(v)) for q, v in values.items()]


def probe_level(spec: Spec, dataset: training.Dataset, store: Store, sparsity: float,
                mask: Mapping[str, torch.Tensor] | None) -> list[ProbeRow]:
    """All probe rows of one sparsity level (see the module docstring)."""
    seed = spec.seeds[0]
    model = Workload.of(spec).build_model(dataset, seed)
    apply_mask(model, mask)
    n = spec.probes.examples
    rows = _rows(probe_network(model, dataset, mask, n, seed), sparsity, "init", 0, None)

    b_ref = reference_batch_size(spec)
    best = _best_trial(store, sparsity, b_ref, seed)
    if best is None:
        return rows
    trial, horizon = best
    decay = None if pd.isna(trial.decay_steps) else int(trial.decay_steps)

    def state_at(steps: int) -> dict[str, torch.Tensor]:
        res = training.train_reference(
            model, dataset,
            training.Trial(lr=float(trial.lr), momentum=float(trial.momentum), decay_steps=decay,
                           end_factor=float(trial.end_factor)),
            training.RunConfig(b_ref, spec.optimizer, max_steps=steps, stop="never", seed=seed,
                               eval_schedule=training.EvalSchedule(every=max(steps, 1))),
            mask=mask, trial_index=int(trial.trial))
        return res.state

    for t in snapshot_steps(horizon, spec.probes.points):
        w_prev, w_next = state_at(t - 1), state_at(t)
        net = copy.deepcopy(model)
        net.load_state_dict(w_next, strict=False)
        values = probe_network(net, dataset, mask, n, seed)
        if any(not torch.equal(w_prev[k], w_next[k]) for k in w_next):
            values["local_lipschitz"] = theory.local_lipschitz(
                net, dataset, w_prev, w_next, mask=mask, examples=min(n, dataset.n_train),
                seed=seed).value
        rows += _rows(values, sparsity, "trajectory", t, b_ref)
    return rows


def run_probes(spec: Spec, dataset: training.Dataset, store: Store, quiet: bool = False) -> None:
    """Probe every sparsity level not yet in the store (one transaction per level), with
    ``PROBE_THREADS`` torch threads."""
    todo = [s for s in spec.sparsities if s not in store.probed_sparsities()]
    if not todo:
        return
    # outside the thread change: the same masks, bit for bit, as the runner gave the groups
    masks = Workload.of(spec).masks(dataset, ((s, spec.seeds[0]) for s in todo))

    with torch_threads(PROBE_THREADS):
        for sparsity in tqdm(todo, disable=quiet, desc="probes", unit="level"):
            rows = probe_level(spec, dataset, store, sparsity, masks[(sparsity, spec.seeds[0])])
            store.write_probes(sparsity, rows)
