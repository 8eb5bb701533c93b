"""The trainers' keyword forms before :class:`training.RunConfig`, kept for one release.

``train_reference(net, ds, batch_size=64, lr=0.1, ..., steps=500, stop_at_goal=True)``,
``train_trials(net, ds, batch_size=64, trials=[...], optimizer=..., target=..., max_steps=...)``
and ``train_distributed(net, ds, 2, batch_size=64, lr=0.1, ...)`` still work: each warns
(``DeprecationWarning``) and is translated into the new call, so both forms give bit-identical
results. ``stop_at_goal=True`` / ``False`` is ``stop="first"`` / ``"never"``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .config import EvalSchedule, RunConfig, Trial, check_batch_size, is_int
from .errors import ConfigError

Translation = tuple[tuple[Any, ...], dict[str, Any]]


def accepts_old_form(translate: Callable[..., Translation], new_form: str):
    """Decorate a trainer whose 4th argument is ``run``: a call whose ``run`` is not a
    :class:`RunConfig` is an old-form call, translated by ``translate(*args, **kwargs) ->
    (args, kwargs)`` after a DeprecationWarning that shows ``new_form``."""

    def decorate(trainer: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(trainer)
        def call(*args: Any, **kwargs: Any) -> Any:
            run = kwargs["run"] if "run" in kwargs else args[3] if len(args) > 3 else None
            if isinstance(run, RunConfig):
                return trainer(*args, **kwargs)
            # old forms pass an integer third (batch size, or world size for DDP)
            if "run" in kwargs or (len(args) > 3 and not is_int(args[2])):
                raise ConfigError(f"{trainer.__name__}: run must be a training.RunConfig, got "
                                  f"{type(run).__name__}")
            warnings.warn(f"this form of {trainer.__name__} is deprecated and will be removed in "
                          f"the next release; call {new_form}", DeprecationWarning, stacklevel=2)
            new_args, new_kwargs = translate(*args, **kwargs)
            return trainer(*new_args, **new_kwargs)

        return call

    return decorate


def _run(dataset: Any, batch_size: Any, optimizer: str, max_steps: int, target: Any,
         eval_schedule: EvalSchedule | None, stop: str, seed: int, dtype: torch.dtype,
         device: str) -> RunConfig:
    # the range check first: it names the training set size, as the old forms did
    check_batch_size(batch_size, dataset.n_train)
    return RunConfig(batch_size=batch_size, optimizer=optimizer, max_steps=max_steps,
                     goal=target, eval_schedule=eval_schedule or EvalSchedule(), stop=stop,
                     seed=seed, dtype=dtype, device=device)


def reference_args(model: Any, dataset: Any, batch_size: int, lr: float, momentum: float = 0.0,
                   optimizer: str = "momentum", steps: int = 500, seed: int = 0,
                   trial_index: int = 0, decay_steps: int | None = None,
                   end_factor: float = 1.0, target: Any = None,
                   eval_schedule: EvalSchedule | None = None, stop_at_goal: bool = True,
                   mask: Mapping[str, torch.Tensor] | None = None,
                   dtype: torch.dtype = torch.float32, device: str = "cpu",
                   beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                   weight_decay: float = 0.0) -> Translation:
    """The old ``train_reference`` signature (with the Adam keys of ``adam`` / ``adamw``), as
    the new call's arguments."""
    trial = Trial(lr=lr, momentum=momentum, decay_steps=decay_steps, end_factor=end_factor,
                  beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    run = _run(dataset, batch_size, optimizer, steps, target, eval_schedule,
               "first" if stop_at_goal else "never", seed, dtype, device)
    return (model, dataset, trial, run), {"mask": mask, "trial_index": trial_index}


def trials_args(model: Any, dataset: Any, batch_size: int, trials: Any,
                optimizer: str = "momentum", target: Any = None, max_steps: int = 1000,
                masks: Mapping[str, torch.Tensor] | None = None, seed: int = 0,
                eval_schedule: EvalSchedule | None = None, stop: str = "first",
                device: str = "cpu", dtype: torch.dtype = torch.float32,
                trials_per_chunk: int | None = None, first_index: int = 0) -> Translation:
    """The old ``train_trials`` signature, as the new call's arguments."""
    run = _run(dataset, batch_size, optimizer, max_steps, target, eval_schedule, stop, seed,
               dtype, device)
    return (model, dataset, trials, run), {"masks": masks, "trials_per_chunk": trials_per_chunk,
                                           "first_index": first_index}


def distributed_args(model: Any, dataset: Any, world_size: int, batch_size: int, lr: float,
                     momentum: float = 0.0, optimizer: str = "momentum", steps: int = 500,
                     seed: int = 0, trial_index: int = 0, decay_steps: int | None = None,
                     end_factor: float = 1.0, target: Any = None,
                     eval_schedule: EvalSchedule | None = None, stop_at_goal: bool = True,
                     mask: Mapping[str, torch.Tensor] | None = None,
                     dtype: torch.dtype = torch.float32, device: str = "cpu", threads: int = 1,
                     timeout: float = 300.0, beta1: float = 0.9, beta2: float = 0.999,
                     eps: float = 1e-8, weight_decay: float = 0.0) -> Translation:
    """The old ``train_distributed`` signature (with the Adam keys), as the new call's
    arguments."""
    (model, dataset, trial, run), kwargs = reference_args(
        model, dataset, batch_size, lr, momentum, optimizer, steps, seed, trial_index,
        decay_steps, end_factor, target, eval_schedule, stop_at_goal, mask, dtype, device,
        beta1, beta2, eps, weight_decay)
    return (model, dataset, trial, run), dict(kwargs, world_size=world_size, threads=threads,
                                              timeout=timeout)
