"""``advise --schedule``: does a batch-size schedule measurably beat the fixed batch size the advice
recommends? If one does, the advice recommends the schedule.

From an :class:`experiments.run.advise.Advice` (its base run's trial, B_0, CBS(t) and time
model t(B)): the recommended fixed B (the largest power of two <= the recommended critical
batch, at least B_0, its lr scaled by the optimizer's rule, :func:`theory.estimators.branching.lr_scale`)
and each policy (default: the CBS warmup from the advice's own CBS(t), Merrill et al. 2025; and
goodput on its time model, Qiao et al. 2021) run from the base run's initialization over
``replicates`` data orders (:func:`theory.policies.train_under_policy`), every run stopped at its
own goal within the spec's budget. The verdict is the shoot-out's
(:mod:`experiments.report.schedules.view`): the paired modelled-time ratio policy / fixed over the
replicates, its geometric mean and 90 % interval; a policy whose interval lies below 1 beats the
fixed B, and the one with the smallest ratio is recommended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

import training
from theory.estimators.branching import lr_scale
from theory.policies import CBSWarmup, Goodput, LinearTime, make_policy, train_under_policy
from training.schedules.order import trial_seed

from experiments.report.schedules.view import BEST_FIXED, summary
from experiments.run.branching import branch_data_seeds
from experiments.run.workload import Workload
from experiments.spec.study import Spec

DEFAULT_POLICIES = ("cbs_warmup", "goodput")


@dataclass(frozen=True, eq=False)
class ScheduleAdvice:
    """``fixed``: the recommended fixed B; ``table``: the shoot-out summary (one row per policy
    and the fixed B, :func:`experiments.report.schedules.view.summary`); ``recommended``: the
    policy that beats the fixed B with the smallest time ratio, or None; ``schedules``: each
    policy's B(t) in replicate 0 as [start_step, batch_size, lr_scale] segments."""

    fixed: int
    table: pd.DataFrame
    recommended: str | None
    schedules: dict[str, list[list[float]]]

    def summary(self) -> str:
        """One line per policy, then the recommendation."""
        lines = []
        for r in self.table[self.table.policy != BEST_FIXED].itertuples():
            lines.append(f"  {r.policy}: modelled time x {r.ratio:.3g} [{r.ratio_low:.3g}, "
                         f"{r.ratio_high:.3g}] of fixed B = {self.fixed}, {r.verdict}")
        if self.recommended is None:
            return "\n".join([f"no schedule measurably beats fixed B = {self.fixed}:", *lines])
        segs = ", ".join(f"B = {b} from step {s}" for s, b, _ in self.schedules[self.recommended])
        return "\n".join([f"recommended schedule: {self.recommended} ({segs})", *lines])


def time_model(advice) -> LinearTime:
    """The advice's t(B) = t_fixed + t_example B (its ``predicted.step_seconds``, linear in B)."""
    p = advice.predicted
    slope, intercept = np.polyfit(p.batch_size.to_numpy(float), p.step_seconds.to_numpy(float), 1)
    return LinearTime(max(float(intercept), 0.0), max(float(slope), 0.0))


def schedule_advice(spec: Spec, advice, *, seed: int = 0, replicates: int = 5,
                    policies: tuple[str, ...] = DEFAULT_POLICIES, every: int | None = None,
                    dataset: training.Dataset | None = None) -> ScheduleAdvice:
    """The schedules against the advice's fixed batch size (module docstring)."""
    workload = Workload.of(spec)
    dataset = dataset if dataset is not None else workload.load_dataset()
    model = workload.build_model(dataset, seed)
    mask = workload.mask(dataset, advice.sparsity, seed)
    b0, n = advice.base_batch, dataset.n_train
    top = max(b for b in (b0 * 2**i for i in range(20)) if b <= n)
    fixed = min(max(1 << int(math.log2(max(advice.recommended, b0))), b0), top)
    step_time = time_model(advice)
    goal = training.Goal(spec.metric, spec.target, spec.strict)
    seeds = branch_data_seeds(trial_seed(seed, advice.trial_index), replicates)
    every = every or max(1, advice.goal_step // 10)
    defaults = {"cbs_warmup": {"min_batch": b0, "max_batch": top},
                "goodput": {"min_batch": b0, "max_batch": top, "step_time": step_time}}
    runs = [(BEST_FIXED, fixed, replace(advice.trial, lr=advice.trial.lr *
                                        lr_scale(fixed // b0, spec.optimizer)), "fixed")]
    runs += [(name, b0, advice.trial, name) for name in policies]
    rows, schedules = [], {}
    for label, b, trial, name in runs:
        policy = (CBSWarmup.of(advice.branching.critical, spec.optimizer, max_batch=top)
                  if name == "cbs_warmup" else
                  Goodput(**defaults["goodput"]) if name == "goodput" else make_policy(name))
        run = training.RunConfig(b, spec.optimizer, max_steps=spec.budget.steps(b), seed=seed,
                                 goal=goal, eval_schedule=spec.eval, stop="all",
                                 device=spec.device, precision=spec.precision)
        trials = train_under_policy(model, dataset, [trial] * replicates, run, policy, every=every,
                                    masks=mask, data_seeds=seeds, first_index=advice.trial_index)
        schedules[label] = [[s.start_step, s.batch_size, s.lr_scale] for s in trials[0].schedule.segments]
        rows += [{"run": spec.name, "sparsity": advice.sparsity, "seed": seed, "policy": label,
                  "replicate": r, "batch_size": b, "steps_to_result": pt.hit_step,
                  "examples_to_result": pt.examples_to_result,
                  "seconds_to_result": pt.seconds(step_time) if pt.hit_step is not None else None,
                  "max_steps": run.max_steps, "measured_examples": pt.measured_examples,
                  "t_fixed": step_time.t_fixed,
                  "t_example": step_time.t_example}
                 for r, pt in enumerate(trials)]
    frame = pd.DataFrame(rows).astype({"steps_to_result": "Int64", "examples_to_result": "Int64"})
    table = summary(frame)
    winners = table[table.verdict == "beats"].sort_values("ratio")
    return ScheduleAdvice(fixed, table, None if winners.empty else str(winners.policy.iloc[0]),
                          schedules)
