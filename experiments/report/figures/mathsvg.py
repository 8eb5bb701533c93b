"""LaTeX formulas as inline SVG, rendered offline by matplotlib's mathtext (no TeX engine).

``latex_svg(tex, name)`` returns an ``<svg>`` element ready to paste into an HTML page: glyphs are
drawn as paths (``svg.fonttype = "path"``), so the page needs no fonts; every ``id`` is prefixed
with ``name`` so several formulas can sit in one document; the output carries no date or
software metadata, so the same formula always gives the same bytes, and no namespace URLs (the
HTML parser supplies the SVG namespace), so a page holding it still holds no address.

mathtext covers the LaTeX that sympy prints for ``theory.models.bounds`` except ``cases``, which is
rewritten into a stack of rows behind a sized left brace (``\\left\\{ \\genfrac{}{}{0}{0}{..}{..}
\\right.``). Fractions are set in display style, as in a displayed LaTeX equation.
"""

from __future__ import annotations

import html
import io
import re

import matplotlib
from matplotlib.figure import Figure

FONT_SIZE = 15
_CASES = re.compile(r"\\begin\{cases\}(.*?)\\end\{cases\}", re.S)
_ID = re.compile(r'(\bid="|href="#|url\(#)([^")]+)')


def _stack(rows: list[str]) -> str:
    """Rows stacked top to bottom (``\\genfrac`` with no rule stacks two; nest for more)."""
    if len(rows) == 1:
        return rows[0]
    return r"\genfrac{}{}{0}{0}{" + rows[0] + "}{" + _stack(rows[1:]) + "}"


def _cases(match: re.Match) -> str:
    rows = []
    for row in re.split(r"\\\\", match.group(1)):
        value, _, condition = row.partition("&")
        rows.append(r"\quad ".join(p.strip() for p in (value, condition) if p.strip()))
    return r"\left\{" + _stack([r for r in rows if r]) + r"\right."


def to_mathtext(tex: str) -> str:
    """``tex`` rewritten into the subset mathtext parses (``cases`` -> stacked rows), with
    display-style fractions (``\\dfrac``) as in a displayed LaTeX equation."""
    return _CASES.sub(_cases, tex).replace(r"\frac", r"\dfrac")


def latex_svg(tex: str, name: str) -> str:
    """The formula ``tex`` (LaTeX math, no dollar signs) as an inline ``<svg>`` element whose ids
    start with ``name``. Raises ``ValueError`` when mathtext cannot parse it."""
    fig = Figure()
    fig.text(0, 0, f"${to_mathtext(tex)}$", fontsize=FONT_SIZE)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "sparsescale"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", pad_inches=0.03, transparent=True,
                    metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):].strip()   # no XML declaration or DOCTYPE inside HTML
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = _ID.sub(lambda m: f"{m.group(1)}{name}-{m.group(2)}", svg)
    # inside HTML the parser puts <svg> in its namespace and SVG 2 takes a plain href: without
    # the namespace URLs the page holds no address at all
    svg = re.sub(r' xmlns(:xlink)?="[^"]*"', "", svg).replace("xlink:href=", "href=")
    return svg.replace("<svg ", f'<svg role="img" aria-label="{html.escape(tex, quote=True)}" ', 1)

