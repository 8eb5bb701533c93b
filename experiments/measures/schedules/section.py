"""The report's shoot-out section (``[schedules]``, :func:`schedules_part`): the table per
policy against the best fixed batch size (:mod:`experiments.report.schedules.view`), the
anchors' claimed gains beside what they gain here, and the figure of the batch-size
trajectories beside the sweep's B_crit and the branching CBS(t)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from theory.errors import TheoryError
from theory.models.scaling import fit_scaling

from experiments.measurement import Part, ReportContext
from experiments.report.figures import measurement as F
from experiments.report.formatting import fmt_interval, fmt_num
from experiments.report.runs import RunSet
from experiments.report.schedules.view import (
    BEST_FIXED, CLAIMS, LEVEL, summary, trajectories,
)
from experiments.report.sections import Figure, Paragraphs, Section, Table

HEADING = "Batch-size policies against the best fixed batch size"
TEXT = (
    "Each policy (theory.policies) starts from the best trial at the study's smallest batch size "
    "that reached the goal (its metaparameters, initialization and budget) and sets B and the "
    "learning rate every few updates from the noise monitor's reading of its own weights "
    "(goodput, noise ramp) or from a schedule fixed before the run (fixed, CBS warmup from the "
    "study's branching, Seesaw). The best fixed B is the sweep's batch size with the least "
    "modelled time to the goal, its best trial rerun on the same data orders. Modelled time: "
    "the sum over a run's segments of steps × t(B), t(B) = t_fixed + t_example B fitted to the "
    "sweep's own seconds per trial-step; the noise readings' cost is not in it (their examples "
    "are in the table's last column). Intervals: geometric mean over replicate data orders, "
    f"{int(LEVEL * 100)} % t interval on the log scale. Verdict: the paired time ratio policy / "
    "best fixed over replicates; beats (interval below 1), loses (above 1), inconclusive.")


def schedules_part(ctx: ReportContext) -> Part:
    """The shoot-out's section, where the store holds its rows."""
    rows = rows_of(ctx.runs)
    return Part(sections=(schedules_section(ctx.runs, rows),) if len(rows) else ())


def rows_of(runs: RunSet) -> pd.DataFrame:
    """The ``policy_runs`` rows of every run, with a ``run`` column."""
    frames = [r.results.tables.get("policy_runs", pd.DataFrame()).assign(run=r.label)
              for r in runs.runs]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def schedules_section(runs: RunSet, rows: pd.DataFrame) -> Section:
    """The section for the stored shoot-out ``rows`` (:func:`rows_of`)."""
    table = summary(rows)
    return Section(HEADING, 2, (
        Paragraphs((TEXT,)),
        Table(_policy_table(table)),
        Paragraphs(("Steps, examples and time: geometric mean [90 % interval] over replicates "
                    "(– where a replicate missed the goal); time ratio: policy / best fixed B, "
                    "paired by replicate; ≤: a replicate of the best fixed B missed the goal and "
                    "counts at its whole budget, so the ratio is an upper bound.",), "note"),
        Table(_claims_table(table)),
        Paragraphs(("Each paper's reported gain, in its own terms, beside the same quantity "
                    "here (1 − the paired ratio's geometric mean).",), "note"),
        Figure("fig_schedules", "Batch size along training under each policy",
               "B against examples seen, one line per replicate, one colour per policy; dashed: "
               "the sweep's fitted B_crit (median steps over seeds); ×: the branching CBS(t) "
               "where the study measured it.",
               F.png_bytes(_figure(rows, runs)))))


def _cell(x: float, lo: float, hi: float) -> str:
    return fmt_num(x, 3) + ("" if np.isnan(lo) else " " + fmt_interval(lo, hi))


def _policy_table(t: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "run": t.run, "sparsity": t.sparsity.map(fmt_num), "seed": t.seed, "policy": t.policy,
        "start B": t.start, "reached": [f"{a}/{b}" for a, b in zip(t.reached, t.replicates)],
        "steps": [_cell(*v) for v in zip(t.steps, t.steps_low, t.steps_high)],
        "examples": [_cell(*v) for v in zip(t.examples, t.examples_low, t.examples_high)],
        "modelled time (s)": [_cell(*v) for v in zip(t.seconds, t.seconds_low, t.seconds_high)],
        "time ratio": [("≤ " if c else "") + _cell(*v) if p != BEST_FIXED else "1" for p, c, *v
                       in zip(t.policy, t.censored, t.ratio, t.ratio_low, t.ratio_high)],
        "verdict": [v if p != BEST_FIXED else "(baseline)" for p, v in zip(t.policy, t.verdict)],
        "noise readings (examples)": t.measured.map(fmt_num)})


def _claims_table(t: pd.DataFrame) -> pd.DataFrame:
    mine = t[t.policy.isin(list(CLAIMS))]
    return pd.DataFrame({
        "policy": mine.policy, "run": mine.run, "sparsity": mine.sparsity.map(fmt_num),
        "seed": mine.seed, "paper": [CLAIMS[p][0] for p in mine.policy],
        "claimed": [CLAIMS[p][1] for p in mine.policy],
        "here": [("–" if np.isnan(r) else f"{(1 - r) * 100:+.0f} % ({CLAIMS[p][2]})")
                 for p, r in zip(mine.policy, mine.claim_ratio)]})


def b_crit(groups: pd.DataFrame, run: str, sparsity: float) -> float:
    """The sweep's fitted B_crit of (run, sparsity): S(B) the median over seeds (nan if the fit
    cannot be made)."""
    g = groups[(groups.run == run) & (groups.sparsity == sparsity) & groups.steps_to_result.notna()
               & (groups.delay == 0)]
    s = g.groupby("batch_size").steps_to_result.median()
    if len(s) < 3:
        return float("nan")
    try:
        return float(fit_scaling(s.index.to_numpy(float), s.to_numpy(float), n_boot=1).b_crit)   # the point fit
    except (TheoryError, ValueError):
        return float("nan")


def _figure(rows: pd.DataFrame, runs: RunSet):
    traj = trajectories(rows)
    panels = list(dict.fromkeys(zip(traj.run, traj.sparsity)))
    policies = list(dict.fromkeys(traj.policy))
    color = F.colors(policies)
    with F.style():
        fig, axes = F._grid(len(panels), min(2, len(panels)), 4.2, 3.0)
        for ax, (run, sparsity) in zip(axes, panels):
            mine = traj[(traj.run == run) & (traj.sparsity == sparsity)]
            seed = mine.seed.min()
            for policy in policies:
                for k, (_, r) in enumerate(mine[(mine.seed == seed) & (mine.policy == policy)]
                                           .groupby("replicate")):
                    ax.step(r.examples, r.batch_size, where="post", color=color[policy],
                            lw=1.0, alpha=0.7, label=policy if k == 0 else None)
            crit = b_crit(runs.groups, run, sparsity)
            if np.isfinite(crit):
                ax.axhline(crit, color="black", ls="--", lw=1.0, label="B_crit (sweep)")
            br = runs.branching
            if len(br):
                br = br[(br.run == run) & (br.sparsity == sparsity) & (br.seed == seed)]
                ax.plot(br.examples, br.critical_batch.clip(lower=1), "x", color="black",
                        ms=5, label="CBS(t) (branching)" if len(br) else None)
            F.log2_axis(ax.yaxis)
            ax.set_title(f"{run}, sparsity {fmt_num(sparsity)}")
            ax.set_xlabel("examples seen")
            ax.set_ylabel("batch size B")
        axes[0].legend(loc="best", fontsize=7)
        return fig
