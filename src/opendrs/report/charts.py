"""Charts as inline SVG, drawn by matplotlib, for the HTML reports and the dashboard.

Each function returns one ``<svg>`` element as text, ready to be placed in a page: no XML
declaration, no external fonts or images, text kept as text. The output is deterministic (the
same data gives the same bytes): matplotlib's SVG ids are salted with a constant and the date
is left out. matplotlib is imported on first use, so commands that draw nothing do not pay for it;
the object-oriented API (``Figure``) is used, never ``pyplot``, so drawing holds no global state
and is safe from the dashboard's request threads; saving as SVG, which reads matplotlib's global
settings, is done by one thread at a time.
"""

from __future__ import annotations

import io
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Line", "Spans", "bar_chart", "line_chart"]

# The text stays text (svg.fonttype none): the reader's fonts draw what the charts' font lacks
# (a CJK name), so matplotlib's warning about its missing glyphs is none of theirs. Installed
# once, here: a filter set around each drawing (catch_warnings) would be undone by another
# thread's drawing ending meanwhile.
warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")

#: Held while a figure is saved: the settings it is saved with are matplotlib's global ones.
_SAVING = threading.Lock()

#: Colours for series in order (matplotlib's default cycle, colour-blind friendly enough).
_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


#: The most category names a bar chart prints under its bars.
_MAX_TICK_LABELS = 40


@dataclass(frozen=True, slots=True)
class Line:
    """A horizontal reference line (a threshold, a limit) drawn dashed across a chart."""

    value: float
    label: str


@dataclass(frozen=True, slots=True)
class Spans:
    """Ranges of x (from, to) shaded behind a chart (a policy's migration windows), named once
    in the legend."""

    ranges: tuple[tuple[float, float], ...]
    label: str


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    lines: Sequence[Line] = (),
    steps: bool = False,
    size: tuple[float, float] = (8.0, 3.0),
    shaded: Spans | None = None,
) -> str:
    """One line per series of (x, y) points; ``steps`` draws them as a step function;
    ``shaded``: ranges of x shaded behind them."""
    figure, axes = _figure(size)
    if shaded is not None:
        for index, (start, end) in enumerate(shaded.ranges):
            label = shaded.label if index == 0 else None
            axes.axvspan(start, end, color="#2ca02c", alpha=0.12, linewidth=0, label=label)
    for index, (name, points) in enumerate(series.items()):
        xs = [x for x, _ in points]
        ys = [y for _, y in points]
        colour = _PALETTE[index % len(_PALETTE)]
        if steps:
            axes.step(xs, ys, where="post", label=name, color=colour, linewidth=1.4)
        else:
            axes.plot(xs, ys, label=name, color=colour, linewidth=1.4)
    _reference_lines(axes, lines)
    legend = len(series) > 1 or bool(lines) or shaded is not None
    _finish(axes, title=title, xlabel=xlabel, ylabel=ylabel, legend=legend)
    return _svg(figure)


def bar_chart(
    categories: Sequence[str],
    groups: Mapping[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    lines: Sequence[Line] = (),
    size: tuple[float, float] | None = None,
) -> str:
    """Grouped bars: one bar per group (e.g. "before", "after") for each category (a node)."""
    count = max(1, len(groups))
    width = 0.8 / count
    if size is None:
        size = (min(14.0, max(6.0, 0.45 * len(categories) * count)), 3.2)
    figure, axes = _figure(size)
    positions = range(len(categories))
    for index, (name, values) in enumerate(groups.items()):
        if len(values) != len(categories):
            raise ValueError(f"bar group {name!r}: {len(values)} values for {len(categories)}")
        offset = (index - (count - 1) / 2) * width
        axes.bar(
            [p + offset for p in positions],
            values,
            width=width,
            label=name,
            color=_PALETTE[index % len(_PALETTE)],
        )
    # At most _MAX_TICK_LABELS names under the bars: every k-th category's beyond that (the
    # chart widens only up to its cap, so more names would print over one another).
    every = -(-len(categories) // _MAX_TICK_LABELS)
    ticks = list(positions)[::every]
    axes.set_xticks(ticks, [categories[i] for i in ticks], rotation=45 if len(ticks) > 8 else 0)
    if len(ticks) > 8:
        for label in axes.get_xticklabels():
            label.set_horizontalalignment("right")
    _reference_lines(axes, lines)
    # Counts and loads: the axis starts at 0 (nothing to show is 0 to 1, not an axis around 0).
    highest = max((v for values in groups.values() for v in values), default=0.0)
    if min((v for values in groups.values() for v in values), default=0.0) >= 0:
        axes.set_ylim(bottom=0.0, top=None if highest > 0 else 1.0)
    _finish(axes, title=title, xlabel="", ylabel=ylabel, legend=count > 1 or bool(lines))
    return _svg(figure)


def _figure(size: tuple[float, float]) -> tuple[object, object]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=96, layout="constrained")
    return figure, figure.subplots()


def _reference_lines(axes: object, lines: Sequence[Line]) -> None:
    for line in lines:
        axes.axhline(line.value, color="#555555", linestyle="--", linewidth=1.0, label=line.label)


def _finish(axes: object, *, title: str, xlabel: str, ylabel: str, legend: bool) -> None:
    axes.set_title(title, fontsize=11)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, axis="y", color="#dddddd", linewidth=0.6)
    axes.set_axisbelow(True)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    if legend:
        axes.legend(fontsize=8, frameon=False, loc="best")


def _svg(figure: object) -> str:
    import matplotlib

    buffer = io.StringIO()
    with (
        _SAVING,
        matplotlib.rc_context({"svg.hashsalt": "opendrs", "svg.fonttype": "none"}),
    ):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]
