"""Models written only for the benchmark (not in the model registry), with their data: models
of the kind a user brings, which no rule of the strategy was written for.

- :func:`transformer_classifier`: embedding, two ``nn.TransformerEncoderLayer`` (width 64,
  4 heads, feed-forward 128, no Dropout, batch first), mean over the sequence, LayerNorm,
  Linear;
- :func:`gru_classifier`: one ``nn.GRU`` layer (hidden 64) and a Linear on its last state;
- :func:`sequences`: synthetic sequences for both (SEQUENCE x FEATURES Gaussian values, uniform
  labels of CLASSES classes: the speed does not depend on the values).

``sparsescale bench`` names them ``transformer`` and ``gru`` (:data:`BENCH_ONLY`); any other
module is benchmarked by import path (``--models package.module:factory``).
"""

from __future__ import annotations

import torch
from torch import nn

from training.data.dataset import Dataset

SEQUENCE, FEATURES, CLASSES = 32, 16, 10
VALIDATION = 256


def sequences(samples: int = 10_000) -> Dataset:
    """Synthetic sequences [SEQUENCE, FEATURES] with CLASSES uniform labels."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, SEQUENCE, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (samples,), generator=g)
    return Dataset("synthetic sequences", "classification", x[VALIDATION:], y[VALIDATION:],
                   x[:VALIDATION], y[:VALIDATION], CLASSES, (SEQUENCE, FEATURES))


class TransformerClassifier(nn.Module):
    """A small transformer-encoder classifier (see the module docstring)."""

    def __init__(self, features: int, classes: int, width: int = 64, layers: int = 2):
        super().__init__()
        self.embed = nn.Linear(features, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm, self.out = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.encoder(self.embed(x)).mean(1)))


class GRUClassifier(nn.Module):
    """One GRU layer and a Linear classifier on its last hidden state."""

    def __init__(self, features: int, classes: int, hidden: int = 64):
        super().__init__()
        self.gru, self.out = nn.GRU(features, hidden, batch_first=True), nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(x)
        return self.out(h[:, -1])


def transformer_classifier(dataset: Dataset) -> nn.Module:
    """:class:`TransformerClassifier` for ``dataset``'s sequences [length, features]."""
    return TransformerClassifier(dataset.input_shape[-1], dataset.num_classes)


def gru_classifier(dataset: Dataset) -> nn.Module:
    """:class:`GRUClassifier` for ``dataset``'s sequences [length, features]."""
    return GRUClassifier(dataset.input_shape[-1], dataset.num_classes)


# bench name -> (model factory, data factory), by import path
BENCH_ONLY = {"transformer": ("training.bench.models:transformer_classifier",
                              "training.bench.models:sequences"),
              "gru": ("training.bench.models:gru_classifier", "training.bench.models:sequences")}
