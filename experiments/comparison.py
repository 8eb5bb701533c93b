"""Which optimizer extends perfect scaling further: the sentence of a multi-optimizer report.

Perfect scaling (steps halve when the batch doubles) lasts up to about B_crit / 4 on the fitted
curve S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018), so at one sparsity level the
optimizer with the larger fitted B_crit extends it further (Shallue et al. 2019 found momentum
extends it beyond plain SGD; Zhang et al. 2019's noisy quadratic model predicts that Adam-like
preconditioning extends it beyond momentum). The answer is only as firm as the fits: the
bootstrap intervals of the two B_crit must not overlap, and a B_crit the measured batch sizes only
bound (the fit's note) decides nothing.
"""

from __future__ import annotations

import pandas as pd

from .findings import FIT_LEVEL, Run, fmt_interval, fmt_num, series_label, sparsity_label


def optimizer_sentences(runs: tuple[Run, ...], fits: pd.DataFrame) -> list[str]:
    """One sentence per sparsity level that runs with two or more optimizers fitted: every
    optimizer's B_crit with its interval (largest first) and the verdict, "extends perfect
    scaling further" when the leader's interval lies above every other's, else unresolved.
    ``fits``: :func:`experiments.findings.fit_series`'s table indexed by series."""
    if len({r.optimizer for r in runs}) < 2:
        return []
    levels = sorted({float(s) for r in runs for s in r.spec.get("sparsities", [])})
    out = []
    for sparsity in levels:
        rows = []
        for r in runs:
            series = series_label(r, sparsity, True)
            if series in fits.index and not pd.isna(fits.loc[series, "b_crit"]):
                rows.append((r.label, fits.loc[series]))
        if len({label for label, _ in rows}) < 2:
            continue
        rows.sort(key=lambda item: -item[1]["b_crit"])
        values = "; ".join(f"{label} {fmt_num(f['b_crit'], 3)} {fmt_interval(f['b_crit_lo'], f['b_crit_hi'])}"
                           + (" (a bound: at the edge of the measured batch sizes)" if f["note"] else "")
                           for label, f in rows)
        (lead, best), others = rows[0], rows[1:]
        if any(f["note"] for _, f in rows):
            verdict = "not resolved: a critical batch at the edge of the measured batch sizes is only a bound"
        elif all(best["b_crit_lo"] > f["b_crit_hi"] for _, f in others):
            verdict = f"{lead} extends perfect scaling further (the intervals do not overlap)"
        else:
            verdict = (f"not resolved: {lead} has the largest B_crit but the intervals overlap, "
                       "so these measurements do not separate the optimizers")
        out.append(f"Which optimizer extends perfect scaling further, {sparsity_label(sparsity)}: "
                   f"{verdict}. Fitted B_crit ({int(FIT_LEVEL * 100)} % intervals): {values}.")
    return out
