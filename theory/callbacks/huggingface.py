"""The noise scale in a Hugging Face ``Trainer`` run: :class:`NoiseScaleCallback`, a
``transformers.TrainerCallback`` that attaches :class:`theory.NoiseScaleMonitor` to the
Trainer's model, logs the readings through the Trainer's own ``log`` (so into
``state.log_history`` and every ``report_to`` integration, at the Trainer's ``logging_steps``)
and optionally drives a batch-size policy (:mod:`theory.callbacks.common`). Needs
``pip install 'sparsescale[huggingface]'``.

A ``TrainerCallback`` is not handed the Trainer, so this one takes it:
``trainer.add_callback(NoiseScaleCallback(trainer, ...))``.

Where it reads: after the step's last backward pass and before the gradients are clipped. The
Trainer clips (``max_grad_norm``, default 1.0) before the first callback event after the
backward pass (``on_pre_optimizer_step``), through ``accelerator.clip_grad_norm_``, which it
also calls without clipping (``max_grad_norm=0``: at an infinite norm) to log the gradient's
norm; so the callback reads inside that method, just before it runs (it wraps the method from
``on_train_begin`` to ``on_train_end``), or in ``on_pre_optimizer_step`` where it was not
called. With
``gradient_accumulation_steps`` = k the monitor's micro-batch estimator reads the k passes at
loss scale 1/k (the Trainer divides the loss by the step's micro-batches, or, for a model that
takes ``num_items_in_batch``, sums the examples' losses over the step's examples: the same
for micro-batches of equal size). Where it decides: in ``on_step_end``, after the optimizer's and
the scheduler's steps; the lr is scaled with the scheduler's ``base_lrs``, which the default
linear schedule recomputes the lr from. What it logs: each measured step's metrics are kept
until the Trainer's next logging step (``control.should_log``), then logged with the step
number, as one entry beside the Trainer's own. Limits: one process (no DDP, DeepSpeed or
FSDP); no fp16 gradient scaler (the Trainer unscales ``.grad`` before clipping, while the
captured per-example terms stay scaled: refused); a policy's new batch size holds from the
second batch after the decision (accelerate's loader fetches one batch ahead), and the Trainer
counts the epochs and steps from the batch size at the start: with ``max_steps`` a larger
batch can end the run early (its last epoch runs out first).
"""

from __future__ import annotations

from typing import Any

from theory.callbacks.common import Run, require
from theory.errors import TheoryError

transformers = require(("transformers",), "huggingface", "theory.callbacks.huggingface")


class NoiseScaleCallback(transformers.TrainerCallback):
    """Logs the noise scale as ``noise/b_simple``, ``noise/g_sq``, ``noise/trace_sigma``, their
    standard errors and per-step values, and each part's as ``noise/b_simple[<part>]`` ...,
    through ``trainer.log``; drives ``policy`` (module docstring).

    ``trainer``: the Trainer it is added to; ``preconditioned``: also the noise scale of the
    gradient preconditioned by the optimizer (an Adam or AdamW: the Trainer's default AdamW);
    ``policy`` / ``policy_options``: a policy object or function, or
    a name of :func:`theory.policies.builtin.make_policy` with its options (module docstring of
    :mod:`theory.callbacks.common`); ``decide_every``: ask the policy every that many measured steps; ``prefix``: the metrics'
    names start with it; ``options``: the monitor's keyword arguments (``window``, ``ema``,
    ``every``, ``per_layer``, ``norm_layers``, ``population``, ...)."""

    def __init__(self, trainer: Any, *, preconditioned: bool = False, policy: Any = None,
                 policy_options: dict | None = None, decide_every: int = 1,
                 prefix: str = "noise/", **options: Any) -> None:
        if not isinstance(trainer, transformers.Trainer):
            raise TheoryError(f"NoiseScaleCallback(trainer, ...) needs the Trainer it is added "
                              f"to, got {type(trainer).__name__}")
        self.trainer = trainer
        self.run = Run(preconditioned=preconditioned, policy=policy,
                       policy_options=policy_options, decide_every=decide_every, prefix=prefix,
                       options=options)
        self.loader: Any = None
        self.read_now = True          # no reading taken yet in this step
        self.pending: dict[str, float] = {}

    def _read(self) -> None:
        if self.read_now:
            self.read_now = False
            self.pending.update(self.run.read(
                1.0 / self.trainer.current_gradient_accumulation_steps))

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, train_dataloader: Any = None, **kwargs: Any) -> None:
        if args.fp16:
            raise TheoryError("NoiseScaleCallback: fp16 training's gradient scaler unscales .grad "
                              "before the callback reads it; use bf16 or 32-bit")
        if args.world_size > 1:
            raise TheoryError(f"NoiseScaleCallback runs in one process, the Trainer has "
                              f"{args.world_size}")
        self.run.start(model, optimizer)
        self.loader, self.read_now, self.pending = train_dataloader, True, {}
        accelerator = self.trainer.accelerator
        clip = accelerator.clip_grad_norm_

        def read_then_clip(*clip_args: Any, **clip_kwargs: Any) -> Any:
            self._read()
            return clip(*clip_args, **clip_kwargs)

        accelerator.clip_grad_norm_ = read_then_clip

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._read()

    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                    lr_scheduler: Any = None, **kwargs: Any) -> None:
        self.read_now = True
        self.pending.update(self.run.decide(
            state.global_step, optimizer, [] if lr_scheduler is None else [lr_scheduler],
            self.loader, args.gradient_accumulation_steps))
        if control.should_log and self.pending:
            values, self.pending = self.pending, {}
            self.trainer.log(values)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.close()
        self.trainer.accelerator.__dict__.pop("clip_grad_norm_", None)
