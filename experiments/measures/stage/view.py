"""Lee et al. (2021)'s L at their own stage, for the report: the store's ``stage_probes``
(L every N steps of each probed run up to its goal or budget, :mod:`experiments.measures.probes.tasks`)
read by :mod:`theory.verdicts.lee_stage`, beside the initialization and the early probes.

- :func:`stage_view`: per run of the report, each level's L per (batch size, step) with its
  interval over runs (Figure 10), the sparse/dense ratio at every common step, the ratio stage by
  stage (initialization: step 0 of the early probes; the early stage: the early probes' points
  after step 0 at equal fractions of each run; Lee's stage: steps >= 1,000), the verdict rows of
  the claim at Lee's stage (the columns of :data:`experiments.report.verdicts.VERDICT_COLUMNS`),
  the decisive rows of a study with ``[stopping]`` or ``[tuning]`` and the bias control's rows
  (:func:`decisive_verdicts`, :func:`bias_control_rows`: :mod:`theory.verdicts.lee_decisive`),
  and L on its fixed sample against the whole split where the study measured both.
- :func:`stage_tables`: those tables as displayed.

Every number says where it comes from: the store's tables, ``theory.verdicts.lee_stage``'s intervals (t
on log L over runs: a run is one (seed, trial) of a level at one batch size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from theory.verdicts.claims import FAILS, HOLDS, INCONCLUSIVE, Verdict
from theory.errors import TheoryError
from theory.verdicts.lee_decisive import CAUSES, compare, resolution, tuned_steps_verdict
from theory.verdicts.lee_stage import (
    STAGE_START, StageRatio, early_ratio, initialization_ratio, interval_side, overall_ratio,
    point_ratios, sample_check, stage_points, stage_verdicts,
)
from theory.verdicts.step_ratio import censored_step_ratio

from experiments.report.analysis import reached_groups
from experiments.report.formatting import fmt_interval, fmt_num, series_label
from experiments.report.runs import Run, RunSet
from experiments.report.verdicts import VERDICT_COLUMNS, level_curves, level_runs

POINT_COLUMNS = ["run", "series", "sparsity", "batch_size", "step", "value", "low", "high", "runs"]
RATIO_COLUMNS = ["run", "series", "sparsity", "batch_size", "step", "value", "low", "high",
                 "runs", "reference_runs", "paired_low", "paired_high"]
STAGE_COLUMNS = ["run", "series", "sparsity", "stage", "where", "value", "low", "high", "runs",
                 "reference_runs", "verdict", "paired_low", "paired_high"]
CHECK_COLUMNS = ["run", "series", "batch_size", "trial", "step", "examples", "sample", "full",
                 "spread", "agrees"]
STAGES = ("initialization (step 0)", "early stage (probes along [0, H], after step 0)",
          f"Lee's stage (steps >= {STAGE_START:,})")


@dataclass(frozen=True)
class StagePart:
    """The frames of :func:`stage_view` (empty when no run measured L at Lee's stage)."""

    points: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=POINT_COLUMNS))
    ratios: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=RATIO_COLUMNS))
    stages: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STAGE_COLUMNS))
    verdicts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=VERDICT_COLUMNS))
    check: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CHECK_COLUMNS))
    samples: tuple[str, ...] = ()

    @property
    def measured(self) -> bool:
        return bool(len(self.points))


def stage_view(runs: RunSet, level: float = 0.9) -> StagePart:
    """The stage's frames for every run that stored L at Lee's stage (module docstring)."""
    parts: dict[str, list] = {k: [] for k in ("points", "ratios", "stages", "verdicts", "check")}
    samples = []
    parts["verdicts"] += bias_control_rows(runs)
    for r in runs.runs:
        mine = runs.stage[runs.stage["run"] == r.label] if len(runs.stage) else runs.stage
        if not len(mine):
            continue
        label = lambda s: series_label(r.label, s, runs.combined)   # noqa: E731
        probes = runs.probes[runs.probes["run"] == r.label]
        start = stage_start(r)
        parts["points"] += [(r.label, label(p.sparsity), p.sparsity, p.batch_size, p.step, p.value,
                             *p.interval, p.runs) for p in stage_points(mine, start, level)]
        levels = sorted(set(mine["sparsity"]))
        reference = 0.0 if 0.0 in levels else None
        if reference is not None:
            parts["ratios"] += [_ratio_row(r.label, label(x.sparsity), x)
                                for x in point_ratios(mine, reference, start, level)]
            parts["stages"] += _stage_rows(r.label, label, mine, probes, levels, reference, level,
                                           start)
            reached = reached_groups(runs.groups)
            try:
                judged = (*stage_verdicts(mine, level_curves(reached[reached["run"] == r.label]),
                                          reference, start, level, runs=_runs_of(r, runs)),
                          *decisive_verdicts(r, mine, runs, reference, start))
            except TheoryError:
                judged = ()
            parts["verdicts"] += [_verdict_row(r.label, label(v.sparsity), v) for v in judged]
        parts["check"] += _check_rows(r.label, label, mine)
        examples = mine.loc[mine["quantity"] == "local_lipschitz", "examples"].dropna()
        samples.append(f"{r.label}: L's gradients on "
                       + (f"a fixed sample of {int(examples.iloc[0]):,} training examples (the "
                          "same for every run and point)" if len(examples) else
                          "the whole training split"))
    return StagePart(pd.DataFrame(parts["points"], columns=POINT_COLUMNS),
                     pd.DataFrame(parts["ratios"], columns=RATIO_COLUMNS),
                     pd.DataFrame(parts["stages"], columns=STAGE_COLUMNS),
                     pd.DataFrame(parts["verdicts"], columns=VERDICT_COLUMNS),
                     pd.DataFrame(parts["check"], columns=CHECK_COLUMNS), tuple(samples))


def _verdict_row(run: str, series: str, v: Verdict) -> dict:
    """A verdict as a row of :data:`experiments.report.verdicts.VERDICT_COLUMNS`."""
    return {"run": run, "series": series, "sparsity": v.sparsity, "claim": v.claim,
            "tier": v.tier, "value": v.value, "low": v.interval[0], "high": v.interval[1],
            "allowed_low": v.threshold[0], "allowed_high": v.threshold[1], "verdict": v.verdict,
            "reason": v.reason, "statistic": v.statistic}


def _runs_of(run: Run, runs: RunSet) -> pd.DataFrame:
    """Every run (trial) of one study's groups, those that missed the goal at their budget."""
    return level_runs(runs.groups[runs.groups["run"] == run.label], runs.trials,
                      getattr(run.spec, "stop", "") == "all")


def stage_start(run: Run) -> int:
    """Where a study's stage starts: its ``[probes] lipschitz_start`` where set (a tiny twin
    starts early), else Lee et al.'s :data:`STAGE_START`."""
    probes = getattr(run.spec, "probes", None)
    return getattr(probes, "lipschitz_start", None) or STAGE_START


def decisive_verdicts(run: Run, table: pd.DataFrame, runs: RunSet, reference: float,
                      start: int = STAGE_START) -> list[Verdict]:
    """The decisive rows of one study (issue 47, :mod:`theory.verdicts.lee_decisive`): with a
    ``[stopping]`` rule, what the paired interval of each sparse level resolves (its
    ``effect``); with ``[tuning]``, the step ratio at the tuned settings with its interval over
    runs."""
    rule, tuned = getattr(run.spec, "stopping", None), getattr(run.spec, "tuning", None)
    if rule is None and tuned is None:
        return []
    steps = _runs_of(run, runs) if tuned is not None else None
    out = []
    for s in sorted(set(table["sparsity"]) - {reference}):
        if rule is not None:
            out.append(resolution(overall_ratio(table, s, reference, start), rule.effect,
                                  start))
        if steps is not None and {s, reference} <= set(steps["sparsity"]):
            out.append(tuned_steps_verdict(censored_step_ratio(steps, s, reference)))
    return out


def bias_control_rows(runs: RunSet) -> list[dict]:
    """The bias control's rows (``[pruning] bias_controls``, :func:`theory.verdicts.lee_decisive.compare`):
    dense without biases / dense ("biases removed"), each sparse level / dense without biases
    ("weights pruned"), each sparse level with its biases kept / dense ("weights pruned, biases
    kept"), L at Lee's stage and steps, from the study's run and its controls' runs."""
    by_series = {getattr(r.spec, "series", ""): r for r in runs.runs}
    main = by_series.get("")
    if main is None or not len(runs.stage) or not (
            {"no_bias", "dense_biases"} & set(by_series)):
        return []

    def tables(r: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
        return runs.stage[runs.stage["run"] == r.label], _runs_of(r, runs)

    study = tables(main)
    sparse = sorted(s for s in set(study[0]["sparsity"]) if s > 0)
    pairs = []
    if "no_bias" in by_series:
        bare = tables(by_series["no_bias"])
        pairs += [(by_series["no_bias"], bare, 0.0, study, 0.0, "biases")]
        pairs += [(main, study, s, bare, 0.0, "weights") for s in sparse]
    if "dense_biases" in by_series:
        kept = by_series["dense_biases"]
        pairs += [(kept, tables(kept), s, study, 0.0, "weights_kept_biases") for s in sparse]
    out = []
    for r, (table, steps), level, (ref_table, ref_steps), ref_level, cause in pairs:
        try:
            rows = compare(table, ref_table, steps, ref_steps, level, ref_level, cause,
                           stage_start(main))
        except TheoryError:   # a side with no runs at Lee's stage or no shared batch size
            continue
        out += [_verdict_row(r.label, f"{r.label} ({CAUSES[cause]})", v) for v in rows]
    return out


def _ratio_row(run: str, series: str, x: StageRatio) -> tuple:
    return (run, series, x.sparsity, x.batch_size, x.step, x.value, *x.interval, *x.runs,
            *x.paired)


def _direction(x: StageRatio) -> str:
    """The stage's verdict on "L is larger when sparse" from its ratio's primary interval: the
    paired one where the runs are paired, else the Welch one (:func:`stage_verdicts`)."""
    side = interval_side(x.interval if math.isnan(x.paired[0]) else x.paired)
    return {1: HOLDS, -1: FAILS, 0: INCONCLUSIVE}[side]


def _stage_rows(run: str, label, table: pd.DataFrame, probes: pd.DataFrame,
                levels: list[float], reference: float, level: float,
                start: int = STAGE_START) -> list[tuple]:
    """Per sparse level the three stages' L ratio, each on its own row."""
    out = []
    for s in levels:
        if s == reference:
            continue
        init = initialization_ratio(probes, s, reference, level) if len(probes) else None
        early = early_ratio(probes, s, reference, level) if len(probes) else None
        stage = overall_ratio(table, s, reference, start, level)
        for name, x, where in (
                (STAGES[0], init, "step 0"),
                (STAGES[1], early, None if early is None or not early.steps else
                 f"points {early.steps[0]}-{early.steps[-1]} of each run"),
                (STAGES[2], stage, None if not stage.steps else
                 f"steps {stage.steps[0]:,}-{stage.steps[-1]:,}")):
            if x is None or math.isnan(x.value):
                out.append((run, label(s), s, name, "not measured", math.nan, math.nan, math.nan,
                            0, 0, "–", math.nan, math.nan))
                continue
            # Lee et al. make no claim at initialization: its row is shown, not judged
            verdict = "not judged (Lee et al. never measured here)" if x.step == 0 else _direction(x)
            out.append((run, label(s), s, name, where or "step 0", x.value, *x.interval, *x.runs,
                        verdict, *x.paired))
    return out


def _check_rows(run: str, label, table: pd.DataFrame) -> list[tuple]:
    """L on its sample beside L on the whole split, where the study measured both."""
    full = table[table["quantity"] == "local_lipschitz_full"]
    sample = table[table["quantity"] == "local_lipschitz"].set_index(
        ["sparsity", "seed", "batch_size", "trial", "step"])
    out = []
    for r in full.itertuples(index=False):
        key = (r.sparsity, r.seed, r.batch_size, r.trial, r.step)
        if key in sample.index:
            s = sample.loc[key]
            # every run's L on the sample at that (level, batch size, step): the spread
            runs = sample.xs((r.sparsity, r.batch_size, r.step),
                             level=["sparsity", "batch_size", "step"]).value
            c = sample_check(float(s.value), float(r.value), runs.to_numpy(float))
            out.append((run, label(r.sparsity), int(r.batch_size), int(r.trial), int(r.step),
                        int(s.examples) if not pd.isna(s.examples) else None, float(s.value),
                        float(r.value), c.spread, c.agrees))
    return out


def stage_tables(part: StagePart) -> list[tuple[str, pd.DataFrame, str]]:
    """(title, table, note) of the stage, in order: the three stages, the ratio at every common
    step, and the sample against the whole split (when measured)."""
    if not part.measured:
        return []
    stages = pd.DataFrame({
        "series": part.stages["series"], "stage": part.stages["stage"],
        "where": part.stages["where"],
        "L / dense L [90 % interval]": [_value(v, lo, hi) for v, lo, hi in zip(
            part.stages["value"], part.stages["low"], part.stages["high"])],
        "runs (level, dense)": [f"{a}, {b}" for a, b in zip(part.stages["runs"],
                                                           part.stages["reference_runs"])],
        "L larger when sparse?": part.stages["verdict"],
        "paired runs' interval": _paired_column(part.stages)})
    ratios = part.ratios.sort_values(["run", "sparsity", "batch_size", "step"], kind="stable")
    points = pd.DataFrame({
        "series": ratios["series"], "B": [str(int(b)) for b in ratios["batch_size"]],
        "step": [f"{int(t):,}" for t in ratios["step"]],
        "L / dense L [90 % interval]": [_value(v, lo, hi) for v, lo, hi in zip(
            ratios["value"], ratios["low"], ratios["high"])],
        "runs (level, dense)": [f"{a}, {b}" for a, b in zip(ratios["runs"],
                                                           ratios["reference_runs"])],
        "paired runs' interval": _paired_column(ratios)})
    out = [("Lee et al.'s L, stage by stage", stages,
            "Ratio of geometric means of L over runs (a run: one seed and trial at one batch "
            "size), with a 90 % t interval on log L (Welch, per batch size, then averaged over "
            "batch sizes). Initialization: step 0 of the probes along [0, H], shown, never "
            "averaged in. Early stage: the K probe points of each run after step 0, compared at "
            "equal fractions of each run. Lee's stage: L every N steps of each run up to its "
            "goal, or its budget where it did not meet it (their edps/train.py), the steps >= "
            f"{STAGE_START:,} that every run of both levels reached. "
            + " ".join(part.samples) + ". " + PAIRED_NOTE),
           ("L at Lee's stage, point by point", points,
            "At each step both levels reached at one batch size: the ratio of the levels' "
            "geometric means of L with its 90 % Welch t interval on log L; one run on a side "
            "gives no interval. " + PAIRED_NOTE)]
    if len(part.check):
        c = part.check
        check = pd.DataFrame({
            "series": c["series"], "B, trial, step": [f"{b}, {t}, {s:,}" for b, t, s in zip(
                c["batch_size"], c["trial"], c["step"])],
            "L on the sample": [f"{fmt_num(v, 4)} ({fmt_num(n)} examples)" for v, n in
                                zip(c["sample"], c["examples"])],
            "L on the whole split": [fmt_num(v, 4) for v in c["full"]],
            "sample / whole": [fmt_num(a / b, 3) for a, b in zip(c["sample"], c["full"])],
            "within the run-to-run spread?": [
                "– (one run)" if agrees is None or pd.isna(agrees) else
                f"{'yes' if agrees else 'no'} (SD of log L over runs {fmt_num(sd, 3)})"
                for agrees, sd in zip(c["agrees"], c["spread"])]})
        out.append(("L's sample against the whole training split", check,
                    "The reduction's effect at one point: L of the same update computed on the "
                    "fixed sample and on every training example (Lee et al.'s check.py uses the "
                    "whole split); it agrees where |log(sample / whole)| is at most the SD of "
                    "log L over the level's runs at that step "
                    "(theory.verdicts.lee_stage.sample_check)."))
    return out


PAIRED_NOTE = ("Paired runs' interval: trial i of every level starts from the same "
               "initialization and sees the same data order, so where both levels hold the same "
               "runs the 90 % paired t interval on the per-run log ratio is shown beside the "
               "Welch one; the verdict uses the paired interval wherever the runs are paired "
               "(declared before the data), else the Welch one.")


def _paired_column(frame: pd.DataFrame) -> list[str]:
    return ["–" if math.isnan(lo) else fmt_interval(lo, hi)
            for lo, hi in zip(frame["paired_low"], frame["paired_high"])]


def _value(v: float, lo: float, hi: float) -> str:
    if math.isnan(v):
        return "–"
    return f"{fmt_num(v, 3)} " + ("(one run: no interval)" if math.isnan(lo) else fmt_interval(lo, hi))


def stage_sentences(part: StagePart) -> list[str]:
    """Per sparse series: the ratio at each stage, and whether the sign flips between them;
    then each decisive and bias-control verdict in its stored words and reason."""
    out = []
    for (run, series), g in part.stages.groupby(["run", "series"], sort=False):
        rows = {r.stage: r for r in g.itertuples(index=False)}
        words = [f"{name.split(' (')[0]} {_value(r.value, r.low, r.high)}"
                 for name, r in rows.items() if not math.isnan(r.value)]
        early, late = (rows.get(name) for name in STAGES[1:3])
        flip = ("" if early is None or late is None or math.isnan(early.value)
                or math.isnan(late.value) else
                " " + flip_sentence((early.value, early.low, early.high),
                                    (late.value, late.low, late.high)))
        out.append(f"{series}: L / dense L at {', '.join(words)}.{flip}")
    decisive = part.verdicts[part.verdicts["claim"].str.startswith(DECISIVE_CLAIMS)]
    out += [f"{v.series}: {v.claim} {v.verdict}: {v.reason}."
            for v in decisive.itertuples(index=False)]
    return out


# the claims of theory.verdicts.lee_decisive, each printed as its stored verdict and reason
DECISIVE_CLAIMS = ("lee_L_resolved", "lee_steps", "lee_L_rises: ")


def flip_sentence(early: tuple[float, float, float], late: tuple[float, float, float]) -> str:
    """Whether L / dense L changes side of 1 between the early stage and Lee's stage, each
    given as (value, low, high): a sign counts as established only where the stage's interval
    excludes 1, so a point estimate crossing 1 inside two wide intervals is said to be one."""
    sides = [interval_side((lo, hi)) for _, lo, hi in (early, late)]
    if all(sides):
        same = sides[0] == sides[1]
        return (("The sign is the same" if same else "The sign flips")
                + " between the early stage and Lee's stage (both intervals exclude 1).")
    cross = (early[0] > 1) != (late[0] > 1)
    open_ = [name + (" has one run" if math.isnan(lo) else "'s interval contains 1")
             for name, (_, lo, _), side in zip(("the early stage", "Lee's stage"), (early, late),
                                               sides) if not side]
    return (("The point estimate crosses 1" if cross else "The point estimates lie on one side "
             "of 1") + f" between the early stage and Lee's stage, but {' and '.join(open_)}: "
            "a change of sign is not established.")

