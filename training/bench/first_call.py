"""The one-time cost of ``train_trials`` in a fresh process: ``sparsescale bench`` saves a cell
(model, data set, batch size, trials, optimizer) with ``torch.save`` and runs this module in a
new Python process, which times a one-step run twice; the first run's excess over the second
is what a fresh process pays once (kernel and primitive creation, first touches of memory,
thread pools, a program choice not in the cache). Imports and loading the cell are not
counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from training.data.dataset import Dataset


def measure(net: nn.Module, ds: Dataset, batch_size: int, n_trials: int, optimizer: str,
            threads: int, timeout: float = 600.0) -> tuple[float, float]:
    """(first, second) wall seconds of a one-step ``train_trials`` run in a fresh process with
    ``threads`` torch threads (NaN, NaN when the process fails)."""
    with tempfile.TemporaryDirectory() as folder:
        cell = Path(folder) / "cell.pt"
        torch.save({"net": net, "ds": ds, "batch_size": batch_size, "trials": n_trials,
                    "optimizer": optimizer, "threads": threads}, cell)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            done = subprocess.run([sys.executable, "-m", "training.bench.first_call", str(cell)],
                                  capture_output=True, text=True, timeout=timeout, env=env)
            found = json.loads(done.stdout.strip().splitlines()[-1])
            return float(found["first"]), float(found["second"])
        except (subprocess.SubprocessError, ValueError, IndexError, KeyError):
            return float("nan"), float("nan")


def main(path: str) -> None:
    from training.bench.speed import vectorized
    from training.processes.setup import setup_training_process

    cell = torch.load(path, weights_only=False)
    torch.set_num_threads(cell["threads"])
    setup_training_process()
    times = []
    for _ in range(2):
        start = time.perf_counter()
        vectorized(cell["net"], cell["ds"], cell["batch_size"], cell["trials"], 1,
                   optimizer=cell["optimizer"])
        times.append(time.perf_counter() - start)
    print(json.dumps({"first": times[0], "second": times[1]}))


if __name__ == "__main__":
    main(sys.argv[1])
