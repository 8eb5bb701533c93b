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

The pipeline: :mod:`experiments.report.runs` loads and stacks the stores;
:class:`experiments.report.context.LazyContext` holds them and the analysis the parts share
(:mod:`experiments.report.analysis`'s tables and fits, :mod:`experiments.report.theory_view`'s
predictions), each computed on first use, once; every registered measurement
(:mod:`experiments.measurement`, :mod:`experiments.measures`: the sweep itself first, then the
sanity checks, time to result, the delay axis, branching, the probes, L at Lee et al.'s stage,
the batch-size policies' shoot-out, a user's own) gives its part; and :func:`build` puts them
all into one :class:`experiments.report.sections.Document`, rendered to both formats by Jinja2
templates. ``build`` names no kind of measurement and calls nothing of ``theory``: the parts do.

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
from experiments.report.context import LazyContext
from experiments.report.runs import ReportError, ReportIOError, RunSet, load_runs
from experiments.report.sections import Document, Paragraphs, Section, Table, render
from experiments.report.verdicts import (
    VERDICT_COLUMNS, findings_table, verdicts_frame,
)

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
    """Every number, figure and table of the report: each registered measurement's part
    (:meth:`experiments.measurement.Measurement.report`, in the registry's order, the sweep's
    first) from one :class:`experiments.report.context.LazyContext` of the loaded runs, placed
    where its :class:`experiments.measurement.Part` says; the Findings' table and
    ``verdicts.csv`` gather every part's verdicts."""
    ctx = LazyContext(runs)
    parts = [m.report(ctx) for _, m in measurement.MEASURES.items()]
    found = [p.verdicts for p in parts if p.verdicts is not None]
    judged = (pd.concat(found, ignore_index=True) if found
              else pd.DataFrame(columns=VERDICT_COLUMNS))
    prose = (
        [s for p in parts for s in p.opening],
        [s for p in parts for f in p.findings
         for s in ((f,) if isinstance(f, str) else f(judged))],
        [s for p in parts for s in p.sentences])
    theory = [_with(judged, b) for p in parts for b in p.theory]
    sections = (
        *(s for p in parts for s in p.head),
        Section("Findings", 2, (
            *((Table(findings_table(judged)), Paragraphs((FINDINGS_NOTE,), "note"))
              if len(judged) else ()),
            # the prose below the table: one paragraph per theme (scaling and the cost of
            # sparsity; the claims; optimizers and each measurement's findings)
            Paragraphs(tuple(" ".join(p) for p in prose if p)))),
        Section("Figures", 2, tuple(f for p in parts for f in p.figures)),
        *([Section("Theory vs measurement", 2, tuple(theory))] if theory else []),
        *(_with(judged, s) for p in parts for s in p.sections),
        Section("Tables", 2, (*(t for p in parts for t in p.tables),
                              *(t for p in parts for t in p.last_tables))),
        *(s for p in parts for s in p.appendix),
        *(s for p in parts for s in p.closing),
    )
    return Report(
        document=Document("Study report: " + ", ".join(ctx.runs.labels), sections),
        tables={**{name: frame for p in parts for name, frame in p.files.items()},
                "verdicts": verdicts_frame(judged, ctx.runs.info())})


def _with(judged: pd.DataFrame, block):
    """A part's block as placed: a function of every part's verdicts called with them
    (:data:`experiments.measurement.Judged`), anything else as it is."""
    return block(judged) if callable(block) else block


FINDINGS_NOTE = (
    "Each paper's claim in its own terms (Theory vs measurement gives the reasons): \"holds\": "
    "the whole interval lies inside the allowed range; \"does not hold\": wholly outside; "
    "\"inconclusive\": it straddles the line. Lee et al.'s claim is judged twice: on the probes "
    "along [0, H] (the early stage, step 0 left out) and, where the study measured it, at "
    "their own stage (steps >= 1,000).")
