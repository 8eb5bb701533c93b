"""The report is its measurements' parts: ``build`` places each part's pieces where
:class:`experiments.measurement.Part` says (a block may be a function of every part's
verdicts), the context computes the shared analysis on first use and once, and ``build``'s
module names no kind of measurement and imports nothing of ``theory``."""

import ast
from pathlib import Path

import pandas as pd

from experiments import measurement
from experiments.report import analysis as A
from experiments.report.context import LazyContext
from experiments.report.runs import load_runs
from experiments.report.sections import Paragraphs, Section
from experiments.report.verdicts import VERDICT_COLUMNS
from experiments.report.write import build

ROOT = Path(__file__).resolve().parents[3]


def _marked(title: str) -> Section:
    return Section(title, 2, (Paragraphs((title,)),))


def _verdict(run: str, claim: str) -> dict:
    return {"run": run, "series": "dense", "sparsity": 0.0, "claim": claim, "tier": "paper",
            "value": 1.0, "low": 0.5, "high": 2.0, "allowed_low": 0.1, "allowed_high": 10.0,
            "verdict": "holds", "reason": "test", "statistic": "test"}


class Placed(measurement.Measurement):
    """A part with every piece, each marked with its place."""

    def wanted(self, spec) -> bool:
        return False

    def report(self, ctx) -> measurement.Part:
        shown = lambda judged: Section(f"judged {len(judged)}", 3, ())   # noqa: E731
        return measurement.Part(
            head=(_marked("my head"),), opening=("My opening.",), findings=("My finding.",),
            sentences=("My sentence.",),
            verdicts=pd.DataFrame([_verdict(ctx.runs.labels[0], "mine")], columns=VERDICT_COLUMNS),
            theory=(shown,), sections=(_marked("my section"),),
            tables=(Section("my table", 3, ()),), last_tables=(Section("my last table", 3, ()),),
            appendix=(_marked("my appendix"),), closing=(_marked("my closing"),),
            files={"mine": pd.DataFrame({"a": [1]})})


def test_each_piece_of_a_part_is_placed_where_the_part_says(full):
    runs = load_runs([full])
    plain = build(runs)
    with measurement.MEASURES.preserved():
        measurement.add_instance("placed", Placed)
        report = build(runs)
    before = [s.title for s in plain.document.sections]
    assert before == ["Studies", "Findings", "Figures", "Theory vs measurement", "Tables",
                      "Time to result on real hardware", "What was fitted and what was predicted",
                      "Theory formulas", "Study specs"]
    # registered last: its head after the sweep's (before Findings), its section after Theory
    # vs measurement, its appendix after the hardware's (after Tables), its closing after the
    # sweep's
    assert [s.title for s in report.document.sections] == [
        "Studies", "my head", "Findings", "Figures", "Theory vs measurement", "my section",
        "Tables", "Time to result on real hardware", "my appendix", *before[6:], "my closing"]
    sections = {s.title: s for s in report.document.sections}
    # the Tables: its own table among the parts' tables, its last table after "Cost and versions"
    tables = [s.title for s in sections["Tables"].blocks]
    assert tables[-1] == "my last table" and tables[-2] == "Cost and versions"
    assert tables.index("my table") < tables.index("Missing and failed")
    # Findings: its verdict joins every other part's in the table, the function of the verdicts
    # (in Theory vs measurement) gets them all, its sentences join each paragraph's end
    judged = plain.tables["verdicts"]
    assert len(report.tables["verdicts"]) == len(judged) + 1
    theory = sections["Theory vs measurement"].blocks
    assert theory[-1].title == f"judged {len(judged) + 1}"
    table, _, prose = sections["Findings"].blocks
    assert len(table.frame) == len(judged) + 1
    first, *middle, last = prose.texts
    assert first.endswith("My opening.") and last.endswith("My sentence.")
    assert any("My finding." in p for p in middle)
    assert report.tables["mine"]["a"].tolist() == [1]
    # everything else as it was
    assert report.tables["summary"].equals(plain.tables["summary"])


def test_the_context_computes_each_shared_piece_on_first_use_and_once(full):
    runs = load_runs([full])
    ctx = LazyContext(runs)
    assert not {"points", "edges", "fits", "ratios", "theory"} & set(vars(ctx))
    fits = ctx.fits
    assert ctx.fits is fits and set(vars(ctx)) >= {"fits"} and "points" not in vars(ctx)
    expected = A.fit_series(ctx.runs.groups, ctx.runs.order)
    pd.testing.assert_frame_equal(fits.table, expected.table)
    assert ctx.every is runs and ctx.runs.order == runs.order


def test_build_names_no_kind_of_measurement_and_imports_nothing_of_theory():
    tree = ast.parse((ROOT / "experiments/report/write.py").read_text(encoding="utf-8"))
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m.split(".")[0] == "theory" or m.startswith("experiments.measures")
                   for m in modules)
    kinds = {name for name, _ in measurement.MEASURES.items()}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not kinds & names
