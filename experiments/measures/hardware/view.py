"""Time to result on real hardware: a study's measured curves combined with a DDP cost model.

A run folder may hold ``cost_model.json`` (copied in by ``sparsescale study``,
:mod:`experiments.run.costcache`, or written by ``sparsescale bench ddp --out
RUN_DIR/cost_model.json``, :mod:`training.distributed.costmodel`). For every series of that run, its measured
steps-to-result S(B) (the median over the seeds that reached the goal, as in the report's
steps table) and the cost model's seconds per step t(B, k) give, with
:func:`theory.models.walltime.predict_time_to_result`,

    T(B, k) = S(B) * t(B, k)        W(B, k) = k * T(B, k)  (worker-seconds),

for k in ``WORKERS`` and every measured B divisible by k, and the fastest B per k
(Shallue et al. 2019 for S(B); the ring all-reduce of Thakur et al. 2005 inside t(B, k)).

A sparse series uses the same t(B, k) as the dense one: pruning here masks weights, so the
network is still computed and its gradient all-reduced densely.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from theory.models.walltime import WallTime, predict_time_to_result
from training.distributed.costmodel import CostModel, load_cost_model, load_measurements

from experiments.report.formatting import fmt_num
from experiments.report.runs import Run
from experiments.run.costcache import COST_MODEL_FILE

WORKERS = (1, 2, 4, 8)
HOW_TO = ("run `sparsescale bench ddp --out RUN_DIR/cost_model.json` and write the report again "
          "to predict time-to-result on k data-parallel workers")
COLUMNS = ["run", "series", "sparsity", "batch_size", "workers", "per_worker_batch", "steps",
           "step_time", "time", "worker_seconds", "fastest", "extrapolated"]


@dataclass(frozen=True)
class RunCost:
    """A run folder's cost model and the worker counts its step times were measured at (empty
    when the file stores no measurements)."""

    cost: CostModel
    measured_workers: tuple[int, ...]


@dataclass(frozen=True)
class HardwarePart:
    """``points``: one row per (series, B, k) with ``COLUMNS`` (times in seconds, ``fastest``:
    the fastest B for that series and k, ``extrapolated``: k beyond the measured worker counts);
    ``paragraphs``: what the numbers are and where they come from; empty ``points`` when no run
    has a cost model (``paragraphs`` then says how to make one)."""

    points: pd.DataFrame
    paragraphs: list[str]


def load_run_cost(run_dir: Path) -> RunCost | None:
    """The cost model in ``run_dir`` (None without ``cost_model.json``); a malformed file raises
    :class:`training.distributed.costmodel.CostModelError` naming it."""
    path = Path(run_dir) / COST_MODEL_FILE
    if not path.exists():
        return None
    meas = load_measurements(path)
    measured = sorted({s.workers for s in meas.steps}) if meas is not None else []
    return RunCost(load_cost_model(path), tuple(measured))


def steps_by_batch(points: pd.DataFrame, series: str) -> dict[int, int]:
    """Measured steps-to-result of one series per batch size; a median over an even number of
    seeds (a half step) is rounded up to the whole step the slower seed needed."""
    p = points[(points["series"] == series) & (points["status"] == "reached")]
    return {int(b): int(math.ceil(s)) for b, s in zip(p["batch_size"], p["steps"])}


def hardware_view(runs: Sequence[Run], order: Sequence[str], points: pd.DataFrame,
                  workers: tuple[int, ...] = WORKERS) -> HardwarePart:
    """Predicted time-to-result per series (in report ``order``) of every run whose folder
    holds a cost model; ``points`` is :func:`experiments.report.analysis.points_table`."""
    costs = {r.label: load_run_cost(r.results.run_dir) for r in runs}
    if not any(costs.values()):
        return HardwarePart(pd.DataFrame(columns=COLUMNS),
                            [f"No cost model: {HOW_TO}."])
    rows: list[dict] = []
    paragraphs = [
        "Predicted wall-clock time to reach the goal when the global batch B is split over k "
        "data-parallel workers: T(B, k) = S(B) · t(B, k) and the cost W = k · T in "
        "worker-seconds, with S(B) the measured steps to result (median over seeds, rounded up "
        "to a whole step) and t(B, k) = t_fixed + t_example · B / k + t_allreduce(P, k) the "
        "cost model measured on this machine by `sparsescale study` or `sparsescale bench ddp` "
        "(ring all-reduce: "
        "2 (k − 1) α + 2 (k − 1) / k · β · P · bytes). Times count training steps only, not "
        "evaluations; a B not divisible by k has no entry. Sparse series use the dense step "
        "time: masked weights are still computed and all-reduced."]
    for r in runs:
        rc = costs[r.label]
        if rc is None:
            paragraphs.append(f"{r.label}: no cost model in its run folder; {HOW_TO}.")
            continue
        paragraphs.append(_cost_sentence(r, rc, workers))
        mine = set(points.loc[points["run"] == r.label, "series"])
        for series in (s for s in order if s in mine):
            steps = steps_by_batch(points, series)
            if not steps:
                paragraphs.append(f"{series}: no batch size reached the goal; no prediction.")
                continue
            pred = predict_time_to_result(steps, rc.cost, workers)
            fastest = {(p.batch_size, p.workers) for p in pred.best_by_workers()}
            sparsity = float(points.loc[points["series"] == series, "sparsity"].iloc[0])
            rows += [{"run": r.label, "series": series, "sparsity": sparsity,
                      "batch_size": p.batch_size, "workers": p.workers,
                      "per_worker_batch": p.per_worker_batch, "steps": p.steps,
                      "step_time": p.step_time, "time": p.time,
                      "worker_seconds": p.worker_seconds,
                      "fastest": (p.batch_size, p.workers) in fastest,
                      "extrapolated": bool(rc.measured_workers)
                      and p.workers > max(rc.measured_workers)}
                     for p in sorted(pred.points, key=lambda p: (p.batch_size, p.workers))]
            paragraphs.append(_fastest_sentence(series, pred.fastest(), pred.best_by_workers()))
    return HardwarePart(pd.DataFrame(rows, columns=COLUMNS), paragraphs)


def _cost_sentence(run: Run, rc: RunCost, workers: tuple[int, ...]) -> str:
    c, meta = rc.cost, rc.cost.meta
    where = ", ".join(f"{k} {meta[k]}" for k in ("backend", "device", "threads", "host")
                      if k in meta)
    text = (f"{run.label}: cost model t_fixed = {fmt_num(c.t_fixed * 1e3, 4)} ms, "
            f"t_example = {fmt_num(c.t_example * 1e6, 4)} µs per example, "
            f"α = {fmt_num(c.alpha * 1e6, 4)} µs per ring round, "
            f"β = {fmt_num(c.beta * 1e9, 4)} ns per byte, P = {c.n_params} parameters of "
            f"{c.bytes_per_param} bytes" + (f" ({where})" if where else "") + ".")
    study = f"{run.spec.dataset}/{run.spec.model}"
    if meta.get("workload") and meta["workload"] != study:
        text += (f" It was measured on {meta['workload']}, not on this study's {study}: the "
                 f"times are that workload's step times.")
    if not rc.measured_workers:
        return text + (" The file stores no measurements, so which k were measured is unknown: "
                       "every k follows the fitted ring formula.")
    measured = ", ".join(map(str, rc.measured_workers))
    beyond = [k for k in workers if k > max(rc.measured_workers)]
    return text + (f" Step times were measured at k ∈ {{{measured}}}"
                   + (f"; k = {', '.join(map(str, beyond))} "
                      f"{'is' if len(beyond) == 1 else 'are'} extrapolated by the ring formula."
                      if beyond else "."))


def _fastest_sentence(series: str, best: WallTime, by_k: list[WallTime]) -> str:
    most = by_k[-1]
    return (f"{series}: fastest with k = {best.workers} worker(s) at B = {best.batch_size}: "
            f"{fmt_num(best.time, 3)} s ({fmt_num(best.worker_seconds, 3)} worker-s); on "
            f"k = {most.workers} the fastest is B = {most.batch_size}: {fmt_num(most.time, 3)} s "
            f"({fmt_num(most.worker_seconds, 3)} worker-s).")


def time_to_result_frame(part: HardwarePart, info: pd.DataFrame) -> pd.DataFrame:
    """time_to_result.csv: the prediction points with the study and optimizer of their run
    (``info``: :meth:`experiments.report.runs.RunSet.info`)."""
    by_run = info.set_index("run")
    df = part.points.rename(columns={"step_time": "step_time_s", "time": "time_s"}).copy()
    df.insert(0, "study", [by_run.loc[r, "study"] for r in df["run"]])
    df.insert(1, "optimizer", [by_run.loc[r, "optimizer"] for r in df["run"]])
    return df.drop(columns=["run"])


def hardware_tables(part: HardwarePart) -> list[tuple[str, pd.DataFrame, str]]:
    """(title, table, note) of the time to result (worker-seconds) per series and B on each k,
    then of the fastest B per k; none without a cost model."""
    p = part.points
    if not len(p):
        return []
    ks = sorted(set(p["workers"]))
    extrapolated = set(p.loc[p["extrapolated"], "workers"])
    heads = {k: f"k = {k}" + (" (extrapolated)" if k in extrapolated else "") for k in ks}
    rows = []
    for (series, b), g in p.groupby(["series", "batch_size"], sort=False):
        cell = {int(r.workers): f"{fmt_num(r.time, 4)} ({fmt_num(r.worker_seconds, 4)})"
                for r in g.itertuples(index=False)}
        rows.append({"series": series, "B": str(b), "steps": str(int(g["steps"].iloc[0])),
                     **{heads[k]: cell.get(k, "–") for k in ks}})
    grid = pd.DataFrame(rows, columns=["series", "B", "steps", *heads.values()])
    rank = {s: i for i, s in enumerate(dict.fromkeys(p["series"]))}
    best = (p[p["fastest"]].assign(_rank=p["series"].map(rank))
            .sort_values(["_rank", "workers"], kind="stable"))
    fastest = pd.DataFrame({
        "series": best["series"], "k": best["workers"].astype(str),
        "fastest B": best["batch_size"].astype(str), "B/k": best["per_worker_batch"].astype(str),
        "steps": best["steps"].astype(str),
        "step (ms)": [fmt_num(v * 1e3, 4) for v in best["step_time"]],
        "time to result (s)": [fmt_num(v, 4) for v in best["time"]],
        "worker-seconds": [fmt_num(v, 4) for v in best["worker_seconds"]],
        "extrapolated": ["yes" if v else "no" for v in best["extrapolated"]]})
    gaps = (grid[list(heads.values())] == "–").any(axis=None)
    return [("Predicted time to result on k workers: seconds (worker-seconds)", grid,
             "–: B is not divisible by k." if gaps else ""),
            ("Fastest batch size per number of workers k", fastest.reset_index(drop=True), "")]
