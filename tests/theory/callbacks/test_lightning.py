"""theory.callbacks.lightning in a real Lightning Trainer on the CPU: the logged noise scales
(whole model, per layer, norm layers, preconditioned) equal the library's own monitor over the
same batches to 1e-10 in float64, per example and by micro-batches; a policy's lr and batch size
reach the optimizer and the loader when the module docstring says."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.loggers import Logger  # noqa: E402

from tests.theory.callbacks.replay import (  # noqa: E402
    OPTIONS, Tape, assert_same, data, labeller, net, replay,
)
from theory.callbacks.lightning import NoiseScaleCallback  # noqa: E402
from theory.errors import TheoryError  # noqa: E402

LR = 1e-2


class Recorder(Logger):
    """The metrics the Trainer's logger receives, by step."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, dict[str, float]] = {}

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.setdefault(step, {}).update(metrics)


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = net()
        self.seen: list[tuple[int, float]] = []     # (batch size, lr) of each training step

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append((len(x), self.optimizers().param_groups[0]["lr"]))
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=LR)


def fit(callback, steps: int, batch: int = 8, accumulate: int = 1, every: int = 1):
    x, y = data()
    module = Module()
    start = copy.deepcopy(module.net)
    tape, logger = Tape(module.net), Recorder()
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=logger,
                         log_every_n_steps=every, callbacks=[callback], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accumulate_grad_batches=accumulate)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=batch))
    return module, start, tape, logger, labeller(x, y)


def noise(row: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in row.items() if k.startswith("noise/")}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_logged_noise_scales_are_the_monitors_on_the_same_batches(accumulate):
    module, start, tape, logger, labels_of = fit(
        NoiseScaleCallback(preconditioned=True, **OPTIONS), steps=4, accumulate=accumulate)
    truth = replay(start, tape.inputs, labels_of, micro=accumulate, lr=LR, **OPTIONS)
    logged = [noise(logger.rows[s]) for s in sorted(logger.rows) if noise(logger.rows[s])]
    assert len(logged) == len(truth) == 4
    for row, expected in zip(logged, truth):
        assert_same(row, expected)
    last = logged[-1]
    assert {"noise/b_simple[<norm layers>]", "noise/b_simple[<preconditioned>]",
            "noise/b_simple[net.0]", "noise/b_simple[net.3]"} <= set(last)
    # the parts' |G|^2 and tr(Sigma) add up to the whole model's (per layer)
    assert last["noise/step_g_sq"] == pytest.approx(
        sum(last[f"noise/step_g_sq[net.{i}]"] for i in (0, 1, 3)))


def test_at_the_loggers_steps_the_latest_reading_is_logged():
    module, start, tape, logger, labels_of = fit(NoiseScaleCallback(**OPTIONS), steps=4, every=2)
    truth = replay(start, tape.inputs, labels_of, lr=LR, preconditioned=False, **OPTIONS)
    steps = [s for s in sorted(logger.rows) if noise(logger.rows[s])]
    assert steps == [1, 3]
    for s in steps:
        assert_same(noise(logger.rows[s]), truth[s])


class Doubling:
    """At the first decision: twice the batch, half the lr; the signals it read."""

    def __init__(self) -> None:
        self.signals = []

    def decide(self, signal, current):
        from theory.policies.interface import Setting

        self.signals.append(signal)
        return Setting(current.batch_size * 2, current.lr / 2) if signal.step == 1 else current


def test_a_policy_sets_the_lr_and_the_batch_size_of_the_next_step():
    pytest.importorskip("theory.policies.interface")
    policy = Doubling()
    module, _, _, logger, _ = fit(NoiseScaleCallback(policy=policy), steps=4)
    assert module.seen == [(8, LR), (16, LR / 2), (16, LR / 2), (16, LR / 2)]
    assert [(s.step, s.examples) for s in policy.signals] == [(1, 8), (2, 24), (3, 40), (4, 56)]
    assert policy.signals[0].b_simple == logger.rows[0]["noise/b_simple"]
    assert logger.rows[0]["policy/batch_size"] == 16 and logger.rows[0]["policy/lr"] == LR / 2


def test_a_built_in_policy_by_name_ramps_the_batch_to_the_noise_scale():
    """noise_ramp (Gray et al. 2024): after the first step B goes to the grid's power of two
    nearest the logged B_simple (here 32: within [8, 32]) with the lr by the square-root rule."""
    module, _, _, logger, _ = fit(NoiseScaleCallback(
        policy="noise_ramp", policy_options={"min_batch": 8, "max_batch": 32, "min_gain": 0.0,
                                             "lr_rule": "sqrt"}), steps=3)
    assert logger.rows[0]["noise/b_simple"] > 16 * 2 ** 0.5     # nearest in log: 32
    assert module.seen == [(8, LR), (32, 2 * LR), (32, 2 * LR)]


def test_an_unknown_monitor_option_is_refused_by_name():
    with pytest.raises(TheoryError, match="unknown monitor option 'windw' \\(did you mean 'window'"):
        NoiseScaleCallback(windw=3)


def test_a_training_step_that_calls_a_sub_module_is_named_in_the_error():
    class Inner(Module):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

    x, y = data()
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False,
                         callbacks=[NoiseScaleCallback()], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(TheoryError, match="NoiseScaleCallback\\(module='net'\\)"):
        trainer.fit(Inner(), DataLoader(TensorDataset(x, y), batch_size=8))
    with pytest.raises(TheoryError, match="no such sub-module; its children: net"):
        pl.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False,
                   callbacks=[NoiseScaleCallback(module="nte")], enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False
                   ).fit(Module(), DataLoader(TensorDataset(x, y), batch_size=8))
