"""Study reports: theory set beside measurement, sparse beside dense.

``write_report(run_dirs, out=None)`` reads one or more run folders ONLY through
:func:`experiments.load_results` (so any finished or partial run can be reported again, and
several runs, e.g. an SGD and a momentum study, can be combined) and writes into ``out``:

- ``report.html``: self-contained (figures embedded as base64 PNG, inline CSS, no scripts): opens
  offline;
- ``report.md`` with ``figures/*.png`` beside it;
- ``summary.csv``: one row per (run, sparsity, batch size): steps-to-result, best metaparameters,
  trials reached / diverged, fit and prediction values;
- ``time_to_result.csv`` when a run folder holds ``cost_model.json``: predicted time-to-result
  per (series, batch size, workers k) on real hardware (:mod:`experiments.hardware`).

``out`` defaults to the first run folder. The same store(s) give byte-identical files: figures
carry no software or time metadata, rows are sorted, numbers have fixed formatting, and nothing
depends on the time the report is written.

Example::

    from experiments.report import write_report
    write_report(["runs/shallue-sgd", "runs/shallue-momentum"], out="runs/shallue")
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import figures as F
from .findings import (
    FIT_LEVEL, HELD_FACTOR, Fits, ReportError, Run, TheoryPart, cost_table, findings_text, fit_series,
    fmt_interval, fmt_num, held, load_runs, missing_table, points_table, search_edges, series_order,
    sparsity_label, stacked, step_ratios, theory_view,
)
from .hardware import HardwarePart, hardware_view
from .mathsvg import latex_svg

__all__ = ["write_report", "ReportError"]

HARDWARE_HEADING = "Time to result on real hardware"


@dataclass(frozen=True)
class Figure:
    name: str       # file stem under figures/
    title: str
    caption: str
    png: bytes


@dataclass(frozen=True)
class Table:
    title: str
    frame: pd.DataFrame   # already formatted as strings
    note: str = ""


@dataclass(frozen=True)
class Report:
    title: str
    overview: Table
    findings: list[str]
    figures: list[Figure]
    tables: list[Table]
    explanations: list[tuple[str, list[str]]]   # (heading, paragraphs)
    formulas: list[tuple[str, str, str]]  # (what, LaTeX, Unicode rendering)
    specs: list[tuple[str, str]]          # (run label, spec TOML)
    summary: pd.DataFrame
    hardware: list[str]                   # paragraphs of "Time to result on real hardware"
    hardware_tables: list[Table]
    time_to_result: pd.DataFrame          # time_to_result.csv (no rows: no cost model)


def write_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Write report.html, report.md, figures/*.png and summary.csv for ``run_dirs`` into ``out``
    (default: the first run folder) and return the path of report.html.

    Raises :class:`ReportError` for an empty ``run_dirs`` and ``experiments.StoreError`` for a
    folder without a store.
    """
    runs = load_runs([Path(d) for d in run_dirs] if not isinstance(run_dirs, (str, Path)) else run_dirs)
    out = Path(out) if out is not None else Path(run_dirs[0])
    report = build(runs)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for fig in report.figures:
        (out / "figures" / f"{fig.name}.png").write_bytes(fig.png)
    _write_text(out / "report.md", render_markdown(report))
    _write_text(out / "report.html", render_html(report))
    csv = report.summary.to_csv(index=False, float_format="%.6g", lineterminator="\n")
    _write_text(out / "summary.csv", csv)
    timing = out / "time_to_result.csv"
    if len(report.time_to_result):
        _write_text(timing, report.time_to_result.to_csv(index=False, float_format="%.6g",
                                                         lineterminator="\n"))
    else:
        timing.unlink(missing_ok=True)   # left by an earlier report whose cost model is gone
    return out / "report.html"


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


# ---------------------------------------------------------------------------------------------
# assembling the report


def build(runs: tuple[Run, ...]) -> Report:
    """Compute every number, figure and table of the report from the loaded runs."""
    points = points_table(runs)
    edges = search_edges(runs, points)
    fits = fit_series(runs)
    ratios = step_ratios(runs, points)
    theory_part = theory_view(runs, fits)
    missing = missing_table(runs)
    cost = cost_table(runs, missing)
    hardware = hardware_view(runs, points)
    series = series_order(runs)
    cmap = F.colors(series)
    trials = stacked(runs, "trials")
    probes = stacked(runs, "probes")
    goal = runs[0].spec["goal"]   # the dashed goal line of Figure 4 (combined runs normally share it)
    goal_text = "; ".join(dict.fromkeys(_goal_text(r.spec["goal"]) for r in runs))

    def drawn(make) -> bytes:
        """PNG of ``make()``, or of a placeholder when no group is stored at all."""
        stored = (points["status"] != "missing").any()
        return F.png_bytes(make() if stored else F.placeholder("no group of this study is in the store yet"))

    figures = [
        Figure("fig1_steps", "Figure 1. Steps to result vs batch size",
               "Measured steps-to-result (median over seeds) per series on log2 axes; dashed: perfect "
               "scaling anchored at the smallest batch size that reached the goal; solid: the fit "
               "S_min (1 + B_crit / B) to the measured points (fitted); dotted: the convergence bound "
               "scaled by the one constant calibrated on the dense curve (on dense: calibrated; on "
               "sparse levels: predicted from their probes); bands: regimes of the fit (perfect scaling "
               "B ≤ B_crit / 4, maximal data parallelism B ≥ 4 B_crit); ×: batch sizes without a point.",
               drawn(lambda: F.steps_figure(points, fits.table, theory_part.curves, series, cmap,
                                            ncols=min(4, max(len(r.spec["sparsities"]) for r in runs))))),
        Figure("fig2_normalized", "Figure 2. Normalized steps and the cost of sparsity",
               "(a) Steps divided by the steps at each series' smallest batch size (Lee et al. 2021's "
               "view); dashed: perfect scaling. (b) Measured steps of each sparse series over its "
               "run's dense series at the same batch size (1 = no extra cost).",
               drawn(lambda: F.normalized_figure(points, ratios, series, cmap))),
        Figure("fig3_metaparameters", "Figure 3. Optimal metaparameters vs batch size",
               "Learning rate, 1 − momentum and effective learning rate lr / (1 − momentum) of the best "
               "trial at each batch size (Shallue et al. 2019), with the linear (dashed) and square-root "
               "(dotted) heuristics anchored at the smallest batch size; ringed: best value in the outer "
               "10 % of the searched range (the optimum may lie outside the search space).",
               drawn(lambda: F.metaparameters_figure(points, edges, series, cmap))),
        Figure("fig4_trials", "Figure 4. Every trial: learning rate × (1 − momentum)",
               f"Each trial of every group, marked by outcome for the goal ({goal_text}). Groups stop "
               "at the first evaluation where any trial meets the goal unless the study ran with "
               "stop = \"all\", so \"did not\" means not met by then.",
               drawn(lambda: F.trials_figure(trials, series, goal["target"], goal["metric"]))),
        Figure("fig5_probes", "Figure 5. Smoothness and gradient noise",
               "Probes of the store: Lee et al. (2021)'s local Lipschitz constant along the reference "
               "trajectory, the top Hessian eigenvalue (Lanczos) and McCandlish et al. (2018)'s simple "
               "noise scale B_simple = tr Σ / |G|², vs sparsity (top: hollow = initialization, filled = "
               "median along training, bars = min to max) and over training steps (bottom).",
               F.png_bytes(F.probes_figure(probes, series, [r.label for r in runs], cmap))),
        Figure("fig6_nqm", "Figure 6. Noisy quadratic model beside the measurement",
               theory_part.nqm_caption,
               F.png_bytes(F.nqm_figure(points, theory_part.nqm, series, cmap, theory_part.nqm_note))),
    ]
    tables = [
        Table("Steps to result", _steps_table(points, edges)),
        Table(f"Scaling fits (S_min, B_crit with {int(FIT_LEVEL * 100)} % bootstrap intervals, "
              "regime boundaries)", _fits_table(fits)),
        Table("Predicted vs measured", _predictions_table(theory_part.table),
              f"Relative error = predicted / measured − 1; a prediction held when it is within a factor "
              f"{HELD_FACTOR:g} of the measurement." if len(theory_part.table) else
              "No prediction could be made (see What was fitted and what was predicted)."),
        Table("Sparse / dense step ratios (measured)", _ratios_table(ratios),
              "" if len(ratios) else "No sparse and dense curve reached the goal at a common batch size."),
        Table("Probe inputs to the theory", _probe_inputs_table(theory_part.inputs),
              "L: Lee et al.'s local Lipschitz constant (median along the reference trajectory; the top "
              "Hessian eigenvalue at initialization if no trajectory was probed); σ² = tr Σ and B_simple: "
              "median along the trajectory; Δ: loss at initialization."),
        Table("Missing and failed", _missing_table(missing),
              "" if len(missing) else "Every planned group is in the store and none failed."),
        Table("Cost and versions", _cost_table(cost)),
    ]
    return Report(
        title="Study report: " + ", ".join(r.label for r in runs),
        overview=Table("Studies", _overview_table(runs)),
        findings=findings_text(runs, points, fits, ratios, theory_part.table, missing),
        figures=figures, tables=tables,
        explanations=[("What was fitted and what was predicted", theory_part.statement)],
        formulas=theory_part.formulas,
        specs=[(r.label, str(r.results.study["spec_toml"].iloc[0])) for r in runs],
        summary=summary_frame(runs, points, edges, fits, theory_part, ratios),
        hardware=hardware.paragraphs, hardware_tables=_hardware_tables(hardware),
        time_to_result=_time_to_result_frame(runs, hardware),
    )


# ---------------------------------------------------------------------------------------------
# tables (formatted as strings, fixed formatting)


def _fmt_frame(df: pd.DataFrame, columns: dict[str, str], digits: int = 4) -> pd.DataFrame:
    """Select ``columns`` (source -> heading) and format every cell with :func:`fmt_num`."""
    out = pd.DataFrame({head: [v if isinstance(v, str) else fmt_num(v, digits) for v in df[src]]
                        for src, head in columns.items()}, columns=list(columns.values()))
    return out


def _goal_text(goal: dict) -> str:
    # an imported workload's metric is a column name that says its split (val/..., test/...)
    metric = goal["metric"] if "/" in goal["metric"] else f"validation {goal['metric']}"
    return f"{metric} {'<' if goal['strict'] else '<='} {goal['target']:g}"


def _overview_table(runs: tuple[Run, ...]) -> pd.DataFrame:
    rows = []
    for r in runs:
        s = r.spec
        bs = s["batch_sizes"]
        goal = s["goal"]
        budget = s.get("budget", {})
        rows.append({
            "study": r.label,
            "workload": f"{s['workload']['dataset']} / {s['workload']['model']}",
            "optimizer": s["optimizer"],
            "goal": _goal_text(goal),
            "batch sizes": f"{bs[0]} … {bs[-1]} ({len(bs)})" if len(bs) > 3 else ", ".join(map(str, bs)),
            "sparsities": ", ".join(sparsity_label(x) for x in s["sparsities"]),
            "pruning": s.get("pruning", {}).get("method", "–"),
            "trials per group": str(s["trials"]),
            "seeds": ", ".join(map(str, s["seeds"])),
            "step budget": (str(budget["max_steps"]) if budget.get("max_steps") is not None else
                            f"{budget.get('examples')} examples / B, "
                            f"in [{budget.get('min')}, {budget.get('max')}]"),
        })
    return pd.DataFrame(rows)


def _steps_table(points: pd.DataFrame, edges: pd.DataFrame) -> pd.DataFrame:
    d = points.join(edges)
    df = _fmt_frame(d, {"series": "series", "batch_size": "B", "status": "status", "steps": "steps",
                        "lr": "lr", "momentum": "momentum", "effective_lr": "effective lr",
                        "n_reached": "trials reached", "n_diverged": "diverged", "n_trials": "trials"})
    df["lr"] = [v + (" *" if e else "") for v, e in zip(df["lr"], d["lr_at_edge"])]
    df["momentum"] = [v + (" *" if e else "") for v, e in zip(df["momentum"], d["momentum_at_edge"])]
    df["seeds reached"] = [f"{a}/{b}" for a, b in zip(d["seeds_reached"], d["seeds"])]
    return df


def _fits_table(fits: Fits) -> pd.DataFrame:
    t = fits.table
    return pd.DataFrame({
        "series": t["series"],
        "points": [fmt_num(v) for v in t["points"]],
        "S_min": [fmt_num(v, 4) for v in t["s_min"]],
        "S_min interval": [fmt_interval(a, b) if not pd.isna(a) else "–"
                           for a, b in zip(t["s_min_lo"], t["s_min_hi"])],
        "B_crit": [fmt_num(v, 4) for v in t["b_crit"]],
        "B_crit interval": [fmt_interval(a, b) if not pd.isna(a) else "–"
                            for a, b in zip(t["b_crit_lo"], t["b_crit_hi"])],
        "perfect scaling up to B": [fmt_num(v, 3) for v in t["perfect_until"]],
        "maximal data parallelism from B": [fmt_num(v, 3) for v in t["largest_useful_batch"]],
        "residual sd (log)": [fmt_num(v, 2) for v in t["residual_sd"]],
        "note": t["note"].fillna(""),
    })


def _predictions_table(table: pd.DataFrame) -> pd.DataFrame:
    df = _fmt_frame(table, {"series": "series", "quantity": "quantity", "predicted": "predicted",
                            "measured": "measured"})
    df["relative error"] = [f"{e:+.1%}" if not pd.isna(e) else "–" for e in table["relative_error"]]
    df["held"] = [("yes" if held(e) else "no") if not pd.isna(e) else "–" for e in table["relative_error"]]
    return df


def _probe_inputs_table(inputs: pd.DataFrame) -> pd.DataFrame:
    return _fmt_frame(inputs, {"series": "series", "L": "L", "L_source": "L from", "sigma2": "σ² = tr Σ",
                               "delta": "Δ", "b_simple": "B_simple", "b_noise": "B_noise"}, digits=3)


def _ratios_table(ratios: pd.DataFrame) -> pd.DataFrame:
    if not len(ratios):
        return pd.DataFrame({"series": []})
    wide = ratios.pivot_table(index="series", columns="batch_size", values="ratio", sort=False)
    wide = wide.reindex([s for s in dict.fromkeys(ratios["series"])])
    df = pd.DataFrame({"series": wide.index})
    for b in sorted(wide.columns):
        df[f"B = {int(b)}"] = [fmt_num(v, 3) for v in wide[b]]
    return df


def _missing_table(missing: pd.DataFrame) -> pd.DataFrame:
    df = missing.copy()
    df["sparsity"] = [sparsity_label(s) for s in df["sparsity"]]
    return _fmt_frame(df, {"run": "study", "sparsity": "sparsity", "batch_size": "B", "seed": "seed",
                           "state": "state", "detail": "detail"})


def _cost_table(cost: pd.DataFrame) -> pd.DataFrame:
    df = _fmt_frame(cost, {"run": "study", "planned": "groups planned", "done": "done", "failed": "failed",
                           "missing": "missing", "trials": "trials", "trial_steps": "trial-steps",
                           "wall_time_s": "wall time (s, summed over groups)", "created": "created",
                           "sparsescale": "sparsescale", "torch": "torch", "python": "python"})
    df["trial-steps"] = [f"{int(v):,}" for v in cost["trial_steps"]]
    df["wall time (s, summed over groups)"] = [f"{v:.1f}" for v in cost["wall_time_s"]]
    return df


def _hardware_tables(part: HardwarePart) -> list[Table]:
    """Time to result (worker-seconds) per series and B on each k, then the fastest B per k."""
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
    return [Table("Predicted time to result on k workers: seconds (worker-seconds)", grid,
                  "–: B is not divisible by k." if gaps else ""),
            Table("Fastest batch size per number of workers k", fastest.reset_index(drop=True))]


def _time_to_result_frame(runs: tuple[Run, ...], part: HardwarePart) -> pd.DataFrame:
    """time_to_result.csv: the prediction points with the study and optimizer of their run."""
    by_label = {r.label: r for r in runs}
    df = part.points.rename(columns={"step_time": "step_time_s", "time": "time_s"}).copy()
    df.insert(0, "study", [by_label[r].name for r in df["run"]])
    df.insert(1, "optimizer", [by_label[r].optimizer for r in df["run"]])
    return df.drop(columns=["run"])


# ---------------------------------------------------------------------------------------------
# summary.csv


def summary_frame(runs: tuple[Run, ...], points: pd.DataFrame, edges: pd.DataFrame, fits: Fits,
                  theory_part: TheoryPart, ratios: pd.DataFrame) -> pd.DataFrame:
    """One row per planned or stored (run, sparsity, batch size): measurement, best
    metaparameters, the fit (regime, fitted steps, S_min, B_crit), the measured step ratio to dense
    and the theory's predicted steps and step ratio."""
    by_label = {r.label: r for r in runs}
    df = points.join(edges).copy()
    df.insert(0, "study", [by_label[r].name for r in df["run"]])
    df.insert(1, "optimizer", [by_label[r].optimizer for r in df["run"]])
    df = df.rename(columns={"steps": "steps_to_result"})
    ft = fits.table.set_index("series")
    fitted = [fits.objects.get(s) for s in df["series"]]
    df["regime"] = [fit.regime(b)[0] if fit else "" for fit, b in zip(fitted, df["batch_size"])]
    df["fit_steps"] = [float(fit.predict(b)) if fit else float("nan")
                       for fit, b in zip(fitted, df["batch_size"])]
    df["fit_s_min"] = [ft.loc[s, "s_min"] if s in ft.index else float("nan") for s in df["series"]]
    df["fit_b_crit"] = [ft.loc[s, "b_crit"] if s in ft.index else float("nan") for s in df["series"]]
    pred = theory_part.curves.set_index(["series", "batch_size"])
    keys = list(zip(df["series"], df["batch_size"].astype(float)))
    df["predicted_steps"] = [pred["steps"].get(k, float("nan")) for k in keys]
    ratio = ratios.set_index(["series", "batch_size"])["ratio"]
    df["ratio_to_dense"] = [ratio.get((s, int(b)), float("nan")) for s, b in keys]
    df.loc[(df["sparsity"] == 0.0) & (df["status"] == "reached"), "ratio_to_dense"] = 1.0
    df["predicted_ratio_to_dense"] = [pred["ratio"].get(k, float("nan")) for k in keys]
    return df.drop(columns=["wall_time"])


# ---------------------------------------------------------------------------------------------
# rendering


def _md_cell(v: str) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(df: pd.DataFrame) -> str:
    if not len(df.columns):
        return ""
    lines = ["| " + " | ".join(map(_md_cell, df.columns)) + " |",
             "|" + "|".join("---" for _ in df.columns) + "|"]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _md_tables(tables: list[Table]) -> list[str]:
    out = []
    for t in tables:
        out += [f"### {t.title}", ""]
        if len(t.frame):
            out += [_md_table(t.frame), ""]
        if t.note:
            out += [t.note, ""]
    return out


def render_markdown(report: Report) -> str:
    """report.md: the same content as the HTML, figures linked from figures/."""
    out = [f"# {report.title}", "", "## Studies", "", _md_table(report.overview.frame), "",
           "## Findings", "", " ".join(report.findings), ""]
    out += ["## Figures", ""]
    for fig in report.figures:
        out += [f"### {fig.title}", "", f"![{fig.title}](figures/{fig.name}.png)", "", fig.caption, ""]
    out += ["## Tables", ""] + _md_tables(report.tables)
    out += [f"## {HARDWARE_HEADING}", ""] + [line for p in report.hardware for line in (p, "")]
    out += _md_tables(report.hardware_tables)
    for head, paragraphs in report.explanations:
        out += [f"## {head}", ""] + [line for p in paragraphs for line in (p, "")]
    out += ["## Theory formulas", ""]
    for what, tex, _ in report.formulas:
        out += [f"{what}:", "", f"$$ {tex} $$", ""]
    out += ["## Study specs", ""]
    for label, toml in report.specs:
        out += [f"### {label}", "", "```toml", toml.strip(), "```", ""]
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1250px;margin:2em auto;
padding:0 1.2em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.8em}h3{font-size:1.05em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0 1em}
th,td{border:1px solid #d4d4d4;padding:.25em .55em;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
figure{margin:1em 0 2em}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.9em;color:#444;max-width:1000px}
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:.85em}
.findings p{margin:.35em 0}.note{font-size:.9em;color:#555}
div.math{margin:.3em 0 .2em}div.math svg{max-width:100%;height:auto}
pre.math{background:none;font-family:"DejaVu Sans Mono",monospace;font-size:.95em;line-height:1.0;margin:.2em 0}
details{margin-bottom:1em}
code.tex{display:block;background:#f6f6f6;padding:.4em .6em;margin:.2em 0 .8em;white-space:pre-wrap}
"""


def _html_table(df: pd.DataFrame) -> str:
    if not len(df.columns):
        return ""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _html_tables(tables: list[Table]) -> list[str]:
    parts = []
    for t in tables:
        parts.append(f"<h3>{html.escape(t.title)}</h3>")
        if len(t.frame):
            parts.append(_html_table(t.frame))
        if t.note:
            parts.append(f'<p class="note">{html.escape(t.note)}</p>')
    return parts


def _formula_html(tex: str, pretty: str, name: str) -> str:
    """The formula as inline SVG (matplotlib mathtext, offline); sympy's Unicode rendering when
    mathtext cannot parse it."""
    try:
        return f'<div class="math">{latex_svg(tex, name)}</div>'
    except ValueError:
        return f'<pre class="math">{html.escape(pretty)}</pre>'


def render_html(report: Report) -> str:
    """report.html: self-contained (inline CSS, figures as base64 PNG data URIs, no scripts)."""
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{e(report.title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(report.title)}</h1>", "<h2>Studies</h2>", _html_table(report.overview.frame),
             '<h2>Findings</h2><div class="findings">',
             *[f"<p>{e(s)}</p>" for s in report.findings], "</div>", "<h2>Figures</h2>"]
    for fig in report.figures:
        data = base64.b64encode(fig.png).decode("ascii")
        parts.append(f'<figure id="{fig.name}"><h3>{e(fig.title)}</h3>'
                     f'<img alt="{e(fig.title)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{e(fig.caption)}</figcaption></figure>")
    parts += ["<h2>Tables</h2>", *_html_tables(report.tables)]
    parts.append(f"<h2>{e(HARDWARE_HEADING)}</h2>"
                 + "".join(f"<p>{e(p)}</p>" for p in report.hardware))
    parts += _html_tables(report.hardware_tables)
    for head, paragraphs in report.explanations:
        parts.append(f"<h2>{e(head)}</h2>" + "".join(f"<p>{e(p)}</p>" for p in paragraphs))
    parts.append("<h2>Theory formulas</h2>")
    for i, (what, tex, pretty) in enumerate(report.formulas):
        parts.append(f"<p>{e(what)}:</p>{_formula_html(tex, pretty, f'formula{i}')}"
                     f"<details><summary>LaTeX</summary><code class=\"tex\">{e(tex)}</code></details>")
    parts.append("<h2>Study specs</h2>")
    for label, toml in report.specs:
        parts.append(f"<h3>{e(label)}</h3><pre>{e(toml.strip())}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
