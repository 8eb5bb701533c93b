"""The calibration table of issue 49: along one training run per workload, the noise monitor's
estimates beside the critical batch measured by branching and the stored sweep's fitted B_crit.

For each workload a base run (batch B0, constant lr, the optimizer of the stored sweep) trains
to its goal; at K checkpoints evenly spaced to the goal step H,
:func:`experiments.run.branching.branch_critical_batch` measures CBS(t) (Merrill et al. 2025: the
largest k B0 whose branch, after a window of examples, has a held-out loss within 1 % of the base
run's; 3 branch seeds, 90 % intervals over them), and at the same weights (its
``on_checkpoint``) :class:`theory.NoiseScaleMonitor` reads M batches of b examples drawn without
replacement from the training split (``population`` = the split, a window of M), giving

- ``B_simple``: the whole model's tr(Sigma) / |G|^2 (McCandlish et al. 2018), with its standard
  error;
- ``B_norm``: the normalization layers' alone (Gray et al. 2024), for a model with LayerNorm;
- ``B_pre``: of the gradient preconditioned by Adam's second moment from the run's state
  (Qiao et al. 2021, AdaptDL), for an Adam-type run.

Each row sets them beside CBS(t) and the fitted B_crit of the stored sweep of the same workload
(:data:`WORKLOADS` says which; docs/reproductions.md). McCandlish et al. read B_simple as an
estimate of B_crit at the goal; Merrill et al. find CBS(t) small early and growing, and B_simple
not tracking it.

    python -m experiments.scripts.calibration                    # the three workloads (minutes)
    python -m experiments.scripts.calibration quickstart         # one of them
    python -m experiments.scripts.calibration --tiny             # seconds, for the test suite
    python -m experiments.scripts.calibration --pre-check        # what the LM's B_pre is made of
"""

from __future__ import annotations

import copy
import math
import sys
import time
from dataclasses import dataclass, field, replace

import torch
from torch import nn

import training
from experiments.run.branching import branch_critical_batch
from theory import NoiseScaleMonitor
from theory.estimators.branching import ADAM_TYPE
from theory.monitor.parts import NORM, NORM_LAYERS, PRECONDITIONED
from training.goal import loss_fn
from training.state import TrainState


@dataclass(frozen=True)
class Workload:
    """A base run and what to branch and read along it; ``swept``: the stored sweep's fitted
    B_crit [90 %] and where it comes from; ``micro``: micro-batches per monitored batch;
    ``monitor``: the monitor's further options (the micro-batch estimator for a model whose
    parameters the per-example terms cannot see, with ``micro`` >= 2)."""

    dataset: str
    model: str
    optimizer: str
    trial: dict
    goal: training.Goal
    base_batch: int
    max_steps: int
    swept: str
    dataset_options: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)
    checkpoints: int = 5
    k_max: int = 16
    multipliers: tuple[float, ...] = (0.5, 1.0, 2.0)
    batches: int = 16
    batch: int = 64
    micro: int = 1
    monitor: dict = field(default_factory=dict)


WORKLOADS = {
    # quickstart's network, data and goal, with plain SGD: the optimizer of the stored sweep
    # (stich_delay_mnist1d, dense, no delay: B_crit 159, median of five seeds)
    "quickstart": Workload(
        "mnist1d", "mlp", "sgd", {"lr": 0.3}, training.Goal("error", 0.4), 32, 8000,
        "159 (stich_delay_mnist1d: dense, no delay, SGD)", {"num_samples": 10_000},
        checkpoints=8, batches=32),
    "fashion_mnist": Workload(
        "fashion_mnist", "lee_cnn", "momentum", {"lr": 0.01, "momentum": 0.9},
        training.Goal("error", 0.25, strict=False), 16, 4000,
        "65.4 [28.2, 144] (lee_fashion_mnist: dense)",
        {"val_fraction": 0.0166667, "train_examples": 4000, "standardize": True}),
    "lm": Workload(
        "python_source", "transformer_lm", "adamw",
        {"lr": 0.00395, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1},
        training.Goal("loss", 2.3), 8, 8000, "57.4 [49.8, 65.4] (lm_python_source)",
        {"context": 32, "max_train_windows": 16384, "max_val_windows": 512},
        {"layers": 2, "width": 32, "heads": 2}, checkpoints=4, k_max=32, multipliers=(1.0, 2.0),
        micro=4, monitor={"method": "micro_batch"}),
}
TINY = Workload("teacher", "mlp", "adam", {"lr": 0.01}, training.Goal("error", 0.5), 8, 400,
                "none (a tiny twin)", {"n": 600, "dim": 8, "num_classes": 3, "hidden": 16},
                {"hidden": [16]}, checkpoints=3, k_max=4, multipliers=(1.0, 2.0), batches=4,
                batch=16, micro=2)


def load_state(model: nn.Module, state: TrainState, work: Workload
               ) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    """A copy of ``model`` at ``state``'s weights, and for an Adam-type run an ``AdamW`` holding
    the state's moments and step (what the preconditioned noise scale reads)."""
    net = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(state.params[name][0])
    if work.optimizer not in ADAM_TYPE or not state.moments:
        return net, None
    t = work.trial
    opt = torch.optim.AdamW(net.parameters(), lr=t["lr"], eps=t.get("eps", 1e-8),
                            betas=(t.get("beta1", 0.9), t.get("beta2", 0.999)))
    for name, p in net.named_parameters():
        opt.state[p] = {"step": torch.tensor(float(state.step)),
                        "exp_avg": state.buffers[name][0].clone(),
                        "exp_avg_sq": state.moments[name][0].clone()}
    return net, opt


def noise_at(model: nn.Module, state: TrainState, dataset: training.Dataset, work: Workload,
             seed: int, huge_moment: str | None = None) -> dict[str, float]:
    """The monitor's smoothed estimates over ``work.batches`` batches at ``state``'s weights;
    ``huge_moment``: the parameters whose names start with it get a second moment of 1e30, so
    P = 0 there (:func:`preconditioner_check`)."""
    net, opt = load_state(model, state, work)
    if huge_moment is not None:
        for name, p in net.named_parameters():
            if name.startswith(huge_moment):
                opt.state[p]["exp_avg_sq"].fill_(1e30)
    norm = any(isinstance(m, NORM_LAYERS) for m in net.modules())
    loss = loss_fn(dataset.task, dataset.loss)
    order = torch.randperm(dataset.n_train, generator=torch.Generator().manual_seed(seed))
    with NoiseScaleMonitor(net, window=work.batches, population=dataset.n_train,
                           norm_layers=norm, optimizer=opt, **work.monitor) as monitor:
        for j in range(work.batches):
            net.zero_grad(set_to_none=True)
            for part in order[j * work.batch:(j + 1) * work.batch].chunk(work.micro):
                (loss(net(dataset.x_train[part]), dataset.y_train[part]) / work.micro).backward()
            reading = monitor.step(loss_scale=1.0 / work.micro)
    parts = {p.name: p.b_simple for p in reading.parts}
    return {"b_simple": reading.b_simple, "b_simple_se": reading.b_simple_se,
            "b_norm": parts.get(NORM, math.nan), "b_pre": parts.get(PRECONDITIONED, math.nan)}


def preconditioner_check(step: int = 323, seed: int = 323) -> list[tuple[str, float, float]]:
    """What the LM's preconditioned noise scale is made of: the base run to ``step`` (the first
    checkpoint after initialization), then B_simple and B_pre at those weights as measured, with
    the embedding's P set to 0 (its second moment made huge), and with larger eps."""
    work = WORKLOADS["lm"]
    dataset = training.data.load(work.dataset, **work.dataset_options)
    model = training.models.build(work.model, dataset, seed=0, **work.model_options)
    run = training.RunConfig(batch_size=work.base_batch, optimizer=work.optimizer,
                             max_steps=step, goal=None, stop="never",
                             eval_schedule=training.EvalSchedule(every=10**9))
    state = training.train_trials(model, dataset, [training.Trial(**work.trial)], run,
                                  return_state=True).end_state.trial(0)
    rows = []
    for label, eps, without in (("as measured", 1e-8, None), ("embedding's P = 0", 1e-8, "token"),
                                ("eps = 1e-6", 1e-6, None), ("eps = 1e-4", 1e-4, None)):
        changed = replace(work, trial={**work.trial, "eps": eps})
        if without is None:
            values = noise_at(model, state, dataset, changed, seed)
        else:
            values = noise_at(model, state, dataset, changed, seed, huge_moment=f"{without}.")
        rows.append((label, values["b_simple"], values["b_pre"]))
        print(f"{label:<20} B_simple {values['b_simple']:.4g}  B_pre {values['b_pre']:.6g}")
    return rows


def calibrate(name: str, work: Workload) -> list[dict]:
    """One row per checkpoint of the workload's base run (module docstring)."""
    dataset = training.data.load(work.dataset, **work.dataset_options)
    model = training.models.build(work.model, dataset, seed=0, **work.model_options)
    trial = training.Trial(**work.trial)
    run = training.RunConfig(batch_size=work.base_batch, optimizer=work.optimizer,
                             max_steps=work.max_steps, goal=work.goal,
                             eval_schedule=training.EvalSchedule(every=10))
    noise: dict[int, dict[str, float]] = {}

    def read(step: int, state: TrainState) -> None:
        noise[step] = noise_at(model, state.trial(0), dataset, work, seed=step)

    result = branch_critical_batch(model, dataset, trial, run, checkpoints=work.checkpoints,
                                   k_max=work.k_max, multipliers=work.multipliers,
                                   base_only_at_k1=True, on_checkpoint=read)
    cbs = result.critical
    return [{"workload": name, "step": int(t), "fraction": int(t) / result.goal_step,
             **noise[int(t)], "cbs": float(c), "cbs_low": float(lo), "cbs_high": float(hi),
             "cbs_at_upper_end": bool(up), "base_batch": work.base_batch,
             "goal_step": result.goal_step, "swept": work.swept}
            for t, c, lo, hi, up in zip(cbs.steps, cbs.critical_batch, cbs.low, cbs.high,
                                        cbs.at_upper_end)]


def table(rows: list[dict]) -> str:
    """The rows as the guide's markdown table."""
    def num(v: float) -> str:
        return "-" if not math.isfinite(v) else f"{v:.3g}"

    out = ["| workload | step (of H) | B_simple | B_norm | B_pre | CBS(t) [90 %] | swept B_crit |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        upper = " (at k_max)" if r["cbs_at_upper_end"] else ""
        out.append(f"| {r['workload']} (B0 = {r['base_batch']}) | {r['step']} "
                   f"({r['fraction']:.2f} of {r['goal_step']}) | {num(r['b_simple'])} "
                   f"± {num(r['b_simple_se'])} | {num(r['b_norm'])} | {num(r['b_pre'])} | "
                   f"{r['cbs']:.0f} [{r['cbs_low']:.0f}, {r['cbs_high']:.0f}]{upper} | "
                   f"{r['swept']} |")
    return "\n".join(out)


def main(names: list[str] | None = None, tiny: bool = False) -> list[dict]:
    torch.set_num_threads(1)
    chosen = {"tiny": TINY} if tiny else {n: WORKLOADS[n] for n in (names or WORKLOADS)}
    rows = []
    for name, work in chosen.items():
        start = time.perf_counter()
        rows += calibrate(name, work)
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    print(table(rows))
    return rows


if __name__ == "__main__":
    argv = sys.argv[1:]
    unknown = [a for a in argv if a not in ("--tiny", "--pre-check") and a not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workload {unknown[0]!r}; allowed: {', '.join(WORKLOADS)}, "
                         f"--tiny or --pre-check")
    if "--pre-check" in argv:
        preconditioner_check()
    else:
        main([a for a in argv if a != "--tiny"] or None, tiny="--tiny" in argv)
