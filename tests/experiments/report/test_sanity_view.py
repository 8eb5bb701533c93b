"""The report's sanity-check comparison on synthetic stores with known curves (no training)."""

import hashlib
import json

import pandas as pd
import pytest

from experiments.report import analysis as A
from experiments.measures.sanity.section import sanity_sentences
from experiments.report.write import write_report
from experiments.report.runs import load_runs
from experiments.measures.sanity.view import SAME_COST_FACTOR, sanity_view
from experiments.store.schema import GroupRecord, StudyInfo, TrialRow
from experiments.spec.series import MASKS_FILE
from experiments.spec.study import loads
from experiments.store.database import open_store

SPEC = """
name = "sane"
optimizer = "sgd"
batch_sizes = [8, 16, 32, 64, 128, 256]
sparsities = [0.0, 0.9]
trials = 1

[workload]
dataset = "teacher"
model = "mlp"

[goal]
target = 0.2

[pruning]
criterion = "snip"
sanity = ["shuffle", "matched_random", "invert"]

[search]
lr = 0.1
momentum = 0.0

[budget]
max_steps = 100000

[probes]
enabled = false
"""

BATCHES = (8, 16, 32, 64, 128, 256)


def truth(series: str, sparsity: float, b: int, factors: dict[str, float]) -> int:
    """Dense 50 (1 + 128 / B); the criterion 100 (1 + 64 / B); a check: that times its factor."""
    if sparsity == 0:
        return round(50 * (1 + 128 / b))
    return round(factors.get(series, 1.0) * 100 * (1 + 64 / b))


def write_study(base, factors: dict[str, float], masks: bool = False):
    dirs = []
    for spec in loads(SPEC).variants():
        run = base / spec.subdir
        with open_store(run, StudyInfo(spec.name, spec.toml, spec.hash, spec.to_json())) as store:
            for s in spec.sparsities:
                for b in BATCHES:
                    steps = truth(spec.series, s, b, factors)
                    key = hashlib.sha256(f"{spec.series}-{s}-{b}".encode()).hexdigest()[:16]
                    trial = TrialRow(0, 0.1, 0.0, None, 1.0, "reached", steps, 0.1)
                    store.write_group(GroupRecord(key, s, b, 0, "done", steps, 0, 100000, 1.0,
                                                  steps, json.dumps({"b": b}), (trial,)))
        if masks:
            layers = [{"name": "1.weight", "kept": 10, "total": 100, "density": 0.1, "dead": 3,
                       "on_path": 9}, {"name": "3.weight", "kept": 0, "total": 10,
                                       "density": 0.0, "dead": 10, "on_path": 0}]
            (run / MASKS_FILE).write_text(json.dumps({"masks": [
                {"series": spec.series, "sparsity": 0.9, "seed": 0, "info": {},
                 "diagnosis": {"connected": False, "layers": layers}}]}))
        dirs.append(run)
    return dirs


def view(dirs):
    """The sanity part of the report and its sentences, from the stores in ``dirs``."""
    runs = load_runs(dirs)
    points = A.points_table(runs.groups, runs.trials, runs.planned, runs.order)
    fits = A.fit_series(runs.groups, runs.order)
    part = sanity_view(runs, points, fits, A.step_ratios(points, runs.order, runs.dense_runs()))
    return part, sanity_sentences(part.table)


def test_densities_alone_set_the_cost(tmp_path):
    part, sentences = view(write_study(tmp_path, {"snip-invert": 3.0}))
    t = part.table.set_index("check")
    assert list(t.index) == ["shuffle", "matched_random", "invert"]
    assert (t["points"] == 6).all() and (t["criterion"] == "snip (sgd), 90 % sparse").all()
    assert t.loc["shuffle", "ratio"] == 1.0 and t.loc["invert", "ratio"] == pytest.approx(3.0, rel=1e-3)
    # steps over the dense network, from the first series' dense level (median over B)
    expected = pd.Series([100 * (1 + 64 / b) / (50 * (1 + 128 / b)) for b in BATCHES]).median()
    assert t.loc["shuffle", "ratio_to_dense"] == pytest.approx(expected, rel=1e-2)
    assert t.loc["shuffle", "criterion_ratio_to_dense"] == pytest.approx(expected, rel=1e-2)
    # the fitted B_crit of the criterion and of its shuffle are the synthetic 64
    assert t.loc["shuffle", "b_crit"] == pytest.approx(64, rel=0.05)
    assert t.loc["shuffle", "criterion_b_crit"] == pytest.approx(64, rel=0.05)
    assert len(sentences) == 1
    assert part.densities.empty   # no masks.json (older runs): no Figure 7, no masks table
    assert sentences[0].startswith("Sanity checks at 90 % sparsity (snip (sgd), 90 % sparse: "
                                        "B_crit 64")
    assert "inverted masks need 3× its steps" in sentences[0]
    assert sentences[0].endswith("only its layer densities, not its choice of weights, set "
                                      "the cost of sparsity (tolerance 1.25×).")


@pytest.mark.parametrize("factor", [1.4, 1 / 1.4])
def test_the_choice_of_weights_matters(tmp_path, factor):
    assert factor > SAME_COST_FACTOR or factor < 1 / SAME_COST_FACTOR
    part, sentences = view(write_study(tmp_path, {"snip-matched_random": factor}))
    assert part.table.set_index("check").loc["matched_random", "ratio"] == \
        pytest.approx(factor, rel=1e-2)
    assert sentences[0].endswith("its choice of weights, not only its layer densities, sets "
                                      "the cost of sparsity (tolerance 1.25×).")


def test_report_sections(tmp_path):
    dirs = write_study(tmp_path, {}, masks=True)
    write_report(dirs, out=tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "### Sanity checks: each series beside its criterion" in md
    assert "| snip-shuffle (sgd), 90 % sparse | snip (sgd), 90 % sparse | 6 | 1 [1, 1] |" in md
    assert "| snip-invert (sgd), 90 % sparse | 3.weight | 0 / 10 | 0 | 10 | 0 | no |" in md
    assert "Figure 8. Per-layer density of the masks" in md
