"""Train a study's workload on its whole training set at the best metaparameters the study found,
and report the test accuracy: does the network the study measured reach the accuracy published
for it (a Fashion-MNIST CNN of Lee et al. 2021's size: about 0.90-0.92)?

The study's best trial is that of the dense group at ``--batch-size`` (default: the smallest batch
size that met the goal, seed 0): its learning rate, momentum and Adam keys; a trial that decayed
its learning rate decays it linearly over the whole run here, to its end factor. The data set is
the study's with its own options, except that the training split is whole (``train_examples`` is
dropped: a study sized to a small machine trains on a sample) and the test split is loaded. The
network is built with the study's model, options and seed 0, and trained with
``training.train_trials`` (one trial) for ``--epochs`` passes over the training split.

``--decay-to F`` (a diagnostic, not the study's trial): decay the learning rate linearly over the
whole run to F times its start, where the study's trial kept it constant. A search that tunes for
the fewest steps to a loose goal picks a large constant learning rate; whether the network can
do better with the same start and a decay tells the network's capacity from the search's aim.

    python -m experiments.scripts.best_trial_test_accuracy runs/lee_fashion_mnist --epochs 10
    python -m experiments.scripts.best_trial_test_accuracy runs/lee_fashion_mnist --decay-to 0.01
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import training
from experiments.store.results import load_results


@dataclass(frozen=True)
class Accuracy:
    """The trained network's accuracy on the test split (and validation), with what trained it."""

    test_accuracy: float
    val_accuracy: float
    batch_size: int
    steps: int
    trial: training.Trial
    seconds: float


def best_trial(run_dir: str | Path, batch_size: int | None = None) -> tuple[int, training.Trial]:
    """(batch size, trial) of the dense group's best trial at ``batch_size`` (default: the
    smallest batch size that met the goal)."""
    res = load_results(run_dir)
    g = res.groups[(res.groups.sparsity == 0) & (res.groups.seed == 0)
                   & res.groups.steps_to_result.notna()]
    if batch_size is not None:
        g = g[g.batch_size == batch_size]
    if not len(g):
        where = f"at B = {batch_size}" if batch_size is not None else "at any batch size"
        raise SystemExit(f"{run_dir}: no dense group met the goal {where}")
    row = g.sort_values("batch_size").iloc[0]
    t = res.trials[(res.trials.group_key == row.key) & (res.trials.trial == row.best_trial)].iloc[0]
    adam = {k: float(t[k]) for k in ("beta1", "beta2", "eps", "weight_decay")
            if t[k] is not None and not (isinstance(t[k], float) and math.isnan(t[k]))}
    decays = t.decay_steps is not None and not (isinstance(t.decay_steps, float)
                                                and math.isnan(t.decay_steps))
    trial = training.Trial(lr=float(t.lr), momentum=float(t.momentum),
                           decay_steps=1 if decays else None,   # replaced by the run's length
                           end_factor=float(t.end_factor), **adam)
    return int(row.batch_size), trial


def main(run_dir: str | Path, batch_size: int | None = None, epochs: float = 10.0,
         eval_chunk: int = 2048, decay_to: float | None = None) -> Accuracy:
    """Train and measure (module docstring); prints one line and returns the numbers."""
    spec = load_results(run_dir).spec
    b, trial = best_trial(run_dir, batch_size)
    if decay_to is not None:
        if not 0 < decay_to <= 1:
            raise SystemExit(f"--decay-to must be in (0, 1], got {decay_to}")
        trial = training.Trial(**{**trial.__dict__, "decay_steps": 1, "end_factor": decay_to})
    options = {k: v for k, v in spec.dataset_options.items() if k != "train_examples"}
    ds = training.data.load(spec.dataset, **options, test=True)
    if ds.x_test is None:
        raise SystemExit(f"data set {spec.dataset!r} has no test split")
    steps = max(1, math.ceil(epochs * ds.n_train / b))
    if trial.decay_steps is not None:
        trial = training.Trial(**{**trial.__dict__, "decay_steps": steps})
    net = training.models.build(spec.model, ds, seed=0, **spec.model_options)
    run = training.RunConfig(b, spec.optimizer, max_steps=steps,
                             eval_schedule=training.EvalSchedule(every=steps))
    start = time.perf_counter()
    res = training.train_trials(net, ds, [trial], run)
    seconds = time.perf_counter() - start
    net.load_state_dict({k: v.to(p.dtype) for (k, v), p in zip(res.state(0).items(),
                                                                net.state_dict().values())})

    def accuracy(x: torch.Tensor, y: torch.Tensor) -> float:
        return 1.0 - training.reference.evaluate(net, x, y, "error", ds.task, chunk=eval_chunk)

    with torch.no_grad():
        out = Accuracy(accuracy(ds.x_test, ds.y_test), accuracy(ds.x_val, ds.y_val), b, steps,
                       trial, seconds)
    schedule = ("constant" if trial.decay_steps is None
                else f"linear decay to {trial.end_factor:.3g} x")
    print(f"{spec.model} on {spec.dataset} ({ds.n_train} training examples), {spec.optimizer} "
          f"lr {trial.lr:.4g} ({schedule}) momentum {trial.momentum:.4g}, B = {b}, {steps} steps "
          f"({epochs:g} epochs) in {seconds:.0f} s: test accuracy {out.test_accuracy:.4f}, "
          f"validation accuracy {out.val_accuracy:.4f}")
    return out


def _option(argv: list[str], name: str) -> str | None:
    """The value after ``name`` in ``argv`` (``--epochs 10``), or None."""
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


if __name__ == "__main__":   # RUN_DIR [--batch-size B] [--epochs E] [--decay-to F]
    argv = sys.argv[1:]
    b, e, d = (_option(argv, k) for k in ("--batch-size", "--epochs", "--decay-to"))
    main(argv[0], int(b) if b else None, float(e) if e else 10.0,
         decay_to=float(d) if d else None)
