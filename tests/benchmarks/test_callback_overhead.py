"""Overhead of the framework callbacks (theory.callbacks): a Lightning Trainer's and a Hugging
Face Trainer's step with and without ``NoiseScaleCallback``.

The workloads of tests/benchmarks/test_monitor_overhead.py (the MNIST-1D MLP and the tiny
transformer), float32, batches of 64 in a fixed order, Adam (the Hugging Face Trainer's default
AdamW with its constant schedule), one thread, the frameworks' default logging intervals
(Lightning's ``log_every_n_steps=50``, the Trainer's ``logging_steps=500``), no progress bars or
checkpoints. A step's time is the thread CPU time between the starts of consecutive steps
(Lightning's ``on_train_batch_start``, the Trainer's ``on_step_begin``: the whole step, its
data fetch and the framework's own work included), the median over the fit's steps after the
first five. The fits with and without the callback alternate within every round; each overhead
is the median over rounds of the fit's step over the plain fit's in the same round. Variants:
the callback alone (the whole model's noise scale) and with its parts (per layer, the
normalization layers where there are any, the preconditioned gradient).
``python tests/benchmarks/test_callback_overhead.py`` prints the table; with pytest's default
``--benchmark-disable`` each framework's test runs one short fit as a quick check.
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # run as a script
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.test_monitor_overhead import BATCH, workload

LR = 1e-4
# label: the callback's keyword arguments (None: the plain fit)
VARIANTS = {"callback": {}, "callback + parts": {"per_layer": True, "norm_layers": True,
                                                 "preconditioned": True}}


def variant(name: str, label: str) -> dict:
    options = dict(VARIANTS[label])
    if name == "mlp":
        options.pop("norm_layers", None)          # the MLP has no normalization layer
    return options


def quiet() -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)


def lightning_fit(net: nn.Module, data: TensorDataset, steps: int, options: dict | None
                  ) -> list[float]:
    """Thread CPU seconds of each step of a Lightning fit (module docstring)."""
    import lightning.pytorch as pl

    from theory.callbacks.lightning import NoiseScaleCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=LR)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.stamps = []

        def on_train_batch_start(self, *args) -> None:
            self.stamps.append(time.thread_time())

    clock = Clock()
    callbacks = [clock] if options is None else [clock, NoiseScaleCallback(module="net",
                                                                           **options)]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                             callbacks=callbacks, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=tmp)
        trainer.fit(Module(), DataLoader(data, batch_size=BATCH))
    return [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]


def huggingface_fit(net: nn.Module, data: TensorDataset, steps: int, options: dict | None
                    ) -> list[float]:
    """Thread CPU seconds of each step of a Hugging Face Trainer's run (module docstring)."""
    import transformers

    from theory.callbacks.huggingface import NoiseScaleCallback

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x, labels=None):
            return {"loss": F.cross_entropy(self.net(x), labels)}

    class Clock(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.stamps = []

        def on_step_begin(self, *args, **kwargs) -> None:
            self.stamps.append(time.thread_time())

    clock = Clock()
    with tempfile.TemporaryDirectory() as tmp:
        args = transformers.TrainingArguments(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=BATCH,
            learning_rate=LR, lr_scheduler_type="constant", report_to="none", disable_tqdm=True,
            save_strategy="no", use_cpu=True, seed=0)
        x, y = data.tensors
        trainer = transformers.Trainer(model=Model(), args=args, train_dataset=[
            {"x": a, "labels": b} for a, b in zip(x, y)])
        trainer.remove_callback(transformers.PrinterCallback)    # (its summary lines)
        trainer.add_callback(clock)
        if options is not None:
            trainer.add_callback(NoiseScaleCallback(trainer, **options))
        trainer.train()
    return [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]


FITS = {"lightning": lightning_fit, "huggingface": huggingface_fit}
MODULES = {"lightning": "lightning.pytorch", "huggingface": "transformers"}


def dataset(name: str, steps: int) -> tuple[nn.Module, TensorDataset]:
    net, ds = workload(name)
    n = steps * BATCH
    return net, TensorDataset(ds.x_train[:n], ds.y_train[:n])


@pytest.mark.parametrize("framework", list(FITS))
def test_a_fit_with_the_callback(benchmark, framework):
    pytest.importorskip(MODULES[framework])
    quiet()
    net, data = dataset("mlp", 3)
    times = benchmark(FITS[framework], net, data, 3, variant("mlp", "callback + parts"))
    assert len(times) == 2 and all(t > 0 for t in times)


def overhead(framework: str, name: str, steps: int = 40, rounds: int = 5, warm: int = 5
             ) -> dict[str | None, float]:
    """The plain fit's step in thread CPU seconds (key None; its fastest round) and each
    variant's overhead as a fraction of it (module docstring)."""
    torch.set_num_threads(1)
    quiet()
    fit = FITS[framework]
    times: dict[str | None, list[float]] = {key: [] for key in (None, *VARIANTS)}
    for _ in range(rounds):
        for key, runs in times.items():
            net, data = dataset(name, steps)
            step = fit(net, data, steps, None if key is None else variant(name, key))
            runs.append(statistics.median(step[warm:]))
    plain = times.pop(None)
    return {None: min(plain), **{key: statistics.median(t / p - 1 for t, p in zip(runs, plain))
                                 for key, runs in times.items()}}


def main() -> None:
    print(f"{'framework':<12} {'workload':<12} {'plain ms/step':>14} "
          + " ".join(f"{k:>17}" for k in VARIANTS))
    for framework in FITS:
        for name in ("mlp", "transformer"):
            times = overhead(framework, name)
            print(f"{framework:<12} {name:<12} {times[None] * 1e3:>14.3f} "
                  + " ".join(f"{100 * times[k]:>16.1f}%" for k in VARIANTS))


if __name__ == "__main__":
    main()
