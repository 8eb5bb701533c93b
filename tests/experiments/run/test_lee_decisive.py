"""The decisive Lee study's tiny twin (``lee_decisive_twin``, issue 47) end to end: the search
then the repeats at each cell's best point (checked against the search's stored trials), L over
the same window in every probed run, and the report's decisive and bias-control verdicts with
finite numbers.

Slow (about 45 s on two cores: three series of searches, repeats and probes on a CNN), so run
with ``pytest -m slow`` or ``sparsescale study lee_decisive_twin``. The default suite covers its
parts: the search's best point (``test_tuning.py``), L's window at Lee's stage
(``test_lee_stage.py``), the bias controls' sub-studies (``spec/test_tuning_keys.py``,
``spec/test_lee_protocol_keys.py``) and the decisive verdicts
(``theory/verdicts/test_lee_decisive.py``).
"""

import math
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

import training
from experiments.run.runner import run_study
from experiments.spec.study import load
from experiments.store.results import load_results
from training.errors import SparsescaleError

TWIN = "lee_decisive_twin"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    spec = load(TWIN)
    try:
        training.data.load(spec.dataset, **spec.dataset_options)
    except SparsescaleError as exc:   # Fashion-MNIST is installed separately
        pytest.skip(f"fashion_mnist not available: {exc}")
    out = tmp_path_factory.mktemp("twin") / "run"
    # the rules choose the program: no timing of candidate programs in a test; no DDP cost
    # model either (the report's time to result is not what these tests check)
    return run_study(spec, out=out, executor=ThreadPoolExecutor(1), quiet=True,
                     program_choice="rules", cost_model=False), spec


def best_by_hand(search):
    """Each cell's best search trial: the fewest steps among those that met the goal (ties: the
    lower index), else the lowest final error."""
    out = {}
    for (s, b), cell in search.trials.groupby(["sparsity", "batch_size"]):
        hit = cell[cell.status == "reached"]
        row = (min(hit.itertuples(), key=lambda r: (r.hit_step, r.trial)) if len(hit) else
               min(cell.itertuples(), key=lambda r: (r.final_metric, r.trial)))
        out[(s, b)] = (row.lr, row.momentum)
    return out


@pytest.mark.parametrize("sub", ["", "no_bias", "dense_biases"])
def test_each_series_repeats_its_searchs_best_point(twin, sub):
    run, spec = twin
    search = load_results(run / sub / "search")
    study = load_results(run / sub)
    assert set(search.groups.seed) == {spec.tuning.seed} and set(study.groups.seed) == {0}
    assert (search.trials.groupby("group_key").size() == spec.tuning.points).all()
    best = best_by_hand(search)
    for (s, b), cell in study.trials.groupby(["sparsity", "batch_size"]):
        assert len(cell) == spec.trials
        assert set(zip(cell.lr, cell.momentum)) == {best[(s, b)]}


def test_every_probed_run_has_the_same_window_of_L(twin):
    run, spec = twin
    p = spec.probes
    steps = list(range(p.lipschitz_start, p.lipschitz_until + 1, p.lipschitz_every))
    for sub in ("", "no_bias", "dense_biases"):
        s = load_results(run / sub).stage_probes
        L = s[s.quantity == "local_lipschitz"]
        per_run = L.groupby(["sparsity", "trial"]).step.apply(sorted)
        assert len(per_run) == spec.trials * len(set(L.sparsity))
        assert all(list(v) == steps for v in per_run)


def test_the_report_holds_the_decisive_and_bias_control_rows(twin):
    run, _ = twin
    v = pd.read_csv(run / "verdicts.csv")
    claims = set(v.claim)
    want = ["lee_L_resolved (steps >= 10)", "lee_steps_tuned (steps to the goal)",
            "lee_L_rises: biases removed", "lee_steps: biases removed",
            "lee_L_rises: weights pruned", "lee_steps: weights pruned",
            "lee_L_rises: weights pruned, biases kept", "lee_steps: weights pruned, biases kept"]
    assert set(want) <= claims, claims
    for claim in want:
        row = v[v.claim == claim].iloc[0]
        assert all(math.isfinite(row[k]) for k in ("value", "low", "high")), row.to_dict()
        assert row.verdict in ("holds", "does not hold", "inconclusive")
    steps = v[v.claim == "lee_steps_tuned (steps to the goal)"].iloc[0]
    assert steps.low <= steps.value <= steps.high and "paired bootstrap" in steps.reason
    md = (run / "report.md").read_text()
    assert "lee_L_resolved (steps >= 10)" in md and "lee_L_rises: biases removed" in md


def test_the_docs_verdicts_of_a_study_and_its_controls_are_its_reports(twin, tmp_path):
    """``docs_verdicts RUN,RUN/no_bias,RUN/dense_biases`` stores what the study's report
    judged, bias-control rows included (one folder alone would miss them)."""
    from experiments.scripts import docs_verdicts

    run, _ = twin
    folders = [run, run / "no_bias", run / "dense_biases"]
    assert docs_verdicts.main([",".join(map(str, folders)), "--assets", str(tmp_path)]) == 0
    got = pd.read_csv(tmp_path / TWIN / "verdicts.csv")
    pd.testing.assert_frame_equal(got.drop(columns="source"), pd.read_csv(run / "verdicts.csv"))
    assert "lee_L_rises: biases removed" in set(got.claim)
    alone = docs_verdicts.write_verdicts(run, tmp_path / "alone")
    assert "lee_L_rises: biases removed" not in set(pd.read_csv(alone).claim)
