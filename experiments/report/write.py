"""Study reports: theory set beside measurement, sparse beside dense.

``write_report(run_dirs, out=None)`` reads one or more run folders ONLY through
:func:`experiments.load_results` (so any finished or partial run can be reported again, and
several runs, e.g. an SGD and a momentum study, can be combined) and writes into ``out``:

- ``report.html``: self-contained (figures embedded as base64 PNG, inline CSS, no scripts): opens
  offline;
- ``report.md`` with ``figures/*.png`` beside it;
- ``summary.csv``: one row per (run, sparsity, batch size): steps-to-result, best metaparameters,
  trials reached / diverged, fit and prediction values;
- ``verdicts.csv``: every claim's stored verdict, one row per (run, level, claim, tier), with its
  value, interval, allowed range, the statistic it uses and its reason
  (:func:`experiments.report.verdicts.verdicts_frame`); the docs quote these
  (``experiments/scripts/docs_verdicts.py``);
- each measurement's CSV files (:attr:`experiments.measurement.Part.files`): ``time_to_result.csv``
  when a run folder holds ``cost_model.json`` (:mod:`experiments.measures.hardware`),
  ``delays.csv`` for a study with a delay axis (:mod:`experiments.measures.delay`).

The pipeline: :mod:`experiments.report.runs` loads and stacks the stores,
:mod:`experiments.report.analysis` computes the tables and fits (once),
:mod:`experiments.report.theory_view` the predictions, :mod:`experiments.report.prose` the
sentences, :mod:`experiments.report.figures.measurement` and
:mod:`experiments.report.figures.theory` the figures and :mod:`experiments.report.tables` the
displayed tables; every registered measurement (:mod:`experiments.measurement`: the sanity
checks, time to result, the delay axis, branching, a user's own) gives its part,
:mod:`experiments.report.schedules` the batch-size policies' shoot-out (studies with
``[schedules]``), and
:func:`build` puts them all into one :class:`experiments.report.sections.Document`, rendered to
both formats by Jinja2 templates.

``out`` defaults to the first run folder. The same store(s) give byte-identical files: figures
carry no software or time metadata, rows are sorted, numbers have fixed formatting, and nothing
depends on the time the report is written.

Example::

    from experiments.report.write import write_report
    write_report(["runs/shallue-sgd", "runs/shallue-momentum"], out="runs/shallue")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from experiments import measurement
from experiments.report import analysis as A
from experiments.report.figures import measurement as F
from experiments.report import tables as T
from experiments.report.figures import theory as TF
from experiments.report.schedules.section import rows_of, schedules_section
from experiments.report.formatting import eval_text, goal_text
from experiments.report.prose import findings_text, optimizer_sentences, prediction_statement
from experiments.report.runs import ReportError, ReportIOError, RunSet, load_runs, synchronous
from experiments.report.sections import (
    Code, Document, Figure, Formula, Paragraphs, Section, Table, render, table_section,
)
from experiments.report.theory_view import (
    NQM_NOTE, NQM_OPTIMIZER, probe_definition_text, theory_view,
)
from experiments.report.design_view import stopping_lines
from experiments.spec.study import reductions
from experiments.report.verdicts import (
    STEPS_DEFINITION, failure_sentences, findings_table, noise_along_table, verdict_table, verdicts,
    verdicts_frame,
)
from experiments.report.lee_stage_view import StagePart, stage_sentences, stage_tables, stage_view

__all__ = ["write_report", "write_document", "build", "ReportError", "ReportIOError"]

CSV_FORMAT = {"index": False, "float_format": "%.6g", "lineterminator": "\n"}


@dataclass(frozen=True)
class Report:
    """What :func:`write_report` writes: the document (figures inside it) and the CSV tables,
    by file name: ``summary``, ``verdicts`` and each measurement's (``time_to_result``,
    ``delays``, ...; None: no such file)."""

    document: Document
    tables: dict[str, pd.DataFrame | None]


def write_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Write report.html, report.md, figures/*.png and summary.csv for ``run_dirs`` into ``out``
    (default: the first run folder) and return the path of report.html.

    Raises :class:`ReportError` for an empty ``run_dirs``, ``experiments.StoreError`` for a
    folder without a store and :class:`ReportIOError` when ``out`` cannot be written.
    """
    runs = load_runs([Path(d) for d in run_dirs] if not isinstance(run_dirs, (str, Path)) else run_dirs)
    out = Path(out) if out is not None else Path(run_dirs[0])
    report = build(runs)
    # a table that is None removes the file an earlier report left (no cost model now)
    return write_document(report.document, out, report.tables)


def write_document(document: Document, out: str | Path, tables: dict[str, pd.DataFrame | None]
                   ) -> Path:
    """Write ``document`` into ``out`` as report.html, report.md and figures/*.png, and each
    table as ``<name>.csv`` (None removes that file); return report.html's path.
    :class:`ReportIOError` when ``out`` cannot be written."""
    out = Path(out)
    try:
        (out / "figures").mkdir(parents=True, exist_ok=True)
        for fig in document.figures():
            (out / "figures" / f"{fig.name}.png").write_bytes(fig.png)
        _write_text(out / "report.md", render(document, "markdown"))
        _write_text(out / "report.html", render(document, "html"))
        for name, frame in tables.items():
            if frame is None:
                (out / f"{name}.csv").unlink(missing_ok=True)
            else:
                _write_text(out / f"{name}.csv", frame.to_csv(**CSV_FORMAT))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise ReportIOError(f"cannot write the report into {out}: {where}"
                            f"{exc.strerror or exc}") from None
    return out / "report.html"


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


def build(runs: RunSet) -> Report:
    """Compute every number, figure and table of the report from the loaded runs: the core
    sections (the sweep, its fits and the theory beside it) from the synchronous (delay 0)
    groups, and each registered measurement's part (:meth:`experiments.measurement.Measurement.report`,
    in the registry's order) placed where its :class:`experiments.measurement.Part` says."""
    every, runs = runs, synchronous(runs)
    order, labels = runs.order, runs.labels
    points = A.points_table(runs.groups, runs.trials, runs.planned, order)
    edges = A.search_edges(points, runs.searched())
    fits = A.fit_series(runs.groups, order)
    ratios = A.step_ratios(points, order, runs.dense_runs())
    theory = theory_view(runs.groups, runs.probes, fits, labels, [r.optimizer for r in runs.runs])
    missing = A.missing_table(runs.groups, runs.probes, runs.planned, labels)
    cost = A.cost_table(runs.groups, runs.study, runs.planned, missing)
    judged, unjudged = verdicts(runs.groups, runs.probes, fits, labels, runs.trials,
                                [r.label for r in runs.runs if getattr(r.spec, "stop", "") == "all"],
                                runs.stage)
    stage = stage_view(runs)
    ctx = measurement.ReportContext(runs, every, points, edges, fits, ratios)
    parts = [m.report(ctx) for _, m in measurement.MEASURES.items()]
    # the claim at Lee et al.'s stage and each measurement's beside the early probes' claims
    judged = pd.concat([judged, *(v for v in (stage.verdicts, *(p.verdicts for p in parts))
                                  if v is not None and len(v))], ignore_index=True)
    prose = (
        findings_text(points, fits.table, ratios, missing, order, labels),
        stage_sentences(stage) + [s for p in parts for s in p.findings]
        + failure_sentences(judged, runs.probes) + unjudged,
        optimizer_sentences(fits.table, {r.label: r.optimizer for r in runs.runs},
                            sorted({s for r in runs.runs for s in r.spec.sparsities}))
        + [s for p in parts for s in p.sentences])
    sections = (
        Section("Studies", 2, (Table(T.overview_table(runs.runs)), *_reductions(runs),
                               *_stopping(runs))),
        Section("Findings", 2, (
            *((Table(findings_table(judged)), Paragraphs((FINDINGS_NOTE,), "note"))
              if len(judged) else ()),
            # the prose below the table: one paragraph per theme (scaling and the cost of
            # sparsity; the theory; optimizers and each measurement's findings)
            Paragraphs(tuple(" ".join(p) for p in prose if p)))),
        Section("Figures", 2, (*_figures(runs, points, edges, fits, ratios, theory),
                               *(f for p in parts for f in p.figures))),
        _theory_section(runs, fits, judged, stage),
        *(s for p in parts for s in p.sections),
        *([schedules_section(runs, shootout)] if len(shootout := rows_of(runs)) else []),
        Section("Tables", 2, (
            table_section("Steps to result", T.steps_table(points, edges), _stop_note(runs)),
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
                          "step 0."),
            *(t for p in parts for t in p.tables),
            table_section("Missing and failed", T.missing_table(missing),
                          "" if len(missing) else
                          "Every planned group is in the store and none failed."),
            table_section("Cost and versions", T.cost_table(cost)))),
        *(s for p in parts for s in p.appendix),
        Section("What was fitted and what was predicted", 2,
                (Paragraphs(tuple(prediction_statement(p) for p in theory.runs)),)),
        Section("Theory formulas", 2, tuple(Formula(*f, name=f"formula{i}")
                                            for i, f in enumerate(theory.formulas))),
        Section("Study specs", 2, tuple(
            Section(r.label, 3, (Code(r.spec.toml.strip(), "toml"),)) for r in runs.runs)),
    )
    return Report(
        document=Document("Study report: " + ", ".join(labels), sections),
        tables={"summary": A.summary_frame(points, edges, fits, theory.curves, ratios,
                                           runs.info()),
                "verdicts": verdicts_frame(judged, runs.info()),
                **{name: frame for p in parts for name, frame in p.files.items()}})


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


FINDINGS_NOTE = (
    "Each paper's claim in its own terms (Theory vs measurement gives the reasons): \"holds\": "
    "the whole interval lies inside the allowed range; \"does not hold\": wholly outside; "
    "\"inconclusive\": it straddles the line. Lee et al.'s claim is judged twice: on the probes "
    "along [0, H] (the early stage, step 0 left out) and, where the study measured it, at "
    "their own stage (steps >= 1,000).")


def _theory_section(runs: RunSet, fits: A.Fits, judged: pd.DataFrame,
                    stage: StagePart | None = None) -> Section:
    """Theory vs measurement: the steps-to-result definition used, the tiered verdict table,
    the two figures along the runs, and L at Lee et al.'s stage when it was measured."""
    order = list(runs.order)
    cmap = F.colors(order)
    evals = "; ".join(dict.fromkeys(f"{r.label}: {eval_text(r.spec)}"
                                    for r in runs.runs))
    probed = [f"{r.label}: {text}" for r in runs.runs
              if (text := probe_definition_text(r.results.run_dir)) is not None]
    noise = noise_along_table(runs.groups, runs.probes, runs.stage, runs.trials, runs.labels)
    return Section("Theory vs measurement", 2, (
        Paragraphs((STEPS_DEFINITION + f" This report used: {evals}.", *probed)),
        table_section("Claims in their own terms", verdict_table(judged),
               "Paper's tier: McCandlish et al. (2018) B_simple at the goal within 10x of the "
               "fitted B_crit; Lee et al. (2021) the sparse/dense step ratio explained by "
               "(L_s Δ_s)/(L_d Δ_d) in direction (and ordering with >= 3 levels); shape: small-B "
               "slope in [-1.1, -0.8], plateau within 2x of S_min. Strict tier: within 2x. "
               "\"holds\": the whole interval inside the allowed range; \"does not hold\": wholly "
               "outside; \"inconclusive\": it straddles the line." if len(judged) else
               "No claim could be judged (no probes or no fitted curve)."),
        Figure("fig5_b_simple", "Figure 5. B_simple along the run against the fitted B_crit",
               "McCandlish et al. (2018)'s simple noise scale tr Σ / |G|² at K evenly spaced points of "
               "each probed run (x: step / H, H its steps-to-result, or its budget where no run "
               "of its group met the goal), one line per probed batch size (median over seeds); "
               "black line and grey band: the series' fitted B_crit and its interval.",
               F.png_bytes(TF.b_simple_figure(runs.probes, fits.table, order, cmap))),
        *([table_section("B_simple along training, pooled over the probed runs", noise,
                  "Ratio of sums tr Σ / |G|² over every probed run's points in each fifth of "
                  "the run (McCandlish et al. 2018), bootstrap over runs (over one run's points "
                  "where a level has one run).")] if len(noise) else []),
        Figure("fig6_smoothness", "Figure 6. L and λ_max along the run, dense beside sparse",
               "Lee et al. (2021)'s local Lipschitz constant on the run's own update (their γ grid, "
               "full training split, masked gradients) and the top Hessian eigenvalue (Lanczos), "
               "one line per series (colour) and probed batch size (line style), median over "
               "seeds at each point of the run.",
               F.png_bytes(TF.smoothness_figure(runs.probes, order, cmap))),
        *([_stage_section(stage, order, cmap)] if stage is not None and stage.measured else []),
    ))


def _stage_section(stage: StagePart, order: list[str], cmap: dict) -> Section:
    """L at Lee et al.'s stage: its tables and Figure 10."""
    return Section("L at Lee et al.'s stage", 3, (
        *(Section(title, 4, (*((Table(frame),) if len(frame) else ()), Paragraphs((note,), "note")))
          for title, frame, note in stage_tables(stage)),
        Figure("fig10_lipschitz_stage", "Figure 10. L every N steps of the runs, Lee et al.'s view",
               "Lee et al. (2021)'s local Lipschitz constant of the update into each step k N of "
               "the probed runs (their edps/train.py), up to each run's goal or, for a run that "
               "did not meet it, its budget; one panel per probed batch size, one line per "
               "series: the geometric mean over its runs (seeds and trials), band: its 90 % t "
               "interval; log scale. ×: L on the whole training split "
               "where the study checked its sample.",
               F.png_bytes(TF.stage_figure(stage.points, stage.check, order, cmap))),
    ))


def _figures(runs: RunSet, points: pd.DataFrame, edges: pd.DataFrame, fits: A.Fits,
             ratios: pd.DataFrame, theory) -> list[Figure]:
    """The five figures of the sweep and the theory, with their captions."""
    order = list(runs.order)
    cmap = F.colors(order)
    first = runs.runs[0].spec   # the dashed goal line of Figure 4 (combined runs normally share it)
    goals = "; ".join(dict.fromkeys(goal_text(r.spec) for r in runs.runs))
    optimizers = [r.optimizer for r in runs.runs]

    def drawn(make) -> bytes:
        """PNG of ``make()``, or of a placeholder when no group is stored at all."""
        stored = (points["status"] != "missing").any()
        return F.png_bytes(make() if stored else F.placeholder("no group of this study is in the store yet"))

    return [
        Figure("fig1_steps", "Figure 1. Steps to result vs batch size",
               "Measured steps-to-result (median over seeds) per series on log2 axes; dashed: perfect "
               "scaling anchored at the smallest batch size that reached the goal; solid: the fit "
               "S_min (1 + B_crit / B) to the measured points (fitted); dotted: the convergence bound "
               "scaled by the one constant calibrated on the dense curve (on dense: calibrated; on "
               "sparse levels: predicted from their probes); bands: regimes of the fit (perfect scaling "
               "B ≤ B_crit / 4, maximal data parallelism B ≥ 4 B_crit); ×: batch sizes without a point.",
               drawn(lambda: F.steps_figure(points, fits.table, theory.curves, order, cmap,
                                            ncols=min(4, max(len(r.spec.sparsities) for r in runs.runs))))),
        Figure("fig2_normalized", "Figure 2. Normalized steps and the cost of sparsity",
               "(a) Steps divided by the steps at each series' smallest batch size (Lee et al. 2021's "
               "view); dashed: perfect scaling. (b) Measured steps of each sparse series over its "
               "run's dense series at the same batch size (1 = no extra cost).",
               drawn(lambda: F.normalized_figure(points, ratios, order, cmap))),
        Figure("fig3_metaparameters", "Figure 3. Optimal metaparameters vs batch size",
               "Learning rate, 1 − momentum and effective learning rate lr / (1 − momentum) of the best "
               "trial at each batch size (Shallue et al. 2019), with the linear (dashed, SGD-type) and "
               "square-root (dotted, the usual rule for Adam-type optimizers) heuristics anchored at the "
               "smallest batch size; ringed: best value in the outer "
               "10 % of the searched range (the optimum may lie outside the search space).",
               drawn(lambda: F.metaparameters_figure(points, edges, order, cmap))),
        Figure("fig4_trials", "Figure 4. Every trial: learning rate × (1 − momentum)",
               f"Each trial of every group, marked by outcome for the goal ({goals}). Groups stop "
               "at the first evaluation where any trial meets the goal unless the study ran with "
               "stop = \"all\", so \"did not\" means not met by then.",
               drawn(lambda: F.trials_figure(runs.trials, order, first.target, first.metric))),
        Figure("fig7_nqm", "Figure 7. Noisy quadratic model beside the measurement",
               nqm_caption(optimizers),
               F.png_bytes(TF.nqm_figure(points, theory.nqm, order, cmap, NQM_NOTE))),
    ]


def nqm_caption(optimizers: list[str]) -> str:
    """Figure 7's caption: the NQM's three optimizers, and which of them each of the study's
    optimizers maps to."""
    nqm_opts = ", ".join(f"{o} → {NQM_OPTIMIZER[o]}" for o in dict.fromkeys(optimizers))
    return ("(a) Measured steps-to-result of every series divided by its value at the smallest "
            "batch size. (b) The noisy quadratic model (Zhang et al. 2019) with SGD, heavy-ball "
            "momentum and Adam-like preconditioning (the study's optimizers map to "
            f"{nqm_opts}), normalized the same way; dashed: perfect scaling. Nothing is fitted: "
            "compare where each curve leaves perfect scaling and whether momentum or "
            "preconditioning extends it. " + NQM_NOTE)
