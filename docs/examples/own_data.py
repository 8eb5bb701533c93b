"""Your own tensors and a model with BatchNorm and Dropout: Dataset.from_tensors, train_trials
(each trial with its own running statistics and random draws), the plain loop it equals, the
probes in eval mode, and a per-example loss of your own. Seconds on a CPU."""
import copy
from dataclasses import replace

import torch
from torch import nn

import theory
import training

# Your data: 600 examples of 12 features; integer labels make it a classification set.
g = torch.Generator().manual_seed(0)
y = torch.randint(0, 3, (600,), generator=g)
x = torch.randn(600, 12, generator=g) + 3.0 * nn.functional.one_hot(y, 12).float()
ds = training.Dataset.from_tensors(x, y, val_fraction=0.2, seed=0, name="blobs")
print("task:", ds.task)
print("classes:", ds.num_classes)
print("split:", ds.n_train, ds.n_val)                  # 480 training, 120 validation examples
print("digest:", ds.provenance["digest"])              # tells data sets apart

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2),
                    nn.Linear(32, 3))
run = training.RunConfig(batch_size=32, max_steps=200, goal=0.1, dtype=torch.float64,
                         eval_schedule=training.EvalSchedule(every=20), stop="all")
trials = [training.Trial(lr=0.02, momentum=0.9), training.Trial(lr=0.1, momentum=0.9)]
res = training.train_trials(net, ds, trials, run)
print("program:", res.program)     # per_trial or plain (measured): batch statistics, random draws
print("hit steps:", " ".join(str(h) for h in res.hit_step))   # exact to the step
print("running statistics:", tuple(res.buffers["1.running_mean"].shape))   # one row per trial

# The plain loop of trial i (its Dropout draws seeded by randomness_seed(run.seed, i)),
# evaluating at every step, meets the goal at the same steps.
every_step = replace(run, eval_schedule=training.EvalSchedule(every=1))
ref = [training.train_reference(net, ds, t, every_step, trial_index=i).steps_to_result
       for i, t in enumerate(trials)]
print("reference hit steps:", " ".join(str(h) for h in ref))

# The probes measure the eval-mode network: the trained trial's running statistics, no dropout.
trained = copy.deepcopy(net)
best = res.best
trained.load_state_dict({**res.state(best), **{k: v[best] for k, v in res.buffers.items()}})
noise = theory.gradient_noise(trained, ds, hessian_examples=0)   # float64, whole split
print("b_simple:", f"{noise.b_simple:.4g}")
print("definition:", theory.estimators.functional.probe_definition(trained))

# A per-example loss of your own (here label smoothing) replaces cross-entropy everywhere; the
# compiled kernel knows only the task's losses, so a sequential ReLU network runs on an eager
# program (func, per_trial or plain: the fastest measured here).
smooth = training.Dataset.from_tensors(
    x, y, val_fraction=0.2, seed=0,
    loss=lambda out, t: nn.functional.cross_entropy(out, t, reduction="none",
                                                    label_smoothing=0.1))
mlp = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
print("mlp program:", training.train_trials(mlp, ds, trials, run).program)
print("mlp program with own loss:", training.train_trials(mlp, smooth, trials, run).program)
