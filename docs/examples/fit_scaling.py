"""Fit S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018) to a steps-vs-batch-size curve and
label its regimes. The curve here is the law itself with 3 % log-normal noise, so the fit should
give back S_min = 1000 and B_crit = 256."""
import numpy as np

import theory

batch_sizes = 2 ** np.arange(2, 15)                       # 4 .. 16384
rng = np.random.default_rng(0)
steps = 1000 * (1 + 256 / batch_sizes) * np.exp(0.03 * rng.standard_normal(len(batch_sizes)))

fit = theory.fit_scaling(batch_sizes, steps)
low, high = fit.intervals["b_crit"]                       # 90 % bootstrap interval
print(f"s_min: {fit.s_min:.4g}")
print(f"b_crit: {fit.b_crit:.4g}")
print(f"b_crit interval: {low:.4g} {high:.4g}")
print(f"largest useful batch: {fit.largest_useful_batch:.4g}")   # 4 B_crit
for b, regime in zip(batch_sizes, fit.regimes):
    print(f"regime at {b}: {regime}")
