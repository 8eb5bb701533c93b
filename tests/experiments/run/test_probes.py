"""Probes stored by a study equal the theory functions applied to independently rebuilt networks."""

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
import torch

import experiments
import pruning
import theory
import training
from experiments.measures.probes.store import probed_sparsities
from experiments.measures.probes.tasks import probe_cost, probe_network
from experiments.run.timing import TIMING_FILE

from ...probe_models import build, loop_gradients, moments
from ..conftest import TINY, run_text

PROBED = (TINY.replace("batch_sizes = [8, 32, 128]", "batch_sizes = [4, 8, 16, 32]")
              .replace("target = 0.3", "target = 0.2")
              .replace("min = 0.01, max = 1.0", "min = 0.003, max = 0.03")   # H >= 9: ten points
              .replace("seeds = [0]", "seeds = [0, 1]")
              .replace("enabled = false", "enabled = true\naverage = 2\nhessian_examples = 4\n"
                                          "lanczos = 5"))


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probed")
    return run_text(tmp, PROBED, "probed")


def test_probes_cover_three_batch_sizes_and_ten_points_per_level_and_seed(probed):
    p, g = probed.probes, probed.groups
    assert list(p.columns[:7]) == ["sparsity", "seed", "batch_size", "step", "fraction", "quantity",
                                   "value"]
    assert set(p.quantity) == set(theory.verdicts.trajectory.QUANTITIES)
    for (sparsity, seed), level in p.groupby(["sparsity", "seed"]):
        reached = g[(g.sparsity == sparsity) & (g.seed == seed) & g.steps_to_result.notna()]
        sizes = sorted(set(level.batch_size))
        assert len(sizes) >= 3
        # the smallest and largest batch sizes that reached the goal are among them
        assert sizes[0] == reached.batch_size.min() and sizes[-1] == reached.batch_size.max()
        for b, run in level.groupby("batch_size"):
            horizon = int(reached[reached.batch_size == b].steps_to_result.iloc[0])
            steps = sorted(set(run.step))
            assert steps == list(theory.probe_steps(horizon, 10)) and len(steps) >= 10
            np.testing.assert_allclose(sorted(set(run.fraction)), np.array(steps) / horizon)
            assert run.seconds.nunique() == 1 and run.seconds.iloc[0] > 0
    seconds, training_seconds = probe_cost(g, p)
    runs = p.drop_duplicates(["sparsity", "seed", "batch_size"])
    assert seconds == pytest.approx(runs.seconds.sum()) and training_seconds == g.wall_time.sum()
    # timing.json reports the probes apart from training and branching (none here)
    tasks = json.loads((probed.run_dir / TIMING_FILE).read_text())["tasks"]
    assert tasks["probes"] == {"tasks": len(runs), "seconds": pytest.approx(seconds),
                               "unit": "run", "share": "probe_share"}
    assert tasks["branching"] == {"tasks": 0, "seconds": 0.0, "unit": "measurement"}
    assert tasks["probe_share"] == pytest.approx(seconds / g[g.status == "done"].wall_time.sum())


def test_stored_probes_equal_the_theory_functions_on_a_rebuilt_run(probed):
    """One stored run (sparsity 0.5, seed 1, its largest probed batch size) against
    theory.probe_trajectory called on an independently rebuilt network and mask."""
    p, g, t = probed.probes, probed.groups, probed.trials
    mine = p[(p.sparsity == 0.5) & (p.seed == 1)]
    b = int(mine.batch_size.max())
    group = g[(g.sparsity == 0.5) & (g.seed == 1) & (g.batch_size == b)].iloc[0]
    trial = t[(t.group_key == group.key) & (t.trial == group.best_trial)].iloc[0]
    ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
    net = training.models.build("mlp", ds, seed=1, hidden=[16])
    mask = pruning.prune(net, "snip", 0.5, dataset=ds, seed=1)
    horizon = int(group.steps_to_result)
    decay = None if pd.isna(trial.decay_steps) else int(trial.decay_steps)
    expected = theory.probe_trajectory(
        net, ds, training.Trial(lr=float(trial.lr), momentum=float(trial.momentum),
                                decay_steps=decay, end_factor=float(trial.end_factor)),
        training.RunConfig(b, "momentum", seed=1), theory.probe_steps(horizon, 10), horizon,
        mask=mask, sparsity=0.5, trial_index=int(trial.trial), average=2, hessian_examples=4,
        lanczos=5, sample_seed=1)
    stored = mine[mine.batch_size == b].set_index(["step", "quantity"]).value
    for r in expected.itertuples(index=False):
        assert stored[(r.step, r.quantity)] == pytest.approx(r.value, rel=1e-6), (r.step, r.quantity)


# an AdamW study: beta1 searched, weight decay fixed; one seed, one level, three points at its
# largest batch size (the replay must use the trial's Adam keys, and resumes Adam's moments)
PROBED_ADAMW = (TINY.replace('optimizer = "momentum"', 'optimizer = "adamw"')
                .replace("batch_sizes = [8, 32, 128]", "batch_sizes = [8, 32]")
                .replace("sparsities = [0.0, 0.5]", "sparsities = [0.5]")
                .replace('lr = {scale = "log", min = 0.01, max = 1.0}\n'
                         'momentum = {scale = "reverse-log", min = 0.5, max = 0.99}',
                         'lr = {scale = "log", min = 0.003, max = 0.1}\n'
                         'beta1 = {scale = "reverse-log", min = 0.5, max = 0.95}\n'
                         'weight_decay = 0.05')
                .replace("enabled = false", 'enabled = true\nbatch_sizes = ["largest"]\n'
                                            "points = 3\naverage = 2\nhessian_examples = 4\n"
                                            "lanczos = 5"))


def test_an_adamw_study_stores_and_replays_its_adam_keys(tmp_path):
    (tmp_path / "adamw.toml").write_text(PROBED_ADAMW)
    spec = experiments.load_spec(tmp_path / "adamw.toml")
    run_dir = experiments.run_study(spec, out=tmp_path / "run", executor=ThreadPoolExecutor(1),
                                    quiet=True, report=False)
    res = experiments.load_results(run_dir)
    p, g, t = res.probes, res.groups, res.trials
    b = int(p.batch_size.max())
    group = g[g.batch_size == b].iloc[0]
    trial = t[(t.group_key == group.key) & (t.trial == group.best_trial)].iloc[0]
    # the trial row holds the planned Adam keys
    point = next(x.trials for x in experiments.plan(spec) if x.batch_size == b)[int(trial.trial)]
    adam = {k: point[k] for k in ("beta1", "beta2", "eps", "weight_decay")}
    assert {k: trial[k] for k in adam} == adam and adam["weight_decay"] == 0.05
    assert 0.5 <= adam["beta1"] <= 0.95 and trial.momentum == 0.0
    ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
    net = training.models.build("mlp", ds, seed=0, hidden=[16])
    mask = pruning.prune(net, "snip", 0.5, dataset=ds, seed=0)
    horizon = int(group.steps_to_result)
    decay = None if pd.isna(trial.decay_steps) else int(trial.decay_steps)
    expected = theory.probe_trajectory(
        net, ds, training.Trial(lr=float(trial.lr), decay_steps=decay,
                                end_factor=float(trial.end_factor), **adam),
        training.RunConfig(b, "adamw"), theory.probe_steps(horizon, 3), horizon, mask=mask,
        sparsity=0.5, trial_index=int(trial.trial), average=2, hessian_examples=4, lanczos=5)
    stored = p[p.batch_size == b].set_index(["step", "quantity"]).value
    assert len(stored) == len(expected)
    for r in expected.itertuples(index=False):
        assert stored[(r.step, r.quantity)] == pytest.approx(r.value, rel=1e-6), (r.step, r.quantity)


def test_torch_threads_sets_and_restores_the_thread_count():
    from experiments.measures.probes.tasks import torch_threads

    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    with torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"):
        with torch_threads(other):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_probes_do_not_depend_on_where_they_ran(probed, tmp_path):
    """The fixture probed its runs as executor tasks; probing the same runs in this process,
    into a copy of the store without probes, stores the same rows in the same order."""
    import shutil
    import sqlite3

    from experiments.measures.probes.tasks import run_probes
    from experiments.store.database import open_store
    from experiments.run.workload import Workload

    copy = tmp_path / "copy"
    shutil.copytree(probed.run_dir, copy)
    with sqlite3.connect(copy / "results.sqlite") as db:
        db.execute("DELETE FROM probes")
    spec = probed.spec
    with open_store(copy) as store:
        assert probed_sparsities(store) == set()
        run_probes(spec, Workload.of(spec).load_dataset(), store, quiet=True)
    again = experiments.load_results(copy).probes
    cols = ["sparsity", "seed", "batch_size", "step", "fraction", "quantity", "value"]
    assert len(again) == len(probed.probes) > 0
    pd.testing.assert_frame_equal(again[cols].reset_index(drop=True),
                                  probed.probes[cols].reset_index(drop=True))


@pytest.mark.parametrize("name", ["batchnorm_cnn", "transformer"])
def test_probe_network_on_batchnorm_and_attention_networks(name):
    """``sparsescale probe``'s measurement on a batch-normalized CNN and a transformer left in
    train mode: the eval-mode network's noise (the per-example autograd loop), finite curvature,
    and the model, its running statistics and modes as they were."""
    model, ds = build(name)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    values = probe_network(model, ds, lanczos=6)
    g_sq, trace = moments(loop_gradients(model, ds.x_train, ds.y_train))
    assert values["g_sq"] == pytest.approx(g_sq, rel=1e-8)
    assert values["b_simple"] == pytest.approx(trace / g_sq, rel=1e-8)
    assert all(np.isfinite(v) for v in values.values()) and values["hessian_top"] > 0
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert all(m.training for m in model.modules())
