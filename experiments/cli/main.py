"""The ``sparsescale`` command line; every command is an argparse subcommand:

- ``study``, ``report``, ``probe``, ``list``: studies, reports, probes and names (here);
- ``branch``: the critical batch by branching (and its warmup) for a stored study or a spec
  (:mod:`experiments.measures.branching.tasks`);
- ``advise``: a recommended batch size from one short run with branches, without a sweep
  (:mod:`experiments.cli.advise`);
- ``design``: the runs or pairs a study needs for a stated resolution, from a pilot's store
  (:mod:`experiments.cli.design`);
- ``bench`` (the vectorized trainer against the plain loop, :mod:`training.bench.speed`) and
  ``bench ddp`` (DDP step times and the wall-clock cost model, :mod:`training.distributed.bench`);
- ``ddp``: one DistributedDataParallel trial on the workers ``torchrun`` started
  (:mod:`training.distributed.trainer`);
- ``import`` (published measurements into run folders) and ``export`` (a run folder's results in
  standard formats): :mod:`experiments.cli.exchange`.

Every ``training.SparsescaleError`` prints ``error: ...`` on one line (one line per spec
problem), without a traceback, and exits with a status that says which kind it is:

- 2: bad input, a ``ValueError`` (a spec problem, an unknown data set, a store holding another
  study, a malformed archive); bad options are argparse's usage errors, also status 2;
- 1: a storage or IO failure, an ``OSError`` (a store locked or in use by another process, a
  read-only run folder, a full disk, a file that cannot be read); the line names the path.

A study whose groups failed also exits with status 1, after one line per failed group.

Ctrl-C (SIGINT) and SIGTERM (``kill``, systemd, Kubernetes, SLURM's time limit) stop a command
the same way: the work in flight is abandoned, what is finished is stored, the worker processes
are ended, one line says so, and the status is 130 or 143 (128 + the signal's number).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from training.errors import SparsescaleError
from training.processes.setup import setup_training_process

from experiments.cli import bench, ddp
from experiments.cli.advise import add_advise_parser
from experiments.cli.design import add_design_parser
from experiments.cli.exchange import add_parsers as add_exchange_parsers
from experiments.cli.options import Renamed, add_device_argument, device_of
from experiments.spec.errors import SpecError
from experiments.spec.tables.executor import PROGRAM_CHOICES

DESCRIPTION = """\
Measure how batch size and sparsity change the steps a network needs to reach a goal, beside
what theory predicts from gradient noise and smoothness."""
EPILOG = ("benchmarks: `sparsescale bench` times the vectorized trainer against the plain loop; "
          "`sparsescale bench ddp` measures DDP step times and fits the wall-clock cost model "
          "(see `sparsescale bench --help`)")
BENCH_EPILOG = ("`sparsescale bench ddp --out RUN_DIR/cost_model.json` saves the fitted cost "
                "model t(B, k) = t_fixed + t_example B / k + t_allreduce(P, k) into a run folder; "
                "`sparsescale report RUN_DIR` then adds the predicted time-to-result on k workers "
                "(see `sparsescale bench ddp --help`)")


def _cmd_study(args: argparse.Namespace) -> int:
    from experiments.run import runner
    from experiments.spec.study import load

    spec = device_of(args, load(args.config))
    if args.dry_run:
        return _dry_run(spec, args.out)
    run_dir = runner.run_study(spec, out=args.out, workers=args.workers, quiet=args.quiet,
                               dask=args.dask, report=not args.no_report,
                               cost_model=not (args.no_cost_model or args.no_report),
                               program_choice=args.program_choice)
    print(f"study written to {run_dir}")
    return 1 if _report_failures(run_dir) else 0


def _dry_run(spec, out: str | None) -> int:
    """Print the plan of each of ``spec``'s variants against its run folder: which groups it
    holds and which are new (all of them when the folder holds another study, e.g. the same
    spec before its factory's code changed: a run there is refused, which the note says)."""
    from experiments.run import runner
    from experiments.spec.plan import format_plan, plan
    from experiments.store.database import stored_study
    from experiments.store.refusals import other_study

    base = runner.run_folder(spec, out)
    for variant in spec.variants():
        runner.load_workload(variant)
        run_dir = base / variant.subdir
        info, done = stored_study(run_dir)
        print(f"run folder {run_dir}" + ("" if info else " (no store yet)"))
        note = None
        if info is not None and info.spec_hash != variant.hash:
            note = other_study(run_dir, info, runner.study_info(variant))
            done = set()
        print(format_plan(variant, plan(variant), done))
        if note:
            print(f"note: {note}")
    return 0


def _report_failures(run_dir: Path) -> int:
    """Print one line per failed group (they are retried by the next run); return their count."""
    from experiments.store.database import DB_NAME
    from experiments.store.results import load_results

    dirs = [run_dir] if (run_dir / DB_NAME).exists() else sorted(
        p.parent for p in run_dir.glob(f"**/{DB_NAME}"))   # sub-studies: <optimizer>/<series>
    failed = 0
    for d in dirs:
        groups = load_results(d).groups
        for g in groups[groups.status == "failed"].itertuples():
            first = (g.error or "").splitlines()[0] if g.error else "unknown error"
            delay = f" delay={g.delay}" if g.delay else ""
            print(f"error: group sparsity={g.sparsity:g} batch_size={g.batch_size}{delay} "
                  f"seed={g.seed} failed: {first} (rerun the same command to retry)",
                  file=sys.stderr)
            failed += 1
    return failed


def _cmd_report(args: argparse.Namespace) -> int:
    from experiments.report.write import write_report

    dirs = [Path(d) for d in args.run_dirs]
    path = write_report(dirs, Path(args.out) if args.out else None)
    print(f"report: {path}")
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    import pruning
    import training

    from experiments.run.executors import torch_threads
    from experiments.measures.probes.tasks import PROBE_THREADS, probe_network

    ds = training.data.load(args.dataset, **ddp.options(args.dataset_option))
    net = training.models.build(args.model, ds, seed=args.seed)
    mask = None
    if args.sparsity > 0:
        mask = pruning.prune(net, args.criterion, args.sparsity, dataset=ds, seed=args.seed)
        mask.apply(net)
    with torch_threads(PROBE_THREADS):
        values = probe_network(net, ds, mask, examples=args.examples, seed=args.seed)
    print(f"{args.model} on {args.dataset}, sparsity {args.sparsity:g}"
          + (f" ({args.criterion})" if mask is not None else "") + f", {args.examples} examples:")
    for name, value in values.items():
        print(f"  {name:<12} {value:.6g}")
    return 0


def _cmd_branch(args: argparse.Namespace) -> int:
    from experiments.run import runner
    from experiments.measures.branching.tasks import run_branching, with_overrides
    from experiments.spec.study import load
    from experiments.store.database import DB_NAME, StoreContentError, open_store
    from experiments.store.results import load_results
    from experiments.run.workload import Workload

    target = Path(args.target)
    if (target / DB_NAME).exists():
        run_dir, spec = target, load_results(target).spec
        if hasattr(spec, "device"):   # a stored spec does not keep its device: --device's
            spec = device_of(args, spec)
    else:   # a spec: run (or complete) its sweep and probes first
        spec = device_of(args, load(args.target))
        run_dir = runner.run_study(spec, out=args.out, workers=args.workers, quiet=args.quiet,
                                   report=False)
    if spec is None or not hasattr(spec, "branching"):
        raise StoreContentError(f"{run_dir} holds no study of this library's (an imported "
                                f"workload cannot be branched: its runs cannot be replayed)")
    settings = with_overrides(spec.branching, batch_size=args.batch_size, k_max=args.k_max, checkpoints=args.checkpoints,
                              seeds=args.seeds, eps=args.eps, window_fraction=args.window_fraction,
                              warmup=False if args.no_warmup else None)
    dataset = Workload.of(spec).load_dataset()
    with open_store(run_dir) as store:
        run_branching(spec, dataset, store, settings, quiet=args.quiet, redo=args.redo)
    b = load_results(run_dir).branching
    for r in b.itertuples(index=False):
        print(f"sparsity {r.sparsity:g} seed {r.seed} step {r.step:>6}: CBS = {r.critical_batch:g} "
              f"[{r.low:g}, {r.high:g}]")
    if not args.no_report:
        from experiments.report.write import write_report

        print(f"report: {write_report([run_dir], run_dir)}")
    return 0


def _key_value(text: str) -> str:
    """An argparse type: ``KEY=VALUE`` (the value is parsed later, as JSON where it is JSON)."""
    key, sep, _ = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def _cmd_list(args: argparse.Namespace) -> int:
    import pruning
    import training

    from experiments.spec.study import list_configs

    sections = {"data sets": training.data.list_datasets(),
                "models": training.models.list_models(), "configs": list_configs(),
                "pruning criteria": list(pruning.list_criteria())}
    for title, names in sections.items():
        print(f"{title}: {', '.join(names)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``sparsescale`` parser: each subcommand sets ``fn``, its handler."""
    parser = argparse.ArgumentParser(prog="sparsescale", description=DESCRIPTION, epilog=EPILOG)
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
    p.add_argument("--program-choice", choices=PROGRAM_CHOICES,
                   help="how the program of a cell no rule covers is chosen: 'measure' times "
                        "the candidates once per machine (a candidate replaces the rules' "
                        "program only when 10%% faster), 'rules' never times anything "
                        "(default: [executor] program_choice of the config, else "
                        "$SPARSESCALE_PROGRAM_CHOICE, else measure); the store records each "
                        "cell's program, which every later group of the cell runs")
    add_device_argument(p)
    p.set_defaults(fn=_cmd_study)

    p = sub.add_parser("report", help="write the report of one or more run folders",
                       description="Write report.html, report.md, figures/ and summary.csv from "
                                   "the stores of the given run folders; a run folder holding "
                                   "cost_model.json (put there by `sparsescale study`, or "
                                   "`sparsescale bench ddp --out RUN_DIR/cost_model.json`) adds "
                                   "predicted time-to-result on k workers and "
                                   "time_to_result.csv.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", help="report folder (default: the first run folder)")
    p.set_defaults(fn=_cmd_report)

    p = sub.add_parser("probe", help="gradient noise and smoothness of one network at init",
                       description="Measure |G|^2, tr(Sigma), B_simple, B_noise, the top Hessian "
                                   "eigenvalue and the loss of one (optionally pruned) network "
                                   "at initialization.")
    p.add_argument("--dataset", default="mnist1d")
    p.add_argument("--dataset-option", action="append", default=[], metavar="KEY=VALUE",
                   type=_key_value, help="data set option, repeatable (e.g. num_samples=2000)")
    p.add_argument("--model", default="mlp")
    p.add_argument("--sparsity", type=float, default=0.0, help="fraction of weights pruned")
    p.add_argument("--criterion", default="snip",
                   help="pruning criterion (see `sparsescale list`)")
    p.add_argument("--method", dest="criterion", action=Renamed, new="--criterion")
    p.add_argument("--examples", type=int, default=512, help="training examples used")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_cmd_probe)

    p = sub.add_parser(
        "branch", help="measure the critical batch by branching from checkpoints",
        description="CBS(t) (Merrill et al. 2025): branch short runs at k B from K checkpoints "
                    "of the best run at a small batch size of every sparsity level and seed, "
                    "and the batch-size warmup it suggests against fixed B. Given a spec, its "
                    "sweep runs (or completes) first. Settings: the spec's [branching] table, "
                    "then these options.")
    p.add_argument("target", metavar="RUN_DIR_OR_CONFIG",
                   help="a study's run folder, or a TOML study file / bundled config name")
    p.add_argument("--out", help="run folder for a spec (default runs/<study name>)")
    p.add_argument("--workers", type=int, help="worker processes for a spec's sweep")
    p.add_argument("--batch-size", type=int,
                   help="base run: the best trial at this batch size (default: [branching] "
                        "batch_size, else the smallest that reached the goal)")
    p.add_argument("--k-max", type=int, help="largest branch factor (a power of two)")
    p.add_argument("--checkpoints", type=int, help="checkpoints K along the base run")
    p.add_argument("--seeds", type=int, help="branch seeds (1, or >= 3 for intervals)")
    p.add_argument("--eps", type=float, help="relative loss tolerance (default 0.01)")
    p.add_argument("--window-fraction", type=float,
                   help="window W as a fraction of the base run's examples to its goal")
    p.add_argument("--no-warmup", action="store_true", help="skip the warmup comparison")
    add_device_argument(p, what="train and branch (a run folder's study: cpu unless given)")
    p.add_argument("--redo", action="store_true", help="measure again what the store holds")
    p.add_argument("--no-report", action="store_true", help="do not rewrite the report")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_branch)

    add_advise_parser(sub)
    add_exchange_parsers(sub)

    p = sub.add_parser("list", help="list data sets, models, pruning criteria and bundled configs",
                       description="List the names accepted in study configs.")
    p.set_defaults(fn=_cmd_list)

    add_design_parser(sub)

    bench.add_trainer_bench_parser(sub, "bench")
    bench_parser = sub.choices["bench"]
    bench_parser.epilog = BENCH_EPILOG
    bench.add_ddp_bench_parser(bench_parser.add_subparsers(dest="benchmark", metavar="BENCHMARK"),
                               "ddp")
    ddp.add_train_parser(sub, "ddp")
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by the handler :func:`main` installs: a
    ``KeyboardInterrupt``, so that every cleanup Ctrl-C runs (pools ended, the store closed)
    runs for it too."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sparsescale`` console script; returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    setup_training_process()   # this process may train: probes, benchmarks, in-process groups
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:   # not the main thread (main() called from a test's thread): no handler
        previous = None
    try:
        return int(args.fn(args) or 0)
    except SpecError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        name = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        print(f"{name}: finished groups are stored; rerun the same command to continue",
              file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    except SparsescaleError as exc:   # DataError, StoreIOError, ... name what is wrong
        print(f"error: {' '.join(str(exc).split()) or type(exc).__name__}", file=sys.stderr)
        return exit_status(exc)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def exit_status(exc: SparsescaleError) -> int:
    """1 for a storage or IO failure (an ``OSError``), 2 for bad input (a ``ValueError``)."""
    return 1 if isinstance(exc, OSError) else 2


if __name__ == "__main__":
    sys.exit(main())
