"""The ``sparsescale import`` and ``sparsescale export`` commands: measurements in from published
archives (:mod:`experiments.exchange`), results out in standard formats (:mod:`experiments.exchange.export`).

    sparsescale import batch-science WORKLOAD_DIR --out RUN_DIR --metric COLUMN --target X
                                     [--all] [--max-steps N] [--incomplete]
                                     [--first N | --every-trial] [--report]
    sparsescale export RUN_DIR --tensorboard DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _cmd_import(args: argparse.Namespace) -> int:
    from experiments.exchange import import_batch_science

    # --first left out: the importer's default (Shallue et al.'s first 100 complete trials)
    count = {"first": None} if args.every_trial else (
        {"first": args.first} if args.first is not None else {})
    done = import_batch_science(args.path, args.out, args.metric, args.target, all=args.all,
                                max_steps=args.max_steps, incomplete=args.incomplete, **count)
    for w in done:
        print(f"{w.name}: {w.batch_sizes} batch sizes, {w.reached} reached the goal -> {w.run_dir}")
    if args.report:
        from experiments.report.write import write_report

        for w in done:
            print(f"report: {write_report([w.run_dir])}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from experiments.exchange.export import export_tensorboard

    runs = export_tensorboard(args.run_dir, args.tensorboard)
    print(f"{runs} TensorBoard runs written to {args.tensorboard} "
          f"(view: tensorboard --logdir {args.tensorboard})")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``import`` and ``export`` on the top-level subcommand parser."""
    p = sub.add_parser("import", help="read published measurements into a run folder",
                       description="Read published measurements into run folders that "
                                   "`sparsescale report` reads like a study of this library's.")
    kinds = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    b = kinds.add_parser(
        "batch-science", help="Shallue et al. (2019)'s batch_science archive",
        description="Import a workload folder dataset/model/optimizer of Shallue et al. "
                    "(2019)'s batch_science archive (or, with --all, every workload below the "
                    "archive root): one group per batch size, its first 100 complete trials "
                    "by trial id (--first, --every-trial) with their parameters, status "
                    "(INFEASIBLE -> diverged; INCOMPLETE left out) and evaluations. "
                    "Steps-to-result is the archive's rule: the first evaluation with "
                    "COLUMN < X, at most --max-steps.")
    b.add_argument("path", metavar="WORKLOAD_DIR",
                   help="dataset/model/optimizer folder (with --all: the archive root)")
    b.add_argument("--out", required=True, type=Path,
                   help="new run folder (with --all: one run folder per workload below it)")
    b.add_argument("--metric", required=True, metavar="COLUMN",
                   help="measurements.csv column of the goal, e.g. val/classification_error")
    b.add_argument("--target", required=True, type=float, metavar="X",
                   help="goal: the first evaluation with COLUMN < X")
    b.add_argument("--all", action="store_true", help="import every workload below WORKLOAD_DIR")
    b.add_argument("--max-steps", type=int, metavar="N",
                   help="step budget: evaluations after step N do not count")
    b.add_argument("--incomplete", action="store_true",
                   help="count INCOMPLETE trials like COMPLETE ones (default: left out, as the "
                        "archive's loader does)")
    count = b.add_mutually_exclusive_group()
    count.add_argument("--first", type=int, metavar="N",
                       help="count the first N complete trials of each batch size, by trial id "
                            "(default: Shallue et al.'s first 100)")
    count.add_argument("--every-trial", action="store_true",
                       help="count every complete trial, however many")
    b.add_argument("--report", action="store_true", help="write each run folder's report too")
    b.set_defaults(fn=_cmd_import)

    p = sub.add_parser("export", help="write a run folder's results in a standard format",
                       description="Write every trial's curves and every group's summary of a "
                                   "run folder as TensorBoard event files (needs the "
                                   "tensorboard extra: pip install 'sparsescale[tensorboard]').")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--tensorboard", required=True, type=Path, metavar="DIR",
                   help="folder for the event files (one TensorBoard run per trial and per "
                        "series of group summaries)")
    p.set_defaults(fn=_cmd_export)
