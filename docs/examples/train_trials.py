"""Train four learning rates of one workload as one vectorized group, then the best trial alone
in the plain torch.optim loop: both reach the goal at the same step."""
from dataclasses import replace

import torch

import training

ds = training.data.load("teacher", n=2000, dim=20, num_classes=4, seed=0)   # instant, synthetic
net = training.models.build("mlp", ds, seed=0, hidden=[32])
run = training.RunConfig(
    batch_size=32, optimizer="momentum", max_steps=3000, goal=0.15,   # validation error < 0.15
    eval_schedule=training.EvalSchedule(every=50), dtype=torch.float64,
    stop="all")   # each trial to its own first hit ("first", the default, stops the group)
trials = [training.Trial(lr=lr, momentum=0.9) for lr in (0.003, 0.03, 0.3, 50.0)]

res = training.train_trials(net, ds, trials, run)
print("program:", res.program)                     # fused, per_trial, batched or func
print("status:", " ".join(res.status))             # reached / not_reached / diverged per trial
print("hit steps:", " ".join(str(h) for h in res.hit_step))
print("steps to result:", res.steps_to_result)     # exact to the step, not to the schedule
print("best lr:", res.best_trial.lr)

# The plain loop, evaluating at every step, finds the same first hit for the best trial
# (trial_index gives it the best trial's data order).
every_step = replace(run, eval_schedule=training.EvalSchedule(every=1))
ref = training.train_reference(net, ds, res.best_trial, every_step, trial_index=res.best)
print("reference steps to result:", ref.steps_to_result)
