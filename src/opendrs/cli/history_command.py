"""``opendrs history --config FILE``: what the daemon decided and did, from its history.

The history file is opened read-only (:class:`~opendrs.controller.history.History` with
``readonly=True``), so the command runs beside a daemon that writes it: SQLite's WAL mode lets a
reader and the writer go on without waiting for each other.

Times are the backend's clock. ``--since`` counts back from *now*: the wall clock for a real
cluster, and for the simulator — whose clock is simulated seconds since its start — the latest
time the history holds (:func:`history_now`).

Exit status: 0 shown; 1 the history cannot be read (it is busy, corrupt or of a newer opendrs);
2 a bad configuration or option, a history that does not exist yet or is kept in memory, or a
file that is not an opendrs history (one line).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console

from opendrs.cli.arguments import Subcommands, guest_by_name_or_id
from opendrs.cli.config_file import add_config_option
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, UsageError
from opendrs.controller.history_file import HistoryError
from opendrs.controller.proposals import ProposedMove, verdict_object
from opendrs.json_data import iso_time, json_text
from opendrs.model.cluster import guest_label
from opendrs.model.document import MAX_SECONDS
from opendrs.model.units import UnitError, format_duration, parse_duration
from opendrs.records import (
    DecisionRecord,
    MigrationRecord,
    decision_object,
    jsonl,
    migration_now,
    timeline,
)
from opendrs.report.text import Report

if TYPE_CHECKING:
    from opendrs.controller.config import Config
    from opendrs.controller.history import History


__all__ = [
    "add_history_parser",
    "cmd_history",
    "history_now",
    "open_history",
    "parse_since",
    "require_history",
]

FORMATS = ("text", "json", "jsonl")
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}")


def open_history(config: Config) -> History:
    """The configuration's history, read-only; :class:`HistoryError` (one line) when it cannot
    be opened — a missing file said as such."""
    # imported when the command runs: the controller is large
    from opendrs.controller.history import History

    return History(config.history, readonly=True)


def require_history(config_file: str, history: str) -> None:
    """:class:`UsageError` (one line, exit status 2) when the configuration in ``config_file``
    keeps its ``history`` in memory or in a file that does not exist yet: no history to read."""
    if history == ":memory:":
        raise UsageError(f"{config_file}: history: kept in memory, there is no history to read")
    if not os.path.lexists(history):
        raise UsageError(
            f"{config_file}: history: {history} does not exist (has the daemon run with this "
            "configuration? its 'history:' names the file; --config FILE reads another)"
        )


def history_now(config: Config, history: History) -> float:
    """Now on the backend's clock: the wall clock, or — for the simulator, whose clock is not
    the wall clock — the latest time the history holds (0 for an empty one)."""
    if config.backend.type == "sim":
        return history.latest() or 0.0
    return time.time()


@dataclass(frozen=True)
class Since:
    """``--since``: a span back from now, or an absolute time."""

    seconds: float | None = None
    at: float | None = None

    def start(self, now: float) -> float:
        return self.at if self.at is not None else now - (self.seconds or 0.0)


def parse_since(text: str) -> Since:
    """A duration (``1d``, ``6h``, ``1d 6h``, seconds; at most 100 years) or an ISO 8601 time
    (UTC unless it says otherwise: ``2026-11-26``, ``2026-11-26T10:00``,
    ``2026-11-26T10:00+01:00``)."""
    if _ISO.match(text.strip()):
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UsageError(
                f"--since: cannot read {text!r} as an ISO 8601 time (example: 2026-11-26T10:00Z)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return Since(at=moment.timestamp())
    try:
        seconds = parse_duration(text)
    except UnitError as exc:
        raise UsageError(f"--since: {exc}, or an ISO 8601 time such as 2026-11-26T10:00Z") from None
    if seconds > MAX_SECONDS:  # as every duration opendrs reads
        raise UsageError(
            f"--since: must be at most {format_duration(MAX_SECONDS)} (100 years) back, got "
            f"{text!r}; an ISO 8601 time (2026-11-26T10:00Z) for an exact start"
        )
    return Since(seconds=float(seconds))


def _name(option: str, text: str) -> str:
    if not text.strip() or text != text.strip() or any(c in text for c in "\r\n\t\0"):
        raise UsageError(f"{option}: {text!r} is not a name (one word, no blanks around it)")
    return text


def _touches(
    guest: object, source: object, target: object, *, only: str | None, node: str | None
) -> bool:
    """Whether a move of ``guest`` from ``source`` to ``target`` is of guest ``only`` and from or
    to ``node`` (``None``: any)."""
    return (only is None or guest == only) and (node is None or node in (source, target))


def select(
    decisions: Iterable[DecisionRecord],
    migrations: Iterable[MigrationRecord],
    *,
    guest: str | None,
    node: str | None,
) -> tuple[list[DecisionRecord], list[MigrationRecord]]:
    """The decisions whose plan has a move of ``guest`` from or to ``node`` (either may be
    ``None``: any), and the migrations that are such a move; everything without filters."""
    if guest is None and node is None:
        return list(decisions), list(migrations)
    kept = [
        d
        for d in decisions
        if any(
            _touches(m.get("guest"), m.get("source"), m.get("target"), only=guest, node=node)
            for m in d.plan
        )
    ]
    moved = [
        m
        for m in migrations
        if _touches(m.guest, m.move.source, m.move.target, only=guest, node=node)
    ]
    return kept, moved


def cmd_history(args: argparse.Namespace) -> int:
    # imported when the command runs: the controller is large
    from opendrs.controller.config import load_config

    config = load_config(args.config)
    since = parse_since(args.since) if args.since is not None else None
    given = _name("--guest", args.guest) if args.guest is not None else None
    node = _name("--node", args.node) if args.node is not None else None
    require_history(args.config, config.history)
    try:
        with open_history(config) as history:
            names = history.guest_names()
            guest = None if given is None else _guest_id(given, names, config.history)
            now = history_now(config, history)
            start = since.start(now) if since is not None else None
            decisions = history.decisions(since=start)
            # Migrations with an event since the start, and every one still in flight.
            migrations = [
                m
                for m in history.migrations(guest=guest)
                if start is None or m.started >= start or m.ended is None or m.ended >= start
            ]
            verdicts = _verdicts(history, start, guest=guest, node=node)
    except HistoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE if exc.foreign else EXIT_PROBLEM
    decisions, migrations = select(decisions, migrations, guest=guest, node=node)
    if args.format == "jsonl":
        for item in timeline(decisions, migrations, start, verdicts):
            sys.stdout.write(jsonl(item))
    elif args.format == "json":
        sys.stdout.write(
            json_text(
                {
                    "history": config.history,
                    "now": now,
                    "since": start,
                    "decisions": [decision_object(d) for d in decisions],
                    "migrations": [migration_now(m) for m in migrations],
                    "verdicts": verdicts,
                }
            )
        )
    else:
        report = Report(Console(highlight=False, soft_wrap=False))
        show_history(report, config, decisions, migrations, start, names)
        if verdicts:
            show_verdicts(report, verdicts)
    return EXIT_OK


def _verdicts(
    history: History, start: float | None, *, guest: str | None, node: str | None
) -> list[dict[str, Any]]:
    """The operators' verdicts on proposals given since ``start`` (``None``: ever), oldest
    first, those with a move of ``guest`` from or to ``node`` (either ``None``: any)."""
    given = [verdict_object(p) for p in history.proposals()]
    kept = [
        v
        for v in given
        if v is not None
        and (start is None or v["at"] >= start)
        and (
            (guest is None and node is None)
            or any(
                _touches(m["guest"], m["source"], m["target"], only=guest, node=node)
                for m in v["moves"]
            )
        )
    ]
    return sorted(kept, key=lambda v: v["at"])


def show_verdicts(report: Report, verdicts: Sequence[Mapping[str, Any]]) -> None:
    """The operators' verdicts on proposals: when, who, which proposal, and its moves."""
    report.heading(f"Verdicts on proposals ({len(verdicts)})")
    rows = [
        [
            v["time"],
            v["event"],
            v["by"],
            v["proposal"],
            v["activity"],
            str(v["decision"]),
            "; ".join(ProposedMove(**m).label() for m in v["moves"]),
        ]
        for v in verdicts
    ]
    report.table(("time", "verdict", "by", "proposal", "kind", "decision", "moves"), rows)


def _guest_id(text: str, names: Mapping[str, str], where: str) -> str:
    """``--guest``: a guest's id, or a name the history recorded for one (a name several
    guests had is refused, naming them); text that is neither is taken as an id."""
    if text in names or text not in names.values():
        return text
    return guest_by_name_or_id(text, names, "--guest", where)


def _moves(record: DecisionRecord) -> str:
    return str(len(record.plan)) if record.plan else ""


def show_history(
    report: Report,
    config: Config,
    decisions: Sequence[DecisionRecord],
    migrations: Sequence[MigrationRecord],
    start: float | None,
    names: Mapping[str, str],
) -> None:
    """Decisions, then migrations, oldest first, and the counts; guests by the ``names`` the
    history recorded."""
    window = f" since {iso_time(start)}" if start is not None else ""
    report.line(f"History {config.history}{window}", "bold")
    report.heading(f"Decisions ({len(decisions)})")
    if decisions:
        rows = []
        for d in decisions:
            item = decision_object(d)
            rows.append(
                [
                    item["time"],
                    d.mode,
                    item["code"] or "",
                    "yes" if item["act"] else "no",
                    _moves(d),
                    d.reason,
                ]
            )
        report.table(("time", "mode", "code", "act", "moves", "reason"), rows, right=(4,))
    report.heading(f"Migrations ({len(migrations)})")
    if migrations:
        rows = []
        for m in migrations:
            took = format_duration(m.ended - m.started) if m.ended is not None else ""
            rows.append(
                [
                    iso_time(m.started),
                    took,
                    guest_label(m.guest, names.get(m.guest, "")),
                    m.move.source,
                    m.move.target,
                    _outcome(m),
                    "parking" if m.parking else "",
                    "" if m.decision is None else str(m.decision),
                    m.error or "",
                ]
            )
        report.table(
            ("started", "took", "guest", "from", "to", "outcome", "", "decision", "error"),
            rows,
            right=(1, 7),
        )
    counts = {
        o: sum(1 for m in migrations if (m.outcome or "in flight") == o)
        for o in ("done", "failed", "lost", "in flight")
    }
    acted = sum(1 for d in decisions if d.action != "none")
    report.line()
    report.line(
        f"{len(decisions)} decisions ({acted} to act); {len(migrations)} migrations: "
        + ", ".join(f"{n} {o}" for o, n in counts.items())
    )


def add_history_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "history",
        help="the daemon's decisions (with why and why not) and migrations, from its history",
        description="Decisions (time, code, whether to act, the reason: why, or why not) and "
        "migrations (start, end, outcome, error, parking, the decision that asked for it) from "
        "the history of a configuration file, opened read-only: it runs beside the daemon. "
        "--guest and --node keep the migrations of that guest or touching that node, and the "
        "decisions whose plan has such a move. Exit status: 0 shown, 1 the history cannot be "
        "read, 2 a bad configuration or option, a history that does not exist yet, or a file "
        "that is not an opendrs history.",
    )
    add_config_option(p)
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="only from WHEN on: a duration back from now (1d, 6h, 1d 6h, 90m; at most 100 "
        "years; with the "
        "simulator backend, back from the latest time in the history) or an ISO 8601 time "
        "(2026-11-26T10:00Z; UTC without an offset); default: everything",
    )
    p.add_argument(
        "--guest", metavar="GUEST", help="only this guest's migrations and decisions (name or id)"
    )
    p.add_argument(
        "--node",
        metavar="NAME",
        help="only the migrations from or to NAME, and the decisions whose plan has one",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (default), json (one document), or jsonl (one object per decision and "
        "migration event, in time order: the decision log's lines)",
    )
    p.set_defaults(func=cmd_history)


def _outcome(m: MigrationRecord) -> str:
    """A migration's outcome, with how long it stopped the guest where it did."""
    if m.outcome is None:
        return "in flight"
    if m.downtime is not None:
        return f"{m.outcome}, guest stopped {m.downtime:.1f} s"
    return m.outcome
