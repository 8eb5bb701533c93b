"""theory.callbacks.huggingface in a real Hugging Face Trainer on the CPU: the noise scales in
``state.log_history`` (whole model, per layer, norm layers, preconditioned) equal the library's
own monitor over the same batches to 1e-10 in float64, per example and by micro-batches, with
the Trainer clipping the gradients; a policy's lr survives the Trainer's linear schedule and its
batch size reaches the loader when the module docstring says."""

from __future__ import annotations

import copy

import pytest
import torch.nn.functional as F
from torch import nn

transformers = pytest.importorskip("transformers")

from tests.theory.callbacks.replay import (  # noqa: E402
    OPTIONS, Tape, assert_same, data, labeller, net, replay,
)
from theory.callbacks.huggingface import NoiseScaleCallback  # noqa: E402
from theory.errors import TheoryError  # noqa: E402

LR = 1e-2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = net()

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class Rates(transformers.TrainerCallback):
    """The lr of each step, read as it begins."""

    def __init__(self) -> None:
        self.lrs = []

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        self.lrs.append(optimizer.param_groups[0]["lr"])


def fit(tmp_path, steps: int, *, accumulate: int = 1, clip: float = 0.0,
        schedule: str = "constant", **callback):
    x, y = data()
    model = Net()
    start, tape = copy.deepcopy(model.net), Tape(model.net)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=8,
        gradient_accumulation_steps=accumulate, learning_rate=LR, lr_scheduler_type=schedule,
        weight_decay=0.0, max_grad_norm=clip, logging_steps=1, report_to="none",
        disable_tqdm=True, save_strategy="no", use_cpu=True, seed=0)
    trainer = transformers.Trainer(model=model, args=args,
                                   train_dataset=[{"x": a, "labels": b} for a, b in zip(x, y)])
    rates = Rates()
    trainer.add_callback(NoiseScaleCallback(trainer, **callback))
    trainer.add_callback(rates)
    trainer.train()
    logged = [{k: v for k, v in row.items() if k.startswith(("noise/", "policy/"))}
              for row in trainer.state.log_history]
    return [row for row in logged if row], start, tape, labeller(x, y), rates.lrs


@pytest.mark.parametrize("accumulate, clip", [(1, 0.0), (1, 1e-3), (2, 1e-3)])
def test_the_logged_noise_scales_are_the_monitors_on_the_same_batches(tmp_path, accumulate, clip):
    logged, start, tape, labels_of, _ = fit(tmp_path, 4, accumulate=accumulate, clip=clip,
                                            preconditioned=True, **OPTIONS)
    truth = replay(start, tape.inputs, labels_of, micro=accumulate, lr=LR,
                   clip=clip or None, **OPTIONS)
    assert len(logged) == len(truth) == 4
    for row, expected in zip(logged, truth):
        assert_same(row, expected)
    assert {"noise/b_simple[<norm layers>]", "noise/b_simple[<preconditioned>]",
            "noise/b_simple[net.0]"} <= set(logged[-1])


class Doubling:
    """At the first decision: twice the batch, half the lr."""

    def __init__(self) -> None:
        self.signals = []

    def decide(self, signal, current):
        from theory.policies.interface import Setting

        self.signals.append(signal)
        return Setting(current.batch_size * 2, current.lr / 2) if signal.step == 1 else current


def test_a_policy_scales_the_schedule_and_sets_the_batch_size_from_the_second_batch(tmp_path):
    pytest.importorskip("theory.policies.interface")
    policy = Doubling()
    logged, _, tape, _, lrs = fit(tmp_path, 4, schedule="linear", policy=policy)
    assert [len(x) for x in tape.inputs] == [8, 8, 16, 16]
    # the linear decay LR (1 - s / 4) goes on at half the lr from the second step
    assert lrs == pytest.approx([LR, LR * 3 / 4 / 2, LR * 2 / 4 / 2, LR * 1 / 4 / 2])
    # (no decision at the end of the decay, where the lr is 0)
    assert [(s.step, s.examples) for s in policy.signals] == [(1, 8), (2, 16), (3, 32)]
    assert logged[0]["policy/batch_size"] == 16


def test_the_callback_needs_its_trainer():
    with pytest.raises(TheoryError, match="needs the Trainer it is added to"):
        NoiseScaleCallback(None)
