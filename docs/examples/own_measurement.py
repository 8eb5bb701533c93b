"""A measurement of your own: the weight norm at five points of every group's best run, stored
in its own table, tabled and plotted in the report. This file is the one file it takes
(``own_measurement.py``); a study names the class by import path, and its digest keys the study.

The class is defined at import of this file, outside the ``__main__`` guard: the study imports it
by its path (``own_measurement:WeightNorm``), which runs this file's top level again as the
module ``own_measurement``.
"""
import matplotlib.pyplot as plt

import experiments
from experiments.measurement import Measurement, Part, Table
from experiments.measures.replay import best_runs
from experiments.report.figures.measurement import png_bytes
from experiments.report.sections import Figure, Section, table_section


class WeightNorm(Measurement):
    """|w|: the Euclidean norm of the network's weight matrices (pruned weights are zero) at
    five evenly spaced steps of each group's best run, from its start to its goal."""

    tables = (Table("weight_norm", ("sparsity", "seed", "batch_size", "step", "norm"),
                    "sparsity REAL NOT NULL, seed INTEGER NOT NULL, batch_size INTEGER NOT NULL, "
                    "step INTEGER NOT NULL, norm REAL NOT NULL, "
                    "PRIMARY KEY (sparsity, seed, batch_size, step)",
                    sort=("sparsity", "seed", "batch_size", "step")),)

    def start(self, ctx):
        """Replay every best run once and store |w| at its five points (one transaction)."""
        rows = []
        for run in best_runs(ctx):
            steps = [round(run.horizon * i / 4) for i in range(5)]
            for step, state in run.states(steps).items():
                norm = sum(float((w.double() ** 2).sum()) for name, w in state.items()
                           if name.endswith("weight")) ** 0.5
                rows.append((run.sparsity, run.seed, run.batch_size, step, norm))
        ctx.store.replace_rows({"weight_norm": rows})

    def report(self, ctx):
        """A section with the table and one figure: |w| against the step, one line per run."""
        frame = ctx.runs.tables["weight_norm"]
        if not len(frame):
            return Part()
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for (series, b), g in frame.groupby(["series", "batch_size"]):
            ax.plot(g["step"], g["norm"], "o-", label=f"{series}, B = {b}")
        ax.set_xlabel("step")
        ax.set_ylabel("|w|")
        ax.legend(fontsize=7)
        shown = frame.assign(norm=frame["norm"].map("{:.4f}".format))[
            ["series", "batch_size", "step", "norm"]]
        return Part(sections=(Section("Weight norm along the best runs", 2, (
            table_section("|w| at five points of each best run", shown),
            Figure("fig_weight_norm", "Weight norm along the best runs",
                   "|w| of the weight matrices at five evenly spaced steps of each group's best "
                   "run, from its start to its goal.", png_bytes(fig)))),))


SPEC = """
name = "own_measurement"
batch_sizes = [16, 64]
sparsities = [0.0, 0.5]
trials = 2
measures = ["own_measurement:WeightNorm"]
goal = {target = 0.15}
search = {lr = {scale = "log", min = 0.03, max = 0.3}}
budget = {max_steps = 600}
eval = {every = 10}
probes = {enabled = false}
workload = {dataset = "teacher", model = "mlp", model_options = {hidden = [64]}, dataset_options = {n = 600, dim = 8, num_classes = 3, hidden = 16}}
"""

if __name__ == "__main__":
    spec = experiments.loads_spec(SPEC)
    print("measures:", " ".join(spec.measures), spec.measure_digests[spec.measures[0]][:12])
    run_dir = experiments.run_study(spec, out="runs/own_measurement", workers=1, quiet=True)
    rows = experiments.load_results(run_dir).weight_norm
    print("rows:", len(rows))
    for (s, b), g in rows.groupby(["sparsity", "batch_size"]):
        print(f"norm {s}/{b}:", " ".join(f"{v:.3f}" for v in g.sort_values("step").norm))
    report = (run_dir / "report.md").read_text()
    print("section:", "## Weight norm along the best runs" in report)
    print("figure:", (run_dir / "figures" / "fig_weight_norm.png").exists())
