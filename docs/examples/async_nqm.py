"""Delay on the noisy quadratic model, its critical delay beside the reconstruction's, and where
asynchronous updates reach the goal sooner than synchronous ones on a modelled wall clock. The
NQM's steps to the goal stand in for a measured S(B, tau)."""
import numpy as np

import theory
from theory.models import delay, nqm, nqm_delay
from training.distributed import asynctime
from training.distributed.costmodel import CostModel

spec = nqm.paper_spectrum(200)
curve = nqm_delay.steps_to_target(spec, 0.05 * spec.initial_loss(), [1, 4, 16, 64, 256],
                                  delays=[0, 1, 3, 7, 15], lrs=np.logspace(-3, 0.3, 40))
for b, row in zip(curve.batch_sizes, curve.steps):
    print(f"steps at B={b:g}, tau=0 1 3 7 15: " + " ".join(f"{s:g}" for s in row))

# the critical batch at tau = 0, and each row's critical delay beside the prediction
b_crit = theory.fit_scaling(curve.batch_sizes, curve.steps[:, 0]).b_crit
measured = [delay.fit_critical_delay(curve.delays, row).tau_crit for row in curve.steps]
# the NQM's noise is additive: M = 0, and B_crit = 3 sigma^2 / eps sets sigma^2 (eps = 1)
predicted = delay.critical_delay(0.0, b_crit / 3, 1.0, curve.batch_sizes)
print(f"b_crit: {b_crit:.3g}")
print("tau_crit measured: " + " ".join(f"{t:.3g}" for t in measured))
print("tau_crit predicted: " + " ".join(f"{t:.3g}" for t in predicted))

# the wall clock: W workers, exponential stragglers, a cost model of 2 ms + 20 us per example
steps = {(int(b), int(t)): int(curve.steps[i, j])
         for i, b in enumerate(curve.batch_sizes) for j, t in enumerate(curve.delays)}
cost = CostModel(t_fixed=2e-3, t_example=2e-5, alpha=5e-5, beta=1e-9, n_params=1_000_000)
stragglers = asynctime.Stragglers("exponential", scale=0.5)
rows = asynctime.compare(steps, cost, workers=(4, 16), stragglers=stragglers, seed=0)
print(asynctime.format_comparison(rows, stragglers))
for r in rows:
    print(f"sooner at b={r.per_worker_batch}, W={r.workers}: {r.winner}")
