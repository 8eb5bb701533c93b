"""``[pruning] mask_per_trial`` with Lee et al.'s initialization and SNIP: every trial of a group
its own initialization seed and its own mask, and trial i's mask is SNIP of trial i's own
initialization on the whole training split (an independent float64 computation,
``tests/lee_snip.py``)."""

import numpy as np
import pytest
import torch

import training
from experiments.run.runner import GroupTask, run_group
from experiments.run.workload import Workload
from experiments.spec.plan import plan
from experiments.spec.study import loads
from training.models.initialization import trial_init_seed

from ..conftest import TINY
from ...lee_snip import lee_snip_mask

LEE_TINY = TINY.replace('model_options = {hidden = [16]}\n',
                        'model_options = {hidden = [16]}\ninit = "lee"\n').replace(
    "[goal]", '[pruning]\ncriterion = "snip"\nexamples = "all"\nprune_biases = true\n'
              'mask_per_trial = true\n\n[goal]')


def trial_model(ds, seed, i):
    return training.models.build("mlp", ds, seed=trial_init_seed(seed, i), init="lee",
                                 hidden=[16])


def test_trial_i_mask_is_snip_of_its_own_initialization_on_the_whole_split():
    spec = loads(LEE_TINY)
    w = Workload.of(spec)
    assert w.trials == spec.trials == 4 and w.mask_per_trial
    ds = w.load_dataset()
    masks = w.masks(ds, [(0.5, 0), (0.0, 0)])
    assert masks[(0.0, 0)] is None
    stacked = masks[(0.5, 0)]
    names = [k for k, _ in trial_model(ds, 0, 0).named_parameters()]
    assert set(stacked) == set(names)   # weights and biases
    rows = []
    for i in range(spec.trials):
        want = lee_snip_mask(trial_model(ds, 0, i), ds.x_train, ds.y_train, 0.5)
        row = w.trial_mask(stacked, i)
        assert all(torch.equal(row[k].double(), want[k]) for k in names), i
        n = sum(v.numel() for v in want.values())
        assert sum(int(v.sum()) for v in row.values()) == round(n * 0.5)
        rows.append(torch.cat([row[k].flatten() for k in names]))
    assert len({tuple(r.tolist()) for r in rows}) == spec.trials   # four different masks


def test_each_trial_starts_from_its_own_initialization():
    spec = loads(LEE_TINY)
    w = Workload.of(spec)
    ds = w.load_dataset()
    inits = w.init_params(ds, 0, 3)
    for i in range(3):
        assert w.init_seed(0, i) == trial_init_seed(0, i) != 0
        for k, p in trial_model(ds, 0, i).named_parameters():
            assert torch.equal(inits[k][i], p.detach())
    shared = Workload.of(loads(TINY))
    assert shared.init_params(ds, 0, 3) is None and shared.init_seed(0, 2) == 0


def test_a_group_trains_trial_i_from_its_own_init_under_its_own_mask():
    spec = loads(LEE_TINY)
    w = Workload.of(spec)
    ds = w.load_dataset()
    group = next(g for g in plan(spec) if g.sparsity == 0.5 and g.batch_size == 128)
    mask = w.masks(ds, [(0.5, 0)])[(0.5, 0)]
    rec = run_group(GroupTask(group, w, mask))
    assert rec.status == "done", rec.error
    run = training.RunConfig(128, "momentum", max_steps=group.max_steps, seed=0,
                             goal=training.Goal("error", 0.3),
                             eval_schedule=training.EvalSchedule(every=10))
    for i, t in enumerate(group.trials):
        ref = training.train_reference(trial_model(ds, 0, i), ds, training.Trial.from_dict(t),
                                       run, mask=w.trial_mask(mask, i), trial_index=i)
        got = rec.trials[i].curve
        steps = [row[0] for row in got]
        assert steps == ref.curve.step.tolist()[:len(steps)]
        np.testing.assert_allclose([row[1] for row in got],
                                   ref.curve.train_loss[:len(steps)], rtol=1e-4)


def test_a_study_probes_its_best_trial_from_that_trials_init_and_mask(tmp_path):
    """End to end: the masks' record names trial 0, and the probes' loss at step 0 is the loss
    of the best trial's own initialization under its own mask (not the seed's)."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    import experiments

    text = LEE_TINY.replace("batch_sizes = [8, 32, 128]", "batch_sizes = [32]").replace(
        "[probes]\nenabled = false", '[probes]\nenabled = true\npoints = 2\n'
                                     'batch_sizes = ["smallest"]')
    spec = loads(text)
    run = experiments.run_study(spec, out=tmp_path / "run", executor=ThreadPoolExecutor(1),
                                quiet=True, report=False)
    res = experiments.load_results(run)
    recorded = json.loads((run / "masks.json").read_text())["masks"]
    assert [(m["sparsity"], m["info"]["trial"], m["info"]["mask_per_trial"]) for m in recorded] \
        == [(0.5, 0, True)]
    w = Workload.of(spec)
    ds = w.load_dataset()
    mask = w.masks(ds, [(0.5, 0)])[(0.5, 0)]
    for sparsity in (0.0, 0.5):
        group = res.groups[res.groups.sparsity == sparsity].iloc[0]
        best = int(group.best_trial)
        net = trial_model(ds, 0, best)
        if sparsity:
            with torch.no_grad():
                for k, p in net.named_parameters():
                    p.mul_(w.trial_mask(mask, best)[k])
        with torch.no_grad():
            want = float(torch.nn.functional.cross_entropy(net(ds.x_train), ds.y_train))
        p = res.probes
        got = p[(p.sparsity == sparsity) & (p.step == 0) & (p.quantity == "loss")].value
        assert float(got.iloc[0]) == pytest.approx(want, rel=1e-5), sparsity


def test_per_trial_masks_in_an_executor_are_the_same_and_kept_for_the_probes():
    from concurrent.futures import ThreadPoolExecutor

    from experiments.run import workload as wl

    w = Workload.of(loads(LEE_TINY))
    ds = w.load_dataset()
    wl._TRIAL_MASKS.clear()
    here = w.masks(ds, [(0.5, 0), (0.0, 0)])
    wl._TRIAL_MASKS.clear()
    with ThreadPoolExecutor(2) as ex:
        there = w.masks(ds, [(0.5, 0), (0.0, 0)], executor=ex)
    assert there[(0.0, 0)] is None
    assert all(torch.equal(here[(0.5, 0)][k], there[(0.5, 0)][k]) for k in here[(0.5, 0)])
    # asked again (the probes after the training), nothing is scored: the same tensors come back
    again = w.masks(ds, [(0.5, 0)])
    assert all(again[(0.5, 0)][k] is there[(0.5, 0)][k] for k in there[(0.5, 0)])
