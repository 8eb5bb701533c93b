"""The cost of L at Lee et al.'s stage as a fraction of the training it measures, for schedules
of the ``[probes]`` table, on one stored run of a study.

For the first probed run of level ``sparsity`` in a run folder (its store and spec): the training
of that run alone (its replay to its end, one torch thread: the cost L would add to if it were
taken inside the run), then, on the states of that replay, the measurements of each schedule
(``--every`` N, ``--examples`` L's sample, with or without the noise quantities measured beside
L). Fraction = measurement seconds / training seconds; the replay a study's probes add today
(one more pass of training per probed run) is printed beside it.

    python -m experiments.scripts.probe_cost RUN_DIR [SPARSITY]     # default sparsity 0
"""

from __future__ import annotations

import sys
import time

import theory
from experiments.run.executors import torch_threads
from experiments.run.probes import (
    LIPSCHITZ_SAMPLE_SEED, STAGE_MEASURED, on_device, probe_tasks, stored_trial,
)
from experiments.run.workload import Workload
from experiments.store.database import open_store
from experiments.store.results import load_results
from theory.verdicts.trajectory import needed_steps
import training

# (label, every, L's sample, quantities): today's schedule, then the denser ones, all from
# Lee's stage on (step 1,000: lipschitz_start)
SCHEDULES = (("every 1000, L + noise, 2000 ex.", 1000, 2000, STAGE_MEASURED),
             ("every 250, L + noise, 2000 ex.", 250, 2000, STAGE_MEASURED),
             ("every 250, L only, 2000 ex.", 250, 2000, ("local_lipschitz",)),
             ("every 250, L only, 1000 ex.", 250, 1000, ("local_lipschitz",)))
START = 1000


def main(run_dir: str, sparsity: float = 0.0) -> list[tuple[str, int, float, float]]:
    """(label, points, seconds, fraction of training) per schedule (module docstring)."""
    spec = load_results(run_dir).spec
    workload = Workload.of(spec)
    dataset = workload.load_dataset()
    seed = spec.seeds[0]
    masks = workload.masks(dataset, [(sparsity, seed)])
    with open_store(run_dir) as store:
        task = probe_tasks(spec, store, sparsity, {seed: masks[(sparsity, seed)]})[0]
    horizon, p_ = task.horizon, spec.probes
    run = training.RunConfig(int(task.group.batch_size), spec.optimizer, seed=int(task.group.seed))
    out = []
    with torch_threads(1):
        _, model = on_device(workload, "cpu", dataset,
                             workload.init_seed(seed, int(task.trial.trial)))
        trial = stored_trial(task.trial)
        plans = [(label, theory.stage_steps(horizon, every, START), examples, quantities)
                 for label, every, examples, quantities in SCHEDULES]
        needed = sorted(set().union(*(needed_steps(steps, horizon, p_.average, "into")
                                      for _, steps, _, _ in plans)) | {horizon})
        # one replay to the run's end keeping every state a schedule needs: its time is the
        # run's training (the snapshots are copies of a few MB)
        start = time.perf_counter()
        states = theory.replay_states(model, dataset, trial, run, needed, task.mask,
                                      int(task.trial.trial))
        train = time.perf_counter() - start
        print(f"run: sparsity {sparsity:g}, B = {run.batch_size}, {horizon} steps; "
              f"training (its replay, 1 thread) {train:.1f} s")
        for label, steps, examples, quantities in plans:
            start = time.perf_counter()
            theory.probe_trajectory(
                model, dataset, trial, run, steps, horizon, mask=task.mask,
                sparsity=sparsity, trial_index=int(task.trial.trial), average=p_.average,
                examples=p_.examples, sample_seed=seed, states=states,
                lipschitz_seed=LIPSCHITZ_SAMPLE_SEED, quantities=quantities,
                lipschitz_update="into", lipschitz_examples=examples)
            seconds = time.perf_counter() - start
            out.append((label, len(steps), seconds, seconds / train))
            print(f"{label:<34} {len(steps):>3} points  {seconds:7.1f} s  "
                  f"{seconds / train:6.1%} of training (+100 % replay when not inside the run)")
    return out


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
