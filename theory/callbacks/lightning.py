"""The noise scale in a Lightning run: :class:`NoiseScaleCallback`, a ``lightning.pytorch``
(or ``pytorch_lightning``) ``Callback`` that attaches :class:`theory.NoiseScaleMonitor` to the
``LightningModule``, logs the readings through the module's ``log_dict`` (so through the
Trainer's loggers) at the Trainer's logging steps (``log_every_n_steps``: the latest values
measured since the last one, logged only then, since Lightning's ``log`` costs about as much as
the monitor; as float64, where Lightning would make a Python number float32) and optionally drives a
batch-size policy (:mod:`theory.callbacks.common`). Needs ``pip install 'sparsescale[lightning]'``.

Where it reads: in ``on_before_optimizer_step``, after the step's last backward pass (with
``accumulate_grad_batches`` = k, the monitor's micro-batch estimator over the k passes, at loss
scale 1/k, the factor Lightning divides the loss by) and before Lightning clips the gradients.
Where it decides: in ``on_train_batch_end``, after the optimizer's step. Limits: automatic
optimization (or manual with the batch-mean loss and no accumulation); one optimizer for
``preconditioned=True``; no gradient scaler (``precision="16-mixed"`` unscales ``.grad`` before
the callback reads it, while the captured per-example terms stay scaled: refused); not under
DDP-type strategies (the parts are not, and the whole-model estimate under DDP needs the
monitor built on the DDP wrapper before its first backward). A policy's new batch size holds
from the next step (a loader with a length and ``num_workers=0``; Lightning fetches a batch
ahead only from a loader without a length), and Lightning counts an epoch's batches at its
start: a smaller batch ends the epoch after that many batches, before every example is seen, a
larger one ends it when the data runs out.
"""

from __future__ import annotations

from typing import Any

import torch

from theory.callbacks.common import Run, require
from theory.errors import TheoryError

pl = require(("lightning.pytorch", "pytorch_lightning"), "lightning",
             "theory.callbacks.lightning")


class NoiseScaleCallback(pl.Callback):
    """Logs the noise scale of every measured step as ``noise/b_simple``, ``noise/g_sq``,
    ``noise/trace_sigma``, their standard errors and per-step values, and each part's as
    ``noise/b_simple[<part>]`` ...; drives ``policy`` (module docstring).

    ``module``: the name of the network inside the ``LightningModule`` that ``training_step``
    calls (``"net"`` for ``self.net(x)``; default None: the ``LightningModule`` itself, called
    as ``self(x)``): the monitor's hooks see the forwards of the module they are attached to.
    ``preconditioned``: also the noise scale of the gradient preconditioned by the optimizer
    (an Adam or AdamW); ``policy`` / ``policy_options``: a policy object or function, or
    a name of :func:`theory.policies.builtin.make_policy` with its options (module docstring of
    :mod:`theory.callbacks.common`); ``decide_every``: ask the policy every that many measured steps;
    ``prefix``: the metrics' names start with it; ``options``: the monitor's keyword arguments
    (``window``, ``ema``, ``every``, ``per_layer``, ``norm_layers``, ``population``, ...)."""

    def __init__(self, *, module: str | None = None, preconditioned: bool = False,
                 policy: Any = None, policy_options: dict | None = None, decide_every: int = 1,
                 prefix: str = "noise/", **options: Any) -> None:
        super().__init__()
        self.module = module
        self.run = Run(preconditioned=preconditioned, policy=policy,
                       policy_options=policy_options, decide_every=decide_every, prefix=prefix,
                       options=options)
        self.pending: dict[str, float] = {}
        self.stepped = False
        self.run.hint = ("; if training_step calls a network inside the LightningModule "
                         "(self.net(x)), name it: NoiseScaleCallback(module='net')")

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            raise TheoryError("NoiseScaleCallback: a gradient scaler (precision='16-mixed') "
                              "unscales .grad before the callback reads it; use bf16 or 32-bit")
        optimizers = trainer.optimizers
        if self.run.preconditioned and len(optimizers) != 1:
            raise TheoryError(f"preconditioned=True needs one optimizer, the run has "
                              f"{len(optimizers)}")
        try:
            model = pl_module if self.module is None else pl_module.get_submodule(self.module)
        except AttributeError:
            names = [name for name, _ in pl_module.named_children()]
            raise TheoryError(f"module={self.module!r}: the {type(pl_module).__name__} has no such "
                              f"sub-module; its children: {', '.join(names) or 'none'}") from None
        self.run.start(model, optimizers[0] if optimizers else None)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.pending.update(self.run.read(1.0 / trainer.accumulate_grad_batches))
        self.stepped = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self.stepped:          # a micro-batch before the step's last
            return
        self.stepped = False
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        self.pending.update(self.run.decide(
            trainer.global_step, trainer.optimizers[0], schedulers, trainer.train_dataloader,
            trainer.accumulate_grad_batches))
        connector = getattr(trainer, "_logger_connector", None)
        if self.pending and (connector is None or connector.should_update_logs):
            values, self.pending = self.pending, {}
            pl_module.log_dict({k: torch.tensor(v, dtype=torch.float64)
                                for k, v in values.items()},
                               on_step=True, on_epoch=False, batch_size=1)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.run.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.run.close()
