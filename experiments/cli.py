"""The ``sparsescale`` command line: study, report, probe, list, bench, bench ddp, import, export.

Bad input (a spec problem, an unknown data set, a store holding another study) prints one
``error: ...`` line per problem and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from .cli_exchange import add_parsers as add_exchange_parsers

DESCRIPTION = """\
Measure how batch size and sparsity change the steps a network needs to reach a goal, beside
what theory predicts from gradient noise and smoothness."""


def _cmd_study(args: argparse.Namespace) -> int:
    from . import runner
    from .spec import check_against_dataset, load

    spec = load(args.config)
    if args.dry_run:
        for variant in spec.variants():
            dataset = runner.load_dataset(variant.canonical()["workload"])
            check_against_dataset(variant, dataset.n_train)
            print(format_plan(variant, runner.plan(variant)))
        return 0
    run_dir = runner.run_study(spec, out=args.out, workers=args.workers, quiet=args.quiet,
                               dask=args.dask, report=not args.no_report,
                               cost_model=not (args.no_cost_model or args.no_report))
    print(f"study written to {run_dir}")
    return 1 if _report_failures(run_dir) else 0


def _report_failures(run_dir: Path) -> int:
    """Print one line per failed group (they are retried by the next run); return their count."""
    from .store import DB_NAME, load_results

    dirs = [run_dir] if (run_dir / DB_NAME).exists() else sorted(
        p.parent for p in run_dir.glob(f"*/{DB_NAME}"))
    failed = 0
    for d in dirs:
        groups = load_results(d).groups
        for g in groups[groups.status == "failed"].itertuples():
            first = (g.error or "").splitlines()[0] if g.error else "unknown error"
            print(f"error: group sparsity={g.sparsity:g} batch_size={g.batch_size} "
                  f"seed={g.seed} failed: {first} (rerun the same command to retry)",
                  file=sys.stderr)
            failed += 1
    return failed


def format_plan(spec, groups) -> str:
    """The plan as text: one line per (sparsity, batch size) with its step budget, and the total
    cost in trial-steps (an upper bound: every trial running its whole budget)."""
    lines = [f"study {spec.name!r}: {spec.dataset} / {spec.model} / {spec.optimizer}, goal "
             f"{spec.metric} {'<' if spec.strict else '<='} {spec.target}",
             f"{len(groups)} groups = {len(spec.sparsities)} sparsities x "
             f"{len(spec.batch_sizes)} batch sizes x {len(spec.seeds)} seeds, "
             f"{spec.trials} trials each",
             f"{'sparsity':>8} {'batch':>6} {'max_steps':>9} {'trial-steps':>12}"]
    for g in groups:
        lines.append(f"{g.sparsity:>8g} {g.batch_size:>6} {g.max_steps:>9} {g.cost:>12,}")
    total = sum(g.cost for g in groups)
    examples = sum(g.cost * g.batch_size for g in groups)
    lines.append(f"estimated cost: at most {total:,} trial-steps ({examples:,} examples)")
    return "\n".join(lines)


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report

    dirs = [Path(d) for d in args.run_dirs]
    path = write_report(dirs, Path(args.out) if args.out else None)
    print(f"report: {path}")
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    import training

    from .probes import PROBE_THREADS, probe_network, torch_threads

    options = dict(_parse_option(o) for o in args.dataset_option)
    ds = training.data.load(args.dataset, **options)
    net = training.models.build(args.model, ds, seed=args.seed)
    mask = None
    if args.sparsity > 0:
        import pruning

        mask = pruning.prune(net, args.method, args.sparsity, data=ds, seed=args.seed)
        mask.apply(net)
    with torch_threads(PROBE_THREADS):
        values = probe_network(net, ds, mask, examples=args.examples, seed=args.seed)
    print(f"{args.model} on {args.dataset}, sparsity {args.sparsity:g}"
          + (f" ({args.method})" if mask is not None else "") + f", {args.examples} examples:")
    for name, value in values.items():
        print(f"  {name:<12} {value:.6g}")
    return 0


def _parse_option(text: str) -> tuple[str, object]:
    import json

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--dataset-option {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _cmd_list(args: argparse.Namespace) -> int:
    import training

    from .spec import list_configs

    sections = {"data sets": training.data.list_datasets(),
                "models": training.models.list_models(), "configs": list_configs()}
    try:
        import pruning

        sections["pruning methods"] = list(pruning.list_methods())
    except (ImportError, AttributeError):
        sections["pruning methods"] = []
    for title, names in sections.items():
        print(f"{title}: {', '.join(names)}")
    return 0


BENCH_HELP = """\
sparsescale bench [options]      the vectorized trainer against the plain torch.optim loop
                                 (training.bench; options below)
sparsescale bench ddp [options]  DDP step time against workers k and per-worker batch, fitted to
                                 t(B, k) = t_fixed + t_example B / k + t_allreduce(P, k); save it
                                 with --out RUN_DIR/cost_model.json and `sparsescale report
                                 RUN_DIR` adds time-to-result on k workers (training.distributed;
                                 see `sparsescale bench ddp --help`)
"""


def _bench(argv: list[str]) -> int:
    """``bench ddp ...`` -> training.distributed.bench_main, ``bench ...`` -> training.bench.main
    (each parses its own options)."""
    if argv[:1] == ["ddp"]:
        from training import distributed

        return int(distributed.bench_main(argv[1:]) or 0)
    from training import bench

    if "-h" in argv or "--help" in argv:
        print(BENCH_HELP)
    return int(bench.main(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparsescale", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "study", help="run (or complete) a study from a TOML config",
        description="Run a batch-size x sparsity study: train every group (sparsity, batch size, "
                    "seed), probe gradient noise and smoothness, write the report. A rerun into "
                    "the same folder skips finished groups.")
    p.add_argument("config", help="TOML study file, or the name of a bundled config "
                                  "(see `sparsescale list`)")
    p.add_argument("--out", help="run folder (default runs/<study name>)")
    p.add_argument("--workers", type=int, help="worker processes (default: [executor] workers "
                                               "of the config, else the CPU count)")
    p.add_argument("--dask", metavar="ADDRESS",
                   help="run groups on a Dask cluster: tcp://host:port, or 'local' for a "
                        "LocalCluster on loopback (needs the dask extra)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, print the plan and its estimated cost, train nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--no-report", action="store_true",
                   help="store results and probes only (write the report later with "
                        "`sparsescale report RUN_DIR`)")
    p.add_argument("--no-cost-model", action="store_true",
                   help="skip this machine's DDP cost model (otherwise measured once per machine "
                        "and workload, cached, and copied into the run folder as cost_model.json "
                        "for the report's time-to-result section)")
    p.set_defaults(fn=_cmd_study)

    p = sub.add_parser("report", help="write the report of one or more run folders",
                       description="Write report.html, report.md, figures/ and summary.csv from "
                                   "the stores of the given run folders; a run folder holding "
                                   "cost_model.json (`sparsescale bench ddp --out "
                                   "RUN_DIR/cost_model.json`) adds predicted time-to-result on "
                                   "k workers and time_to_result.csv.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", help="report folder (default: the first run folder)")
    p.set_defaults(fn=_cmd_report)

    p = sub.add_parser("probe", help="gradient noise and smoothness of one network at init",
                       description="Measure |G|^2, tr(Sigma), B_simple, B_noise, the top Hessian "
                                   "eigenvalue and the loss of one (optionally pruned) network "
                                   "at initialization.")
    p.add_argument("--dataset", default="mnist1d")
    p.add_argument("--dataset-option", action="append", default=[], metavar="KEY=VALUE",
                   help="data set option, repeatable (e.g. num_samples=2000)")
    p.add_argument("--model", default="mlp")
    p.add_argument("--sparsity", type=float, default=0.0, help="fraction of weights pruned")
    p.add_argument("--method", default="snip", help="pruning method (see `sparsescale list`)")
    p.add_argument("--examples", type=int, default=512, help="training examples used")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_cmd_probe)

    add_exchange_parsers(sub)

    p = sub.add_parser("list", help="list data sets, models, pruning methods and bundled configs",
                       description="List the names accepted in study configs.")
    p.set_defaults(fn=_cmd_list)

    # listed for the top-level help only: main() hands `bench ...` to the benchmark whole (see
    # _bench), so `sparsescale bench [ddp] --help` shows that benchmark's own options
    sub.add_parser("bench", help="benchmarks: `bench` the vectorized trainer against the plain "
                                 "loop, `bench ddp` DDP step times and the wall-clock cost model "
                                 "(see `sparsescale bench --help`)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sparsescale`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        command = partial(_bench, argv[1:])
    else:
        args = build_parser().parse_args(argv)
        command = partial(args.fn, args)
    from .spec import SpecError

    try:
        return command()
    except SpecError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished groups are stored; rerun the same command to continue",
              file=sys.stderr)
        return 130
    except ValueError as exc:   # DataError, ModelError, StoreError, ... name what is wrong
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
