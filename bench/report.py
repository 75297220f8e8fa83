"""Tables of benchmark results: one Markdown table per case, padded so it reads on a terminal."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.metrics import Evaluation, Snapshot

MiB = 1024**2
GiB = 1024**3
#: The targets of a method case: the method's spread at most 1 pp with at most
#: 1.25× the migrations of the lower bound for the method's resource alone.
TARGET_SPREAD = 0.01
TARGET_RATIO = 1.25
#: Peers, in column order, with their short column labels.
PEER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("proxlb-greedy", "greedy"),
    ("proxlb-solver", "solver"),
)


@dataclass
class Row:
    """One runner's outcome on one case."""

    runner: str
    kind: str
    seconds: float | None = None
    rss_peak: int | None = None
    rss_setup: int | None = None
    evaluation: Evaluation | None = None
    info: Mapping[str, object] = field(default_factory=dict)
    notes: Sequence[str] = ()
    error: str | None = None
    #: The guests the runner moves: guest id → node.
    placement: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.evaluation is not None


@dataclass
class Case:
    """One cluster (size, rules) and every runner's row on it."""

    size: str
    nodes: int
    guests: int
    rules: bool
    before: Snapshot
    lb_spread: float | None
    bounds_available: bool
    rows: list[Row] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: The cluster generator (:data:`bench.clusters.GENERATORS`).
    generator: str = "basic"

    @property
    def title(self) -> str:
        rules = "with rules" if self.rules else "without rules"
        return (
            f"{self.size} — {self.nodes} nodes, {self.guests:,} guests, {rules}, "
            f"{self.generator} generator"
        )

    def row(self, runner: str) -> Row | None:
        for row in self.rows:
            if row.runner == runner and row.ok:
                return row
        return None


@dataclass
class MethodCase:
    """A generated cluster imported as a proxlb-solver scenario balancing ``method``, and the
    rows of the strategies run on it."""

    size: str
    nodes: int
    guests: int
    rules: bool
    method: str
    seed: int
    before: Snapshot
    rows: list[Row] = field(default_factory=list)

    def spread(self, snapshot: Snapshot) -> float:
        """The spread of the method's resource (memory, or cpu for ``method: cpu``)."""
        return snapshot.cpu_spread if self.method == "cpu" else snapshot.memory_spread

    def other(self, snapshot: Snapshot) -> float:
        return snapshot.memory_spread if self.method == "cpu" else snapshot.cpu_spread


def method_target(case: MethodCase, row: Row) -> bool | None:
    """Whether a row meets the targets (spread and migrations against the bound); None when it
    failed or there is no bound."""
    ev = row.evaluation
    if not row.ok or ev is None or ev.lb_migrations is None:
        return None
    spread_ok = case.spread(ev.after) <= TARGET_SPREAD + 1e-12
    if ev.lb_migrations == 0:
        return spread_ok and ev.migrations == 0
    return spread_ok and ev.migrations <= TARGET_RATIO * ev.lb_migrations


def ratio(value: float | None, reference: float | None) -> str:
    """``value / reference`` as ``1.23×``; a dash when undefined."""
    if value is None or reference is None or reference <= 0 or not math.isfinite(reference):
        return "—"
    r = value / reference
    return f"{r:.3g}×"


def _pp(fraction: float) -> str:
    return f"{fraction * 100:.1f}"


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / MiB:,.0f}"


def columns(case: Case) -> list[str]:
    """Column headers of a case's table."""
    cols = [
        "runner",
        "time s",
        "peak RSS MiB",
        "Δ RSS MiB",
        "mem spread pp",
        "CPU spread pp",
        "CV",
        "migrations",
        "cost",
        "moved GiB",
        "violations",
    ]
    for _peer, short in PEER_COLUMNS:
        cols.append(f"time/{short}")
    for _peer, short in PEER_COLUMNS:
        cols.append(f"migr./{short}")
    if case.bounds_available:
        cols += ["migr./LB", "moved/LB"]
    return cols


def cells(case: Case, row: Row) -> list[str]:
    """One row's cells, matching :func:`columns`."""
    n_cols = len(columns(case))
    label = row.runner if row.kind == "strategy" else f"{row.runner} (peer)"
    if not row.ok or row.evaluation is None:
        failed = [label, f"**{row.error or 'failed'}**", _mib(row.rss_peak)]
        return failed + [""] * (n_cols - len(failed))
    ev = row.evaluation
    peers = [case.row(peer) for peer, _short in PEER_COLUMNS]
    out = [
        label,
        f"{row.seconds:.3g}" if row.seconds is not None else "—",
        _mib(row.rss_peak),
        _mib(None if row.rss_peak is None else max(row.rss_peak - (row.rss_setup or 0), 0)),
        _pp(ev.after.memory_spread),
        _pp(ev.after.cpu_spread),
        f"{ev.after.cv:.3f}",
        f"{ev.migrations:,}",
        f"{ev.cost:,}",
        f"{ev.moved_gib:,.0f}",
        str(len(ev.violations)),
    ]
    for peer in peers:
        out.append(ratio(row.seconds, peer.seconds if peer else None))
    for peer in peers:
        ref = peer.evaluation.migrations if peer and peer.evaluation else None
        out.append(ratio(ev.migrations, ref))
    if case.bounds_available:
        out.append(ratio(ev.migrations, ev.lb_migrations))
        out.append(ratio(ev.moved_bytes, ev.lb_moved_bytes))
    return out


def table(case: Case) -> str:
    """The case's Markdown table, columns padded to equal width."""
    return _padded(columns(case), [cells(case, row) for row in case.rows])


def _info_text(row: Row) -> str:
    info = row.info
    if row.runner == "proxlb-solver":
        parts = [
            f"{info.get('status')} within {info.get('time_limit_s'):g} s",
            f"level {info.get('balanciness')}",
            f"its own gap {float(info.get('solver_gap') or 0) * 100:.2f} pp (priority-weighted)",
            f"plan: {info.get('steps')} steps, {info.get('parking_moves')} parking moves",
            "path feasible" if info.get("path_feasible") else "**path not feasible**",
            f"{info.get('attempts')} attempt(s)",
        ]
        return "; ".join(parts)
    if row.runner == "proxlb-greedy":
        return (
            f"mode {info.get('mode')}, balanciness {info.get('balanciness')} pp; "
            f"{info.get('model_moves')} moves in its model"
        )
    if "stopped" in info:
        return f"stopped: {info['stopped']}"
    return ""


def notes(case: Case) -> list[str]:
    """Bullet lines under a case's table: the before state, bounds, each runner's details."""
    lines = [
        f"- before: memory spread {_pp(case.before.memory_spread)} pp, "
        f"CPU spread {_pp(case.before.cpu_spread)} pp, CV {case.before.cv:.3f}"
    ]
    if case.bounds_available and case.lb_spread is not None:
        lines.append(f"- lower bound on memory spread: {_pp(case.lb_spread)} pp")
    for row in case.rows:
        parts = []
        text = _info_text(row)
        if text:
            parts.append(text)
        if row.evaluation is not None and row.evaluation.violations:
            vio = row.evaluation.violations
            shown = "; ".join(vio[:3]) + (f"; … ({len(vio)} in all)" if len(vio) > 3 else "")
            parts.append(f"violations: {shown}")
        parts.extend(row.notes)
        if parts:
            lines.append(f"- {row.runner}: " + "; ".join(parts))
    for skipped in case.skipped:
        lines.append(f"- skipped: {skipped}")
    return lines


def emit(text: str, markdown: Path | None) -> None:
    """Print a section of a ``python -m bench.X`` command, and write it to ``markdown`` if given."""
    print(text)
    if markdown:
        markdown.write_text(text, encoding="utf-8")


def _padded(header: Sequence[str], body: Sequence[Sequence[str]], left: int = 1) -> str:
    """A Markdown table with padded columns; the first ``left`` columns align left."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    right = [i >= left for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)
        ]
        return "| " + " | ".join(parts) + " |"

    rule = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if r else "-" * (w + 2)
            for w, r in zip(widths, right, strict=True)
        )
        + "|"
    )
    return "\n".join([line(header), rule, *(line(b) for b in body)])


def method_section(cases: Sequence[MethodCase], level: int = 3) -> str:
    """Method cases as Markdown: one table (a row per case and runner), then the targets."""
    if not cases:
        return ""
    method = cases[0].method
    other = "memory" if method == "cpu" else "CPU"
    header = [
        "size",
        "rules",
        "seed",
        "runner",
        "time s",
        "peak RSS MiB",
        f"{method} spread before pp",
        f"{method} spread pp",
        f"{other} spread pp",
        "migrations",
        f"LB ({method} only)",
        "migr./LB",
        "target",
    ]
    body: list[list[str]] = []
    met: list[bool] = []
    for case in cases:
        for row in case.rows:
            lead = [case.size, "with" if case.rules else "without", str(case.seed), row.runner]
            ev = row.evaluation
            if not row.ok or ev is None:
                failed = [*lead, f"**{row.error or 'failed'}**", _mib(row.rss_peak)]
                body.append(failed + [""] * (len(header) - len(failed)))
                continue
            target = method_target(case, row)
            if target is not None:
                met.append(target)
            body.append(
                [
                    *lead,
                    f"{row.seconds:.3g}" if row.seconds is not None else "—",
                    _mib(row.rss_peak),
                    f"{case.spread(case.before) * 100:.2f}",
                    f"{case.spread(ev.after) * 100:.2f}",
                    f"{case.other(ev.after) * 100:.1f}",
                    f"{ev.migrations:,}",
                    "—" if ev.lb_migrations is None else f"{ev.lb_migrations:,}",
                    ratio(ev.migrations, ev.lb_migrations),
                    "—" if target is None else ("met" if target else "**missed**"),
                ]
            )
    lines = [
        f"{'#' * level} proxlb-solver scenarios, `method: {method}`",
        "",
        _padded(header, body, left=4),
        "",
        f"- the generated clusters written as proxlb-solver scenarios with `method: {method}` and "
        "imported as `opendrs plan scenario.yaml` imports them (bench/scenario.py); the lower "
        f"bound holds the {method} spread alone to the spread each row reaches",
        f"- target: {method} spread ≤ {TARGET_SPREAD * 100:g} pp with migrations ≤ "
        f"{TARGET_RATIO:g}× that bound: met in {sum(met)} of {len(met)} rows",
        "",
    ]
    return "\n".join(lines)


def section(case: Case, level: int = 3) -> str:
    """A case as Markdown: heading, table, notes."""
    return "\n".join([f"{'#' * level} {case.title}", "", table(case), "", *notes(case), ""])


__all__ = [
    "PEER_COLUMNS",
    "TARGET_RATIO",
    "TARGET_SPREAD",
    "Case",
    "MethodCase",
    "Row",
    "cells",
    "columns",
    "method_section",
    "method_target",
    "notes",
    "ratio",
    "section",
    "table",
]
