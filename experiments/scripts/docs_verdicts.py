"""The docs' stored verdicts: each study's verdicts.csv from its store, and the docs' verdict
tables generated from them.

    python -m experiments.scripts.docs_verdicts runs/lee_lipschitz_fashion_mnist [RUN_DIR ...] \\
        [--assets docs/assets/reproductions] [--page docs/reproductions.md]

A RUN_DIR may join several folders with commas, reported together as the study reported them
(a study and its bias controls:
``runs/lee_decisive_fashion_mnist,runs/lee_decisive_fashion_mnist/no_bias``; the study is the
first folder's). For each run folder: its verdicts, computed from the store as its report computes them
(:func:`experiments.report.write.build`), go to ``ASSETS/<study>/verdicts.csv`` with a
``source`` column naming the folder. Then every table block of ``--page`` between
``<!-- verdicts-table STUDY -->`` and ``<!-- /verdicts-table -->`` is written again from
``ASSETS/STUDY/verdicts.csv`` (:func:`render_table`), so the page's verdict tables are the
stored verdicts. ``tests/docs/test_verdict_words.py`` checks the pages against the same files.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pandas as pd

from experiments.report.formatting import fmt_interval, fmt_num, sparsity_label

ASSETS = Path("docs/assets/reproductions")
TABLE = re.compile(r"(<!-- verdicts-table (?P<study>\S+) -->\n)(?P<body>.*?)(<!-- /verdicts-table -->)",
                   re.S)
HEADER = ("| level | claim | tier | value [90 %] | allowed | verdict | statistic |\n"
          "|---|---|---|---|---|---|---|\n")


def stored(assets: Path, study: str) -> pd.DataFrame:
    """``assets/<study>/verdicts.csv``."""
    return pd.read_csv(assets / study / "verdicts.csv", keep_default_na=False,
                       na_values=[""], dtype={"statistic": str, "reason": str})


def render_table(frame: pd.DataFrame) -> str:
    """The verdict table a page shows for one study's stored verdicts (one row per level,
    claim and tier, in the file's order)."""
    rows = []
    for r in frame.itertuples(index=False):
        allowed = (fmt_interval(r.allowed_low, r.allowed_high)
                   if math.isfinite(float(r.allowed_low)) else "–")
        interval = fmt_interval(r.low, r.high) if math.isfinite(float(r.low)) else "(no interval)"
        rows.append(f"| {sparsity_label(r.sparsity)} | `{r.claim}` | {r.tier} | "
                    f"{fmt_num(r.value, 3)} {interval} | {allowed} | {r.verdict} | "
                    f"{r.statistic if isinstance(r.statistic, str) else ''} |\n")
    return HEADER + "".join(rows)


def write_tables(page: Path, assets: Path) -> int:
    """Write every verdict table block of ``page`` from its stored verdicts; the number written."""
    text = page.read_text(encoding="utf-8")
    count = 0

    def fill(m: re.Match) -> str:
        nonlocal count
        count += 1
        return m.group(1) + render_table(stored(assets, m.group("study"))) + m.group(4)

    page.write_text(TABLE.sub(fill, text), encoding="utf-8")
    return count


def write_verdicts(run_dir: Path | list[Path], assets: Path) -> Path:
    """The run folder's verdicts (or those of several folders reported together, the first
    naming the study), as its report computes them, into ``assets/<study>/verdicts.csv``; the
    file's path."""
    from experiments.report.runs import load_runs
    from experiments.report.write import CSV_FORMAT, build

    dirs = [run_dir] if isinstance(run_dir, Path) else list(run_dir)
    runs = load_runs(dirs)
    names = ", ".join(f"{d.name}/" for d in dirs)
    frame = build(runs).tables["verdicts"].assign(source=f"generated from the store in {names} "
                                               "by experiments/scripts/docs_verdicts.py")
    path = assets / runs.runs[0].name / "verdicts.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(frame.to_csv(**CSV_FORMAT), encoding="utf-8")
    return path


def main(argv: list[str]) -> int:
    """``RUN_DIR ... [--assets DIR] [--page FILE ...]`` (module docstring)."""
    assets, pages, run_dirs = ASSETS, [], []
    args = iter(argv)
    for arg in args:
        if arg == "--assets":
            assets = Path(next(args))
        elif arg == "--page":
            pages.append(Path(next(args)))
        else:
            run_dirs.append([Path(d) for d in arg.split(",")])
    for run_dir in run_dirs:
        print(write_verdicts(run_dir, assets))
    for page in pages:
        print(f"{page}: {write_tables(page, assets)} verdict table(s) written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
