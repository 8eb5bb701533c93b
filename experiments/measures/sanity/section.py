"""The pruning sanity checks in the report: the comparison table of each sanity series beside
its criterion, the masks' per-layer table and Figure 8, and one sentence per (criterion,
sparsity) saying whether the layer densities alone set the cost of sparsity
(:mod:`experiments.measures.sanity.view` computes them)."""

from __future__ import annotations

import pandas as pd

import pruning

from experiments.measures.sanity.view import (
    DENSITY_PRESERVING, SAME_COST_FACTOR, SanityPart, same_cost,
)
from experiments.measurement import Part
from experiments.report.figures.measurement import png_bytes, style
from experiments.report.formatting import fmt_interval, fmt_num, fmt_pct, with_interval
from experiments.report.sections import Figure, Paragraphs, Section, Table

# The sanity checks as adjectives of "masks" (experiments.spec.series.SANITY).
SANITY_WORDS = {"shuffle": "shuffled", "matched_random": "matched-random",
                "reinit": "reinitialized", "invert": "inverted"}


def sanity_sentences(table: pd.DataFrame) -> list[str]:
    """One sentence per (criterion, sparsity) of the sanity-check table
    (:func:`experiments.measures.sanity.view.sanity_view`): its sanity series' step ratios and B_crit, and
    whether its layer densities alone set the cost of sparsity (:func:`~experiments.measures.sanity.view.same_cost` for every density-preserving series that reached the goal)."""
    out = []
    for (criterion, sparsity), g in table.groupby(["criterion", "sparsity"], sort=False):
        parts = [f"{SANITY_WORDS[r.check]} masks need {fmt_num(r.ratio, 3)}× its steps (B_crit "
                 f"{fmt_num(r.b_crit, 3)})" if r.points else f"{SANITY_WORDS[r.check]} masks "
                 f"share no batch size where both reached the goal"
                 for r in g.itertuples(index=False)]
        kept = g[g["check"].isin(DENSITY_PRESERVING) & (g["points"] > 0)]
        head = (f"Sanity checks at {fmt_pct(sparsity)} sparsity ({criterion}: B_crit "
                f"{fmt_num(g['criterion_b_crit'].iloc[0], 3)}; median over the batch sizes both "
                f"reached): " + ", ".join(parts))
        if not len(kept):
            out.append(head + "; without a density-preserving series that reached the goal, the "
                              "question stays open.")
            continue
        verdict = ("only its layer densities, not its choice of weights, set the cost of sparsity"
                   if all(same_cost(r) for r in kept["ratio"]) else
                   "its choice of weights, not only its layer densities, sets the cost of sparsity")
        out.append(f"{head}: {verdict} (tolerance {SAME_COST_FACTOR:g}×).")
    return out


def sanity_table(table: pd.DataFrame) -> pd.DataFrame:
    """Each sanity series beside its criterion (:func:`experiments.measures.sanity.view.sanity_view`): steps
    ratios to the criterion and to dense, and both fitted B_crit."""
    return pd.DataFrame({
        "series": table["series"], "criterion": table["criterion"],
        "batch sizes compared": [str(v) for v in table["points"]],
        "steps / criterion (median [min, max])": [
            f"{fmt_num(m, 3)} {fmt_interval(lo, hi)}" if p else "–"
            for m, lo, hi, p in zip(table["ratio"], table["ratio_min"], table["ratio_max"],
                                    table["points"])],
        "steps / dense (median)": [fmt_num(v, 3) for v in table["ratio_to_dense"]],
        "criterion steps / dense": [fmt_num(v, 3) for v in table["criterion_ratio_to_dense"]],
        "B_crit [interval]": [with_interval(*v) for v in zip(
            table["b_crit"], table["b_crit_lo"], table["b_crit_hi"])],
        "criterion B_crit [interval]": [with_interval(*v) for v in zip(
            table["criterion_b_crit"], table["criterion_b_crit_lo"], table["criterion_b_crit_hi"])],
    })


def densities_table(densities: pd.DataFrame) -> pd.DataFrame:
    """The masks' per-layer density and layer-collapse counts
    (:func:`experiments.measures.sanity.view.density_frame`)."""
    return pd.DataFrame({
        "series": densities["series"], "layer": densities["layer"],
        "kept / total": [f"{k} / {t}" for k, t in zip(densities["kept"], densities["total"])],
        "density": [fmt_num(v, 3) for v in densities["density"]],
        "dead units": [fmt_num(v) for v in densities["dead"]],
        "kept weights on an input-output path": [fmt_num(v) for v in densities["on_path"]],
        "every output reached": [fmt_num(v) for v in densities["connected"]],
    })


def layer_density_figure(densities: pd.DataFrame):
    """``pruning.density_figure`` of the masks' per-layer densities
    (:func:`experiments.measures.sanity.view.density_frame`), in the report's style."""
    with style():
        return pruning.density_figure(densities, title="Per-layer density of the masks")


NOTES = {
    "table": ("Sanity checks: each series beside its criterion",
              "Shuffled, matched-random and reinitialized masks keep the criterion's layer "
              "densities (Frankle et al. 2021; Su et al. 2020); inverted masks keep what it ranks "
              "lowest."),
    "densities": ("Masks: per-layer density and layer collapse",
                  "Lowest seed. Dead units: no kept incoming or no kept outgoing weight; paths are "
                  "traced for chains of Linear / Conv layers only (pruning.diagnose)."),
}


def sanity_part(sanity: SanityPart) -> Part:
    """The report's part for the sanity checks: its two tables (where they have rows), Figure 8
    (where the runs recorded their masks) and its sentences."""
    shown = {"table": sanity_table, "densities": densities_table}
    tables = tuple(Section(title, 3, (Table(shown[part](getattr(sanity, part))),
                                      Paragraphs((note,), "note")))
                   for part, (title, note) in NOTES.items() if len(getattr(sanity, part)))
    figures = (Figure(
        "fig8_layer_density", "Figure 8. Per-layer density of the masks",
        "Kept / total weights of every masked layer (log axis; lowest seed), one bar per "
        "series; \"0\": a layer with nothing kept. Shuffled and matched-random masks have "
        "their criterion's densities by construction.",
        png_bytes(layer_density_figure(sanity.densities))),) if len(sanity.densities) else ()
    return Part(figures=figures, tables=tables, sentences=tuple(sanity_sentences(sanity.table)))
