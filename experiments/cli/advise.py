"""``sparsescale advise``: a recommended batch size from one short run with branches
(:func:`experiments.run.advise.advise`), printed and written as a short report."""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.cli.options import add_device_argument, device_of
from experiments.run.advise import (
    DEFAULT_FRACTIONS, DEFAULT_K_MAX, DEFAULT_LR_TRIALS, DEFAULT_PROBE_EXAMPLES, DEFAULT_SEEDS,
)


def _cmd_advise(args: argparse.Namespace) -> int:
    from experiments.run.advise import advise, write_advice
    from experiments.spec.study import load

    spec = device_of(args, load(args.config, model=args.model, dataset=args.dataset))
    advice = advise(spec, sparsity=args.sparsity, seed=args.seed, batch_size=args.batch_size,
                    lr=args.lr, lr_trials=args.lr_trials, at=args.at, k_max=args.k_max,
                    seeds=args.seeds, probe_examples=args.probe_examples, quiet=args.quiet,
                    fractions=tuple(sorted({*DEFAULT_FRACTIONS, args.at})))
    print(advice.summary())
    if args.schedule:
        from experiments.run.advise_schedule import schedule_advice

        seed = spec.seeds[0] if args.seed is None else args.seed
        print(schedule_advice(spec, advice, seed=seed, replicates=args.schedule).summary())
    out = Path(args.out) if args.out else Path("runs") / "advise" / (
        spec.name + (f"-sparsity{args.sparsity:g}" if args.sparsity else ""))
    print(f"report: {write_advice(advice, out)}")
    return 0


def add_advise_parser(sub: argparse._SubParsersAction, name: str = "advise") -> None:
    """The ``advise`` subcommand."""
    p = sub.add_parser(
        name, help="recommend a batch size from one short run, without a sweep",
        description="Recommend a batch size for a study spec's workload without its sweep: a "
                    "short learning-rate search and one base run at a small batch size with "
                    "gradient-noise probes (B_simple) along it, branches from its checkpoints "
                    "at larger batches (Merrill et al. 2025); prints the critical batch at the "
                    "goal with its interval, the predicted steps and time to the goal per batch "
                    "size and the cost as a fraction of the equivalent sweep (with a spec's "
                    "delays, the critical delay next to the critical batch), and writes a "
                    "report (Markdown, HTML, figure, CSV).")
    p.add_argument("config", help="TOML study file or bundled config name: its goal, optimizer, "
                                  "search space, budget, batch sizes and workload")
    p.add_argument("--model", help="replace the spec's model: a registered name or "
                                   "\"package.module:factory\"")
    p.add_argument("--dataset", help="replace the spec's data set: a registered name or "
                                     "\"package.module:factory\"")
    p.add_argument("--sparsity", type=float, default=0.0,
                   help="fraction of weights pruned by the spec's pruning criterion (default 0)")
    p.add_argument("--seed", type=int, help="initialization, mask and data seed (default: the "
                                            "spec's first)")
    p.add_argument("--batch-size", type=int, help="base batch size B_0 (default: the largest power "
                                                  "of two with k_max B_0 <= the training set)")
    p.add_argument("--lr", type=float, help="the base run's learning rate (default: the best of "
                                            "--lr-trials points of the spec's search)")
    p.add_argument("--lr-trials", type=int, default=DEFAULT_LR_TRIALS,
                   help=f"points of the learning-rate search (default {DEFAULT_LR_TRIALS})")
    p.add_argument("--at", type=float, default=1.0,
                   help="recommend the critical batch at this fraction of the base run's steps to "
                        "the goal (default 1: at the goal)")
    p.add_argument("--k-max", type=int, default=DEFAULT_K_MAX,
                   help=f"largest branch factor, a power of two (default {DEFAULT_K_MAX})")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help=f"branch seeds, >= 3 (default {DEFAULT_SEEDS})")
    p.add_argument("--probe-examples", type=int, default=DEFAULT_PROBE_EXAMPLES,
                   help=f"training examples per noise probe (default {DEFAULT_PROBE_EXAMPLES})")
    p.add_argument("--schedule", type=int, metavar="REPLICATES", nargs="?", const=5, default=0,
                   help="also run the CBS warmup and goodput policies (theory.policies) against "
                        "the recommended fixed batch size over REPLICATES data orders (default "
                        "5) and recommend a schedule where one measurably beats it")
    p.add_argument("--out", help="report folder (default runs/advise/<study name>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_argument(p, what="run, branch and probe")
    p.set_defaults(fn=_cmd_advise)
