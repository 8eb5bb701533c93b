"""What the callback tests share: a tiny float64 model with a LayerNorm, a tape of the batches a
framework's Trainer fed it, and the ground truth: the library's own monitor in a plain loop over
the same batches (same start, optimizer and options), its readings as the callbacks' metrics."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from theory import NoiseScaleMonitor
from theory.callbacks.common import metrics

FEATURES, CLASSES, N = 6, 3, 96
OPTIONS = {"window": 2, "per_layer": True, "norm_layers": True}


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 12), nn.LayerNorm(12), nn.Tanh(),
                         nn.Linear(12, CLASSES)).double()


def data(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, FEATURES, generator=gen, dtype=torch.float64)
    return x, (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()


class Tape:
    """The inputs of the model's training forwards (gradients enabled), in order."""

    def __init__(self, model: nn.Module) -> None:
        self.inputs: list[torch.Tensor] = []
        self.handle = model.register_forward_pre_hook(self._keep, with_kwargs=True)

    def _keep(self, module, args, kwargs) -> None:
        if torch.is_grad_enabled():
            self.inputs.append((args[0] if args else kwargs["x"]).detach().clone())


class Holder(nn.Module):
    """The network under the name ``net``, as the Trainers' modules hold it (the layers' names,
    ``net.0``, ..., name the per-layer parts)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def replay(start: nn.Module, inputs: list[torch.Tensor], labels_of, *, micro: int = 1,
           lr: float = 1e-2, clip: float | None = None, preconditioned: bool = True,
           prefix: str = "noise/", **options) -> list[dict[str, float]]:
    """The readings, as metrics, of the monitor in a plain Adam loop over ``inputs`` taken
    ``micro`` at a time per step (the loss over each divided by ``micro``), clipped after the
    monitor's step like the Trainers' ``max_grad_norm`` where ``clip`` is given."""
    model = Holder(copy.deepcopy(start))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    monitor = NoiseScaleMonitor(model, optimizer=opt if preconditioned else None, **options)
    out = []
    for at in range(0, len(inputs) - micro + 1, micro):
        opt.zero_grad()
        for x in inputs[at:at + micro]:
            (F.cross_entropy(model(x), labels_of(x)) / micro).backward()
        out.append(metrics(monitor.step(loss_scale=1.0 / micro), prefix))
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    monitor.close()
    return out


def labeller(x_all: torch.Tensor, y_all: torch.Tensor):
    """The labels of a batch of inputs from the data set (rows found by value)."""
    def labels_of(x: torch.Tensor) -> torch.Tensor:
        rows = [int(torch.nonzero((x_all == row).all(1))[0]) for row in x]
        return y_all[rows]
    return labels_of


def assert_same(logged: dict[str, float], truth: dict[str, float]) -> None:
    """The same metric names, and values to 1e-10 (relative, or absolute near zero; nan where
    the truth is nan)."""
    assert set(logged) == set(truth), set(logged) ^ set(truth)
    for name, value in truth.items():
        assert (math.isnan(value) and math.isnan(logged[name])) or math.isclose(
            logged[name], value, rel_tol=1e-10, abs_tol=1e-12), (name, logged[name], value)
