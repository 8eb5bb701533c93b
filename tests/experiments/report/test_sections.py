"""One section model, two templates: the exact Markdown and HTML of a small document."""

import base64
import html

import pandas as pd
import pytest

from experiments.report.figures.mathsvg import latex_svg
from experiments.report.runs import ReportError
from experiments.report.sections import (
    Code, Document, Figure, Formula, Paragraphs, Section, Table, render,
)

PNG = b"\x89PNG fake"
DOC = Document("T <1>", (
    Section("Studies", 2, (Table(pd.DataFrame({"a|b": ["x", "y\nz"], "c": ["<&>", "'q'"]})),)),
    Section("Findings", 2, (Paragraphs(("One.", "Two."), "findings"),)),
    Section("Figures", 2, (Figure("fig1", "Figure 1. F", "cap & more", PNG),)),
    Section("Tables", 2, (Section("Sub", 3, (Paragraphs(("a note",), "note"),)),)),
    Section("Text", 2, (Paragraphs(("p1", "p2")), Section("Inner", 3, (Code("k = 1", "toml"),)))),
    Section("Formulas", 2, (Formula("What", r"\frac{a}{b}", "a/b"),)),
))


def test_markdown():
    assert render(DOC, "markdown") == (
        "# T <1>\n\n"
        "## Studies\n\n| a\\|b | c |\n|---|---|\n| x | <&> |\n| y z | 'q' |\n\n"
        "## Findings\n\nOne. Two.\n\n"
        "## Figures\n\n### Figure 1. F\n\n![Figure 1. F](figures/fig1.png)\n\ncap & more\n\n"
        "## Tables\n\n### Sub\n\na note\n\n"
        "## Text\n\np1\n\np2\n\n### Inner\n\n```toml\nk = 1\n```\n\n"
        "## Formulas\n\nWhat:\n\n$$ \\frac{a}{b} $$\n")


def test_html():
    data = base64.b64encode(PNG).decode()
    svg = latex_svg(r"\frac{a}{b}", "formula")   # the formula drawn as inline SVG
    out = render(DOC, "html")
    head, body = out.split("</style></head><body>\n")
    assert head.startswith('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
                           "<title>T &lt;1&gt;</title><style>\nbody{")
    assert body == (
        "<h1>T &lt;1&gt;</h1>\n"
        "<h2>Studies</h2>\n<table><thead><tr><th>a|b</th><th>c</th></tr></thead><tbody>"
        "<tr><td>x</td><td>&lt;&amp;&gt;</td></tr><tr><td>y\nz</td><td>&#x27;q&#x27;</td></tr>"
        "</tbody></table>\n"
        '<h2>Findings</h2><div class="findings">\n<p>One.</p>\n<p>Two.</p>\n</div>\n'
        f'<h2>Figures</h2>\n<figure id="fig1"><h3>Figure 1. F</h3><img alt="Figure 1. F" '
        f'src="data:image/png;base64,{data}"><figcaption>cap &amp; more</figcaption></figure>\n'
        '<h2>Tables</h2>\n<h3>Sub</h3>\n<p class="note">a note</p>\n'
        "<h2>Text</h2><p>p1</p><p>p2</p>\n<h3>Inner</h3><pre>k = 1</pre>\n"
        f'<h2>Formulas</h2>\n<p>What:</p><div class="math">{svg}</div><details><summary>LaTeX</summary>'
        '<code class="tex">\\frac{a}{b}</code></details>\n'
        "</body></html>\n")
    # every text is escaped as html.escape does (the report's bytes depend on it)
    assert html.escape("'q'") in out and "<script" not in out


def test_a_formula_mathtext_cannot_draw_falls_back_to_its_unicode_rendering():
    doc = Document("T", (Section("Formulas", 2, (Formula("Bad", r"\notacommand{x}", "x?", "f0"),)),))
    assert ('<p>Bad:</p><pre class="math">x?</pre><details><summary>LaTeX</summary>'
            '<code class="tex">\\notacommand{x}</code></details>') in render(doc, "html")


def test_figures_are_collected_in_order_and_bad_format_is_refused():
    assert [f.name for f in DOC.figures()] == ["fig1"]
    with pytest.raises(ReportError, match="fmt must be one of markdown, html, got 'pdf'"):
        render(DOC, "pdf")
