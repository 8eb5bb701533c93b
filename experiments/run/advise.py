"""Which batch size should I train with? A recommendation from one short run, without a sweep.

:func:`advise` answers it for a study spec's workload (its data set and model, registered names
or import paths, :mod:`experiments.spec.factories`; its goal, optimizer, search space, budget
and batch range) at one sparsity level, in five steps (six with a delay axis), every one counted in trial-steps
(updates summed over trials, the unit of a sweep's ``groups.trial_steps``):

1. **Learning rate.** The first ``lr_trials`` (default 8) points of the spec's own Sobol search
   are trained as one vectorized group at the base batch B_0, stopped at the first evaluation
   where one meets the goal (exact to the step, as a sweep's group): the best point and the base
   run's steps-to-result H. A learning rate given (``lr=``) skips this and the base run is
   trained to its goal once.
2. **Base run and probes.** The best trial is replayed to checkpoints at ``fractions`` of H
   (default 1/4, 1/2, 3/4, 1). At each, and at initialization, the gradient noise of the
   weights there (``theory.gradient_noise`` on ``probe_examples`` training examples: |G|^2,
   tr(Sigma) and B_simple = tr(Sigma) / |G|^2, unbiased for the split, with jackknife standard
   errors; McCandlish et al. 2018).
3. **Branches** (Merrill et al. 2025, :func:`experiments.run.branching.branch_critical_batch`):
   from each checkpoint, runs at k B_0 for k = 2, 4, ..., ``k_max`` with the lr scaled by the
   optimizer's rule times 0.5, 1, 2, over 3 branch seeds, for a window of 10 % of the base run's
   examples to its goal; CBS(t) is the largest k B_0 whose seed-mean held-out loss is within
   1 % of the base run's (``theory.critical_batch``), with a bootstrap interval over the seeds.
   At k = 1 only the base run's own continuation runs (the other multipliers cannot change CBS).
4. **Recommendation.** CBS at the checkpoint ``at`` (default 1: at the goal), with its interval.
5. **Prediction.** S(B) = S_min (1 + B_crit / B) with B_crit the recommendation and S_min fixed
   by the base run's measured S(B_0) = H (McCandlish et al. 2018):
   S(B) = H (1 + B_crit / B) / (1 + B_crit / B_0), its range from the recommendation's interval;
   time to the goal T(B) = S(B) t(B) (``theory.predict_time_to_result``) with t(B) =
   t_fixed + t_example B fitted to this machine's measured step times (one trial of
   ``training.train_trials``, ``timing_steps`` steps at each batch size).

6. **Critical delay** (a study with a delay axis, ``delays``): the critical delay at each batch
   size that the recommendation predicts, tau_crit(B) = 1 + B_crit / B, reading the critical
   batch as the one parameter of the delayed-SGD bound (``theory.models.delay``; Stich,
   Mohtashami & Jaggi 2021 reconstructed), its range from the recommendation's interval: a
   prediction, not a measurement (the advice trains no delay; the study's report measures it).

**Base batch B_0** (default): the largest power of two with k_max B_0 <= the training set, so
the branches reach a batch of (nearly) the whole training set, the most a data-parallel step can
use; the cost of every step above scales as 1 / B_0, so the largest B_0 the branch ladder allows
is the cheapest. When CBS stays at B_0 the critical batch is at or below it: the advice says so
(rerun with a smaller ``batch_size``).

**The equivalent sweep** (the cost's denominator, :func:`sweep_trial_steps`): the spec's own
design (``trials`` points at each of its ``batch_sizes``), each group training every trial until
the first evaluation at or after the predicted S(B) (capped at the group's step budget), as a
sweep's group does, summed. A sweep measured instead (its stored ``trial_steps``) is the better
denominator where one exists: the validation page uses it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

import training
from theory.estimators.noise import gradient_noise
from theory.models.delay import critical_delay
from theory.models.scaling import regime_of_slope
from theory.models.walltime import predict_time_to_result
from training.distributed.costmodel import CostModel
from training.errors import SparsescaleError
from training.state import TrainState, model_at

from experiments.report.advice import advice_document, cost_frame
from experiments.report.formatting import grid_interval
from experiments.report.write import write_document
from experiments.run.branching import BranchResult, branch_critical_batch
from experiments.run.runner import load_workload
from experiments.run.workload import Workload
from experiments.spec import search
from experiments.spec.study import Spec

DEFAULT_LR_TRIALS = 8
DEFAULT_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
DEFAULT_K_MAX = 64
DEFAULT_SEEDS = 3
DEFAULT_PROBE_EXAMPLES = 1024
DEFAULT_TIMING_STEPS = 10


class AdviceError(SparsescaleError, ValueError):
    """Bad input to :func:`advise`, or a workload it cannot advise on: one line saying why."""


@dataclass(frozen=True)
class Cost:
    """What the advice cost, in trial-steps, beside the equivalent sweep (module docstring).

    ``probes`` counts the probes' per-example gradients as ``ceil(examples / B_0)`` steps of the
    base run (a gradient per example is what a training step computes); ``timing``: the step-time
    measurement's updates."""

    lr_search: int
    base: int
    branches: int
    probes: int
    timing: int
    sweep: int
    sweep_definition: str

    @property
    def total(self) -> int:
        return self.lr_search + self.base + self.branches + self.probes + self.timing

    @property
    def fraction(self) -> float:
        """Total over the equivalent sweep's trial-steps."""
        return self.total / self.sweep


@dataclass(frozen=True, eq=False)
class Advice:
    """The recommendation and what it rests on.

    ``recommended`` [``low``, ``high``]: CBS at fraction ``at`` of the base run (``level``
    bootstrap interval over branch seeds); ``lower_bound``: CBS reached k_max B_0 (the critical
    batch may be larger); ``at_base``: CBS stayed at B_0 (it may be smaller). ``trial`` /
    ``trial_index`` / ``lr_source``: the base run's metaparameters, its index in the search group
    (its data order, ``training.schedules.order.trial_seed(seed, trial_index)``) and where they came from; ``goal_step``: its H.
    ``noise``: B_simple along the run (columns step, fraction, b_simple, b_simple_se, g_sq,
    g_sq_se, trace_sigma, trace_sigma_se, loss); ``critical``: CBS(t) (step, fraction,
    critical_batch, low, high); ``predicted``: per batch size the predicted steps (and range),
    regime, modelled step time t(B) (beside the measured one where measured) and time to the
    goal S(B) t(B); ``step_times``: the measured
    seconds per step; ``branching``: the full branching result; ``cost``: :class:`Cost`.
    """

    name: str
    workload: str
    goal: str
    optimizer: str
    sparsity: float
    base_batch: int
    trial: training.Trial
    trial_index: int
    lr_source: str
    goal_step: int
    at: float
    recommended: float
    low: float
    high: float
    level: float
    lower_bound: bool
    at_base: bool
    noise: pd.DataFrame
    critical: pd.DataFrame
    predicted: pd.DataFrame
    step_times: pd.DataFrame
    branching: BranchResult
    cost: Cost
    seconds: float
    # a study with a delay axis (``delays``): per batch size the critical delay the
    # recommendation predicts (:func:`delay_prediction`); empty otherwise
    delays: pd.DataFrame = field(default_factory=pd.DataFrame)

    def summary(self) -> str:
        """The advice in a few lines (what ``sparsescale advise`` prints)."""
        bound = " (a lower bound: the largest branch passed)" if self.lower_bound else \
            " (at the base batch: the critical batch may be smaller; try a smaller base batch)" \
            if self.at_base else ""
        where = "at the goal" if self.at == 1.0 else f"at {self.at:g} of the way to the goal"
        noise = self.noise.iloc[-1]
        # CBS is one of k B_0, k = 1, 2, 4, ...: say what a doubling grid cannot tell apart
        cbs = grid_interval(self.recommended, self.low, self.high, open_above=self.lower_bound)
        return "\n".join([
            f"{self.name}: {self.workload}, {self.goal}, {self.optimizer}"
            + (f", {self.sparsity:.0%} sparse" if self.sparsity else ""),
            f"recommended batch size: {cbs}; the critical batch by branching {where}, "
            f"{self.level:.0%} interval over the branch seeds{bound}",
            f"base run: B = {self.base_batch}, lr {self.trial.lr:.4g} ({self.lr_source}), "
            f"{self.goal_step} steps to the goal; B_simple there {noise.b_simple:.4g} "
            f"+- {noise.b_simple_se:.2g}",
            f"cost: {self.cost.total:,} trial-steps, {self.cost.fraction:.1%} of the equivalent "
            f"sweep's {self.cost.sweep:,} ({self.cost.sweep_definition}); {self.seconds:.0f} s",
            *([delay_line(self.delays, self.base_batch)] if len(self.delays) else []),
        ])


def write_advice(advice: Advice, out: str | Path) -> Path:
    """Write the advice's report into ``out``: report.md and report.html with the figure
    (figures/advice.png), and noise.csv, critical.csv, predicted.csv and cost.csv; return
    report.html's path."""
    a, c = advice, advice.cost
    parts = {"learning-rate search": c.lr_search, "base run": c.base, "branches": c.branches,
             "probes (examples / B_0)": c.probes, "step-time measurement": c.timing}
    cost = cost_frame(parts, c.sweep)
    notes = [
        f"Base run: batch {a.base_batch}, {a.optimizer}, metaparameters {_trial_text(a.trial)} "
        f"({a.lr_source}); {a.goal_step} steps to {a.goal}.",
        f"Branches (Merrill et al. 2025): from each checkpoint, batch k x {a.base_batch} for k up to "
        f"{int(a.branching.critical.ks[-1])}, lr scaled by the optimizer's rule x 0.5, 1, 2, "
        f"{a.branching.critical.n_seeds} branch seeds, window {a.branching.window:,} examples; CBS(t) = "
        f"the largest k B whose seed-mean held-out loss is within {a.branching.critical.eps:.0%} of "
        f"the base run's; {a.level:.0%} bootstrap intervals over the branch seeds.",
        "B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018) on a sample of the training split, "
        "unbiased for the split, jackknife standard errors.",
        "Prediction: S(B) = S_min (1 + B_crit / B) with B_crit = the recommendation and S_min from the "
        "measured base run; time = S(B) t(B), t(B) = t_fixed + t_example B fitted to one trial's "
        "measured step times on this machine (one process).",
        f"Equivalent sweep: {c.sweep_definition}: {c.sweep:,} trial-steps; the advice cost "
        f"{c.total:,} ({c.fraction:.1%}).",
    ]
    doc = advice_document(f"Batch-size advice: {a.name}", a.summary().splitlines(), a.noise, a.critical,
                          a.predicted, cost, a.base_batch, a.goal_step, a.recommended, (a.low, a.high), notes,
                          top=float(a.branching.critical.ks[-1] * a.base_batch))
    return write_document(doc, out, {"noise": a.noise, "critical": a.critical, "predicted": a.predicted,
                                     "cost": cost, "delays": a.delays if len(a.delays) else None})


def default_base_batch(n_train: int, k_max: int = DEFAULT_K_MAX) -> int:
    """The largest power of two B_0 with ``k_max`` B_0 <= ``n_train`` (at least 1)."""
    return 1 << max(0, int(math.floor(math.log2(max(1, n_train // k_max)))))


def predicted_steps(batch_sizes: Sequence[int] | np.ndarray, b_crit: float, base_batch: int,
                    base_steps: int) -> np.ndarray:
    """S(B) = S_min (1 + B_crit / B) through the measured point S(B_0) = H (McCandlish et al.
    2018): H (1 + B_crit / B) / (1 + B_crit / B_0)."""
    b = np.asarray(batch_sizes, dtype=float)
    return base_steps * (1.0 + b_crit / b) / (1.0 + b_crit / base_batch)


def group_trial_steps(spec: Spec, batch_size: int, steps: float) -> int:
    """Trial-steps of a sweep's group at ``batch_size`` whose best trial needs ``steps``: every
    one of ``spec.trials`` trials trains to the first evaluation at or after it (a group stops
    only at an evaluation), at most the group's step budget."""
    budget = spec.budget.steps(batch_size)
    stop = next((s for s in spec.eval.steps(budget) if s >= steps), budget)
    return spec.trials * int(stop)


def sweep_trial_steps(spec: Spec, steps: Sequence[float]) -> int:
    """The equivalent sweep's trial-steps: :func:`group_trial_steps` at each of the spec's batch
    sizes, with ``steps`` its predicted steps there (one seed)."""
    return sum(group_trial_steps(spec, int(b), s) for b, s in zip(spec.batch_sizes, steps))


def advise(spec: Spec, *, sparsity: float = 0.0, seed: int | None = None,
           batch_size: int | None = None, lr: float | None = None,
           lr_trials: int = DEFAULT_LR_TRIALS, fractions: Sequence[float] = DEFAULT_FRACTIONS,
           at: float = 1.0, k_max: int = DEFAULT_K_MAX, seeds: int = DEFAULT_SEEDS,
           probe_examples: int = DEFAULT_PROBE_EXAMPLES,
           timing_steps: int = DEFAULT_TIMING_STEPS, level: float = 0.9,
           quiet: bool = True, dataset: training.Dataset | None = None) -> Advice:
    """The recommended batch size for ``spec``'s workload at ``sparsity`` (module docstring).

    ``seed``: the initialization, mask and data seed (default the spec's first); ``batch_size``:
    B_0 (default :func:`default_base_batch`); ``lr``: the base run's learning rate (default: the
    best of ``lr_trials`` points of the spec's search, other metaparameters from the first
    point); ``fractions``: the checkpoints as fractions of H, which must include ``at``;
    ``k_max``: the largest branch factor (a power of two, lowered to fit the training set);
    ``seeds``: branch seeds (>= 3); ``quiet``: no progress bar. ``dataset``: the spec's data
    set, already loaded. Raises :class:`AdviceError` (or the spec's, the factory's, the
    branching's errors) for bad input, before training where it can."""
    seed = spec.seeds[0] if seed is None else seed
    fr = _fractions(fractions, at)
    if isinstance(sparsity, bool) or not (isinstance(sparsity, (int, float)) and 0 <= sparsity < 1):
        raise AdviceError(f"sparsity must be in [0, 1), got {sparsity!r}")
    for value, name, low in ((lr_trials, "lr_trials", 1), (probe_examples, "probe_examples", 2),
                             (timing_steps, "timing_steps", 1), (seeds, "seeds", 3)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise AdviceError(f"{name} must be an integer >= {low}, got {value!r}")
    if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise AdviceError(f"lr must be a positive number, got {lr!r}")
    started = time.perf_counter()
    workload = Workload.of(spec)
    if dataset is None:   # a model or data set that cannot be loaded fails here, in one line
        workload, dataset, _ = load_workload(spec)
    n = dataset.n_train
    b0 = default_base_batch(n, k_max) if batch_size is None else batch_size
    if isinstance(b0, bool) or not isinstance(b0, int) or not 1 <= b0 <= n // 2:
        raise AdviceError(f"batch_size must be an integer in [1, {n // 2}] (half the training set, "
                          f"so that one branch doubles it), got {b0!r}")
    k_max = min(k_max, 1 << int(math.log2(n // b0)))
    model = workload.build_model(dataset, seed)
    mask = workload.mask(dataset, sparsity, seed)
    if spec.device != "cpu":   # runs and probes on the spec's device (training.device)
        device = training.device.resolve_device(spec.device, "workload.device")
        dataset, model = dataset.to(device), model.to(device)
    goal = training.Goal(spec.metric, spec.target, spec.strict)
    run = training.RunConfig(b0, spec.optimizer, max_steps=spec.budget.steps(b0), seed=seed,
                             goal=goal, eval_schedule=spec.eval, stop="first",
                             device=spec.device, precision=spec.precision)
    points = search.sample(spec.search, lr_trials, spec.search_seed, run.max_steps,
                           momentum_used=spec.optimizer != "sgd")
    bar = tqdm(total=len(fr) + 2, disable=quiet, desc="advise", unit="stage", dynamic_ncols=True)
    with bar:
        if lr is None:
            res = training.train_trials(model, dataset, points, run, masks=mask)
            lr_cost = int(sum(res.steps_taken))
            if res.steps_to_result is None:
                raise AdviceError(f"none of the {lr_trials} learning rates searched reached the goal "
                                  f"({_goal(spec)}) within {run.max_steps} steps at batch {b0}; give "
                                  f"a learning rate (--lr), more points (--lr-trials) or a larger budget")
            trial, index, h = res.best_trial, int(res.best), int(res.steps_to_result)
            source = f"best of {lr_trials} searched"
        else:
            trial, index = training.Trial.from_dict({**points[0], "lr": float(lr)}), 0
            res = training.train_trials(model, dataset, [trial], run, masks=mask)
            lr_cost = int(sum(res.steps_taken))
            if res.steps_to_result is None:
                raise AdviceError(f"the base run (lr {lr:g}, batch {b0}) does not reach the goal "
                                  f"({_goal(spec)}) within {run.max_steps} steps")
            h, source = int(res.steps_to_result), "given"
        bar.update()
        steps = np.unique(np.round(np.asarray(fr) * h).astype(np.int64))
        if len(steps) != len(fr):
            raise AdviceError(f"the base run reaches the goal in {h} steps, too few for "
                              f"{len(fr)} distinct checkpoints; use a smaller batch size")
        noise = [_noise_row(model, dataset, mask, 0, h, probe_examples, seed)]

        def probe(step: int, state: TrainState) -> None:
            noise.append(_noise_row(model_at(model, state), dataset, mask, step, h, probe_examples, seed))
            bar.update()

        branched = branch_critical_batch(
            model, dataset, trial, run, mask=mask, trial_index=index, goal_step=h, k_max=k_max,
            seeds=seeds, level=level, steps=[int(t) for t in steps], base_only_at_k1=True,
            on_checkpoint=probe)
        timing = _step_times(model, dataset, trial, run, mask, index, _ladder(b0, k_max, spec, n),
                             timing_steps)
        bar.update()
    c = branched.critical
    i = int(np.searchsorted(c.steps, round(at * h)))
    rec, low, high = (float(c.critical_batch[i]), float(c.low[i]), float(c.high[i]))
    batches = _ladder(min(b0, min(spec.batch_sizes)), k_max, spec, n, top=max(spec.batch_sizes))
    predicted = _prediction(batches, rec, low, high, b0, h, timing, model)
    sweep_steps = predicted_steps(spec.batch_sizes, rec, b0, h)
    probe_examples = min(probe_examples, n)
    cost = Cost(lr_search=lr_cost, base=branched.base_trial_steps, branches=branched.branch_trial_steps,
                probes=len(noise) * math.ceil(probe_examples / b0), timing=int(timing.trial_steps.sum()),
                sweep=sweep_trial_steps(spec, sweep_steps),
                sweep_definition=f"{spec.trials} trials at each of the {len(spec.batch_sizes)} batch "
                                 f"sizes {min(spec.batch_sizes)}..{max(spec.batch_sizes)} of the spec, "
                                 f"each to the first evaluation after the predicted steps")
    critical = pd.DataFrame({"step": c.steps, "fraction": c.steps / h, "critical_batch": c.critical_batch,
                             "low": c.low, "high": c.high})
    return Advice(
        name=spec.name, workload=f"{spec.model} on {spec.dataset}", goal=_goal(spec),
        optimizer=spec.optimizer, sparsity=float(sparsity), base_batch=b0, trial=trial,
        trial_index=index, lr_source=source, goal_step=h, at=float(at), recommended=rec, low=low, high=high,
        level=float(level), lower_bound=bool(c.at_upper_end[i]), at_base=rec <= b0,
        noise=pd.DataFrame(noise), critical=critical, predicted=predicted,
        step_times=timing, branching=branched, cost=cost, seconds=time.perf_counter() - started,
        delays=delay_prediction(sorted({b0, *spec.batch_sizes}), rec, low, high)
        if len(spec.delays) > 1 else pd.DataFrame())


def delay_prediction(batch_sizes: Sequence[int], rec: float, low: float, high: float
                     ) -> pd.DataFrame:
    """The critical delay at each batch size that the recommended critical batch predicts, with
    its range from the recommendation's interval: the delayed-SGD bound's one parameter M read
    as the critical batch (``theory.models.delay``, without additive noise: B_crit = M and
    tau_crit(B) = 1 + M / B). A prediction, not a measurement: the advice trains no delay."""
    b = np.asarray(batch_sizes, dtype=float)
    ends = [np.asarray(critical_delay(max(m, 1e-12), 0.0, 1.0, b)) for m in (rec, low, high)]
    return pd.DataFrame({"batch_size": np.asarray(batch_sizes, dtype=int), "tau_crit": ends[0],
                         "tau_crit_low": np.minimum(ends[1], ends[2]),
                         "tau_crit_high": np.maximum(ends[1], ends[2])})


def delay_line(delays: pd.DataFrame, base_batch: int) -> str:
    """The summary's line on the critical delay, at the base batch and the spec's batch sizes."""
    parts = [f"{r.tau_crit:.3g} [{r.tau_crit_low:.3g}, {r.tau_crit_high:.3g}] at B = {r.batch_size}"
             for r in delays.itertuples(index=False)]
    return ("critical delay (predicted from the critical batch as the one parameter M of the "
            f"delayed-SGD bound, tau_crit = 1 + M / B; base batch {base_batch}): "
            + "; ".join(parts))


def _trial_text(trial: training.Trial) -> str:
    # the delay's fields only for a delayed trial (an undelayed one reads as before they existed)
    delay = ("delay", "delay_kind", "workers")
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in asdict(trial).items()
                     if v is not None and (trial.delay or k not in delay))


def _goal(spec: Spec) -> str:
    return f"validation {spec.metric} {'<' if spec.strict else '<='} {spec.target:g}"


def _fractions(fractions: Sequence[float], at: float) -> list[float]:
    if isinstance(at, bool) or not (isinstance(at, (int, float)) and 0 < at <= 1):
        raise AdviceError(f"at must be a fraction of the base run's steps to the goal in (0, 1], got {at!r}")
    fr = [float(f) for f in fractions]
    if not fr or any(not 0 < f <= 1 for f in fr) or fr != sorted(set(fr)):
        raise AdviceError(f"fractions must be increasing numbers in (0, 1], got {list(fractions)}")
    if float(at) not in fr:
        raise AdviceError(f"at must be one of the checkpoint fractions {fr}, got {at!r}")
    return fr




def _noise_row(net: torch.nn.Module, dataset: training.Dataset, mask, step: int, horizon: int,
               examples: int, seed: int) -> dict[str, float]:
    """Gradient noise of ``net`` on a seeded sample of ``examples`` training examples."""
    est = gradient_noise(net, dataset, mask=mask, examples=min(examples, dataset.n_train),
                         hessian_examples=0, seed=seed, dtype=torch.float32)
    return {"step": step, "fraction": step / horizon, "b_simple": est.b_simple,
            "b_simple_se": est.b_simple_se, "g_sq": est.g_sq, "g_sq_se": est.g_sq_se,
            "trace_sigma": est.trace_sigma, "trace_sigma_se": est.trace_sigma_se, "loss": est.loss}


def _ladder(b0: int, k_max: int, spec: Spec, n: int, top: int | None = None) -> list[int]:
    """Powers of two from ``b0`` up to ``top`` (default the largest branch, k_max b0), at most n."""
    top = min(k_max * b0 if top is None else max(top, k_max * b0), n)
    return [b0 << j for j in range(int(math.log2(top // b0)) + 1)]


def _step_times(model, dataset, trial, run, mask, index, batch_sizes, steps) -> pd.DataFrame:
    """Seconds per step of one trial at each batch size: ``train_trials`` for ``2 steps``
    steps minus for ``steps`` steps, over ``steps`` (start-up cancels out)."""
    rows = []
    for b in batch_sizes:
        timed = []
        for s in (steps, 2 * steps):
            cfg = replace(run, batch_size=b, max_steps=s, goal=None, stop="never",
                          eval_schedule=training.EvalSchedule(every=10**9))
            t0 = time.perf_counter()
            training.train_trials(model, dataset, [trial], cfg, masks=mask, first_index=index)
            timed.append(time.perf_counter() - t0)
        rows.append({"batch_size": b, "seconds": max(timed[1] - timed[0], 0.0) / steps,
                     "trial_steps": 3 * steps})
    return pd.DataFrame(rows)


def _cost_model(timing: pd.DataFrame, model: torch.nn.Module) -> CostModel:
    """t(B) = t_fixed + t_example B on one worker, least squares on the measured step times,
    constrained to t_fixed, t_example >= 0."""
    b, t = timing.batch_size.to_numpy(float), timing.seconds.to_numpy(float)
    slope = max(np.polyfit(b, t, 1)[0], 0.0) if len(b) > 1 else 0.0
    fixed = max(float(np.mean(t - slope * b)), 0.0)
    if fixed == 0.0 and len(b) > 1:
        slope = max(float(b @ t / (b @ b)), 0.0)
    n_params = sum(p.numel() for p in model.parameters())
    return CostModel(t_fixed=fixed, t_example=float(slope), alpha=0.0, beta=0.0, n_params=int(n_params),
                     meta={"source": "advise: one trial's measured step times, one worker"})


def _prediction(batches: list[int], rec: float, low: float, high: float, b0: int, h: int,
                timing: pd.DataFrame, model: torch.nn.Module) -> pd.DataFrame:
    """Predicted steps (range from the recommendation's interval), regime and time to the goal."""
    steps = predicted_steps(batches, rec, b0, h)
    # a larger B_crit predicts fewer steps above B_0 and more below it
    ends = np.stack([predicted_steps(batches, v, b0, h) for v in (max(low, 1.0), max(high, 1.0))])
    cost = _cost_model(timing, model)
    times = predict_time_to_result({b: int(round(s)) for b, s in zip(batches, steps)}, cost, workers=(1,))
    measured = dict(zip(timing.batch_size, timing.seconds))
    return pd.DataFrame({
        "batch_size": batches, "steps": steps, "steps_low": ends.min(0), "steps_high": ends.max(0),
        "regime": [regime_of_slope(-rec / (b + rec)) for b in batches],
        "step_seconds": [cost.step_time(b, 1) for b in batches],
        "measured_seconds": [measured.get(b, math.nan) for b in batches],
        "seconds": [times.at(b, 1).time for b in batches]})
