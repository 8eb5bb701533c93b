"""L at Lee et al.'s stage: a study's schedule points fall at k N up to each probed trial's own
goal step, or to the budget for a run that never met the goal, and a stored L equals Lee's
formula evaluated independently on the reference loop's weights (float64)."""

import dataclasses

import json

import pandas as pd
import pytest
import torch

import pruning
import theory
import training
from experiments.measures.probes.tasks import longest_first, probe_cost, probe_tasks
from experiments.store.database import Store
from experiments.run.timing import TIMING_FILE
from theory.estimators.functional import select_examples

from ..conftest import TINY, run_text

EVERY = 4
SAMPLE = 150
BUDGET = 60
# a goal some runs miss within the budget: at sparsity 0.5, B = 8 none of the four meets it
STAGE = (TINY.replace("batch_sizes = [8, 32, 128]", "batch_sizes = [8, 16]")
         .replace("target = 0.3", "target = 0.15")
         .replace("max = 200", f"max = {BUDGET}")
         .replace("min = 0.01, max = 1.0", "min = 0.003, max = 0.03")   # runs of 10+ steps
         .replace("seeds = [0]", 'seeds = [0]\nstop = "all"')
         .replace("enabled = false",
                  'enabled = true\nbatch_sizes = ["smallest", "largest"]\npoints = 3\n'
                  f"average = 2\nhessian_examples = 4\nlanczos = 5\nlipschitz_every = {EVERY}\n"
                  f"lipschitz_examples = {SAMPLE}\nlipschitz_trials = 2\n"
                  "lipschitz_check = [0.0]\nexamples = 200"))


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stage")
    return run_text(tmp, STAGE, "stage")


def _probed(t, group_key, k=2):
    """The trials a group's probes should take: reached ones, fewest steps first (the group's
    best first), then the ones that missed the goal, lowest index first; never diverged."""
    mine = t[t.group_key == group_key]
    reached = mine[mine.status == "reached"].sort_values(["hit_step", "trial"]).trial.tolist()
    missed = mine[mine.status == "not_reached"].sort_values("trial").trial.tolist()
    return (reached + missed)[:k]


def test_points_fall_at_multiples_of_n_up_to_each_trials_own_end(staged):
    s, t, g = staged.stage_probes, staged.trials, staged.groups
    assert len(s) and set(s.quantity) == {"local_lipschitz", "local_lipschitz_full", "g_sq",
                                          "trace_sigma", "b_simple", "loss"}
    runs = s.groupby(["sparsity", "seed", "batch_size", "trial"])
    ends = set()
    for (sparsity, seed, b, trial), run in runs:
        group = g[(g.sparsity == sparsity) & (g.seed == seed) & (g.batch_size == b)].iloc[0]
        row = t[(t.group_key == group.key) & (t.trial == trial)].iloc[0]
        # the goal ends a run that met it; the budget one that did not (stop = "all")
        end = int(row.hit_step) if row.status == "reached" else BUDGET
        ends.add(row.status)
        assert set(run.horizon) == {end}
        lipschitz = run[run.quantity == "local_lipschitz"]
        # k N for k = 1, 2, ... until the goal or the budget ends the run; never step 0
        assert sorted(lipschitz.step) == list(range(EVERY, end + 1, EVERY))
        assert set(lipschitz.examples) == {SAMPLE}
    assert ends == {"reached", "not_reached"}
    # two trials per group (stop = "all"), chosen reached first: at every batch size, also
    # where no run of the level met the goal
    for group in g.itertuples():
        mine = s[(s.sparsity == group.sparsity) & (s.batch_size == group.batch_size)]
        assert sorted(set(mine.trial)) == sorted(_probed(t, group.key))
    assert g[(g.sparsity == 0.5) & (g.batch_size == 8)].steps_to_result.isna().all()
    # the whole split's L at the first point of the dense level's first run only
    full = s[s.quantity == "local_lipschitz_full"]
    assert len(full) == 1 and full.sparsity.iloc[0] == 0.0 and full.examples.isna().all()
    assert full.step.iloc[0] == EVERY
    # the replayed runs' seconds are counted once each, here and in timing.json
    runs = s.drop_duplicates(["sparsity", "seed", "batch_size", "trial"])
    seconds, _ = probe_cost(g, staged.probes, s)
    assert seconds == pytest.approx(runs.seconds.sum())
    tasks = json.loads((staged.run_dir / TIMING_FILE).read_text())["tasks"]["probes"]
    assert tasks == {"tasks": len(runs), "seconds": pytest.approx(seconds), "unit": "run",
                     "share": "probe_share"}


def test_a_level_that_never_met_the_goal_is_probed_along_its_budget(staged):
    """Sparsity 0.5 at B = 8: no run met the goal, so its points along [0, H] are at 0, H / 2
    and H of the first run that ended at the budget H."""
    p, t, g = staged.probes, staged.trials, staged.groups
    mine = p[(p.sparsity == 0.5) & (p.batch_size == 8)]
    assert sorted(set(mine.step)) == [0, BUDGET // 2, BUDGET]
    assert (mine.fraction == mine.step / BUDGET).all()


def test_a_study_stopped_at_the_first_hit_probes_only_runs_that_met_the_goal(staged):
    """stop = "first" ends a group where one run meets the goal, so the others have no end of
    their own: only reached runs are probed, and a level none of whose runs met the goal at a
    batch size is not probed there."""
    spec = dataclasses.replace(staged.spec, stop="first")
    with Store(staged.run_dir, create=False) as store:
        tasks = probe_tasks(spec, store, 0.5, {0: None})
    assert {int(task.group.batch_size) for task in tasks} == {16}
    assert all(task.trial.status == "reached" for task in tasks)
    assert [task.horizon for task in tasks] == [int(task.trial.hit_step) for task in tasks]


def test_the_pool_starts_the_whole_split_check_then_the_longest_runs(staged):
    spec = staged.spec
    with Store(staged.run_dir, create=False) as store:
        tasks = [t for s in (0.0, 0.5) for t in probe_tasks(spec, store, s, {0: None})]
    order = longest_first(tasks)
    assert order[0].check and sum(t.check for t in tasks) == 1
    horizons = [t.horizon for t in order[1:]]
    assert horizons == sorted(horizons, reverse=True) and len(set(horizons)) > 1
    assert sorted(map(id, order)) == sorted(map(id, tasks))


def _lee_lipschitz(net, ds, mask, w_prev, w_next, examples):
    """Lee et al.'s edps/check.py written out in float64: mean gradients of the loss over the
    examples at w_prev and at w_prev + gamma (w_next - w_prev), gamma in 0.1 .. 0.9, masked
    (TF's gradient with respect to the unmasked weights is the masked gradient), and
    max_gamma |g_gamma - g_prev| / |gamma (w_next - w_prev)|."""
    net = net.double()
    names = [n for n, _ in net.named_parameters()]
    x, y = (v for v in select_examples(ds, examples, 0, "train"))
    x = x.double()

    def grad(weights):
        params = {n: (w * mask[n] if n in mask else w).detach().requires_grad_(True)
                  for n, w in weights.items()}
        loss = torch.nn.functional.cross_entropy(torch.func.functional_call(net, params, (x,)), y)
        gs = torch.autograd.grad(loss, list(params.values()))
        return torch.cat([(g * mask[n] if n in mask else g).reshape(-1) for n, g in zip(names, gs)])

    prev = {n: w_prev[n].double() for n in names}
    step = {n: w_next[n].double() - prev[n] for n in names}
    norm = float(torch.cat([(step[n] * mask[n] if n in mask else step[n]).reshape(-1)
                            for n in names]).norm())
    g0 = grad(prev)
    return max(float((grad({n: prev[n] + gamma * step[n] for n in names}) - g0).norm())
               / (gamma * norm) for gamma in [0.1 * i for i in range(1, 10)])


def test_a_stored_L_equals_lees_formula_on_the_reference_loops_weights(staged):
    """Sparsity 0.5, its largest batch size, the second probed trial, its last point: the
    reference trainer's snapshots (torch.optim.SGD) of steps t - 1 and t, rebuilt network and
    SNIP mask, L written out in float64 and by theory.local_lipschitz (float64)."""
    s, g, t = staged.stage_probes, staged.groups, staged.trials
    mine = s[(s.sparsity == 0.5) & (s.quantity == "local_lipschitz")]
    b = int(mine.batch_size.max())
    mine = mine[mine.batch_size == b]
    trial_index = int(sorted(set(mine.trial))[-1])
    point = mine[mine.trial == trial_index].sort_values("step").iloc[-1]
    group = g[(g.sparsity == 0.5) & (g.batch_size == b)].iloc[0]
    row = t[(t.group_key == group.key) & (t.trial == trial_index)].iloc[0]
    ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
    net = training.models.build("mlp", ds, seed=0, hidden=[16])
    mask = pruning.prune(net, "snip", 0.5, dataset=ds, seed=0)
    step = int(point.step)
    decay = None if pd.isna(row.decay_steps) else int(row.decay_steps)
    ref = training.reference.train_schedule_reference(
        net, ds, training.Trial(lr=float(row.lr), momentum=float(row.momentum),
                                decay_steps=decay, end_factor=float(row.end_factor)),
        training.RunConfig(b, "momentum", max_steps=step, seed=0), mask=mask,
        trial_index=trial_index, snapshots=[step - 1, step])
    w_prev, w_next = ref.snapshots[step - 1], ref.snapshots[step]
    written = _lee_lipschitz(net, ds, dict(mask), w_prev, w_next, SAMPLE)
    library = theory.local_lipschitz(net, ds, w_prev, w_next, mask=mask, examples=SAMPLE,
                                     seed=0, dtype=torch.float64).value
    assert library == pytest.approx(written, rel=1e-9)
    # the study measured in float32 (theory.probe_trajectory's default precision)
    assert point.value == pytest.approx(written, rel=1e-4)


def test_the_probes_along_the_run_take_L_on_the_same_sample(staged):
    """lipschitz_examples applies to L along [0, H] too: the dense level's best run at its
    smallest batch size, its middle point (the update out of step t), on the 150 examples."""
    p, g, t = staged.probes, staged.groups, staged.trials
    mine = p[(p.sparsity == 0.0) & (p.quantity == "local_lipschitz")]
    b = int(mine.batch_size.min())
    mine = mine[mine.batch_size == b].sort_values("step")
    step = int(mine.step.iloc[1])
    group = g[(g.sparsity == 0.0) & (g.batch_size == b)].iloc[0]
    row = t[(t.group_key == group.key) & (t.trial == group.best_trial)].iloc[0]
    assert 0 < step < int(group.steps_to_result)
    ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
    net = training.models.build("mlp", ds, seed=0, hidden=[16])
    decay = None if pd.isna(row.decay_steps) else int(row.decay_steps)
    ref = training.reference.train_schedule_reference(
        net, ds, training.Trial(lr=float(row.lr), momentum=float(row.momentum),
                                decay_steps=decay, end_factor=float(row.end_factor)),
        training.RunConfig(b, "momentum", max_steps=step + 1, seed=0),
        trial_index=int(row.trial), snapshots=[step, step + 1])
    written = _lee_lipschitz(net, ds, {}, ref.snapshots[step], ref.snapshots[step + 1], SAMPLE)
    assert mine.value.iloc[1] == pytest.approx(written, rel=1e-4)
