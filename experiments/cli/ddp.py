"""``sparsescale ddp``: one DistributedDataParallel trial on the workers torchrun started
(``torchrun --nproc-per-node K -m experiments.cli ddp [options]``), and the workload options it
shares with ``sparsescale bench ddp``. The trainer is :mod:`training.distributed.trainer`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training import data, models
from training.config import EvalSchedule, RunConfig, Trial
from training.data import Dataset
from training.distributed.trainer import DistRun, env_rendezvous, train_env_rank
from training.errors import ConfigError


def options(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` strings as a dict, values parsed as JSON where they are JSON."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"option {item!r} must look like key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The data set, model and device options of the DDP commands."""
    p.add_argument("--dataset", default="mnist1d", help="data set name (training.data)")
    p.add_argument("--data-option", action="append", default=[], metavar="KEY=VALUE",
                   help="data set option, e.g. num_samples=1000 (repeatable)")
    p.add_argument("--model", default="mlp", help="model name (training.models)")
    p.add_argument("--model-seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))


def build_workload(args: argparse.Namespace) -> tuple[nn.Module, Dataset]:
    """The model and data set named by :func:`add_workload_arguments`' options."""
    ds = data.load(args.dataset, **options(args.data_option))
    return models.build(args.model, ds, seed=args.model_seed), ds


def run_train_command(args: argparse.Namespace) -> int:
    """One trial under ``torchrun`` (env:// rendezvous). Rank 0 prints a summary and saves the
    :class:`ReferenceResult` with ``torch.save`` to ``--out``. Returns 0."""
    _, world = env_rendezvous()
    dist_run = DistRun(
        Trial(lr=args.lr, momentum=args.momentum, decay_steps=args.decay_steps,
              end_factor=args.end_factor, beta1=args.beta1, beta2=args.beta2, eps=args.eps,
              weight_decay=args.weight_decay),
        RunConfig(batch_size=args.batch_size, optimizer=args.optimizer, max_steps=args.steps,
                  goal=args.target, eval_schedule=EvalSchedule(every=args.eval_every),
                  seed=args.seed, device=args.device),
        world_size=world, trial_index=args.trial_index, threads=args.threads)
    model, ds = build_workload(args)
    rank, res = train_env_rank(model, ds, dist_run, args.device)
    if rank == 0:
        print(f"world_size={world} batch_size={args.batch_size} steps_run={res.steps_run} "
              f"steps_to_result={res.steps_to_result} diverged={res.diverged} "
              f"final_metric={res.curve.metric[-1] if len(res.curve) else float('nan'):.4f}")
        if args.out:
            torch.save(res, args.out)
    return 0


def add_train_parser(subparsers: Any, name: str = "ddp") -> Any:
    """Add the ``name`` subcommand (``sparsescale ddp``): one trial on the workers torchrun
    started. Its options are those of :func:`training.distributed.train_distributed`; the handler
    :func:`run_train_command` is set as the subcommand's ``fn`` default and returned."""
    p = subparsers.add_parser(
        name, help="train one trial with DistributedDataParallel under torchrun",
        description="Train one trial on the workers torchrun started (env:// rendezvous): "
                    "torchrun --nproc-per-node K -m experiments.cli ddp [options]. Rank 0 "
                    "prints a summary and saves the result with --out.")
    add_workload_arguments(p)
    p.add_argument("--batch-size", type=int, required=True, help="global batch B")
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--optimizer", default="momentum")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trial-index", type=int, default=0)
    p.add_argument("--decay-steps", type=int)
    p.add_argument("--end-factor", type=float, default=1.0)
    p.add_argument("--beta1", type=float, default=0.9, help="adam / adamw")
    p.add_argument("--beta2", type=float, default=0.999, help="adam / adamw")
    p.add_argument("--eps", type=float, default=1e-8, help="adam / adamw")
    p.add_argument("--weight-decay", type=float, default=0.0, help="adam / adamw")
    p.add_argument("--target", type=float)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path)
    p.set_defaults(fn=run_train_command)
    return run_train_command
