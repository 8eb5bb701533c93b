"""Probes stored by a study equal the theory functions applied to independently rebuilt networks."""

from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
import torch

import experiments
import pruning
import theory
import training
from experiments.probes import HESSIAN_EXAMPLES, snapshot_steps

from .conftest import TINY

PROBED = (TINY.replace("batch_sizes = [8, 32, 128]", "batch_sizes = [32, 128]")
              .replace("sparsities = [0.0, 0.5]", "sparsities = [0.5]")
              .replace("enabled = false", "enabled = true\nbatch_size = 32\nexamples = 64\npoints = 2"))


def test_snapshot_steps():
    assert snapshot_steps(100, 3) == [1, 10, 100]
    assert snapshot_steps(2, 4) == [1, 2]
    assert snapshot_steps(0, 4) == []


def test_probes_match_direct_computation(tmp_path):
    toml = tmp_path / "probed.toml"
    toml.write_text(PROBED)
    run_dir = experiments.run_study(toml, out=tmp_path / "run", executor=ThreadPoolExecutor(1),
                                    quiet=True, report=False)
    res = experiments.load_results(run_dir)
    probes = res.probes.set_index(["phase", "step", "quantity"]).value

    ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
    net = training.models.build("mlp", ds, seed=0, hidden=[16])
    mask = pruning.prune(net, "snip", 0.5, dataset=ds, seed=0)
    mask.apply(net)
    noise = theory.gradient_noise(net, ds, mask=mask, examples=64, seed=0,
                                  hessian_examples=HESSIAN_EXAMPLES)
    assert probes[("init", 0, "g_sq")] == pytest.approx(noise.g_sq, rel=1e-9)
    assert probes[("init", 0, "b_simple")] == pytest.approx(noise.b_simple, rel=1e-9)
    top = theory.hessian_top_eigenvalues(net, ds, k=1, mask=mask, examples=64)
    assert probes[("init", 0, "hessian_top")] == pytest.approx(float(top[0]), rel=1e-3)

    # trajectory: the best trial of the (0.5, B=32) group replayed with the reference trainer
    g = res.groups[res.groups.batch_size == 32].iloc[0]
    assert not pd.isna(g.best_trial)
    trial = res.trials[(res.trials.group_key == g.key) & (res.trials.trial == g.best_trial)].iloc[0]
    steps = snapshot_steps(int(g.steps_to_result), 2)
    traj = res.probes[res.probes.phase == "trajectory"]
    assert sorted(set(traj.step)) == steps and set(traj.batch_size) == {32}
    t = steps[-1]

    def state(k):
        return training.train_reference(
            net, ds, training.Trial(lr=float(trial.lr), momentum=float(trial.momentum)),
            training.RunConfig(32, max_steps=k, stop="never"), mask=mask,
            trial_index=int(trial.trial)).state

    lip = theory.local_lipschitz(net, ds, state(t - 1), state(t), mask=mask, examples=64)
    assert probes[("trajectory", t, "local_lipschitz")] == pytest.approx(lip.value, rel=1e-9)
    at_t = training.models.build("mlp", ds, seed=0, hidden=[16])
    at_t.load_state_dict(state(t))
    with torch.no_grad():
        loss = theory.gradient_noise(at_t, ds, mask=mask, examples=64, hessian_examples=0).loss
    assert probes[("trajectory", t, "loss")] == pytest.approx(loss, rel=1e-9)



def test_torch_threads_sets_and_restores_the_thread_count():
    from experiments.probes import torch_threads

    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    with torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"):
        with torch_threads(other):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
