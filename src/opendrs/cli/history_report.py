"""The report of a daemon's history (``opendrs report --config FILE``).

It reads what ``opendrs history`` reads — decisions and migrations, from the history opened
read-only — and shows them over time: the spread each decision saw against the threshold,
migrations per day by outcome, each failed or lost migration and what came of it, the guests
that moved most, and what the decisions said. "Now" is the latest time the history holds, so the
same history gives the same report whenever it is made.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opendrs.engine.policy.metrics import format_metric, metric_label, metric_scale
from opendrs.json_data import iso_time
from opendrs.model.cluster import guest_label
from opendrs.records import Avoid, DecisionRecord, MigrationRecord, decision_object
from opendrs.report.charts import Line, bar_chart, line_chart
from opendrs.report.render import Document

if TYPE_CHECKING:
    from opendrs.controller.config import Config
    from opendrs.controller.history import History


__all__ = ["history_document"]

DAY = 86_400.0
#: Outcomes as the report counts them (``in flight``: no outcome yet).
OUTCOMES = ("done", "failed", "lost", "in flight")
#: How many guests "moved most" lists, and how many of the latest acting decisions are shown.
TOP_GUESTS = 10
LATEST_ACTIONS = 20


def history_document(config: Config, history: History) -> Document:
    """The report of ``config``'s history, read through ``history`` (opened read-only)."""
    decisions = history.decisions()
    migrations = history.migrations()
    latest = history.latest()
    avoided = history.avoid_entries(latest) if latest is not None else []
    names = history.guest_names()
    metric = config.policy.metric
    threshold = config.policy.threshold
    spread = [(d.at, d.imbalance) for d in decisions if d.imbalance is not None]
    days = _days(decisions, migrations, metric)
    data = {
        "config": config.file,
        "history": config.history,
        "cluster": history.cluster or config.cluster or "",
        "backend": config.backend.type,
        "mode": config.mode,
        "metric": metric_label(metric),
        "threshold": format_metric(metric, threshold),
        "first": min([d.at for d in decisions] + [m.started for m in migrations], default=None),
        "latest": latest,
        "counts": _counts(decisions, migrations),
        "codes": _codes(decisions),
        "days": days,
        "failures": _with_labels(_failures(migrations, avoided), names),
        "avoid_after_failure": config.executor.avoid_after_failure,
        "avoided": _with_labels([_avoid(a) for a in avoided], names),
        "movers": _with_labels(_movers(migrations), names),
        "actions": [decision_object(d) for d in decisions if d.action != "none"][-LATEST_ACTIONS:],
        "shadow": _shadow(decisions, metric, names),
    }

    def charts() -> dict[str, str]:
        return _charts(spread, days, metric, threshold, shadow=bool(data["shadow"]["decisions"]))

    return Document("history", f"opendrs history report: {data['cluster']}", data, charts)


def _with_labels(rows: list[dict[str, Any]], names: Mapping[str, str]) -> list[dict[str, Any]]:
    """``rows`` with each guest's ``label`` (``name (id)``, by the ``names`` the history
    recorded) beside its id."""
    label = [guest_label(row["guest"], names.get(row["guest"], "")) for row in rows]
    return [{**row, "label": text} for row, text in zip(rows, label, strict=True)]


def _shadow(
    decisions: Sequence[DecisionRecord], metric: str, names: Mapping[str, str]
) -> dict[str, Any]:
    """What shadow mode would have done: how many of its decisions would have acted, the latest
    :data:`LATEST_ACTIONS` of them with what they would have bought (the policy's metric then,
    and as the plan predicted it after) and their number of migrations, and the last plan's
    moves (guests by name). Each decision plans afresh from the cluster as it is: their moves
    are not added up, the same guests come back while nothing moves."""
    acting = [d for d in decisions if d.mode == "shadow" and d.action != "none" and d.plan]
    rows = [
        {
            "at": d.at,
            "id": d.id,
            "action": d.action,
            "migrations": len(d.plan),
            "before": _figure(metric, d.imbalance),
            "after": _figure(metric, d.predicted),
        }
        for d in acting[-LATEST_ACTIONS:]
    ]
    return {
        "decisions": len(acting),
        "latest": rows,
        "last": rows[-1] if rows else None,
        "last_moves": [_planned(m, names) for m in acting[-1].plan] if acting else [],
    }


def _planned(move: Mapping[str, Any], names: Mapping[str, str]) -> str:
    """A planned move of a decision: ``db-main (101) pve1 → pve4``."""
    guest = str(move.get("guest"))
    name = move.get("name") or names.get(guest, "")
    return f"{guest_label(guest, name)} {move.get('source')} → {move.get('target')}"


def _figure(metric: str, value: float | None) -> str:
    return "–" if value is None else format_metric(metric, value)


def _outcome(migration: MigrationRecord) -> str:
    return migration.outcome or "in flight"


def _counts(
    decisions: Sequence[DecisionRecord], migrations: Sequence[MigrationRecord]
) -> dict[str, int]:
    counts = Counter(_outcome(m) for m in migrations)
    return {
        "decisions": len(decisions),
        "acted": sum(1 for d in decisions if d.action != "none"),
        "migrations": len(migrations),
        **{outcome: counts.get(outcome, 0) for outcome in OUTCOMES},
    }


def _codes(decisions: Sequence[DecisionRecord]) -> list[dict[str, Any]]:
    """How often each decision code came up, most frequent first, with its latest reason."""
    counts: Counter[tuple[str, str]] = Counter()
    latest: dict[tuple[str, str], str] = {}
    for d in decisions:
        item = decision_object(d)
        key = (d.action, item["code"] or "")
        counts[key] += 1
        latest[key] = d.reason
    return [
        {"action": action, "code": code, "count": count, "reason": latest[(action, code)]}
        for (action, code), count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def _day(at: float) -> str:
    return iso_time(at)[:10] or "?"


def _days(
    decisions: Sequence[DecisionRecord], migrations: Sequence[MigrationRecord], metric: str
) -> list[dict[str, Any]]:
    """Per calendar day (UTC): decisions, the imbalance they saw (the policy's ``metric``, mean
    and highest, as an operator reads it), and migrations by outcome."""
    days: dict[str, dict[str, Any]] = {}

    def day(at: float) -> dict[str, Any]:
        return days.setdefault(
            _day(at),
            {"spreads": [], "decisions": 0, "would": 0, **{outcome: 0 for outcome in OUTCOMES}},
        )

    for d in decisions:
        entry = day(d.at)
        entry["decisions"] += 1
        if d.imbalance is not None:
            entry["spreads"].append(d.imbalance)
        if d.mode == "shadow" and d.action != "none" and d.plan:
            entry["would"] += 1
    for m in migrations:
        day(m.started)[_outcome(m)] += 1
    out = []
    for name, entry in sorted(days.items()):
        spreads = entry.pop("spreads")
        out.append(
            {
                "day": name,
                **entry,
                "migrations": sum(entry[o] for o in OUTCOMES),
                "mean": format_metric(metric, sum(spreads) / len(spreads)) if spreads else "–",
                "max": format_metric(metric, max(spreads)) if spreads else "–",
            }
        )
    return out


def _failures(
    migrations: Sequence[MigrationRecord], avoided: Sequence[Avoid]
) -> list[dict[str, Any]]:
    """Each failed or lost migration, and what came of it: the guest's next migration (moved
    elsewhere, or failed again), or that it stayed; whether its target is still avoided."""
    keep_off = {(a.guest, a.node): a for a in avoided}
    out = []
    for index, m in enumerate(migrations):
        if m.outcome not in ("failed", "lost"):
            continue
        later = next((n for n in migrations[index + 1 :] if n.guest == m.guest), None)
        if later is None:
            after = f"not moved since: it stayed on {m.move.source}"
            if m.outcome == "lost":
                after = "not moved since by opendrs"
        elif later.outcome == "done":
            after = f"moved {later.move.source} → {later.move.target} at {iso_time(later.started)}"
        else:
            after = f"next migration, to {later.move.target}: {_outcome(later)}"
        avoid = keep_off.get((m.guest, m.move.target))
        out.append(
            {
                "started": m.started,
                "ended": m.ended,
                "guest": m.guest,
                "source": m.move.source,
                "target": m.move.target,
                "outcome": m.outcome,
                "error": m.error or "",
                "decision": m.decision,
                "after": after,
                "avoid_until": avoid.until if avoid is not None else None,
            }
        )
    return out


def _avoid(entry: Avoid) -> dict[str, Any]:
    return {"guest": entry.guest, "node": entry.node, "until": entry.until, "reason": entry.reason}


def _movers(migrations: Sequence[MigrationRecord]) -> list[dict[str, Any]]:
    """The guests with the most migrations (done ones first), with the nodes they went to."""
    by_guest: dict[str, list[MigrationRecord]] = {}
    for m in migrations:
        by_guest.setdefault(m.guest, []).append(m)

    def rank(item: tuple[str, list[MigrationRecord]]) -> tuple[int, int, str]:
        guest, moves = item
        done = sum(1 for m in moves if m.outcome == "done")
        return (-done, -len(moves), guest)

    out = []
    for guest, moves in sorted(by_guest.items(), key=rank)[:TOP_GUESTS]:
        done = [m for m in moves if m.outcome == "done"]
        path = [done[0].move.source, *(m.move.target for m in done)] if done else []
        out.append(
            {
                "guest": guest,
                "migrations": len(moves),
                "done": len(done),
                "failed": sum(1 for m in moves if m.outcome in ("failed", "lost")),
                "path": path,
                "last": moves[-1].started,
            }
        )
    return out


def _charts(
    spread: Sequence[tuple[float, float]],
    days: Sequence[Mapping[str, Any]],
    metric: str,
    threshold: float,
    *,
    shadow: bool,
) -> dict[str, str]:
    """The metric over time; migrations per day by outcome — and, where shadow mode would have
    acted, how many of its decisions would have, beside them."""
    charts = {}
    scale, unit = metric_scale(metric)
    unit = f" ({unit})" if unit else ""
    if spread:
        start = spread[0][0]
        span = spread[-1][0] - start
        per, name = (DAY, "days") if span > 2 * DAY else (3600.0, "hours")
        charts["spread"] = line_chart(
            {metric: [((at - start) / per, scale * value) for at, value in spread]},
            title=f"{metric_label(metric).capitalize()} each decision saw",
            xlabel=f"{name} since {iso_time(start)}",
            ylabel=metric_label(metric) + unit,
            lines=[Line(scale * threshold, "threshold")],
        )
    if days:
        groups = {
            "done": [float(d["done"]) for d in days],
            "failed or lost": [float(d["failed"] + d["lost"]) for d in days],
        }
        title, ylabel = "Migrations per day (UTC)", "migrations"
        if shadow:
            groups["decisions shadow mode would have acted on"] = [float(d["would"]) for d in days]
            title, ylabel = "Migrations, and decisions shadow mode would have acted on, per day", ""
        names = [d["day"] for d in days]
        charts["migrations"] = bar_chart(names, groups, title=title, ylabel=ylabel)
    return charts
