"""``sparsescale design`` on a store holding nested L values with known components: the printed
components are the ANOVA estimates computed here by hand from the stored values, and the pairs
and runs are the normal-approximation sample sizes."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments.cli.main import main
from experiments.report.design_view import design, metric_points
from experiments.store.database import open_store
from experiments.store.results import load_results
from experiments.measures.probes.store import write_probes
from experiments.measures.stage.store import StageRow

from ..synthetic import make_store

RUNS, STEPS = 8, (1000, 1250, 1500, 1750)


@pytest.fixture(scope="module")
def pilot(tmp_path_factory):
    run_dir = make_store(tmp_path_factory.mktemp("design"), probes=False)
    rng = np.random.default_rng(5)
    shared = rng.normal(0, 0.15, RUNS)
    with open_store(run_dir) as store:
        for sparsity, mu in ((0.0, 1.0), (0.9, 1.2)):
            own = rng.normal(0, 0.1, RUNS)
            rows = [StageRow(sparsity, 0, 8, trial, step, 2000, "local_lipschitz",
                                math.exp(mu + shared[trial] + own[trial] + rng.normal(0, 0.3)),
                                500, 1.0)
                    for trial in range(RUNS) for step in (0, *STEPS)]
            write_probes(store, sparsity, [], rows)
    return run_dir


def by_hand(y):
    """(sigma_w^2, sigma_b^2, cov_b) of a (level, run, point) array, balanced."""
    levels, runs, points = y.shape
    means = y.mean(axis=2)
    ms_w = ((y - means[..., None]) ** 2).sum() / (levels * runs * (points - 1))
    ms_b = points * ((means - means.mean(axis=1, keepdims=True)) ** 2).sum() / (levels * (runs - 1))
    c = means - means.mean(axis=1, keepdims=True)
    return ms_w, (ms_b - ms_w) / points, (c[0] * c[1]).sum() / (runs - 1)


def test_components_and_sizes_are_the_closed_forms(pilot, capsys):
    frame = metric_points(load_results(pilot))
    assert set(frame.step) == set(STEPS)   # step 0 is before Lee's stage
    y = np.log(np.array([[frame[(frame.sparsity == s) & (frame.trial == t)].sort_values("step")
                          .value.to_numpy() for t in range(RUNS)] for s in (0.0, 0.9)]))
    within, between, cov = by_hand(y)
    comps, delta, rows = design(load_results(pilot), points=(4, 16))
    assert comps.within == pytest.approx(within)
    assert comps.between == pytest.approx(max(between, 0.0))
    assert comps.cov_paired == pytest.approx(cov)
    assert comps.pairs == RUNS and delta == pytest.approx(math.log(1.1))
    z2 = (stats.norm.ppf(0.95) + stats.norm.ppf(0.8)) ** 2
    for r in rows:
        v = (2 * (comps.between - min(cov, comps.between)) + 2 * within / r.points if r.paired
             else 2 * (comps.between + within / r.points))
        assert r.n == max(2, math.ceil(v * z2 / delta ** 2))
    assert main(["design", str(pilot), "--points", "4,16"]) == 0
    out = capsys.readouterr().out
    assert f"sigma_w^2 = {within:.4g}" in out and f"{RUNS} pairs" in out
    assert "pairs" in out and "runs/level" in out


def test_a_trials_column_and_bad_metric(pilot, capsys):
    assert main(["design", str(pilot), "--metric", "final_metric", "--scale", "linear",
                 "--effect", "0.05"]) == 0
    assert "one value per run" in capsys.readouterr().out
    assert main(["design", str(pilot), "--metric", "lipschitz"]) == 2
    assert "allowed: " in capsys.readouterr().err
