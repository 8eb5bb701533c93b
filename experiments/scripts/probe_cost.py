"""The cost of L at Lee et al.'s stage as a fraction of the training it measures: by replay
(the probes' path without ``lipschitz_in_run``) and inside the run
(:mod:`experiments.measures.stage.inside`).

One run of level ``sparsity`` (one torch thread, the study's precision): a run folder's first
probed run, up to its end; or, given a config (a TOML path or bundled name), trial 0 of the
first seed's group at the smallest batch size, the spec's search point, trained ``steps`` steps
(default 2,000) from its own initialization and mask, without a goal. Measured, in seconds:

- training: the run as the study trains it (``training.train_trials``, its evaluations);
- before: the replay of the run (one more pass of training) and, on its states, today's
  schedule (every 1,000 steps from step 1,000: L and the noise on 2,000 examples);
- after: the run trained again with a :class:`training.Watch` at every 250 steps from 1,000
  measuring L on each sample size of ``SIZES``, each size's time summed apart; the watch's own
  overhead (stops, weight copies) is the rest of the extra time; and each smaller sample's L
against the largest's at the same updates (mean and SD of the log ratio over the points).

Fraction = cost / training. Why a point costs what it does: L takes 10 gradients (9 gammas
and w_{t-1}) on n examples, i.e. 10 n example-gradients, against 250 B example-steps of
training between two points; the per-example-gradient seconds of each are printed.

    python -m experiments.scripts.probe_cost RUN_DIR_OR_CONFIG [SPARSITY] [STEPS]
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

import theory
import training
from experiments.run.executors import torch_threads
from experiments.measures.stage.inside import LIPSCHITZ_SAMPLE_SEED, InsideL, InsidePlan
from experiments.measures.probes.tasks import STAGE_MEASURED, probe_tasks
from experiments.run.workload import Workload, on_device, stored_trial
from experiments.spec.plan import plan
from experiments.spec.study import load as load_spec
from experiments.store.database import open_store
from experiments.store.results import load_results
from theory.verdicts.trajectory import needed_steps

START, BEFORE_EVERY, BEFORE_EXAMPLES, AFTER_EVERY = 1000, 1000, 2000, 250
SIZES = (2000, 1000, 500, 250)


def _run(source: str, sparsity: float, steps: int):
    """(spec, workload, dataset, model, trial, trial index, mask, run config, horizon)."""
    if (Path(source) / "results.sqlite").exists():
        spec = load_results(source).spec
        workload, seed = Workload.of(spec), spec.seeds[0]
        dataset = workload.load_dataset()
        masks = workload.masks(dataset, [(sparsity, seed)])
        with open_store(source) as store:
            task = probe_tasks(spec, store, sparsity, {seed: masks[(sparsity, seed)]})[0]
        index, trial, mask = int(task.trial.trial), stored_trial(task.trial), task.mask
        batch, horizon = int(task.group.batch_size), task.horizon
    else:
        spec = load_spec(source)
        workload, seed = Workload.of(spec), spec.seeds[0]
        dataset = workload.load_dataset()
        group = next(g for g in plan(spec) if g.sparsity == sparsity and g.seed == seed
                     and g.batch_size == min(spec.batch_sizes) and not g.delay)
        index, trial, batch, horizon = 0, training.Trial.from_dict(group.trials[0]), \
            group.batch_size, steps
        mask = workload.trial_mask(workload.masks(dataset, [(sparsity, seed)])[(sparsity, seed)],
                                   0)
    _, model = on_device(workload, "cpu", dataset, workload.init_seed(seed, index))
    run = training.RunConfig(batch, spec.optimizer, max_steps=horizon, seed=seed,
                             eval_schedule=spec.eval, precision=spec.precision)
    return spec, dataset, model, trial, index, mask, run, horizon


def main(source: str, sparsity: float = 0.0, steps: int = 2000) -> dict[str, float]:
    """The seconds and fractions of the module docstring (printed, and returned by label)."""
    spec, dataset, model, trial, index, mask, run, horizon = _run(source, sparsity, steps)
    out: dict[str, float] = {}
    with torch_threads(1):
        def train(watch=None, steps=horizon) -> float:
            start = time.perf_counter()
            training.train_trials(model, dataset, [trial], replace(run, max_steps=steps),
                                  masks=mask, first_index=index, watch=watch)
            return time.perf_counter() - start

        train(steps=50)   # warm: the program's choice and first allocations are not the run's
        out["training"] = base = train()
        print(f"run: sparsity {sparsity:g}, B = {run.batch_size}, {horizon} steps; training "
              f"{base:.1f} s ({base / (horizon * run.batch_size) * 1e6:.1f} us an example-step)")
        before = theory.stage_steps(horizon, BEFORE_EVERY, START)
        start = time.perf_counter()
        states = theory.replay_states(model, dataset, trial, run, needed_steps(
            before, horizon, spec.probes.average, "into"), mask, index)
        out["replay"] = replay = time.perf_counter() - start
        start = time.perf_counter()
        theory.probe_trajectory(
            model, dataset, trial, run, before, horizon, mask=mask, sparsity=sparsity,
            trial_index=index, average=spec.probes.average, examples=spec.probes.examples,
            states=states, lipschitz_seed=LIPSCHITZ_SAMPLE_SEED, quantities=STAGE_MEASURED,
            lipschitz_update="into", lipschitz_examples=min(BEFORE_EXAMPLES, dataset.n_train))
        out["before"] = measured = time.perf_counter() - start
        print(f"before: replay {replay:.1f} s + every {BEFORE_EVERY}, L + noise on "
              f"{min(BEFORE_EXAMPLES, dataset.n_train)} ex., {len(before)} points {measured:.1f} s = "
              f"{(replay + measured) / base:.0%} of training")
        after = theory.stage_steps(horizon, AFTER_EVERY, START)
        sizes = {n: InsideL(InsidePlan(after, n, False, LIPSCHITZ_SAMPLE_SEED), model, dataset,
                            lambda _: mask) for n in SIZES if n <= dataset.n_train}

        def every_size(t, ids, before_w, after_w):
            for inside in sizes.values():
                inside(t, [index + i for i in ids], before_w, after_w)

        with_watch = train(training.Watch(after, every_size))
        spent = {n: sum(inside.seconds.values()) for n, inside in sizes.items()}
        out["watch overhead"] = with_watch - base - sum(spent.values())
        print(f"after (inside the run, every {AFTER_EVERY} from {START}, {len(after)} points; "
              f"watch overhead {out['watch overhead']:.1f} s):")
        for n, seconds in spent.items():
            point = seconds / len(after)
            out[f"after {n}"] = seconds
            print(f"  L on {n:>5} ex.: {seconds:6.1f} s = {seconds / base:6.1%} of training; "
                  f"a point {point:.2f} s = {point / (base / horizon * AFTER_EVERY):.0%} of "
                  f"{AFTER_EVERY} steps ({point / (10 * n) * 1e6:.1f} us an example-gradient)")
        # the smaller samples' L beside the largest's at the same updates: mean and SD over
        # the points of log(L_n / L_largest), to set beside the run-to-run spread of log L
        first, *others = sizes
        largest = sizes[first].values
        for n in others:
            logs = torch.tensor([math.log(v / largest[k]) for k, v in sizes[n].values.items()])
            out[f"log ratio {n}"] = float(logs.mean())
            print(f"  log(L_{n} / L_{first}) over the points: mean {float(logs.mean()):+.3f}, "
                  f"SD {float(logs.std()) if len(logs) > 1 else math.nan:.3f}")
    return out


if __name__ == "__main__":
    main(sys.argv[1], *(float(sys.argv[2]),) * (len(sys.argv) > 2),
         *(int(sys.argv[3]),) * (len(sys.argv) > 3))
