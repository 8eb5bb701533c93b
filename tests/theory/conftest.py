"""Shared helpers of the theory tests: synthetic long-format probe tables with known summaries."""

import numpy as np
import pandas as pd

FRACTIONS = np.linspace(0, 1, 10)   # ten evenly spaced probe points, as theory.verdicts.probe_points


def run_rows(sparsity, seed, batch_size, horizon, **series):
    """Rows of one run: every keyword is a quantity with one value per point of FRACTIONS (or a
    constant)."""
    rows = []
    for k, f in enumerate(FRACTIONS):
        for quantity, values in series.items():
            value = values[k] if np.ndim(values) else values
            rows.append((sparsity, seed, batch_size, int(round(f * horizon)), f, quantity, float(value)))
    return rows


def table(rows):
    return pd.DataFrame(rows, columns=["sparsity", "seed", "batch_size", "step", "fraction",
                                       "quantity", "value"])


def level_rows(sparsity, L, delta, b_simple, lam, seeds=(0, 1, 2), batch_sizes=(16, 64, 256),
               spread=0.0, horizon=900):
    """A level whose every run has L along the run = L (times 1 +- spread by seed), loss at step
    0 = delta, |G|^2 = 1 and tr(Sigma) = b_simple everywhere, lambda_max = lam."""
    rows = []
    for i, seed in enumerate(seeds):
        wobble = 1.0 + spread * (i - (len(seeds) - 1) / 2)
        for b in batch_sizes:
            loss = np.linspace(delta, 0.3 * delta, len(FRACTIONS))
            rows += run_rows(sparsity, seed, b, horizon, local_lipschitz=L * wobble, loss=loss,
                             g_sq=1.0, trace_sigma=b_simple * wobble, hessian_top=lam * wobble)
    return rows
