"""The report's section on the gradient-delay axis (:mod:`experiments.measures.delay.view`): the
two figures, the theory of ``theory.models.delay`` beside the measurement, the tuned learning
rates beside the guideline, and asynchronous against synchronous modelled time
(``training.distributed.asynctime``) where a run folder holds a cost model."""

from __future__ import annotations

import math

import pandas as pd

from theory.errors import TheoryError
from theory.models.delay import critical_batch, critical_delay, lr_ratio
from theory.verdicts.summaries import find, summarize
from training.distributed.asynctime import Stragglers, compare

from experiments.measures.delay.view import CRITICAL_FACTOR, DelayPart, TIER
from experiments.measures.delay import figures as DF
from experiments.report.figures import measurement as F
from experiments.report.formatting import fmt_interval, fmt_num
from experiments.measures.hardware.view import HOW_TO, load_run_cost
from experiments.report.runs import RunSet
from experiments.report.sections import Figure, Paragraphs, Section, Table

HEADING = "Asynchronous updates: the gradient delay"
# the stragglers of the modelled comparison: exponential compute-time noise of mean 0.5 c
STRAGGLERS = Stragglers("exponential", 0.5)

TEXT = (
    "Every group trains its trials with a gradient delay τ: the update at step t applies the "
    "gradient computed at the weights of step t − τ (training.delay), the model of an "
    "asynchronous worker; the metaparameter search runs per (B, τ) group, so the learning rate "
    "is tuned per (B, τ) as it is per B. S(B, τ) is the median over the seeds that reached the "
    "goal. The critical delay τ_crit(B) is defined here as the delay at which S(B, τ) reaches "
    f"{CRITICAL_FACTOR:g} × S(B, 0), interpolated linearly in τ between the measured delays "
    "that bracket it (the delayed-SGD bound's steps grow as 1 + τ / τ_crit, so its own τ_crit "
    "is where they double); ≤: a delay that did not reach the goal counted at its step "
    "budget; ≥: no measured delay doubled the steps. The critical batch size B_crit(τ) is the "
    "scaling fit S(B) = S_min (1 + B_crit / B) of each delay's curve. Theory "
    "(theory.models.delay, a reconstruction of Stich, Mohtashami & Jaggi 2021 without "
    "additive noise): one parameter M gives B_crit(τ) = M / (1 + τ) and τ_crit(B) = 1 + M / B, "
    "and the learning-rate guideline lr(B, τ) / lr(B, 0) = (1 + M/B) / (1 + M/B + τ). M is "
    "read two ways: the synchronous fit's B_crit(0), and the probes' B_simple at the goal "
    "(McCandlish et al. 2018's simple noise scale, the library's own noise estimators).")


def delay_section(runs: RunSet, part: DelayPart) -> Section:
    """The section (figures, tables, notes) for ``part``, the runs' delay axis."""
    series = list(dict.fromkeys(part.points.sort_values(["run", "sparsity"], kind="stable")["series"]))
    probe_m = probe_parameter(runs.probes, part)
    blocks = [
        Paragraphs((TEXT, verdict_note())),
        Figure("fig11_steps_by_delay", "Figure 11. Steps to result against batch size, one line "
               "per gradient delay τ",
               "S(B, τ): median over the seeds that reached the goal, the learning rate tuned "
               "per (B, τ); ×: a delay that did not reach the goal at that B, drawn at its step "
               "budget.", F.png_bytes(DF.steps_by_delay_figure(part.points, series))),
        Figure("fig12_critical_delay", "Figure 12. Critical delay against critical batch size",
               "y = 1 + τ, both axes log. Circles: the measured τ_crit(B) at each batch size "
               "(open: a bound); squares: the fitted B_crit(τ) at each delay τ > 0. Dashed: "
               "1 + τ_crit = 2 + M / B, dotted: 1 + τ = M / B_crit, with the one parameter M = "
               "the level's synchronous B_crit(0): where the markers follow their lines, one "
               "parameter explains both saturations.",
               F.png_bytes(DF.critical_figure(part.critical, part.b_crit, part.m, series,
                                              F.colors(series)))),
        _table("Critical delay per batch size, measured and predicted", critical_frame(part, probe_m),
               "τ_crit predicted as 1 + M / B: from the synchronous fit's B_crit(0), and from the "
               "probes' B_simple at the goal (– where the level was not probed)."),
        _table("Critical batch size per delay, fitted and predicted", b_crit_frame(part, probe_m),
               "B_crit(τ): the scaling fit of the delay's curve with its 90 % bootstrap interval; "
               "predicted M / (1 + τ) from B_crit(0) and from B_simple at the goal."),
        _table("Tuned learning rate against the guideline", lr_frame(part),
               "Tuned: the effective learning rate lr / (1 − momentum) of the best trial (the "
               "seed with the fewest steps); ratio: over the tuned rate at τ = 0 and the same B; "
               "guideline: (1 + M/B) / (1 + M/B + τ) with M = B_crit(0). No adjustment would be "
               "a ratio of 1. The tuned rate can only take the searched values (the spec's "
               "trials points), so a ratio is resolved no finer than their spacing."),
        *async_blocks(runs, part),
    ]
    return Section(HEADING, 2, tuple(blocks))


def _table(title: str, frame: pd.DataFrame, note: str) -> Section:
    return Section(title, 3, (*((Table(frame),) if len(frame) else ()), Paragraphs((note,), "note")))


def probe_parameter(probes: pd.DataFrame, part: DelayPart) -> dict[str, float]:
    """Series -> M read from its probes: B_simple at the goal (``theory.verdicts.summaries``),
    for the levels of ``part`` that were probed."""
    out = {}
    levels = part.points.drop_duplicates(["run", "series", "sparsity"])
    for r in levels.itertuples(index=False):
        mine = probes[(probes["run"] == r.run)] if "run" in probes else probes.iloc[:0]
        if mine.empty:
            continue
        try:
            out[r.series] = find(summarize(mine, n_boot=100), r.sparsity, "b_simple_goal").value
        except TheoryError:
            continue
    return out


def critical_frame(part: DelayPart, probe_m: dict[str, float]) -> pd.DataFrame:
    rows = []
    for r in part.critical.itertuples(index=False):
        m = part.m.get(r.series)
        shown = "–" if math.isnan(r.tau_crit) else f"{r.kind} {fmt_num(r.tau_crit, 3)}".strip()
        rows.append({"series": r.series, "B": r.batch_size, "τ_crit measured": shown,
                     "from B_crit(0)": _predicted(critical_delay, m, r.batch_size),
                     "from B_simple": _predicted(critical_delay, probe_m.get(r.series),
                                                 r.batch_size)})
    return pd.DataFrame(rows)


def _predicted(fn, m: float | None, x: float) -> str:
    """``fn(M, sigma^2 = 0, eps = 1, x)`` formatted, or "–" without M."""
    if m is None or not m > 0:
        return "–"
    return fmt_num(float(fn(m, 0.0, 1.0, x)), 3)


def b_crit_frame(part: DelayPart, probe_m: dict[str, float]) -> pd.DataFrame:
    rows = []
    for r in part.b_crit.itertuples(index=False):
        m = part.m.get(r.level)
        measured = ("–" if pd.isna(r.b_crit) else
                    f"{fmt_num(r.b_crit, 3)} {fmt_interval(r.b_crit_lo, r.b_crit_hi)}")
        rows.append({"series": r.level, "τ": int(r.delay), "B_crit(τ) [90 %]": measured,
                     "from B_crit(0)": _predicted(critical_batch, m, r.delay),
                     "from B_simple": _predicted(critical_batch, probe_m.get(r.level), r.delay),
                     "note": r.note if isinstance(r.note, str) else ""})
    return pd.DataFrame(rows)


def lr_frame(part: DelayPart) -> pd.DataFrame:
    p = part.points
    sync = p[p["delay"] == 0].set_index(["series", "batch_size"])["lr"]
    rows = []
    for r in p[(p["delay"] > 0) & p["lr"].notna()].itertuples(index=False):
        base = sync.get((r.series, r.batch_size), math.nan)
        m = part.m.get(r.series)
        rows.append({"series": r.series, "B": r.batch_size, "τ": r.delay,
                     "tuned lr": fmt_num(r.lr, 3), "tuned at τ = 0": fmt_num(base, 3),
                     "ratio": fmt_num(r.lr / base, 3),
                     "guideline": "–" if m is None else fmt_num(
                         float(lr_ratio(m, r.batch_size, r.delay)), 3)})
    return pd.DataFrame(rows)


def async_blocks(runs: RunSet, part: DelayPart) -> list:
    """Asynchronous (W workers of batch b, delay W − 1) against synchronous (global batch W b)
    modelled time to the goal, per run holding a cost model; else how to make one."""
    blocks: list = []
    for run in runs.runs:
        rc = load_run_cost(run.results.run_dir)
        if rc is None:
            blocks.append(Paragraphs((f"{run.label}: no cost model, so no modelled time; {HOW_TO}.",),
                                     "note"))
            continue
        mine = part.points[part.points["run"] == run.label]
        for series, g in mine.groupby("series", sort=False):
            steps = {(int(r.batch_size), int(r.delay)): None if math.isnan(r.steps) else round(r.steps)
                     for r in g.itertuples(index=False)}
            workers = sorted({d + 1 for _, d in steps if d > 0})
            rows = compare(steps, rc.cost, workers, STRAGGLERS) if workers else []
            frame = pd.DataFrame([{
                "b": c.per_worker_batch, "W": c.workers, "sync steps (B = W b)": fmt_num(c.sync_steps),
                "sync time (s)": fmt_num(c.sync_time, 3), "async steps (τ = W − 1)": fmt_num(c.async_steps),
                "async time (s)": fmt_num(c.async_time, 3),
                "delay mean / p95 / max": f"{c.mean_delay:.2f} / {c.p95_delay:.0f} / {c.max_delay}",
                "sooner": c.winner} for c in rows])
            sooner = frame["sooner"].value_counts().to_dict() if len(frame) else {}
            blocks.append(_table(
                f"Asynchronous against synchronous modelled time: {series}", frame,
                f"The run's cost model (cost_model.json), stragglers {STRAGGLERS.distribution} "
                f"with scale {STRAGGLERS.scale:g} of the compute time; asynchronous needs "
                "S(b, W − 1) updates of batch b, synchronous S(W b, 0) steps of batch W b. "
                + (", ".join(f"{k}: {v}" for k, v in sorted(sooner.items())) + " pairs."
                   if sooner else "No (b, W) pair has both sides measured.")))
    return blocks


def verdict_note() -> str:
    """What the delay claims' rows in the verdict table mean."""
    return (f"The delay claims in the verdict tables (within 2x: the whole 90 % seed-bootstrap interval in "
            f"[{TIER[0]:g}, {TIER[1]:g}]): measured τ_crit over 1 + B_crit(0) / B; tuned "
            "learning-rate ratio over the guideline's; sparse/dense τ_crit ratio over the one "
            "B_crit(0) predicts.")

