"""The sweep's part of the report (:func:`sweep_part`): the studies' overview (with each run's
reductions and stopping rule), the scaling findings, the figures
(:mod:`~experiments.measures.sweep.figures`), the core tables, what was fitted and predicted,
the theory's formulas, the study specs and ``summary.csv``."""

from __future__ import annotations

from experiments.measurement import Part, ReportContext
from experiments.measures.sweep.figures import sweep_figures
from experiments.report import analysis as A
from experiments.report import tables as T
from experiments.report.design_view import stopping_lines
from experiments.report.prose import findings_text, optimizer_sentences, prediction_statement
from experiments.report.runs import RunSet
from experiments.report.sections import Code, Formula, Paragraphs, Section, Table, table_section
from experiments.spec.study import reductions


def sweep_part(ctx: ReportContext) -> Part:
    """The sweep's sections, findings, figures, tables and ``summary.csv`` (module docstring)."""
    runs, points, fits, ratios, theory = ctx.runs, ctx.points, ctx.fits, ctx.ratios, ctx.theory
    order, labels = runs.order, runs.labels
    missing = A.missing_table(runs.groups, runs.probes, runs.planned, labels)
    cost = A.cost_table(runs.groups, runs.study, runs.planned, missing)
    return Part(
        head=(Section("Studies", 2, (Table(T.overview_table(runs.runs)), *_reductions(runs),
                                     *_stopping(runs))),),
        opening=tuple(findings_text(points, fits.table, ratios, missing, order, labels)),
        sentences=tuple(optimizer_sentences(
            fits.table, {r.label: r.optimizer for r in runs.runs},
            sorted({s for r in runs.runs for s in r.spec.sparsities}))),
        figures=tuple(sweep_figures(ctx)),
        tables=(
            table_section("Steps to result", T.steps_table(points, ctx.edges), _stop_note(runs)),
            table_section(f"Scaling fits (S_min, B_crit with {int(A.FIT_LEVEL * 100)} % bootstrap "
                          "intervals, regime boundaries)", T.fits_table(fits)),
            table_section(
                "Structure of the bound (not scored)", T.predictions_table(theory.table),
                "The convergence bound's values beside the measurement. Not a prediction the "
                "papers make: with one ε shared by all levels the bound's critical batch 4σ²/ε "
                "scales as σ²_sparse / σ²_dense by construction. The papers' claims are scored "
                "under Theory vs measurement." if len(theory.table) else
                "No bound could be evaluated (see What was fitted and what was predicted)."),
            table_section("Sparse / dense step ratios (measured)", T.ratios_table(ratios),
                          "" if len(ratios) else
                          "No sparse and dense curve reached the goal at a common batch size."),
            table_section("Probe inputs to the theory", T.probe_inputs_table(theory.inputs),
                          "L: Lee et al.'s local Lipschitz constant (mean along the probed runs); "
                          "σ² = tr Σ and B_simple: over the last 20 % of the runs; Δ: loss at "
                          "step 0.")),
        last_tables=(
            table_section("Missing and failed", T.missing_table(missing),
                          "" if len(missing) else
                          "Every planned group is in the store and none failed."),
            table_section("Cost and versions", T.cost_table(cost))),
        closing=(
            Section("What was fitted and what was predicted", 2,
                    (Paragraphs(tuple(prediction_statement(p) for p in theory.runs)),)),
            Section("Theory formulas", 2, tuple(Formula(*f, name=f"formula{i}")
                                                for i, f in enumerate(theory.formulas))),
            Section("Study specs", 2, tuple(
                Section(r.label, 3, (Code(r.spec.toml.strip(), "toml"),)) for r in runs.runs))),
        files={"summary": A.summary_frame(points, ctx.edges, fits, theory.curves, ratios,
                                          runs.info())})


STOP_WORDS = {
    "first": "stop = \"first\": a group stops at the first evaluation where any trial meets the "
             "goal (Shallue et al.'s steps-to-result), so one trial reaches it by construction",
    "all": "stop = \"all\": each trial trained to its own first hit, so \"trials reached\" "
           "counts the trials that met the goal within the budget",
}


def _stop_note(runs: RunSet) -> str:
    """What produced the "trials reached" column: each run's stop rule, and whether diverged
    trials were replaced (an imported workload says neither)."""
    parts = []
    for r in runs.runs:
        stop = getattr(r.spec, "stop", None)
        if stop is None:
            continue
        complete = getattr(r.spec, "complete_trials", False)
        parts.append(f"{r.label}: {STOP_WORDS[stop]}; "
                     + ("diverged trials replaced until the trials per group completed "
                        "(Shallue et al.'s count)" if complete else
                        "diverged trials count toward the trials per group"))
    return ("Trials reached: " + "; ".join(parts) + ".") if parts else ""


def _reductions(runs: RunSet) -> tuple[Paragraphs, ...]:
    """Each run's ``reductions`` text (how its design is reduced from the paper's), once per
    distinct text, as a note under the overview."""
    texts = dict.fromkeys(t for r in runs.runs if (t := reductions(r.spec)))
    return (Paragraphs(tuple(texts), "note"),) if texts else ()


def _stopping(runs: RunSet) -> tuple[Paragraphs, ...]:
    """Each run's pre-declared stopping rule and its looks at the stored paired runs
    (:mod:`experiments.report.design_view`)."""
    out = []
    for r in runs.runs:
        rule = getattr(r.spec, "stopping", None)
        if rule is None:
            continue
        mine = (runs.stage[runs.stage["run"] == r.label] if len(runs.stage)
                else runs.stage)
        out.append(Paragraphs(tuple(f"{r.label}: {line}" if len(runs.runs) > 1 else line
                                    for line in stopping_lines(mine, rule, r.spec.seeds))))
    return tuple(out)
