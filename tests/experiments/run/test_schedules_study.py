"""The ``schedules`` shoot-out end to end on a tiny twin of the bundled configs: every policy
over 5 replicates against the sweep's best fixed batch size (least modelled time S(B) t(B)),
stored in ``policy_runs``, reported with its table, verdicts and figure; a rerun keeps what is
stored; the spec table's errors name the key."""

import json

import pandas as pd
import pytest

from experiments.report.schedules.view import summary
from experiments.run.runner import run_study
from experiments.measures.schedules.tasks import best_fixed, time_model
from experiments.spec.errors import SpecError
from experiments.spec.study import loads
from experiments.store.results import load_results

from ..conftest import TINY

TWIN = TINY.replace("sparsities = [0.0, 0.5]", "sparsities = [0.0]") + (
    "\n[branching]\nenabled = true\ncheckpoints = 3\nk_max = 4\nwarmup = false\n"
    "\n[schedules]\nenabled = true\nreplicates = 5\nevery = 2\nmeasure_steps = 2\n"
    "[schedules.options.goodput]\nmin_gain = 0.0\n")
POLICIES = ["fixed", "goodput", "noise_ramp", "cbs_warmup", "seesaw"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("schedules") / "run"
    run_study(loads(TWIN), out=out, workers=1, quiet=True, cost_model=False)
    return out


def test_every_policy_and_the_best_fixed_b_over_five_replicates(study):
    rows = load_results(study).policy_runs
    assert sorted(set(rows.policy)) == sorted(POLICIES + ["best fixed"])
    assert all(sorted(r) == [0, 1, 2, 3, 4] for _, r in rows.groupby("policy").replicate)
    groups = load_results(study).groups
    t = time_model(groups)
    want = min((int(s) * t(int(b)), int(b)) for s, b in
               zip(groups.steps_to_result.dropna(), groups.batch_size[groups.steps_to_result.notna()]))[1]
    assert best_fixed(groups, 0.0, 0, t).batch_size == want
    assert (rows[rows.policy == "best fixed"].batch_size == want).all()
    smallest = int(groups[groups.steps_to_result.notna()].batch_size.min())
    assert (rows[rows.policy != "best fixed"].batch_size == smallest).all()
    for r in rows.itertuples():
        segs = json.loads(r.schedule)
        assert segs[0][:2] == [0, r.batch_size]
        if pd.notna(r.steps_to_result):
            # examples and modelled seconds are those of the schedule it followed
            bounds = [s[0] for s in segs[1:]] + [int(r.steps_to_result)]
            spans = [(min(e, r.steps_to_result) - s[0], s[1]) for s, e in zip(segs, bounds)]
            assert r.examples_to_result == sum(max(n, 0) * b for n, b in spans)
            assert r.seconds_to_result == pytest.approx(
                sum(max(n, 0) * (r.t_fixed + r.t_example * b) for n, b in spans))
    # the noise-driven policies read 2 batches at the current B before each decision
    for r in rows.itertuples():
        decisions = json.loads(r.decisions)
        if r.policy in ("goodput", "noise_ramp"):
            before = [r.batch_size] + [d[3] for d in decisions[:-1]]
            assert r.measured_examples == 2 * sum(before[:len(decisions)])
            assert all(d[2] is not None for d in decisions)
        else:
            assert r.measured_examples == 0 and all(d[2] is None for d in decisions)
    assert (rows[rows.policy.isin(["goodput", "noise_ramp"])].measured_examples > 0).any()


def test_summary_verdicts_and_report_section(study):
    rows = load_results(study).policy_runs.assign(run="tiny")
    table = summary(rows)
    assert set(table.verdict) <= {"", "beats", "loses", "inconclusive", "not reached"}
    fixed = table[table.policy == "best fixed"].iloc[0]
    assert fixed.replicates == 5 and fixed.steps_low <= fixed.steps <= fixed.steps_high
    report = (study / "report.md").read_text()
    assert "## Batch-size policies against the best fixed batch size" in report
    assert "Qiao et al. 2021 (Pollux)" in report and (study / "figures" / "fig_schedules.png").exists()


def test_a_rerun_keeps_what_is_stored(study):
    before = load_results(study).policy_runs
    run_study(loads(TWIN), out=study, workers=1, quiet=True, report=False, cost_model=False)
    pd.testing.assert_frame_equal(load_results(study).policy_runs, before.drop(columns=[]))


def test_table_errors_name_the_key():
    with pytest.raises(SpecError) as err:
        loads(TINY + "\n[schedules]\nenabled = true\nreplicates = 3\npolicies = [\"goodptu\"]\n"
                     "[schedules.options.seesaw]\nmilestones = [1]\n")
    text = str(err.value)
    assert "schedules.replicates" in text and "did you mean 'goodput'" in text
    assert "schedules.options.seesaw" in text


def test_the_table_enters_the_hash_only_when_enabled_and_round_trips():
    from experiments.spec.study import from_canonical

    plain, off, on = (loads(TINY), loads(TINY + "\n[schedules]\nreplicates = 6\n"), loads(TWIN))
    assert plain.hash == off.hash and on.hash != loads(TWIN.replace("every = 2", "every = 3")).hash
    back = from_canonical(json.loads(on.to_json()))
    assert back.schedules == on.schedules and back.hash == on.hash
