"""experiments.branch_critical_batch on a small network: every branch loss against a run trained
independently, CBS(t) by the rule, the cost in trial-steps; the warmup against fixed batch sizes."""

from dataclasses import replace

import numpy as np
import pytest
import torch

import training
from experiments.run.branching import (
    branch_critical_batch, branch_data_seeds, steps_for_examples, warmup_comparison,
)
from theory.estimators.branching import BranchingError, CriticalBatch, branching_trial_steps, critical_batch
from training import EvalSchedule, RunConfig, Trial
from training.schedules.batch_schedule import BatchSchedule, BatchSegment
from training.schedules.order import trial_seed

F64 = torch.float64


@pytest.fixture(scope="module")
def teacher():
    return training.data.load("teacher", n=1280, dim=8, num_classes=3, seed=1)   # 1024 training examples


@pytest.fixture(scope="module")
def net(teacher):
    return training.models.build("mlp", teacher, hidden=[16], seed=0)


TRIAL = Trial(lr=0.05, momentum=0.9)


def run_config(**kw):
    return RunConfig(8, "momentum", max_steps=400, goal=0.3, eval_schedule=EvalSchedule(every=10), seed=3,
                     dtype=F64, **kw)


@pytest.fixture(scope="module")
def measured(teacher, net):
    return branch_critical_batch(net, teacher, TRIAL, run_config(), trial_index=2, goal_step=70, k_max=8,
                                 window=128, seeds=3)


def held_out_loss(net, ds, params):
    model = training.models.build("mlp", ds, hidden=[16], seed=0).double()
    out = torch.func.functional_call(model, {k: v.double() for k, v in params.items()}, (ds.x_val.double(),))
    return float(torch.nn.functional.cross_entropy(out, ds.y_val))


def test_branch_losses_equal_runs_trained_independently(teacher, net, measured):
    res = measured.critical
    assert res.steps.tolist() == [0, 10, 20, 30, 40, 50, 60, 70] and res.ks.tolist() == [1, 2, 4, 8]
    # seed 1's branch at checkpoint 30, k = 4 (B = 32), multiplier 2: 30 steps at B = 8, then
    # 4 steps at B = 32, lr 0.05 * 4 * 2, from the base run's data position in seed 1's order
    seed1 = branch_data_seeds(trial_seed(3, 2), 3)[1]
    base = training.train_trials(net, teacher, [TRIAL], replace(run_config(), max_steps=30, stop="never"),
                                 first_index=2, return_state=True)
    branch = training.train_trials(net, teacher, [Trial(lr=0.4, momentum=0.9)],
                                   replace(run_config(), batch_size=32, max_steps=34, stop="never"),
                                   start=base.end_state, data_seeds=[seed1])
    assert measured.branch_loss[3, 2, 2, 1] == pytest.approx(held_out_loss(net, teacher, branch.state(0)), rel=1e-9)
    # seed 0, k = 1, multiplier 1: the base run itself, 70 + 16 steps
    straight = training.train_trials(net, teacher, [TRIAL], replace(run_config(), max_steps=86, stop="never"),
                                     first_index=2)
    assert measured.base_loss[-1, 0] == pytest.approx(held_out_loss(net, teacher, straight.state(0)), rel=1e-9)


def test_critical_batch_follows_the_rule_and_the_cost_is_counted(measured):
    res = measured.critical
    again = critical_batch(res.steps, measured.base_loss, measured.branch_loss, base_batch=8, ks=res.ks)
    np.testing.assert_array_equal(res.critical_batch, again.critical_batch)
    assert set(res.critical_batch.tolist()) <= {0.0, 8.0, 16.0, 32.0, 64.0}
    assert np.all((res.low <= res.critical_batch) & (res.critical_batch <= res.high))
    assert res.n_seeds == 3 and measured.window == 128 and measured.goal_step == 70
    diverged = ~np.isfinite(measured.branch_loss)
    planned = branching_trial_steps(128, 8, res.ks, 3, 3, 8)
    assert measured.branch_trial_steps <= planned
    assert measured.branch_trial_steps == planned or diverged.any()
    assert measured.base_trial_steps == 70 and measured.trial_steps == 70 + measured.branch_trial_steps


def test_goal_step_found_and_window_defaults(teacher, net):
    got = branch_critical_batch(net, teacher, TRIAL, run_config(), trial_index=2, checkpoints=3, k_max=2,
                                seeds=1)
    hit = training.train_trials(net, teacher, [TRIAL], run_config(), first_index=2)
    assert got.goal_step == hit.steps_to_result
    # W = 10 % of H B examples, rounded up to whole steps at 2 B
    assert got.window == 16 * max(1, -(-got.goal_step * 8 // 160))
    assert got.base_trial_steps == hit.steps_run + got.goal_step
    assert got.critical.low.tolist() == got.critical.high.tolist() == got.critical.critical_batch.tolist()


def test_bad_arguments(teacher, net):
    kw = dict(goal_step=70)
    with pytest.raises(BranchingError, match=r"k_max \* batch_size = 2048 exceeds the training set"):
        branch_critical_batch(net, teacher, TRIAL, run_config(), k_max=256, **kw)
    with pytest.raises(BranchingError, match="multipliers must include 1"):
        branch_critical_batch(net, teacher, TRIAL, run_config(), multipliers=(0.5, 2.0), **kw)
    with pytest.raises(BranchingError, match="seeds must be 1 or an integer >= 3"):
        branch_critical_batch(net, teacher, TRIAL, run_config(), seeds=2, **kw)
    with pytest.raises(BranchingError, match=r"window must be a positive multiple of k_max \* batch_size \(16 examples"):
        branch_critical_batch(net, teacher, TRIAL, run_config(), k_max=2, window=100, **kw)
    with pytest.raises(BranchingError, match="does not reach the goal within 3 steps"):
        branch_critical_batch(net, teacher, TRIAL, replace(run_config(), max_steps=3))


def test_steps_for_examples():
    sched = BatchSchedule((BatchSegment(0, 8), BatchSegment(5, 32, 4.0)))
    assert [steps_for_examples(sched, e) for e in (1, 40, 41, 72, 73)] == [1, 5, 6, 6, 7]
    assert steps_for_examples(BatchSchedule.constant(16), 100) == 7


def test_warmup_against_fixed_batch_sizes(teacher, net):
    # CBS 8 at the start, 32 from 160 examples on: B(t) = 8, then 32 with lr x 4
    critical = CriticalBatch(steps=np.array([0, 20]), base_batch=8, ks=np.array([1, 2, 4]), eps=0.01, level=0.9,
                             n_seeds=3, critical_batch=np.array([8.0, 32.0]), low=np.array([8.0, 16.0]),
                             high=np.array([8.0, 32.0]), relative_gap=np.zeros((2, 3)),
                             best_multiplier=np.ones((2, 3), int))
    run = run_config()
    got = warmup_comparison(net, teacher, TRIAL, run, critical, trial_index=2, replicates=3, examples=4000)
    assert got.schedule == BatchSchedule((BatchSegment(0, 8), BatchSegment(20, 32, 4.0)))
    assert got.runs.kind.tolist() == ["warmup"] * 3 + ["fixed"] * 9
    assert got.runs[got.runs.kind == "fixed"].batch_size.tolist() == [8] * 3 + [16] * 3 + [32] * 3
    assert got.runs.max_steps.tolist() == [140] * 3 + [500] * 3 + [250] * 3 + [125] * 3
    # replicate 0 of the warmup is the base run's data order under the schedule
    seeds = branch_data_seeds(trial_seed(3, 2), 3)
    ref = training.reference.train_schedule_reference(
        net, teacher, TRIAL, replace(run, max_steps=140, eval_schedule=EvalSchedule(every=1)),
        schedule=got.schedule, trial_index=2)
    warm = got.runs[got.runs.kind == "warmup"]
    assert warm.steps_to_result.iloc[0] == ref.result.steps_to_result
    assert warm.examples_to_result.iloc[0] == got.schedule.examples(ref.result.steps_to_result)
    assert seeds[0] == trial_seed(3, 2)
    fixed = got.runs[got.runs.kind == "fixed"]
    full = fixed.groupby("batch_size").steps_to_result.agg(lambda v: v.notna().all())
    med = fixed.groupby("batch_size").steps_to_result.median()[full]
    assert got.best_fixed == med.idxmin()
    s = got.summary("warmup")
    assert s[0] == warm.steps_to_result.median() and s[1] <= s[0] <= s[2]
    done = got.runs.steps_to_result.fillna(got.runs.max_steps)
    assert got.trial_steps >= int(done.sum()) - 12 * 10   # each run stops at the evaluation after its hit


@pytest.mark.parametrize("layer", ["batchnorm", "dropout", "gru"])
def test_branching_runs_on_models_with_state_randomness_or_recurrence(teacher, layer):
    """Checkpoints of a model with running statistics, random draws or a recurrent layer branch
    like any other (each branch resumes the checkpoint's buffers and generator)."""
    from torch import nn

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru, self.out = nn.GRU(2, 8, batch_first=True), nn.Linear(8, 3)

        def forward(self, x):
            return self.out(self.gru(x.view(x.shape[0], 4, 2))[0][:, -1])

    torch.manual_seed(0)
    middle = {"batchnorm": nn.BatchNorm1d(16), "dropout": nn.Dropout(0.2)}
    net = (Recurrent() if layer == "gru" else
           nn.Sequential(nn.Linear(8, 16), middle[layer], nn.ReLU(), nn.Linear(16, 3)))
    got = branch_critical_batch(net, teacher, TRIAL, run_config(), goal_step=30, checkpoints=2,
                                k_max=2, window=32, seeds=1)
    assert np.isfinite(got.base_loss).all() and np.isfinite(got.branch_loss).all()
    assert len(got.critical.critical_batch) == 2


def test_given_steps_base_only_at_k1_and_the_checkpoint_hook(teacher, net, measured):
    seen = []
    got = branch_critical_batch(net, teacher, TRIAL, run_config(), trial_index=2, goal_step=70, k_max=8,
                                window=128, seeds=3, steps=[30, 70], base_only_at_k1=True,
                                on_checkpoint=lambda t, state: seen.append((t, state.step)))
    assert seen == [(30, 30), (70, 70)]
    assert got.critical.steps.tolist() == [30, 70]
    # k >= 2 and the k = 1, multiplier 1 branches are those of the full measurement at the same steps
    rows = [3, 7]
    np.testing.assert_array_equal(got.branch_loss[:, 1:], measured.branch_loss[rows, 1:])
    np.testing.assert_array_equal(got.base_loss, measured.base_loss[rows])
    assert np.isinf(got.branch_loss[:, 0, [0, 2]]).all()
    # ... so CBS is the same: k = 1 passes through its multiplier 1 whatever the others do
    np.testing.assert_array_equal(got.critical.critical_batch, measured.critical.critical_batch[rows])
    # cost: per checkpoint and seed, one k = 1 branch (16 steps) and 3 multipliers at k = 2, 4, 8
    assert got.branch_trial_steps == 2 * 3 * (16 + 3 * (8 + 4 + 2)) and got.base_trial_steps == 70
    with pytest.raises(BranchingError, match=r"steps must be increasing integers in \[0, goal_step=70\]"):
        branch_critical_batch(net, teacher, TRIAL, run_config(), goal_step=70, k_max=2, steps=[30, 20])
    with pytest.raises(BranchingError, match=r"steps must be increasing integers"):
        branch_critical_batch(net, teacher, TRIAL, run_config(), goal_step=70, k_max=2, steps=[30, 80])
