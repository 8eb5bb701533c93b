"""Small networks of the kinds people write (batch normalization, dropout, attention, recurrent
layers), in float64, with the data sets they read, for the probe tests; each comes back in train
mode, as a training script leaves it, with non-trivial batch-normalization running statistics.
And the probes' ground truth on them: per-example gradients of the eval-mode network from a
plain loop of ``torch.autograd.grad``."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from training.data import Dataset

CLASSES = 3
SIDE = 8        # images SIDE x SIDE
SEQ, FEATURES = 6, 5


def dataset(kind: str, n: int = 30, seed: int = 0, seq: int = SEQ, features: int = FEATURES) -> Dataset:
    """``n`` float64 examples with random labels: images ``[1, SIDE, SIDE]`` (``kind="image"``)
    or sequences ``[seq, features]`` (``kind="sequence"``)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (1, SIDE, SIDE) if kind == "image" else (seq, features)
    x = torch.randn(n, *shape, generator=gen, dtype=torch.float64)
    y = torch.randint(CLASSES, (n,), generator=gen)
    return Dataset(kind, "classification", x, y, x[:4], y[:4], CLASSES, shape)


class MnistExampleCNN(nn.Module):
    """PyTorch's MNIST example network (examples/mnist/main.py), narrowed: two convolutions,
    max-pooling, two dropouts, log-softmax output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 3, 3, 1)
        self.conv2 = nn.Conv2d(3, 4, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(4 * 2 * 2, 8)
        self.fc2 = nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def batchnorm_cnn() -> nn.Sequential:
    """Conv2d -> BatchNorm2d -> max-pool -> Linear -> BatchNorm1d -> Linear."""
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3 * 3 * 3, 6), nn.BatchNorm1d(6), nn.ReLU(),
                         nn.Dropout(0.3), nn.Linear(6, CLASSES))


class TransformerClassifier(nn.Module):
    """Linear embedding -> nn.TransformerEncoderLayer (self-attention, LayerNorm, dropout) ->
    mean over the sequence -> Linear."""

    def __init__(self, d_model: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, d_model)
        self.encoder = nn.TransformerEncoderLayer(d_model, heads, 2 * d_model, dropout=0.1,
                                                  batch_first=True)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


class TinyAttention(nn.Module):
    """nn.MultiheadAttention (d_model 4, one head, attention dropout) on the raw sequence, mean
    over positions, Linear: 95 parameters."""

    def __init__(self, d_model: int = 4) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, 1, dropout=0.2, batch_first=True)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x, x, x, need_weights=False)[0].mean(1))


class ScaledDotProduct(nn.Module):
    """A hand-written multi-head attention block calling F.scaled_dot_product_attention on
    ``[batch, heads, sequence, head dim]`` (with attention dropout in training, as such blocks
    are written)."""

    def __init__(self, d_model: int = 6, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(FEATURES, 3 * d_model)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)
        return self.head(self.norm(a.transpose(1, 2).reshape(b, s, -1)).mean(1))


class RecurrentClassifier(nn.Module):
    """nn.GRU or nn.LSTM over the sequence, Linear on the last output."""

    def __init__(self, kind: type[nn.RNNBase] = nn.GRU, hidden: int = 5) -> None:
        super().__init__()
        self.rnn = kind(FEATURES, hidden, batch_first=True)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


IMAGES = dict(kind="image")
SEQUENCES = dict(kind="sequence")
BUILDERS = {
    "mnist_example_cnn": (MnistExampleCNN, IMAGES),
    "batchnorm_cnn": (batchnorm_cnn, IMAGES),
    "transformer": (TransformerClassifier, SEQUENCES),
    "multihead_attention": (TinyAttention, dict(kind="sequence", seq=3, features=4)),
    "scaled_dot_product": (ScaledDotProduct, SEQUENCES),
    "gru": (lambda: RecurrentClassifier(nn.GRU), SEQUENCES),
    "lstm": (lambda: RecurrentClassifier(nn.LSTM), SEQUENCES),
}


def build(name: str, seed: int = 0) -> tuple[nn.Module, Dataset]:
    """Model ``name`` of :data:`BUILDERS` (float64, train mode; batch normalization's running
    statistics moved away from their initial 0 / 1 by three training-mode passes) and its data."""
    make, data_args = BUILDERS[name]
    torch.manual_seed(seed)
    model = make().double().train()
    data = dataset(**data_args, seed=seed)
    with torch.no_grad():
        for _ in range(3):
            model(data.x_train * 2 + 1)
    return model, data


def eval_copy(model, flat=None):
    """An eval-mode copy of ``model`` (buffers included), with all parameters set from ``flat``."""
    net = copy.deepcopy(model).eval()
    if flat is not None:
        torch.nn.utils.vector_to_parameters(flat, net.parameters())
    return net


def loop_gradients(model, x, y, flat=None):
    """Each example's gradient of the eval-mode network's cross-entropy, one autograd call per
    example, rows in ``named_parameters()`` order."""
    net = eval_copy(model, flat)
    params = list(net.parameters())
    rows = [torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        F.cross_entropy(net(xi[None]), yi[None]), params)]) for xi, yi in zip(x, y)]
    return torch.stack(rows)


def moments(g):
    """|G|^2 and tr(Sigma) (divide by n) of per-example gradients ``g`` [n, dim]."""
    mean = g.mean(0)
    return float(mean @ mean), float((g - mean).pow(2).sum(1).mean())
