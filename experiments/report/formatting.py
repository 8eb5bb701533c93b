"""Fixed, locale-free formatting of the report's numbers and labels.

The tables, the prose and the files all format through these functions, so the same store always
gives the same bytes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from training.data.text import BYTE_LEVEL, bits_per_byte

from experiments.spec.external import ExternalSpec
from experiments.spec.study import Spec
from experiments.spec.tables.budget import Budget


def fmt_num(x, digits: int = 4) -> str:
    """Integers as integers, other numbers to ``digits`` significant digits (no exponent below
    1e15 once they reach 10**digits), booleans as yes / no, missing values as an en dash."""
    if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA:
        return "–"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)) or (float(x).is_integer() and abs(x) < 1e15):
        return f"{int(x)}"
    if 10**digits <= abs(x) < 1e15:
        return f"{x:.0f}"       # 1788 rather than 1.79e+03
    return f"{float(x):.{digits}g}"


def fmt_pct(fraction: float) -> str:
    """0.9 -> '90 %'."""
    return f"{100 * fraction:g} %"


def fmt_interval(lo: float, hi: float) -> str:
    """'[lo, hi]' to three significant digits."""
    return f"[{fmt_num(lo, 3)}, {fmt_num(hi, 3)}]"


# the ratio of neighbouring values on the branching grid (k B, k = 1, 2, 4, ...:
# theory.estimators.branching.branch_factors)
DOUBLINGS = 2.0
GRID_NAMES = {2.0: "doublings"}


def grid_interval(value: float, low: float, high: float, ratio: float = DOUBLINGS,
                  open_above: bool = False, digits: int = 3) -> str:
    """A value measured on a geometric grid of batch sizes (neighbours ``ratio`` apart) with
    its interval, stating the grid's resolution: the grid cannot tell a point from anything
    between the geometric midpoints to its neighbours, v / sqrt(r) and v sqrt(r), so the
    interval is widened to those edges ('256 (grid of doublings: between 181 and 362)' when
    every resample landed on 256; '256 [128, 256] (grid of doublings: between 90.5 and 362)'
    otherwise). 0 (below the grid's first point) has no lower edge; ``open_above``: the value
    is the grid's last point that passed (a lower bound), so there is no upper edge."""
    if value is None or pd.isna(value):
        return "–"
    if high == 0:
        return f"{fmt_num(value, 4)} (below the grid's first batch size)"
    half = math.sqrt(ratio)
    name = GRID_NAMES.get(ratio, f"x{fmt_num(ratio, 3)} steps")
    lo_edge = low / half if low > 0 else 0.0
    edges = (f"{fmt_num(lo_edge, digits)} or more" if open_above else
             f"between {fmt_num(lo_edge, digits)} and {fmt_num(high * half, digits)}")
    point = fmt_num(value, 4) if low == high == value else \
        f"{fmt_num(value, 4)} {fmt_interval(low, high)}"
    return f"{'≥ ' if open_above else ''}{point} (grid of {name}: {edges})"


def sparsity_label(sparsity: float) -> str:
    """'dense' or '90 % sparse'."""
    return "dense" if sparsity == 0 else f"{fmt_pct(sparsity)} sparse"


def series_label(run: str, sparsity: float, combined: bool) -> str:
    """The label of one curve: the sparsity level, prefixed by its run's label when several
    runs share the report."""
    return f"{run}, {sparsity_label(sparsity)}" if combined else sparsity_label(sparsity)


def goal_text(spec: Spec | ExternalSpec) -> str:
    """'validation error < 0.3' (``<=`` for a non-strict goal, Lee et al. 2021); an imported
    workload's metric is a column name that says its split ('val/classification_error < 0.1');
    a byte-level language model's loss goal also in bits per byte ('validation loss < 1.5
    (2.164 bits per byte)')."""
    metric = spec.metric if "/" in spec.metric else f"validation {spec.metric}"
    text = f"{metric} {'<' if spec.strict else '<='} {spec.target:g}"
    if spec.metric == "loss" and spec.dataset in BYTE_LEVEL:
        # a byte-level language model's loss is nats per byte: also say it in bits per byte
        text += f" ({fmt_num(bits_per_byte(spec.target), 4)} bits per byte)"
    return text


def eval_text(spec: Spec | ExternalSpec) -> str:
    """How steps-to-result was evaluated: '[eval] exact every 20', or for an imported workload
    that its source's own measurement was kept ('as published (batch_science)')."""
    if isinstance(spec, ExternalSpec):
        return f"as published ({spec.source.get('format', 'import')})"
    return f"[eval] {spec.eval.kind} every {spec.eval.every}"


def budget_text(budget: Budget | str) -> str:
    """The step budget: 'N', 'E examples / B, in [min, max]', or an imported workload's own
    description (its batch sizes had different budgets)."""
    if isinstance(budget, str):
        return budget
    if budget.max_steps is not None:
        return str(budget.max_steps)
    return f"{budget.examples} examples / B, in [{budget.min}, {budget.max}]"


def with_interval(value: float, lo: float, hi: float, digits: int = 4) -> str:
    """``value [lo, hi]`` (:func:`fmt_interval`), or "–" for a missing value."""
    return "–" if pd.isna(value) else f"{fmt_num(value, digits)} {fmt_interval(lo, hi)}"
