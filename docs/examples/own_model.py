"""Register a data set and two models of your own, train them with train_trials, and run a
small study on them with the spawned worker pool.

The registrations run at import of this file, outside the ``__main__`` guard: the study's
worker processes are spawned, and each re-runs this file's top level (not the guarded block)
before it trains a group, so the names exist there too.
"""
import torch
from torch import nn

import experiments
import training
from training.data import Dataset


@training.data.register("blobs")
def load_blobs(n: int = 600, seed: int = 0, val_fraction: float = 0.2) -> Dataset:
    """Three Gaussian blobs in 8 dimensions (classification)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 8, generator=g) + 2.0 * nn.functional.one_hot(y, 8).float()
    n_val = int(n * val_fraction)
    return Dataset(name="blobs", task="classification", x_train=x[n_val:], y_train=y[n_val:],
                   x_val=x[:n_val], y_val=y[:n_val], num_classes=3, input_shape=(8,))


@training.models.register("tiny_mlp")
def tiny_mlp(dataset: Dataset, width: int = 16) -> nn.Module:
    """A sequential ReLU network: the compiled kernel's program can run it."""
    return nn.Sequential(nn.Flatten(), nn.Linear(dataset.input_shape[0], width), nn.ReLU(),
                         nn.Linear(width, dataset.num_classes))


class Residual(nn.Module):
    def __init__(self, d_in: int, width: int, classes: int):
        super().__init__()
        self.inp, self.out = nn.Linear(d_in, width), nn.Linear(width, classes)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return self.out(h + h.square())


@training.models.register("residual")
def residual(dataset: Dataset, width: int = 16) -> nn.Module:
    """Not an nn.Sequential of the kernel's layers: it runs through torch.func."""
    return Residual(dataset.input_shape[0], width, dataset.num_classes)


SPEC = """
name = "own_model"
batch_sizes = [16, 64]
sparsities = [0.0, 0.5]
trials = 4

[workload]
dataset = "blobs"
model = "tiny_mlp"
model_options = {width = 8}

[goal]
target = 0.15

[search]
lr = {scale = "log", min = 0.01, max = 1.0}

[budget]
max_steps = 400

[eval]
every = 10

[probes]
enabled = false          # only to keep the example short: the probes run on any such model
"""

if __name__ == "__main__":
    ds = training.data.load("blobs")
    run = training.RunConfig(batch_size=32, max_steps=300, goal=0.15)
    trials = [training.Trial(lr=0.1, momentum=0.9), training.Trial(lr=0.3, momentum=0.9)]
    for name in ("tiny_mlp", "residual"):
        res = training.train_trials(training.models.build(name, ds), ds, trials, run)
        print(f"{name} program: {res.program}")
        print(f"{name} steps to result: {res.steps_to_result}")

    spec = experiments.loads_spec(SPEC)
    run_dir = experiments.run_study(spec, out="runs/own_model", workers=1, quiet=True,
                                    report=False)
    groups = experiments.load_results(run_dir).groups
    for row in groups.sort_values(["sparsity", "batch_size"]).itertuples():
        print(f"study sparsity {row.sparsity} batch {row.batch_size}: {row.status}, "
              f"steps to result {row.steps_to_result}")
