"""What the history records — decisions, migrations, cooldowns, avoids — and their one JSON form.

The record types (:class:`DecisionRecord`, :class:`MigrationRecord`, :class:`Cooldown`,
:class:`Avoid`), the values their fields take (:data:`Mode`, :data:`Action`, :data:`Outcome`,
:data:`PENDING`) and their JSON objects live here, below the controller that writes them
(:mod:`opendrs.controller.history`, the SQLite store) and the commands, reports and dashboard
that present them.

``opendrs history --format json|jsonl``, ``opendrs status --format json`` and the daemon's
decision log (``log: {decisions: FILE}``) all write these objects, built here and nowhere else,
so a log shipper, a script reading ``history --format jsonl`` and one reading the log see the
same fields.

A **decision** object (``kind: decision``)::

    {"kind": "decision", "at": 1764172800.0, "time": "2025-11-26T16:00:00Z", "id": 7,
     "cluster": "prod", "mode": "shadow", "policy": "opendrs", "action": "none", "act": false,
     "code": "balanced", "reason": "spread 4.1 pp at or below threshold 15 pp: nothing to do",
     "stop": null, "imbalance": 0.041, "predicted": null, "moves": []}

``act`` is true for ``action`` ``plan`` or ``repair``; ``code`` is the decision's code (``null``
in a history written before codes were recorded); ``reason`` is its sentence — for a decision not
to act, why not (the filter that stopped it, with counts), guests named ``name (id)``; ``stop`` is
where the strategy stopped, when the decision says it (the strategy proposes nothing, a balancing
plan, a return from maintenance, a repair toward the failover headroom), as its code and details
(``{"code": "batch_cut", "kept": 2, …, "parts": [...]}``, the ``plan --format json`` form; ``null``
otherwise, and in a history written before stops were recorded); ``moves`` are the plan's
migrations in order (``guest``, ``name``, ``source``, ``target``, ``step``, ``parking``; ``name``
is the guest's name, ``null`` in a history written before names were recorded), the ones shadow
mode would have made in shadow mode.

A **migration** object (``kind: migration``) is one event of one migration::

    {"kind": "migration", "event": "failed", "at": …, "time": …, "id": 3, "decision": 7,
     "guest": "101", "source": "pve1", "target": "pve2", "parking": false,
     "handle": "UPID:pve1:…", "started": …, "ended": …, "outcome": "failed",
     "error": "migration aborted"}

``event`` is ``started`` (the platform accepted the request: ``at`` is ``started``, and
``ended``, ``outcome`` and ``error`` are ``null``) or the outcome — ``done``, ``failed``,
``lost`` (``at`` is ``ended``). A migration whose request got no answer, or was refused, has no
``started`` event: its outcome event says when it started. ``decision`` is the id of the decision
that asked for it.

An operator's verdict on a proposal of manual mode (``kind: verdict``) is built beside the
proposals it judges, by :func:`opendrs.controller.proposals.verdict_object`.

Times: ``at``, ``started`` and ``ended`` are seconds on the backend's clock (since the epoch on a
real cluster; since the start of the simulation in the simulator), ``time`` is ``at`` in ISO 8601,
UTC. The objects hold what the history holds, nothing from the configuration's backend section:
no address, token or password (a Proxmox task id names its node and API user, as Proxmox's own
task log does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from opendrs.backends.base import Handle
from opendrs.json_data import finite, iso_time
from opendrs.model.cluster import Move

__all__ = [
    "ACTIONS",
    "MODES",
    "OUTCOMES",
    "PENDING",
    "Action",
    "Avoid",
    "Cooldown",
    "DecisionRecord",
    "MigrationRecord",
    "Mode",
    "Outcome",
    "decision_object",
    "jsonl",
    "migration_events",
    "migration_now",
    "migration_object",
    "record_object",
    "timeline",
]

Mode = Literal["shadow", "manual", "active"]
Action = Literal["none", "plan", "repair"]
Outcome = Literal["done", "failed", "lost"]

MODES: Final[tuple[str, ...]] = get_args(Mode)
ACTIONS: Final[tuple[str, ...]] = get_args(Action)
OUTCOMES: Final[tuple[str, ...]] = get_args(Outcome)

#: Handle of a migration recorded before its request was answered (or whose answer was lost).
PENDING: Final = "(pending)"


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One row of ``decisions``; ``summary`` and ``plan`` are the decoded JSON."""

    id: int
    at: float
    cluster: str
    mode: Mode
    policy: str
    action: Action
    reason: str
    imbalance: float | None
    predicted: float | None
    summary: Mapping[str, Any]
    plan: tuple[Mapping[str, Any], ...]
    #: What the decision is (the policy's ``DecisionCode``); None for a row that never said.
    code: str | None = None


@dataclass(frozen=True, slots=True)
class MigrationRecord:
    """One row of ``migrations``; ``outcome`` is ``None`` while the migration is in flight."""

    id: int
    decision: int | None
    move: Move
    handle: str
    started: float
    parking: bool
    ended: float | None
    outcome: Outcome | None
    error: str | None
    #: Where its outcome comes among all recorded outcomes (1, 2, …); ``None`` while in flight.
    ended_order: int | None = None
    #: Seconds a done move stopped the guest; ``None`` when it ran throughout.
    downtime: float | None = None
    #: The guest's name when the migration started; ``None`` where no name was ever known.
    name: str | None = None

    @property
    def guest(self) -> str:
        return self.move.guest

    @property
    def in_flight(self) -> bool:
        return self.outcome is None

    def as_handle(self) -> Handle:
        """The backend handle, to poll the migration again (e.g. after a restart)."""
        return Handle(id=self.handle, move=self.move, started=self.started)


@dataclass(frozen=True, slots=True)
class Cooldown:
    """One row of ``cooldowns``: ``guest`` is not moved before ``until``."""

    guest: str
    until: float
    reason: str


@dataclass(frozen=True, slots=True)
class Avoid:
    """One row of ``avoid``: ``guest`` keeps off ``node`` until ``until``."""

    guest: str
    node: str
    until: float
    reason: str


#: The fields of a plan's move in a decision object (``name``: the guest's, ``None`` in a
#: history written before names were recorded).
_MOVE_FIELDS = ("guest", "name", "source", "target", "step", "parking")


def decision_object(record: DecisionRecord) -> dict[str, Any]:
    """The JSON object of a recorded decision."""
    return {
        "kind": "decision",
        "at": record.at,
        "time": iso_time(record.at),
        "id": record.id,
        "cluster": record.cluster,
        "mode": record.mode,
        "policy": record.policy,
        "action": record.action,
        "act": record.action != "none",
        "code": record.code,
        "reason": record.reason,
        "stop": record.summary.get("stop"),
        "imbalance": record.imbalance,
        "predicted": record.predicted,
        "moves": [{key: step.get(key) for key in _MOVE_FIELDS} for step in record.plan],
    }


def migration_object(record: MigrationRecord, event: str) -> dict[str, Any]:
    """The JSON object of one event of a migration: ``started``, or its outcome."""
    started = event == "started"
    at = record.started if started or record.ended is None else record.ended
    return {
        "kind": "migration",
        "event": event,
        "at": at,
        "time": iso_time(at),
        "id": record.id,
        "decision": record.decision,
        "guest": record.move.guest,
        "name": record.name,
        "source": record.move.source,
        "target": record.move.target,
        "parking": record.parking,
        "handle": record.handle,
        "started": record.started,
        "ended": None if started else record.ended,
        "outcome": None if started else record.outcome,
        "error": None if started else record.error,
        "downtime": None if started else record.downtime,
    }


def migration_now(record: MigrationRecord) -> dict[str, Any]:
    """A migration as it stands: its outcome event once it ended, else its start."""
    return migration_object(record, record.outcome or "started")


def migration_events(record: MigrationRecord) -> list[dict[str, Any]]:
    """The events the history shows of a migration: ``started`` once the platform's task is
    known, and its outcome once it ended — the objects the daemon's log wrote as they happened."""
    events = []
    if record.handle != PENDING:
        events.append(migration_object(record, "started"))
    if record.outcome is not None:
        events.append(migration_object(record, record.outcome))
    return events


def record_object(record: DecisionRecord | MigrationRecord) -> dict[str, Any]:
    """What a record just written adds to the decision log (see ``History.listen``): a decision,
    a migration's start (its task became known) or its outcome."""
    if isinstance(record, DecisionRecord):
        return decision_object(record)
    return migration_now(record)


#: At one instant the daemon records the migrations that ended, then decides, then starts;
#: operators' verdicts come last.
_OUTCOME, _DECISION, _START, _VERDICT = 0, 1, 2, 3


def timeline(
    decisions: Iterable[DecisionRecord],
    migrations: Iterable[MigrationRecord],
    since: float | None = None,
    verdicts: Iterable[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Decisions, migration events and ``verdicts`` (operators' verdicts on proposals, objects
    with an ``at``) at or after ``since``, in time order — at one instant outcomes (in the order
    they were recorded), then decisions, then starts (by id), as the daemon records them, then
    verdicts."""
    keyed: list[tuple[tuple[float, int, int], dict[str, Any]]] = [
        ((item["at"], _VERDICT, 0), item) for item in verdicts
    ]
    for decision in decisions:
        item = decision_object(decision)
        keyed.append(((item["at"], _DECISION, decision.id), item))
    for record in migrations:
        for item in migration_events(record):
            if item["event"] == "started":
                keyed.append(((item["at"], _START, record.id), item))
            else:
                keyed.append(((item["at"], _OUTCOME, record.ended_order or record.id), item))
    if since is not None:
        keyed = [(key, item) for key, item in keyed if item["at"] >= since]
    keyed.sort(key=lambda pair: pair[0])
    return [item for _, item in keyed]


def jsonl(item: Mapping[str, Any]) -> str:
    """One object as one line of JSON Lines (with its newline); never ``NaN`` or ``Infinity``."""
    text = json.dumps(finite(item), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text + "\n"
