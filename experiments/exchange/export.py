"""A results store as TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``).

``export_tensorboard(run_dir, out)`` reads the store only through
:func:`experiments.load_results` and writes one TensorBoard run per trial and one per group
series, so ``tensorboard --logdir OUT`` shows them side by side:

- ``OUT/sparsity=S/B=B/seed=N/trial=T``: the trial's evaluations, scalars ``curve/train_loss``
  and ``curve/metric`` against the training step (values the store holds as missing, e.g. a NaN
  loss after divergence, are left out; infinities are kept);
- ``OUT/summary/sparsity=S/seed=N``: one point per stored group with the batch size as the step:
  ``group/steps_to_result`` (groups that reached the goal), ``group/trials``, ``group/reached``,
  ``group/diverged``, and the best trial's ``group/best_lr`` and ``group/best_momentum``.

Needs the optional ``tensorboard`` package (``pip install 'sparsescale[tensorboard]'``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from training.errors import SparsescaleError

from experiments.store.results import load_results

# events buffered before a write: a trial is written in one go, not every 10 events (the default)
QUEUE = 10_000
INSTALL = "pip install 'sparsescale[tensorboard]'"


class ExportError(SparsescaleError, ValueError):
    """The export cannot be written as asked (e.g. the tensorboard package is missing)."""


def _writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:   # torch raises it when the tensorboard package is absent
        raise ExportError(f"--tensorboard needs the tensorboard package: {INSTALL}") from None
    return SummaryWriter


def trial_run(sparsity: float, batch_size: int, seed: int, trial: int) -> str:
    """The TensorBoard run (a folder below OUT) holding one trial's curves."""
    return f"sparsity={sparsity:g}/B={batch_size}/seed={seed}/trial={trial}"


def summary_run(sparsity: float, seed: int) -> str:
    """The TensorBoard run holding the group summaries of one (sparsity, seed) series."""
    return f"summary/sparsity={sparsity:g}/seed={seed}"


def _add(writer, tag: str, value, step: int) -> None:
    if value is not None and value is not pd.NA and not math.isnan(float(value)):
        writer.add_scalar(tag, float(value), int(step))


def export_tensorboard(run_dir: str | Path, out: str | Path) -> int:
    """Write the curves of every trial and the summary of every group stored in ``run_dir`` as
    TensorBoard event files below ``out``; returns the number of runs written."""
    SummaryWriter = _writer_class()
    res = load_results(run_dir)
    out = Path(out)
    groups = res.groups[res.groups["status"] == "done"].set_index("key")
    curves = res.curves.groupby(["group_key", "trial"], sort=False)
    runs = 0
    for (key, trial), c in curves:
        g = groups.loc[key]
        with SummaryWriter(out / trial_run(g["sparsity"], g["batch_size"], g["seed"], trial),
                           max_queue=QUEUE) as w:
            for row in c.itertuples(index=False):
                _add(w, "curve/train_loss", row.train_loss, row.step)
                _add(w, "curve/metric", row.metric, row.step)
        runs += 1
    best = res.trials.set_index(["group_key", "trial"])
    for (sparsity, seed), series in groups.groupby(["sparsity", "seed"], sort=True):
        with SummaryWriter(out / summary_run(sparsity, seed)) as w:
            for key, g in series.sort_values("batch_size").iterrows():
                b = int(g["batch_size"])
                _add(w, "group/steps_to_result", g["steps_to_result"], b)
                for tag, column in (("trials", "n_trials"), ("reached", "n_reached"),
                                    ("diverged", "n_diverged")):
                    _add(w, f"group/{tag}", g[column], b)
                if not pd.isna(g["best_trial"]):
                    t = best.loc[(key, int(g["best_trial"]))]
                    _add(w, "group/best_lr", t["lr"], b)
                    _add(w, "group/best_momentum", t["momentum"], b)
        runs += 1
    return runs
