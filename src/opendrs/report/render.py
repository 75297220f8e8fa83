"""Reports as one self-contained HTML file or as Markdown, through Jinja2 templates.

A report is a :class:`Document`: the name of its templates (``templates/NAME.html.j2`` and
``templates/NAME.md.j2``, package data), its figures as plain data, and a function that draws its
charts — called for HTML only, so Markdown never pays for matplotlib. The HTML page holds its
styles and its charts (inline SVG); it has no script and no reference to anything outside itself
(no URL at all: matplotlib's SVG metadata, which names its website, is left out), so it opens
anywhere, offline. The same document gives the same bytes: nothing here reads the clock.

HTML is autoescaped; in Markdown every value written is made safe for a table cell (``|``, line
breaks) and for a Markdown viewer (``<``, ``>`` and ``&`` as entities, so a name is never markup).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from opendrs import __version__
from opendrs.json_data import iso_time
from opendrs.model.units import format_bytes, format_duration
from opendrs.report import FORMATS

if TYPE_CHECKING:
    from jinja2 import Environment

__all__ = ["FORMATS", "Document", "inline_svg", "render"]

_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)
_XMLNS = re.compile(r'\s+xmlns(?::\w+)?="[^"]*"')


@dataclass(frozen=True)
class Document:
    """One report: its templates' name, its title, its figures, and its charts (HTML only)."""

    template: str
    title: str
    data: Mapping[str, Any]
    charts: Callable[[], Mapping[str, str]] = field(default=lambda: {})


def inline_svg(svg: str) -> Markup:
    """An ``<svg>`` element for an HTML page: without matplotlib's metadata block and the XML
    namespace declarations, which HTML does not need and which name URLs."""
    return Markup(_XMLNS.sub("", _METADATA.sub("", svg)))


def render(document: Document, fmt: str) -> str:
    """``document`` as ``html`` or ``md`` text."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}")
    environment = _environment(html=fmt == "html")
    charts: Mapping[str, Markup] = {}
    if fmt == "html":
        charts = {name: inline_svg(svg) for name, svg in document.charts().items()}
    template = environment.get_template(f"{document.template}.{fmt}.j2")
    text = template.render(
        title=document.title, data=document.data, charts=charts, version=__version__
    )
    return text.rstrip("\n") + "\n"


# -- filters -----------------------------------------------------------------------------------


def _pct(value: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: ``0.123`` → ``12.3 %``."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value * 100:.{digits}f} %"


def _pp(value: float | None, digits: int = 1) -> str:
    """A difference of fractions in percentage points: ``0.05`` → ``5.0 pp``."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value * 100:.{digits}f} pp"


def _number(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}g}"


def _when(at: float | None) -> str:
    return "–" if at is None else iso_time(at) or "–"


def _duration(seconds: float | None) -> str:
    return "–" if seconds is None else format_duration(seconds)


_FILTERS: dict[str, Callable[..., str]] = {
    "pct": _pct,
    "pp": _pp,
    "num": _number,
    "bytes": format_bytes,
    "when": _when,
    "duration": _duration,
}


def _md_text(value: object) -> object:
    """Every value a Markdown template writes: safe in a table cell and never markup."""
    if value is None:
        return ""
    text = str(value)
    for raw, safe in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|")):
        text = text.replace(raw, safe)
    return " ".join(text.splitlines())


@cache
def _environment(*, html: bool) -> Environment:
    """The Jinja2 environment of HTML or Markdown reports, built at the first report."""
    # imported here: Jinja2 is large, and only a command that writes a report needs it
    from jinja2 import Environment, PackageLoader, StrictUndefined

    environment = Environment(
        loader=PackageLoader("opendrs.report", "templates"),
        autoescape=html,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=None if html else _md_text,
    )
    environment.filters.update(_FILTERS)
    return environment
