"""``sparsescale design``: from a pilot study's store, the variance components of a per-run
metric and the runs or pairs a study needs to resolve an effect
(:mod:`experiments.report.design_view`, :mod:`theory.verdicts.design`)."""

from __future__ import annotations

import argparse

from theory.verdicts.lee_stage import QUANTITY, STAGE_START


def _cmd_design(args: argparse.Namespace) -> int:
    from experiments.report.design_view import design, format_design
    from experiments.store.results import load_results

    points = tuple(float(p) for p in args.points.split(",")) if args.points else ()
    comps, delta, rows = design(load_results(args.run_dir), args.metric, args.start, args.scale,
                                args.effect, args.level, args.power, points, args.reference,
                                args.t)
    print(format_design(comps, delta, rows, args.metric, args.scale, args.effect))
    return 0


def add_design_parser(sub: argparse._SubParsersAction, name: str = "design") -> None:
    """The ``design`` subcommand."""
    p = sub.add_parser(
        name, help="runs or pairs needed to resolve an effect, from a pilot study's store",
        description="From a pilot study's store: the variance components of a per-run metric "
                    "(between runs, and between points within a run: a nested one-way ANOVA), "
                    "and the runs per level (unpaired) or pairs (runs that share their "
                    "initialization seed and data order across levels) needed to resolve an "
                    "effect at a given interval level and power, for several numbers of "
                    "points per run.")
    p.add_argument("run_dir", help="the pilot's run folder (its results.sqlite)")
    p.add_argument("--metric", default=QUANTITY,
                   help=f"a stage_probes quantity (default {QUANTITY}: Lee et al.'s L) or a "
                        "trials column (hit_step, final_metric)")
    p.add_argument("--start", type=int, default=STAGE_START,
                   help=f"first step of a stage_probes metric (default {STAGE_START})")
    p.add_argument("--scale", choices=("log", "linear"), default="log",
                   help="analysis scale (default log: --effect is relative)")
    p.add_argument("--effect", type=float, default=0.1,
                   help="the difference to resolve: relative on the log scale (0.1: 10 %%), "
                        "in the metric's units on the linear one (default 0.1)")
    p.add_argument("--level", type=float, default=0.9,
                   help="two-sided interval level (default 0.9)")
    p.add_argument("--power", type=float, default=0.8, help="power (default 0.8)")
    p.add_argument("--points", help="points per run to plan for, comma-separated (default: "
                                    "the pilot's, 2x, 4x and 8x)")
    p.add_argument("--reference", type=float, default=0.0,
                   help="the level the others are paired with (default 0: dense)")
    p.add_argument("--t", action="store_true",
                   help="Student's t quantiles instead of the normal approximation")
    p.set_defaults(fn=_cmd_design)
