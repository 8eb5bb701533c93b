"""The report as one section model, rendered to Markdown and HTML by Jinja2 templates.

A :class:`Document` is a title and a tree of :class:`Section` s; a section holds blocks in
order: :class:`Paragraphs` (body text, a table's note, or the findings), :class:`Table` (cells
already formatted as text), :class:`Figure` (PNG bytes), :class:`Formula` (LaTeX and a Unicode
rendering; inline SVG in the HTML), :class:`Code`, and sub-sections. :func:`render` fills
``templates/report.md.j2`` or ``templates/report.html.j2`` with it: the two formats are two
templates of the same model, not two walkers of the report. The HTML is self-contained (inline CSS, figures as base64 data URIs,
no scripts); text is escaped with :func:`html.escape`. Rendering is deterministic: the same
document gives the same bytes.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import ClassVar, Union

import jinja2
import pandas as pd

from experiments.report.figures.mathsvg import latex_svg
from experiments.report.runs import ReportError

TEMPLATES = Path(__file__).resolve().parent / "templates"
FORMATS = {"markdown": "report.md.j2", "html": "report.html.j2"}


@dataclass(frozen=True)
class Paragraphs:
    """Text paragraphs. ``style``: ``""`` body text, ``"note"`` a table's note, ``"findings"``
    the generated findings (one paragraph in Markdown, one sentence per line in HTML)."""

    texts: tuple[str, ...]
    style: str = ""
    kind: ClassVar[str] = "paragraphs"


@dataclass(frozen=True)
class Table:
    """A table whose cells are already formatted as text."""

    frame: pd.DataFrame
    kind: ClassVar[str] = "table"

    @property
    def columns(self) -> list[str]:
        return [str(c) for c in self.frame.columns]

    @property
    def rows(self) -> list[list[str]]:
        return [[str(v) for v in row] for row in self.frame.itertuples(index=False)]


@dataclass(frozen=True)
class Figure:
    """A PNG figure: written to ``figures/<name>.png`` beside the Markdown, embedded in the HTML."""

    name: str
    title: str
    caption: str
    png: bytes
    kind: ClassVar[str] = "figure"

    @property
    def base64(self) -> str:
        return base64.b64encode(self.png).decode("ascii")


@dataclass(frozen=True)
class Formula:
    """A formula: what it is, its LaTeX, and a Unicode rendering that reads without a TeX engine.
    The HTML shows it as inline SVG (:attr:`svg`, whose ids start with ``name``: unique per
    document), or as the Unicode rendering when mathtext cannot parse the LaTeX."""

    what: str
    tex: str
    pretty: str
    name: str = "formula"
    kind: ClassVar[str] = "formula"

    @property
    def svg(self) -> str:
        """The formula as an inline ``<svg>`` (:func:`experiments.report.figures.mathsvg.latex_svg`), or ""."""
        try:
            return latex_svg(self.tex, self.name)
        except ValueError:
            return ""


@dataclass(frozen=True)
class Code:
    """A verbatim block (e.g. a study's TOML spec)."""

    text: str
    language: str = ""
    kind: ClassVar[str] = "code"


@dataclass(frozen=True)
class Section:
    """A heading of ``level`` (2 = a top section) and its blocks in order."""

    title: str
    level: int
    blocks: tuple[Block, ...]
    kind: ClassVar[str] = "section"

    def figures(self) -> list[Figure]:
        """Every figure of this section and its sub-sections, in order."""
        return [f for b in self.blocks for f in (b.figures() if isinstance(b, Section) else
                                                 [b] if isinstance(b, Figure) else [])]


Block = Union[Paragraphs, Table, Figure, Formula, Code, Section]


def table_section(title: str, frame: pd.DataFrame, note: str = "", level: int = 3) -> Section:
    """A sub-section holding a table (when it has rows) and its note (when there is one)."""
    return Section(title, level, (*((Table(frame),) if len(frame) else ()),
                                  *((Paragraphs((note,), "note"),) if note else ())))


@dataclass(frozen=True)
class Document:
    """A report: its title (the level-1 heading) and its top sections."""

    title: str
    sections: tuple[Section, ...]

    def figures(self) -> list[Figure]:
        return [f for s in self.sections for f in s.figures()]


def _md_cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


@cache
def _environment() -> jinja2.Environment:
    # no autoescape: the HTML template escapes each value with html.escape (filter ``esc``), the
    # Markdown template escapes table cells (filter ``md_cell``)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=False,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["esc"] = lambda text: html.escape(str(text))
    env.filters["md_cell"] = _md_cell
    return env


def render(document: Document, fmt: str) -> str:
    """``document`` as ``"markdown"`` or ``"html"`` text."""
    if fmt not in FORMATS:
        raise ReportError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return _environment().get_template(FORMATS[fmt]).render(document=document)
