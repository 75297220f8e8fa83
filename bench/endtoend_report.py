"""The end-to-end benchmark's table (:mod:`bench.endtoend`) and its targets, as Markdown."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.endtoend import (
    OPENDRS,
    SOLVER_CLI_TIME_LIMIT,
    TARGET_GUESTS,
    TARGET_RSS,
    TARGET_WALL,
    Result,
    Row,
)
from bench.report import _padded, ratio

MiB = 1024**2
HEADER = (
    "input",
    "runner",
    "wall s",
    "CPU s",
    "peak RSS MiB",
    "mem spread pp",
    "CPU spread pp",
    "migrations",
    "migr./LB",
    "violations",
    "wall/solver",
    "wall/greedy",
)


def _wall(row: Row | None) -> float | None:
    if row is None or row.error is not None or row.measured is None:
        return None
    return row.measured.wall


def cells(result: Result, row: Row) -> list[str]:
    """One row of the table."""
    m, ev = row.measured, row.evaluation
    wall = _wall(row)
    figures = ["—"] * 5
    if ev is not None:
        lb = ratio(ev.migrations, ev.lb_migrations) if ev.lb_migrations is not None else "—"
        figures = [
            f"{ev.after.memory_spread * 100:.1f}",
            f"{ev.after.cpu_spread * 100:.1f}",
            f"{ev.migrations:,}",
            lb,
            str(len(ev.violations)),
        ]
    return [
        result.input.label,
        row.runner if row.error is None else f"{row.runner}: {row.error}",
        "—" if m is None else f"{m.wall:.1f}",
        "—" if m is None else f"{m.cpu:.1f}",
        "—" if m is None or m.rss_peak is None else f"{m.rss_peak / MiB:,.0f}",
        *figures,
        ratio(wall, _wall(result.row("proxlb-solver"))),
        ratio(wall, _wall(result.row("proxlb-greedy"))),
    ]


def _before(result: Result) -> list[str]:
    before = result.before
    spreads = ["—", "—"]
    if before is not None:
        spreads = [f"{before.memory_spread * 100:.1f}", f"{before.cpu_spread * 100:.1f}"]
    label = f"{result.input.label} ({result.input.guests:,} guests, {result.megabytes:.3g} MB)"
    return [label, "(before)", "", "", "", *spreads, "", "", "", "", ""]


def target_lines(results: Sequence[Result]) -> list[str]:
    """``opendrs plan``'s rows at :data:`TARGET_GUESTS` guests against the targets."""
    lines = []
    for result in results:
        row = result.row(OPENDRS)
        if result.input.guests < TARGET_GUESTS or row is None or row.measured is None:
            continue
        m = row.measured
        wall_ok = row.error is None and m.wall <= TARGET_WALL
        rss_ok = m.rss_peak is not None and m.rss_peak <= TARGET_RSS
        rss = "—" if m.rss_peak is None else f"{m.rss_peak / MiB:,.0f}"
        lines.append(
            f"- {result.input.label}: wall {m.wall:.1f} s (≤ {TARGET_WALL:g} s) "
            f"**{'met' if wall_ok else 'not met'}**; peak RSS {rss} MiB "
            f"(≤ {TARGET_RSS / MiB:,.0f}) **{'met' if rss_ok else 'not met'}**"
            + ("" if row.error is None else f" ({row.error})")
        )
    return lines or [f"- targets at {TARGET_GUESTS:,} guests: no such input in this run"]


def note_lines(results: Sequence[Result]) -> list[str]:
    """Each run's notes (stop reason, solver status) and the peers not run."""
    lines = []
    for result in results:
        for row in result.rows:
            if row.notes:
                lines.append(f"- {result.input.label}, {row.runner}: {'; '.join(row.notes)}")
        if result.skipped:
            lines.append(f"- {result.input.label}, not run: {'; '.join(result.skipped)}")
    return lines


def section(results: Sequence[Result]) -> str:
    """The end-to-end runs as a Markdown section."""
    body = []
    for result in results:
        body.append(_before(result))
        body.extend(cells(result, row) for row in result.rows)
    lines = [
        "### End to end: `opendrs plan FILE` beside proxlb-solver and ProxLB",
        "",
        "Each run a fresh process, from its start to its exit, on the same file: wall and CPU "
        "seconds, peak RSS (`VmHWM`), the placement it leaves measured by opendrs on the "
        "cluster read from the file. proxlb-solver: its CLI (`--quiet --markdown`), time limit "
        f"{SOLVER_CLI_TIME_LIMIT:g} s (its default); ProxLB: the file read, `ProxLbData` built, "
        "its decision steps (no Proxmox API).",
        "",
        _padded(HEADER, body, left=2) if body else "(nothing run)",
        "",
        f"Targets, `opendrs plan FILE` at {TARGET_GUESTS:,} guests:",
        "",
        *target_lines(results),
        "",
        *note_lines(results),
    ]
    return "\n".join(lines).rstrip() + "\n"


def exponent(points: Sequence[tuple[int, float]]) -> float | None:
    """The slope of log time against log guests (least squares) over ``(guests, seconds)``
    points: time grows as guests to this power; None with fewer than two sizes."""
    if len({g for g, _t in points}) < 2 or any(t <= 0 for _g, t in points):
        return None
    guests, seconds = np.log([g for g, _t in points]), np.log([t for _g, t in points])
    return float(np.polyfit(guests, seconds, 1)[0])


def _timed(results: Sequence[Result]) -> list[tuple[Result, float, float]]:
    """``opendrs plan``'s finished runs: (result, wall s, CPU s)."""
    timed = []
    for result in results:
        row = result.row(OPENDRS)
        if row is not None and row.error is None and row.measured is not None:
            timed.append((result, row.measured.wall, row.measured.cpu))
    return timed


#: The smallest runs the second fit leaves out: below this many guests the interpreter's start
#: and imports (about 2 s) hide the work.
GROWTH_FROM = 3_000


def _fit(timed: Sequence[tuple[Result, float, float]], column: int, least: int = 0) -> str:
    points = [(r.input.guests, (w, c)[column]) for r, w, c in timed if r.input.guests >= least]
    found = exponent(points)
    return "—" if found is None else f"{found:.2f}"


def growth_section(results: Sequence[Result]) -> str:
    """``opendrs plan SNAPSHOT``'s wall time per size, with and without rules, and the exponent
    of its growth in the guests (per generator and over them all)."""
    timed = _timed(results)
    sizes = list(dict.fromkeys(r.input.size for r in results))
    generators = list(dict.fromkeys(r.input.generator for r in results))
    header = [
        "generator",
        "rules",
        *(f"{s} wall s" for s in sizes),
        "exponent wall",
        "CPU",
        f"wall from {GROWTH_FROM:,}",
        f"CPU from {GROWTH_FROM:,}",
    ]
    body = []
    for rules in (False, True):
        for generator in [*generators, "all"]:
            mine = [
                t
                for t in timed
                if t[0].input.rules == rules and generator in ("all", t[0].input.generator)
            ]
            walls = {
                s: "; ".join(f"{w:.1f}" for r, w, _c in mine if r.input.size == s) or "—"
                for s in sizes
            }
            label = generator if generator != "all" else f"all {len(generators)}"
            row = [label, "with" if rules else "without", *walls.values()]
            fits = [_fit(mine, 0), _fit(mine, 1)]
            fits += [_fit(mine, 0, GROWTH_FROM), _fit(mine, 1, GROWTH_FROM)]
            body.append([*row, *fits])
    failed = [f"- {r.input.label}: {row.error}" for r in results for row in r.rows if row.error]
    lines = [
        "### Growth: `opendrs plan SNAPSHOT` on the production-like clusters",
        "",
        "Each run a fresh process from start to exit (the default strategy, the snapshot as YAML); "
        "the exponent is the slope of log time against log guests (least squares over the sizes "
        f"{', '.join(sizes)}, then over those of {GROWTH_FROM:,} guests or more, where the "
        "interpreter's start no longer hides the work): time ∝ guests^exponent.",
        "",
        _padded(header, body, left=2),
        "",
        *failed,
    ]
    return "\n".join(lines).rstrip() + "\n"


__all__ = [
    "HEADER",
    "cells",
    "exponent",
    "growth_section",
    "note_lines",
    "section",
    "target_lines",
]
