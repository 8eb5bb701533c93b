"""The report's "Critical batch by branching" section on a synthetic store with known branching
and warmup rows: the table, the findings and the cost share by value; no section without rows."""

import json

import pytest

from experiments.measures.branching.view import schedule_text
from experiments.measures.branching.section import BRANCHING_HEADING
from experiments.report.write import write_report
from experiments.measures.branching.store import BranchRow, WarmupRow, write_branching
from experiments.store.database import open_store
from experiments.store.results import load_results

from ..synthetic import make_store

SCHEDULE = json.dumps([[0, 8, 1.0], [40, 32, 4.0], [55, 64, 8.0]])
# (sparsity, CBS at the checkpoints 0, 50, 100 (= H)); dense's last is the largest branch (k_max 8)
CBS = {0.0: (8.0, 32.0, 64.0), 0.9: (0.0, 16.0, 32.0)}
# steps to result per replicate: the warmup, and fixed B = 8, 16, 32, 64 (64 misses once)
WARM = {"warmup": (60, 64, 70), 8: (100, 104, 98), 16: (52, 55, 60), 32: (40, 45, 41), 64: (30, None, 31)}


def branch_rows(sparsity):
    return [BranchRow(sparsity, 0, step, cbs, cbs / 2, cbs, step * 8, 8, 100, 512, 8, 3, 0.01, 5000)
            for step, cbs in zip((0, 50, 100), CBS[sparsity])]


def warmup_rows(sparsity):
    rows = []
    for kind, steps in WARM.items():
        b = 64 if kind == "warmup" else kind
        for r, s in enumerate(steps):
            rows.append(WarmupRow(sparsity, 0, "warmup" if kind == "warmup" else "fixed", b, r, s,
                                  None if s is None else s * 8 * (4 if kind == "warmup" else b // 8),
                                  200, 3000, SCHEDULE, 700))
    return rows


@pytest.fixture(scope="module")
def branched(tmp_path_factory):
    run = make_store(tmp_path_factory.mktemp("branched") / "run")
    with open_store(run) as store:
        for s in (0.0, 0.9):
            write_branching(store, s, 0, branch_rows(s), warmup_rows(s))
    write_report([run])
    return run


def test_section_table_and_figure(branched):
    md = (branched / "report.md").read_text()
    section = md.split(f"## {BRANCHING_HEADING}")[1].split("\n## ")[0]
    # CBS lies on the grid k B (k = 1, 2, 4, 8): the interval states the grid's resolution,
    # out to the geometric midpoints of its neighbours (32 / sqrt 2 = 22.6, 32 sqrt 2 = 45.3)
    assert "| dense | 0 | 8, 100 | ≥ 64 [32, 64] (grid of doublings: 22.6 or more) |" in section
    assert ("| 90 % sparse | 0 | 8, 100 | 32 [16, 32] (grid of doublings: between 11.3 and "
            "45.3) |") in section
    # cost: 5000 of the sweep's trial-steps per level
    sweep = int(load_results(branched).groups.trial_steps.sum())
    assert f"| 5000 | {100 * 5000 / sweep:.3g} |" in section
    assert "](figures/fig9_branching.png)" in section
    assert (branched / "figures" / "fig9_branching.png").read_bytes()[:4] == b"\x89PNG"
    # the warmup: median 64 [60, 70]; the best fixed B is 32 (64 missed the goal once): 41 [40, 45]
    assert "| 8 → 32 (step 40) → 64 (step 55) | 3000 | 64 [60, 70] | 2048 | 32 | 41 [40, 45] | 1312 | 8: 100 |" \
        in section


def test_findings_give_the_numbers(branched):
    findings = (branched / "report.md").read_text().split("## Findings")[1].split("## Figures")[0]
    assert ("dense, seed 0: the critical batch measured by branching at the goal (step H = 100 of the best "
            "B = 8 run; k up to 8, 3 branch seeds) is CBS = ≥ 64 [32, 64] (grid of doublings: 22.6 or "
            "more) (the largest branch passed: "
            "a lower bound); the sweep's fitted B_crit is") in findings
    sweep = int(load_results(branched).groups.trial_steps.sum())
    assert f"branching cost 10000 trial-steps, {round(100 * 10000 / sweep, 1):g} % of the sweep's {sweep}" \
        in findings
    assert ("reached the goal in 64 steps (median of 3 replicates, range [60, 70]; 2048 examples), against "
            "41 [40, 45] steps (1312 examples) for the best fixed batch size B = 32 under the same "
            "3000-example budget: 56.1 % more steps; against the base batch size B = 8 (100 steps): "
            "36 % fewer steps.") in findings


def test_no_section_without_branching_rows(tmp_path):
    run = make_store(tmp_path / "run", probes=False)
    write_report([run])
    md = (run / "report.md").read_text()
    assert BRANCHING_HEADING not in md and "CBS" not in md


def test_schedule_text():
    assert schedule_text(SCHEDULE) == "8 → 32 (step 40) → 64 (step 55)"
