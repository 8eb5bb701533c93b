"""Train one workload at a few batch sizes and fit S(B) = S_min (1 + B_crit / B).

For each batch size, a small quasi-random learning-rate search (the same Sobol points everywhere)
is trained as one vectorized group with ``training.train_trials``; steps-to-result is the first
step at which any trial meets the goal (Shallue et al. 2019). The measured curve is then fitted
with ``theory.fit_scaling`` (McCandlish et al. 2018) and every batch size labelled with its
regime (perfect scaling, diminishing returns, maximal data parallelism).

    python -m experiments.scripts.fit_scaling_curve            # MNIST-1D MLP, B = 8 .. 1024
    python -m experiments.scripts.fit_scaling_curve --tiny     # seconds, for the test suite
"""

from __future__ import annotations

import sys


import training
import theory
from experiments.spec.search import sample
from experiments.spec.study import Dimension


def measure(dataset: training.Dataset, model_name: str, batch_sizes: list[int], trials: int,
            target: float, examples: int, model_options: dict | None = None
            ) -> dict[int, int | None]:
    """Steps-to-result at each batch size (None where no trial met the goal)."""
    net = training.models.build(model_name, dataset, seed=0, **(model_options or {}))
    points = sample({"lr": Dimension("log", 3e-3, 3.0), "momentum": Dimension("linear", 0.9, 0.9)},
                    trials, seed=0)
    steps = {}
    for b in batch_sizes:
        run = training.RunConfig(b, "momentum", max_steps=max(50, examples // b),
                                 goal=training.Goal("error", target),
                                 eval_schedule=training.EvalSchedule(every=10))
        res = training.train_trials(net, dataset, points, run)
        steps[b] = res.steps_to_result
    return steps


def main(tiny: bool = False) -> theory.ScalingFit:
    if tiny:
        ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
        steps = measure(ds, "mlp", [4, 16, 64, 256], trials=4, target=0.3, examples=4000,
                        model_options={"hidden": [16]})
    else:
        ds = training.data.load("mnist1d", num_samples=10_000)
        steps = measure(ds, "mlp", [8, 32, 128, 512, 1024], trials=16, target=0.4,
                        examples=2_000_000)
    reached = {b: s for b, s in steps.items() if s is not None}
    fit = theory.fit_scaling(list(reached), list(reached.values()), n_boot=200)
    print(f"{'batch':>6} {'steps':>7} {'fitted':>8}  regime")
    for b, s in steps.items():
        label = fit.regime(b)[0] if s is not None else "-"
        print(f"{b:>6} {s if s is not None else 'never':>7} {float(fit.predict(b)):>8.1f}  {label}")
    lo, hi = fit.intervals["b_crit"]
    print(f"S_min = {fit.s_min:.1f} steps, B_crit = {fit.b_crit:.1f} "
          f"({fit.level:.0%} interval {lo:.1f} .. {hi:.1f})")
    return fit


if __name__ == "__main__":
    main(tiny="--tiny" in sys.argv[1:])   # the one option: a tiny workload (seconds)
