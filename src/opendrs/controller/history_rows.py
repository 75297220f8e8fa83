"""The rows of the history file: values checked before they are written, records read back.

Every check raises :class:`~opendrs.controller.history_file.HistoryError` with one line; see
:mod:`opendrs.controller.history_file` for the columns.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from types import MappingProxyType
from typing import Any

from opendrs.controller.history_file import HistoryError, one_line
from opendrs.model.cluster import Move
from opendrs.records import ACTIONS, MODES, Action, DecisionRecord, MigrationRecord, Mode

__all__ = [
    "bound_cluster",
    "check_choice",
    "check_name",
    "check_number",
    "check_text",
    "check_time",
    "decision_columns",
    "decision_json",
    "decision_record",
    "json_column",
    "migration_record",
]


def bound_cluster(db: sqlite3.Connection) -> str | None:
    """The cluster the history is bound to, or ``None``."""
    row = db.execute("SELECT value FROM state WHERE key = 'cluster'").fetchone()
    return None if row is None else str(row[0])


def check_time(what: str, value: object) -> float:
    """``value`` as a time in seconds, refused unless a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HistoryError(f"{what} must be a time in seconds, got {value!r}")
    if not math.isfinite(value):
        raise HistoryError(f"{what} must be a finite time in seconds, got {value!r}")
    return float(value)


def check_number(what: str, value: object) -> float | None:
    """``value`` as a finite number, or ``None``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise HistoryError(f"{what} must be a finite number or None, got {value!r}")
    return float(value)


def check_name(what: str, value: object) -> str:
    """``value`` as a name: a non-empty word without surrounding blanks."""
    if not isinstance(value, str) or not value.strip():
        raise HistoryError(f"{what} must be a non-empty string, got {value!r}")
    if value != value.strip() or any(c in value for c in "\r\n\t\0"):
        raise HistoryError(f"{what} must be one word without surrounding blanks, got {value!r}")
    return value


def check_text(what: str, value: object) -> str:
    """``value`` as a non-empty sentence on one line."""
    if not isinstance(value, str) or not value.strip():
        raise HistoryError(f"{what} must be a non-empty string, got {value!r}")
    return one_line(value)


def check_choice(what: str, value: object, choices: tuple[str, ...]) -> str:
    """``value``, refused unless one of ``choices``."""
    if value not in choices or not isinstance(value, str):
        raise HistoryError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _json_default(value: object) -> object:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def json_column(what: str, value: object) -> str:
    """``value`` as the compact JSON text of a column (dataclasses, mappings and sets too)."""
    try:
        return json.dumps(
            value,
            default=_json_default,
            allow_nan=False,
            ensure_ascii=False,
            separators=(",", ":"),
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise HistoryError(f"{what} cannot be stored as JSON: {exc}") from None


def decision_record(row: sqlite3.Row) -> DecisionRecord:
    """The record of a ``decisions`` row."""
    return DecisionRecord(
        id=int(row["id"]),
        at=float(row["at"]),
        cluster=row["cluster"],
        mode=row["mode"],
        policy=row["policy"],
        action=row["action"],
        reason=row["reason"],
        imbalance=None if row["imbalance"] is None else float(row["imbalance"]),
        predicted=None if row["predicted"] is None else float(row["predicted"]),
        summary=MappingProxyType(json.loads(row["summary"])),
        plan=tuple(MappingProxyType(step) for step in json.loads(row["plan"])),
        code=row["code"],
    )


def decision_columns(
    *,
    at: float,
    cluster: str,
    mode: Mode,
    policy: str,
    action: Action,
    reason: str,
    imbalance: float | None,
    predicted: float | None,
    summary: Mapping[str, Any],
    plan: Sequence[Mapping[str, Any]],
    code: str | None,
) -> dict[str, object]:
    """A decision's row of ``decisions``, column → value, checked (see
    :meth:`~opendrs.controller.history.History.record_decision`); all but ``id``."""
    columns: dict[str, object] = {
        "at": check_time("at", at),
        "cluster": check_name("cluster", cluster),
        "mode": check_choice("mode", mode, MODES),
        "policy": check_name("policy", policy),
        "action": check_choice("action", action, ACTIONS),
        "reason": check_text("reason", reason),
        "imbalance": check_number("imbalance", imbalance),
        "predicted": check_number("predicted", predicted),
    }
    summary_json, plan_json = decision_json(summary, plan)
    columns.update(moves=len(plan), summary=summary_json, plan=plan_json)
    if code is None and isinstance(summary.get("code"), str):
        code = summary["code"]
    columns["code"] = None if code is None else check_name("decision code", code)
    return columns


def decision_json(summary: object, plan: object) -> tuple[str, str]:
    """A decision's summary (a mapping) and plan (a sequence of mappings) as JSON text."""
    if not isinstance(summary, Mapping):
        raise HistoryError(f"decision summary must be a mapping, got {type(summary).__name__}")
    if isinstance(plan, str | bytes) or not isinstance(plan, Sequence):
        raise HistoryError(f"decision plan must be a sequence, got {type(plan).__name__}")
    for index, step in enumerate(plan):
        if not isinstance(step, Mapping):
            raise HistoryError(
                f"decision plan[{index}] must be a mapping, got {type(step).__name__}"
            )
    return json_column("decision summary", summary), json_column("decision plan", list(plan))


def migration_record(row: sqlite3.Row) -> MigrationRecord:
    """The record of a ``migrations`` row."""
    return MigrationRecord(
        id=int(row["id"]),
        decision=None if row["decision"] is None else int(row["decision"]),
        move=Move(row["guest"], row["source"], row["target"]),
        handle=row["handle"],
        started=float(row["started"]),
        parking=bool(row["parking"]),
        ended=None if row["ended"] is None else float(row["ended"]),
        outcome=row["outcome"],
        error=row["error"],
        ended_order=None if row["ended_order"] is None else int(row["ended_order"]),
        downtime=None if row["downtime"] is None else float(row["downtime"]),
        name=row["name"] or None,
    )
