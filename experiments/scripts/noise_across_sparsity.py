"""Gradient noise and smoothness across sparsity levels, and the critical batch they predict.

For each sparsity level, SNIP-prune (Lee et al. 2021) the same initialization and measure at
initialization, on a subsample of training examples:

- the simple noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018), their estimate of
  the critical batch size beyond which larger batches stop paying off;
- the top Hessian eigenvalue (Lanczos), a local smoothness constant L: the SGD bound
  K ~ L Delta / eps (1 + B_crit / B) predicts more steps for a larger L at every batch size.

    python -m experiments.scripts.noise_across_sparsity           # MNIST-1D MLP, 0/50/70/90 %
    python -m experiments.scripts.noise_across_sparsity --tiny    # seconds, for the test suite
"""

from __future__ import annotations

import sys


import pruning
import training
from experiments.measures.probes.tasks import probe_network


def measure(dataset: training.Dataset, model_name: str, sparsities: list[float], examples: int,
            model_options: dict | None = None) -> list[dict[str, float]]:
    """One row per sparsity level: b_simple, hessian_top, and the rest of ``probe_network``."""
    rows = []
    for sparsity in sparsities:
        net = training.models.build(model_name, dataset, seed=0, **(model_options or {}))
        mask = None
        if sparsity > 0:
            mask = pruning.prune(net, "snip", sparsity, dataset=dataset, seed=0)
            mask.apply(net)
        rows.append({"sparsity": sparsity, **probe_network(net, dataset, mask, examples)})
    return rows


def main(tiny: bool = False) -> list[dict[str, float]]:
    if tiny:
        ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16)
        rows = measure(ds, "mlp", [0.0, 0.5, 0.8], examples=64, model_options={"hidden": [16]})
    else:
        ds = training.data.load("mnist1d", num_samples=10_000)
        rows = measure(ds, "mlp", [0.0, 0.5, 0.7, 0.9], examples=1024)
    dense_top = rows[0]["hessian_top"]
    print(f"{'sparsity':>8} {'B_simple':>9} {'B_noise':>9} {'L (top eig)':>11} {'L / L_dense':>11}")
    for r in rows:
        print(f"{r['sparsity']:>8.0%} {r['b_simple']:>9.1f} {r['b_noise']:>9.1f} "
              f"{r['hessian_top']:>11.4g} {r['hessian_top'] / dense_top:>11.2f}")
    print("B_simple estimates the critical batch size; L / L_dense the predicted step ratio "
          "of the sparse network against the dense one at every batch size.")
    return rows


if __name__ == "__main__":
    main(tiny="--tiny" in sys.argv[1:])   # the one option: a tiny workload (seconds)
