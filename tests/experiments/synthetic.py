"""Synthetic study stores with a known truth, written through the store's public writing API
(``experiments.store.database.open_store`` / ``write_group``, ``experiments.measures.probes.store.write_probes``): no training."""

from __future__ import annotations

import hashlib
import json
import math
import zlib

import numpy as np

from experiments.measures.probes.store import ProbeRow, write_probes
from experiments.measures.stage.store import StageRow
from experiments.store.schema import GroupRecord, StudyInfo, TrialRow
from experiments.spec.study import loads
from experiments.store.database import open_store

SPEC_TOML = """
name = "{name}"
optimizer = "{optimizer}"
batch_sizes = {{min = 8, max = 256}}
sparsities = [0.0, 0.9]
trials = 6
seeds = {seeds}

[workload]
dataset = "teacher"
model = "mlp"

[goal]
metric = "error"
target = 0.2

[search]
lr = {{scale = "log", min = 1e-3, max = 10.0}}
momentum = {momentum}

[budget]
max_steps = 20000

[probes]
batch_sizes = [8, 32, 256]
"""

# Ground truth of the synthetic curves: S(B) = S_min (1 + B_crit / B) per sparsity level.
TRUTH = {0.0: (100.0, 200.0), 0.9: (220.0, 100.0)}
NOISE = 0.03   # log-normal measurement noise of the synthetic steps


def spec_text(name="synthetic", optimizer="sgd", seeds=(0,), momentum="0.0"):
    return SPEC_TOML.format(name=name, optimizer=optimizer, seeds=list(seeds), momentum=momentum)


def noisy_steps(sparsity: float, batch_size: int, seed: int, momentum_gain: float = 1.0) -> int:
    """The true curve times a fixed pseudo-random factor exp(N(0, NOISE)) per group."""
    s_min, b_crit = TRUTH[sparsity]
    noise = np.random.default_rng([int(100 * sparsity), batch_size, seed]).normal(0.0, NOISE)
    return int(round(s_min * (1.0 + momentum_gain * b_crit / batch_size) * math.exp(noise)))


# Probes consistent with TRUTH under the bound S = c (2 L Delta / eps) (1 + 4 sigma^2 / (eps B)):
# B_simple = the true B_crit, tr(Sigma) proportional to it (so 4 sigma^2 / eps = B_crit at every
# level) and L proportional to S_min (same Delta). L and B_simple wobble along the run by factors
# whose mean is 1 with and without step 0 (so L's trajectory mean after step 0 is exact); in the
# last 20 % of the run B_simple is exact.
PROBES = {0.0: {"trace_sigma": 50.0, "b_simple": 200.0, "local_lipschitz": 2.0},
          0.9: {"trace_sigma": 25.0, "b_simple": 100.0, "local_lipschitz": 4.4}}
PROBED_BATCHES = (8, 32, 256)
FRACTIONS = np.linspace(0.0, 1.0, 10)
WOBBLE = np.array([1.0] + [0.8, 1.2] * 3 + [1.0, 1.0, 1.0])


def probe_rows(sparsity: float, seeds=(0,), horizon: int = 900) -> list[ProbeRow]:
    p = PROBES[sparsity]
    rows = []
    for seed in seeds:
        for b in PROBED_BATCHES:
            for f, wobble in zip(FRACTIONS, WOBBLE):
                step = int(round(f * horizon))
                values = {"trace_sigma": p["trace_sigma"], "b_simple": p["b_simple"] * wobble,
                          "g_sq": p["trace_sigma"] / (p["b_simple"] * wobble),
                          "b_noise": 0.8 * p["b_simple"] * wobble, "g_h_g": 1.0,
                          "hessian_top": 1.5 * p["local_lipschitz"],
                          "local_lipschitz": p["local_lipschitz"] * wobble,
                          "loss": 2.3 / (1 + step / 50)}
                rows += [ProbeRow(sparsity, seed, b, step, float(f), q, v, 1.0)
                         for q, v in values.items()]
    return rows


# L at Lee et al.'s stage: three trials per probed batch size with L = level value x these
# factors (geometric mean 1) at steps 1,000 .. 4,000; a trial of the 8 x batch ends at 3,000
STAGE_TRIALS = (0.8, 1.0, 1.25)
STAGE_BATCHES = (8, 32)
STAGE_STEPS = (1000, 2000, 3000, 4000)


def stage_rows(sparsity: float, value: float, seeds=(0,), check: float | None = None
               ) -> list[StageRow]:
    """Schedule rows of one level (module constants), on a sample of 500 examples; ``check``:
    L on the whole split at the first point of the first run, this factor times its sample's."""
    rows = []
    for seed in seeds:
        for b in STAGE_BATCHES:
            for trial, factor in enumerate(STAGE_TRIALS):
                steps = STAGE_STEPS[:3] if (b, trial) == (8, 2) else STAGE_STEPS
                for step in steps:
                    L = value * factor
                    rows.append(StageRow(sparsity, seed, b, trial, step, steps[-1],
                                            "local_lipschitz", L, 500, 2.0))
                    rows.append(StageRow(sparsity, seed, b, trial, step, steps[-1], "g_sq",
                                            1.0, 500, 2.0))
    if check is not None:
        first = rows[0]
        rows.append(StageRow(sparsity, first.seed, first.batch_size, first.trial, first.step,
                                first.horizon, "local_lipschitz_full", first.value * check,
                                None, 2.0))
    return rows


def make_store(run_dir, *, name="synthetic", optimizer="sgd", seeds=(0,), skip=(), fail=(),
               unreached=(), probes=True, momentum_gain=1.0, stage=None):
    """Write a synthetic study. ``skip``: (sparsity, B) groups left out (an interrupted run);
    ``fail``: groups stored as failed; ``unreached``: groups where no trial met the goal;
    ``stage``: sparsity -> L at Lee's stage (:func:`stage_rows`; the dense level's first run
    also on the whole split, 1.1 x its sample's)."""
    mom = "{scale = \"reverse-log\", min = 0.5, max = 0.99}" if optimizer != "sgd" else "0.0"
    spec = loads(spec_text(name, optimizer, seeds, mom))
    info = StudyInfo(spec.name, spec.toml, spec.hash, spec.to_json())
    rng = np.random.default_rng(zlib.crc32(f"{name}-{optimizer}".encode()))
    with open_store(run_dir, info) as store:
        for sparsity in spec.sparsities:
            for b in spec.batch_sizes:
                for seed in spec.seeds:
                    key = hashlib.sha256(f"{sparsity}-{b}-{seed}".encode()).hexdigest()[:16]
                    cfg = json.dumps({"sparsity": sparsity, "batch_size": b, "seed": seed})
                    if (sparsity, b) in skip:
                        continue
                    if (sparsity, b) in fail:
                        store.write_group(GroupRecord(key, sparsity, b, seed, "failed", None, None,
                                                      20000, 1.0, 0, cfg, (), "RuntimeError: out of memory"))
                        continue
                    reach = (sparsity, b) not in unreached
                    steps = noisy_steps(sparsity, b, seed, momentum_gain) if reach else None
                    trials = []
                    # the best learning rate grows with B (trial 0 sits at the edge of the lr range)
                    best = 0 if b == 8 else 1 + min(2, int(math.log2(b / 16)) // 2)
                    for t in range(spec.trials):
                        lr = float(1e-3 * 10 ** (4 * (t + 0.5) / spec.trials))
                        m = 0.0 if optimizer == "sgd" else float(1 - 0.5 * 0.02 ** (t / spec.trials))
                        status = "diverged" if lr > 3 else ("reached" if reach and t == best else "not_reached")
                        hit = steps if status == "reached" else None
                        final = 0.15 if status == "reached" else (math.nan if status == "diverged" else 0.4)
                        curve = tuple((s, 2.0 / (1 + s / 100), 0.9 / (1 + s / 500)) for s in (0, 100, 200))
                        trials.append(TrialRow(t, lr, m, None, 1.0, status, hit, final, curve))
                    store.write_group(GroupRecord(key, sparsity, b, seed, "done", steps,
                                                  best if reach else None,
                                                  20000, float(rng.uniform(1, 2)), 6 * (steps or 20000),
                                                  cfg, tuple(trials)))
            if probes:
                write_probes(store, sparsity, probe_rows(sparsity, spec.seeds),
                                   stage_rows(sparsity, stage[sparsity], spec.seeds,
                                              1.1 if sparsity == 0 else None) if stage else ())
    return run_dir
