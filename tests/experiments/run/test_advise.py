"""experiments.run.advise on the teacher data: the recommendation is theory.critical_batch of its
own branches, inside its interval; the probes are of the base run's weights (replayed with the
plain loop); the cost and the equivalent sweep by hand; the report's files; bad input."""

import math

import numpy as np
import pytest
import torch

import training
from experiments.report.formatting import fmt_num
from experiments.run.advise import (
    AdviceError, advise, default_base_batch, predicted_steps, sweep_trial_steps, write_advice,
)
from experiments.run.workload import Workload
from experiments.spec.study import loads
from theory.estimators.branching import critical_batch
from theory.estimators.noise import gradient_noise
from theory.verdicts.trajectory import replay_states

from ..conftest import TINY

SPEC = loads(TINY)


@pytest.fixture(scope="module")
def advice():
    return advise(SPEC, k_max=8)


def test_recommendation_is_the_rule_on_its_own_branches(advice):
    b = advice.branching
    assert advice.low <= advice.recommended <= advice.high
    # theory.critical_batch computed directly on the same branch losses, at the goal
    direct = critical_batch(b.critical.steps, b.base_loss, b.branch_loss, base_batch=advice.base_batch,
                            ks=b.critical.ks, level=advice.level)
    assert b.critical.steps[-1] == advice.goal_step and advice.at == 1.0
    assert advice.recommended == direct.critical_batch[-1]
    assert (advice.low, advice.high) == (direct.low[-1], direct.high[-1])
    assert advice.critical.critical_batch.tolist() == direct.critical_batch.tolist()
    # checkpoints at 1/4, 1/2, 3/4 and all of the base run's steps to the goal
    h = advice.goal_step
    assert b.critical.steps.tolist() == np.round(np.array([0.25, 0.5, 0.75, 1.0]) * h).astype(int).tolist()
    # the base batch: the largest power of two with k_max B_0 <= the training set
    n = Workload.of(SPEC).load_dataset().n_train
    assert advice.base_batch == default_base_batch(n, 8) and 8 * advice.base_batch <= n < 16 * advice.base_batch


def test_probes_are_of_the_base_runs_weights(advice):
    workload = Workload.of(SPEC)
    ds = workload.load_dataset()
    model = workload.build_model(ds, 0)
    run = training.RunConfig(advice.base_batch, SPEC.optimizer, max_steps=advice.goal_step, seed=0,
                             goal=training.Goal(SPEC.metric, SPEC.target, SPEC.strict), eval_schedule=SPEC.eval)
    # the best trial keeps its index in the search group: its data order
    states = replay_states(model, ds, advice.trial, run, advice.noise.step.tolist(),
                           trial_index=advice.trial_index)
    for row in advice.noise.itertuples():
        net = training.models.build("mlp", ds, hidden=[16], seed=0)
        with torch.no_grad():
            for name, p in net.named_parameters():
                p.copy_(states[row.step][name])
        want = gradient_noise(net, ds, hessian_examples=0, dtype=torch.float64)   # the whole split
        assert row.b_simple == pytest.approx(want.b_simple, rel=1e-3)
        assert row.g_sq == pytest.approx(want.g_sq, rel=1e-3)
    steps = [0, *np.round(np.array([0.25, 0.5, 0.75, 1.0]) * advice.goal_step).astype(int)]
    assert advice.noise.step.tolist() == steps
    assert advice.noise.fraction.tolist() == [s / advice.goal_step for s in steps]


def test_cost_and_the_equivalent_sweep_by_hand(advice):
    c, b, h, b0 = advice.cost, advice.branching, advice.goal_step, advice.base_batch
    w = b.window
    # W: 10 % of the H B_0 examples to the goal, rounded up to whole steps at k_max B_0 = 8 B_0
    assert w == 8 * b0 * max(1, math.ceil(0.1 * h * b0 / (8 * b0)))
    diverged = ~np.isfinite(b.branch_loss[:, 1:])
    # per checkpoint and branch seed: the k = 1 continuation, and 3 multipliers at k = 2, 4, 8
    planned = 4 * 3 * (w // b0 + 3 * (w // (2 * b0) + w // (4 * b0) + w // (8 * b0)))
    assert c.branches == planned or (c.branches < planned and diverged.any())
    assert c.base == h
    n = Workload.of(SPEC).load_dataset().n_train
    assert c.probes == 5 * math.ceil(min(1024, n) / b0)
    assert c.timing == len(advice.step_times) * 3 * 10
    assert h <= c.lr_search <= 8 * (h + SPEC.eval.every)
    assert c.total == c.lr_search + c.base + c.branches + c.probes + c.timing
    # the sweep: 4 trials at B = 8, 32, 128, each to the first evaluation (every 10) at or after
    # the predicted steps, at most the budget clamp(8000 / B, 20, 200)
    r = advice.recommended
    sweep = 0
    for batch, budget in ((8, 200), (32, 200), (128, 63)):
        s = h * (1 + r / batch) / (1 + r / b0)
        sweep += 4 * min(budget, 10 * math.ceil(s / 10))
    assert c.sweep == sweep == sweep_trial_steps(SPEC, predicted_steps(SPEC.batch_sizes, r, b0, h))
    assert c.fraction == pytest.approx(c.total / sweep, rel=1e-15)


def test_prediction_passes_through_the_base_run(advice):
    p = advice.predicted
    at_base = p[p.batch_size == advice.base_batch].iloc[0]
    assert at_base.steps == pytest.approx(advice.goal_step) == at_base.steps_low == at_base.steps_high
    assert np.all(p.steps_low <= p.steps + 1e-9) and np.all(p.steps <= p.steps_high + 1e-9)
    assert np.all(np.diff(p.steps) < 0)
    assert p.seconds.to_numpy() == pytest.approx(np.round(p.steps.to_numpy()) * p.step_seconds.to_numpy())
    # S_min (1 + B_crit / B): twice S_min at B = B_crit
    s_min = advice.goal_step / (1 + advice.recommended / advice.base_batch)
    assert predicted_steps([advice.recommended], advice.recommended, advice.base_batch,
                           advice.goal_step)[0] == pytest.approx(2 * s_min)


def test_report_files(advice, tmp_path):
    html = write_advice(advice, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert html == tmp_path / "report.html" and html.read_text().count("data:image/png;base64") == 1
    assert "recommended batch size" in md and "figures/advice.png" in md
    # CBS is one of k B_0 (k = 1, 2, 4, ...): the summary states the doubling grid's resolution,
    # out to the geometric midpoints of the interval's ends and their neighbours
    a = advice
    edge = (f"{fmt_num(a.low / math.sqrt(2), 3)} or more" if a.lower_bound else
            f"between {fmt_num(a.low / math.sqrt(2), 3)} and {fmt_num(a.high * math.sqrt(2), 3)}")
    line = a.summary().splitlines()[1]
    assert line.startswith("recommended batch size: ") and f"(grid of doublings: {edge})" in line
    assert f"(grid of doublings: {edge})" in md
    assert (tmp_path / "figures" / "advice.png").read_bytes()[:4] == b"\x89PNG"
    for name in ("noise", "critical", "predicted", "cost"):
        assert (tmp_path / f"{name}.csv").exists()
    assert "equivalent sweep" in (tmp_path / "cost.csv").read_text()


@pytest.mark.parametrize("kw, message", [
    (dict(lr_trials=0), "lr_trials must be an integer >= 1"),
    (dict(at=0.3), r"at must be one of the checkpoint fractions"),
    (dict(at=2), r"at must be a fraction .* in \(0, 1\]"),
    (dict(seeds=1), "seeds must be an integer >= 3"),
    (dict(sparsity=1.0), r"sparsity must be in \[0, 1\)"),
    (dict(batch_size=10_000), r"batch_size must be an integer in \[1, "),
    (dict(lr=-1.0), "lr must be a positive number"),
])
def test_bad_arguments(kw, message):
    with pytest.raises(AdviceError, match=message):
        advise(SPEC, **kw)


def test_a_goal_no_learning_rate_reaches():
    spec = loads(TINY.replace("target = 0.3", "target = 0.0001"))
    with pytest.raises(AdviceError, match=r"none of the 2 learning rates searched reached the goal"):
        advise(spec, lr_trials=2, k_max=2)


def test_a_delay_axis_adds_the_critical_delay_the_recommendation_predicts(advice, tmp_path):
    """tau_crit(B) = 1 + B_crit / B (the delayed-SGD bound without additive noise, B_crit as its
    one parameter), its range from the recommendation's interval; printed and written."""
    from dataclasses import replace

    from experiments.run.advise import delay_prediction

    d = delay_prediction([8, 32], 64.0, 16.0, 128.0)
    assert list(d.batch_size) == [8, 32]
    np.testing.assert_allclose(d.tau_crit, [9.0, 3.0])
    np.testing.assert_allclose(d.tau_crit_low, [3.0, 1.5])
    np.testing.assert_allclose(d.tau_crit_high, [17.0, 5.0])
    assert advice.delays.empty and "critical delay" not in advice.summary()
    delayed = replace(advice, delays=d)
    assert "critical delay" in delayed.summary().splitlines()[-1]
    assert "9 [3, 17] at B = 8" in delayed.summary()
    write_advice(delayed, tmp_path)
    assert (tmp_path / "delays.csv").read_text().startswith("batch_size,tau_crit")
    assert "9 [3, 17] at B = 8" in (tmp_path / "report.md").read_text()
