"""A measurement of the user's own, written in one module outside the library's packages (here in
tmp_path) and named in a spec by import path: a tiny study runs it, its rows are in the store,
its section and figure are in the report, and no file of the four packages is touched."""

import math
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import experiments
from experiments import measurement
from experiments.run.workload import Workload

from ..conftest import TINY, forget_imports

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("training", "pruning", "theory", "experiments")

MYMEASURES = textwrap.dedent('''\
    """The weight norm at five points of every group's best run: a measurement of my own."""
    import matplotlib.pyplot as plt
    import torch

    from experiments.measurement import Measurement, Part, Table
    from experiments.measures.replay import best_runs
    from experiments.report.figures.measurement import png_bytes
    from experiments.report.sections import Figure, Section, table_section


    class WeightNorm(Measurement):
        """|w|: the Euclidean norm of the weight matrices (masked weights are zero)."""

        tables = (Table("weight_norm", ("sparsity", "seed", "batch_size", "step", "norm"),
                        "sparsity REAL NOT NULL, seed INTEGER NOT NULL, "
                        "batch_size INTEGER NOT NULL, step INTEGER NOT NULL, norm REAL NOT NULL, "
                        "PRIMARY KEY (sparsity, seed, batch_size, step)",
                        sort=("sparsity", "seed", "batch_size", "step")),)

        def start(self, ctx):
            rows = []
            for run in best_runs(ctx):
                steps = [round(run.horizon * i / 4) for i in range(5)]
                for step, state in run.states(steps).items():
                    norm = sum(float((w.double() ** 2).sum()) for name, w in state.items()
                               if name.endswith("weight")) ** 0.5
                    rows.append((run.sparsity, run.seed, run.batch_size, step, norm))
            ctx.store.replace_rows({"weight_norm": rows})

        def report(self, ctx):
            frame = ctx.runs.tables["weight_norm"]
            if not len(frame):
                return Part()
            fig, ax = plt.subplots(figsize=(4, 3))
            for (series, b), g in frame.groupby(["series", "batch_size"]):
                ax.plot(g["step"], g["norm"], "o-", label=f"{series}, B = {b}")
            ax.set_xlabel("step")
            ax.set_ylabel("|w|")
            ax.legend(fontsize=6)
            shown = frame[["series", "batch_size", "step", "norm"]].astype(str)
            return Part(sections=(Section("Weight norm along the best runs", 2, (
                table_section("|w| at five points of each best run", shown),
                Figure("fig_weight_norm", "Weight norm along the run",
                       "|w| of the weight matrices at five evenly spaced steps.",
                       png_bytes(fig)))),))
    ''')


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A folder holding ``mymeasures.py`` and a spec naming its measurement; the study run in
    one thread, with its report. Afterwards this process forgets the module and the entry."""
    tmp_path = tmp_path_factory.mktemp("own_measurement")
    (tmp_path / "mymeasures.py").write_text(MYMEASURES)
    text = TINY.replace("seeds = [0]\n",
                        'seeds = [0]\nmeasures = ["mymeasures:WeightNorm"]\n')
    (tmp_path / "own.toml").write_text(text)
    path = list(sys.path)
    try:
        with measurement.MEASURES.preserved():
            out = experiments.run_study(tmp_path / "own.toml", out=tmp_path / "run",
                                        executor=ThreadPoolExecutor(1), quiet=True)
            yield tmp_path, out, sys.modules["mymeasures"]
    finally:
        forget_imports(("mymeasures",))
        sys.path[:] = path


def test_a_measurement_of_ones_own_runs_is_stored_and_reported(study):
    folder, out, module = study
    assert Path(module.__file__).parent == folder                  # one module of the user's
    assert not any(Path(module.__file__).is_relative_to(ROOT / p) for p in PACKAGES)
    res = experiments.load_results(out)
    spec = res.spec
    assert spec.measures == ("mymeasures:WeightNorm",)
    assert len(spec.measure_digests["mymeasures:WeightNorm"]) == 64   # its module keys the study
    rows = res.weight_norm
    reached = res.groups[res.groups.steps_to_result.notna()]
    assert len(reached) and len(rows)
    # five points of every reached group's best run (fewer where the run is short)
    assert set(zip(rows.sparsity, rows.batch_size)) == set(zip(reached.sparsity,
                                                               reached.batch_size))
    # at step 0 every best run is its initialization: |w| of the model (masked when sparse)
    # the workload builds, summed in float64 here
    workload = Workload.of(spec)
    dataset = workload.load_dataset()
    for s in sorted(set(rows.sparsity)):
        model = workload.build_model(dataset, 0)
        mask = workload.mask(dataset, s, 0) or {}
        expected = math.sqrt(sum(float(((p.detach().double() * mask.get(n, 1)) ** 2).sum())
                                 for n, p in model.named_parameters() if n.endswith("weight")))
        first = rows[(rows.sparsity == s) & (rows.step == 0)].norm
        assert first.to_numpy() == pytest.approx(expected, rel=1e-12)
    md = (out / "report.md").read_text()
    assert "## Weight norm along the best runs" in md
    assert "Weight norm along the run" in md
    assert (out / "figures" / "fig_weight_norm.png").read_bytes()[:4] == b"\x89PNG"


def test_a_rerun_measures_nothing_again(study):
    """The default :meth:`Measurement.pending`: the table holds rows, so a rerun leaves them."""
    folder, out, _ = study
    before = experiments.load_results(out).weight_norm
    experiments.run_study(folder / "own.toml", out=out, executor=ThreadPoolExecutor(1),
                          quiet=True, report=False)
    assert experiments.load_results(out).weight_norm.equals(before)


def test_a_name_that_is_no_measurement_is_refused(tmp_path):
    (tmp_path / "notmeasures.py").write_text("def f():\n    return 1\n")
    text = TINY.replace("seeds = [0]\n", 'seeds = [0]\nmeasures = ["notmeasures:f", "branching"]\n')
    try:
        with measurement.MEASURES.preserved(), pytest.raises(experiments.SpecError) as info:
            experiments.loads_spec(text, folders=(str(tmp_path),))
    finally:
        forget_imports(("notmeasures",))
    problems = info.value.problems
    assert any(p.startswith("measures[0]") and "Measurement" in p for p in problems)
    # a built-in kind is asked for by its own table, not in measures
    assert any(p.startswith("measures[1]") and "package.module:Class" in p for p in problems)


def test_a_taken_name_or_table_is_refused_in_one_line():
    class Mine(measurement.Measurement):
        tables = (measurement.Table("branching", ("x",), "x REAL"),)

    with measurement.MEASURES.preserved():
        with pytest.raises(measurement.MeasurementError, match="table 'branching'.*owned by"):
            measurement.add_instance("mine", Mine)
        with pytest.raises(measurement.MeasurementError, match="already registered"):
            measurement.register("probes")(type("Other", (measurement.Measurement,), {}))
