"""L at Lee et al.'s stage in the report, on a synthetic store whose schedule rows have a known
answer (tests/experiments/synthetic.py: the sparse level's L is twice the dense level's at every
point; the early probes put it at 2.2x)."""

import math

import pytest

from experiments.measures.stage.view import STAGES, flip_sentence, stage_tables, stage_view
from experiments.report.runs import load_runs
from experiments.report.write import write_report

from ..synthetic import make_store


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    run = make_store(tmp_path_factory.mktemp("staged") / "run", stage={0.0: 3.0, 0.9: 6.0})
    write_report([run])
    return run


def test_each_level_and_step_is_the_geometric_mean_over_its_trials(staged):
    part = stage_view(load_runs([staged]))
    p = part.points.set_index(["sparsity", "batch_size", "step"])
    # the trials' factors 0.8, 1.0, 1.25 have geometric mean 1; at B = 8, step 4,000 one trial
    # had ended (factors 0.8 and 1.0 remain)
    assert p.loc[(0.0, 32, 2000), "value"] == pytest.approx(3.0)
    assert p.loc[(0.9, 32, 2000), "runs"] == 3
    assert p.loc[(0.9, 8, 4000), "value"] == pytest.approx(6.0 * math.sqrt(0.8))
    assert p.loc[(0.9, 8, 4000), "runs"] == 2
    low, high = p.loc[(0.0, 32, 1000), ["low", "high"]]
    assert low < 3.0 < high
    # the ratio at every common step is 2, with an interval around it
    assert part.ratios.value.to_numpy() == pytest.approx(2.0)
    assert len(part.ratios) == 8 and (part.ratios.low < 2).all() and (part.ratios.high > 2).all()


def test_the_stages_have_their_own_rows_and_the_stage_verdict_holds(staged):
    part = stage_view(load_runs([staged]))
    rows = part.stages.set_index("stage")
    assert list(rows.index) == list(STAGES)
    # initialization: 4.4 / 2.0 at step 0, shown, not judged; early stage: the same after step 0
    assert rows.loc[STAGES[0], "value"] == pytest.approx(2.2)
    assert rows.loc[STAGES[0], "verdict"].startswith("not judged")
    assert rows.loc[STAGES[1], "value"] == pytest.approx(2.2)
    assert rows.loc[STAGES[1], "where"] == "points 1-9 of each run"
    stage = rows.loc[STAGES[2]]
    assert stage["value"] == pytest.approx(2.0) and stage["low"] > 1
    assert stage["where"] == "steps 1,000-4,000" and stage["verdict"] == "holds"
    assert (stage["runs"], stage["reference_runs"]) == (6, 6)
    # the same seeds and trials at both levels: the paired interval stands beside the Welch one
    assert stage["paired_low"] > 0 and stage["paired_high"] >= stage["paired_low"]
    assert rows.loc[list(STAGES[:2]), "paired_low"].isna().all()   # the early probes: no pairs
    v = part.verdicts.set_index("claim")
    assert v.loc["lee_L_rises (steps >= 1000)", "verdict"] == "holds"
    # the sparse synthetic curve needs more steps: L's direction explains it
    assert v.loc["lee_L_explains (steps >= 1000)", "verdict"] == "holds"
    # the sample against the whole split at the dense level's first point
    (check,) = part.check.itertuples(index=False)
    assert (check.step, check.examples) == (1000, 500)
    assert check.full / check.sample == pytest.approx(1.1)
    titles = [t for t, _, _ in stage_tables(part)]
    assert titles == ["Lee et al.'s L, stage by stage", "L at Lee's stage, point by point",
                      "L's sample against the whole training split"]


def test_the_report_draws_L_of_t_and_opens_its_findings_with_the_verdicts(staged):
    md = (staged / "report.md").read_text()
    assert "### L at Lee et al.'s stage" in md
    assert (staged / "figures" / "fig10_lipschitz_stage.png").stat().st_size > 10_000
    findings = md.split("## Findings")[1].split("## Figures")[0]
    assert findings.lstrip().startswith("| claim | tier | verdict | the numbers |")
    assert ("| L larger when sparse, at Lee's stage (steps >= 1000) (Lee et al. 2021): "
            "90 % sparse | paper | holds | 2 [") in findings
    assert "90 % sparse: L / dense L at initialization 2.2" in findings
    assert ("The sign is the same between the early stage and Lee's stage (both intervals "
            "exclude 1).") in findings


@pytest.mark.parametrize("early, late, said", [
    ((0.5, 0.4, 0.6), (2.0, 1.5, 2.5), "The sign flips between the early stage and Lee's stage "
                                       "(both intervals exclude 1)."),
    ((1.5, 1.2, 1.9), (2.0, 1.5, 2.5), "The sign is the same between the early stage and Lee's "
                                       "stage (both intervals exclude 1)."),
    # the lee_lipschitz_fashion_mnist study's 90 % level: the estimate crosses 1, the interval
    # at Lee's stage contains it
    ((0.847, math.nan, math.nan), (1.07, 0.701, 1.63),
     "The point estimate crosses 1 between the early stage and Lee's stage, but the early stage "
     "has one run and Lee's stage's interval contains 1: a change of sign is not established."),
])
def test_a_flip_of_sign_is_said_only_where_both_intervals_exclude_one(early, late, said):
    assert flip_sentence(early, late) == said


def test_a_store_without_the_stage_shows_none_of_it(full):
    part = stage_view(load_runs([full]))
    assert not part.measured and stage_tables(part) == []
    assert "Lee et al.'s stage" not in (full / "report.md").read_text().split("## Figures")[1]
