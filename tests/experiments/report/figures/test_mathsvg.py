"""Formulas rendered offline as inline SVG (matplotlib mathtext), checked in the report's HTML and,
where Chromium is installed, drawn by a real browser."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import experiments
from experiments.report.figures.mathsvg import latex_svg, to_mathtext
from experiments.report.write import write_report
from experiments.report.theory_view import formulas

FORMULAS = formulas(["momentum"])   # (what, LaTeX, Unicode) of every formula the report shows


def test_cases_become_stacked_rows_behind_a_brace():
    tex = r"\begin{cases} \frac{a}{b} & \text{for}\: B \leq 2 \\\frac{1}{L} & \text{otherwise} \end{cases}"
    assert to_mathtext(tex) == (r"\left\{\genfrac{}{}{0}{0}{\dfrac{a}{b}\quad \text{for}\: B \leq 2}"
                                r"{\dfrac{1}{L}\quad \text{otherwise}}\right.")
    three = to_mathtext(r"\begin{cases} a & x \\ b & y \\ c & z \end{cases}")
    assert three.count(r"\genfrac") == 2 and "begin" not in three


def test_svg_is_self_contained_deterministic_and_its_ids_are_prefixed():
    tex = FORMULAS[2][1]
    svg = latex_svg(tex, "f2")
    assert svg == latex_svg(tex, "f2") and svg.startswith("<svg ") and svg.rstrip().endswith("</svg>")
    assert "<?xml" not in svg and "<metadata" not in svg and "<text" not in svg   # glyphs as paths
    ids = re.findall(r'\bid="([^"]+)"', svg)
    refs = re.findall(r'href="#([^"]+)"', svg)
    assert ids and refs and all(i.startswith("f2-") for i in ids) and set(refs) <= set(ids)
    assert f'aria-label="{html.escape(tex, quote=True)}"' in svg


def test_mathtext_failure_is_a_value_error():
    with pytest.raises(ValueError):
        latex_svg(r"\notacommand{x}", "bad")


@pytest.fixture
def report_html(tiny_toml, tmp_path):
    run = experiments.run_study(tiny_toml, out=tmp_path / "tiny", executor=ThreadPoolExecutor(1),
                                quiet=True, report=False)
    return write_report([run]).read_text()


def test_report_html_shows_every_formula_as_svg_with_its_latex(report_html):
    section = report_html[report_html.index("<h2>Theory formulas</h2>"):]
    blocks = re.findall(r'<div class="math">(<svg .*?</svg>)\s*</div><details><summary>LaTeX</summary>'
                        r'<code class="tex">(.*?)</code></details>', section, re.S)
    assert [html.unescape(tex) for _, tex in blocks] == [tex for _, tex, _ in FORMULAS]
    assert [svg for svg, _ in blocks] == [latex_svg(tex, f"formula{i}") for i, (_, tex, _) in enumerate(FORMULAS)]
    assert '<pre class="math">' not in report_html   # no formula fell back to text


ROW = 170   # px per formula in the browser page


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed")
def test_chromium_draws_every_formula(tmp_path):
    from PIL import Image

    svgs = [latex_svg(tex, f"f{i}") for i, (_, tex, _) in enumerate(FORMULAS)]
    # control: the same drawing with its glyph references broken must draw (almost) nothing
    svgs.append(svgs[0].replace('href="#f0-', 'href="#gone-'))
    rows = "".join(f'<div style="position:absolute;left:10px;top:{i * ROW + 10}px">{s}</div>'
                   for i, s in enumerate(svgs))
    page = tmp_path / "page.html"
    page.write_text(f'<!DOCTYPE html><html><body style="margin:0;background:#fff">{rows}</body></html>')
    png = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--no-first-run", "--disable-component-update",
                    "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
                    f"--window-size=800,{ROW * len(svgs)}", f"--screenshot={png}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    ink = np.asarray(Image.open(png).convert("L")) < 128
    per_row = [int(ink[i * ROW:(i + 1) * ROW].sum()) for i in range(len(svgs))]
    assert all(n > 150 for n in per_row[:-1]), per_row
    assert per_row[-1] < 0.2 * per_row[0], per_row   # only the fraction bars of the control
