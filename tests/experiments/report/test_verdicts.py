"""Theory vs measurement on a synthetic store whose probes agree with its curves: every claim's
verdict by value, the report section's table and sentences, and the steps-to-result definition."""

import pytest

from experiments.measures.probes import verdicts as PV
from experiments.report import analysis as A
from experiments.report import verdicts as V
from experiments.report.formatting import fmt_interval, fmt_num
from experiments.report.write import build
from experiments.report.runs import load_runs

from ..synthetic import PROBES


@pytest.fixture(scope="module")
def judged(full):
    runs = load_runs([full])
    fits = A.fit_series(runs.groups, runs.order)
    table, skipped = PV.verdicts(runs.groups, runs.probes, fits, runs.labels)
    return runs, fits, table, skipped


def test_mccandlish_is_b_simple_at_the_goal_over_the_fitted_b_crit(judged):
    runs, fits, table, skipped = judged
    assert skipped == []
    m = table[table.claim == "mccandlish"].set_index(["series", "tier"])
    for sparsity, series in zip((0.0, 0.9), runs.order):
        expected = PROBES[sparsity]["b_simple"] / fits.objects[series].b_crit
        for tier, factor in (("paper", 10.0), ("strict", 2.0)):
            row = m.loc[(series, tier)]
            assert row.value == pytest.approx(expected, rel=1e-9)
            assert (row.allowed_low, row.allowed_high) == (1 / factor, factor)
            assert row.low <= row.value <= row.high
        assert m.loc[(series, "paper"), "verdict"] == "holds"


def test_every_claim_is_judged_per_level_with_an_interval(judged):
    _, _, table, _ = judged
    claims = set(table.claim)
    assert {"mccandlish", "shape_slope", "shape_plateau"} <= claims
    assert any(c.startswith("lee_sparsity") for c in claims)
    assert set(table.verdict) <= {"holds", "does not hold", "inconclusive"}
    assert (table.low <= table.high).all()


def test_the_report_section_holds_the_table_the_figures_and_the_findings_open_with_the_verdicts(
        judged, full):
    runs, _, table, _ = judged
    report = build(runs)
    (section,) = [s for s in report.document.sections if s.title == "Theory vs measurement"]
    paragraphs, sub, fig_b, noise, fig_l = section.blocks
    # B_simple along training: per series and fifth of the run, the ratio of sums over every
    # probed run's points (here the last fifth of the dense runs, written out)
    along = noise.blocks[0].frame
    dense = runs.probes[(runs.probes["sparsity"] == 0.0) & (runs.probes["fraction"] >= 0.8)]
    sums = dense.pivot_table(index=["seed", "batch_size", "step"], columns="quantity",
                             values="value").sum()
    last = along[(along["series"] == along["series"].iloc[0])].iloc[-1]
    assert last["fraction of the run"] == "0.8-1.0"
    assert last["B_simple [90 %]"].startswith(fmt_num(sums["trace_sigma"] / sums["g_sq"], 3))
    assert last["runs"] == dense.groupby(["seed", "batch_size"]).ngroups > 1
    assert paragraphs.texts[0].startswith(PV.STEPS_DEFINITION)
    assert "This report used: " in paragraphs.texts[0] and "every 10" in paragraphs.texts[0]
    shown = sub.blocks[0].frame
    assert len(shown) == len(table) and list(shown.verdict) == list(table.verdict)
    assert (fig_b.name, fig_l.name) == ("fig5_b_simple", "fig6_smoothness")
    (findings,) = [s for s in report.document.sections if s.title == "Findings"]
    # Findings open with the verdict table (claim | tier | verdict | the numbers), prose below
    top, note, prose = findings.blocks
    shown = top.frame
    assert list(shown.columns) == ["claim", "tier", "verdict", "the numbers"]
    assert list(shown.verdict) == list(table.verdict) and list(shown.tier) == list(table.tier)
    first = table.iloc[0]
    assert shown.claim.iloc[0] == f"{V.claim_words(first.claim)}: {first.series}"
    assert shown["the numbers"].iloc[0].startswith(
        f"{fmt_num(first.value, 3)} {fmt_interval(first.low, first.high)}")
    assert note.style == "note" and prose.style == ""
    assert not any("tier): " in t for t in prose.texts)   # the sentences gave way to the table
    assert not any("held" in t for t in prose.texts)   # nothing scored the papers do not claim


def test_a_failed_claim_gets_the_quantities_and_a_plain_statement(judged):
    runs, _, table, _ = judged
    failed = table.iloc[:1].assign(verdict="does not hold", claim="lee_sparsity (S_min ratio)")
    (sentence,) = PV.failure_sentences(failed, runs.probes)
    assert "the theory does not explain this workload" in sentence
    assert f"L = {PROBES[0.9]['local_lipschitz']:g}" in sentence
