"""The proposals of manual mode: a decision's plan waiting for an operator.

In ``mode: manual`` a decision to act whose kind is not ``automatic`` is not handed to the
executor: its moves are stored in the history (table ``proposals``) as a proposal with a short
id, and wait there — through restarts — until an operator approves or rejects it (``opendrs
approve``/``reject``, or the dashboard), or it expires. An approved proposal is checked again
against a fresh observation (:mod:`opendrs.controller.approval`) before anything starts.

This module holds the record and its rows; it imports nothing of the engine.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from opendrs.json_data import iso_time

__all__ = [
    "KINDS",
    "STATES",
    "ProposalRecord",
    "ProposedMove",
    "choose_moves",
    "open_proposal",
    "proposal_columns",
    "proposal_id",
    "proposal_record",
    "verdict_object",
]

#: What a proposal does, as migration windows name it (``policy.windows``): ``balance`` (a
#: balancing plan), ``maintenance`` (guests leaving a node in maintenance), ``return``
#: (evacuated guests back to their node once its maintenance ends), ``repair`` (moves that mend
#: another broken hard constraint, or relieve a hot node).
KINDS: Final = ("balance", "maintenance", "return", "repair")
#: ``open`` waits for an operator; ``approved`` waits for the daemon's next cycle; ``started``
#: was handed to the executor; ``rejected`` and ``expired`` are final.
STATES: Final = ("open", "approved", "rejected", "expired", "started")


@dataclass(frozen=True, slots=True)
class ProposedMove:
    """One move of a proposal: ``guest`` (its id; ``name`` for the operator) from ``source`` to
    ``target``."""

    guest: str
    name: str
    source: str
    target: str

    def label(self) -> str:
        """``name (id) source → target``, as the operator reads it."""
        who = self.guest if self.name in ("", self.guest) else f"{self.name} ({self.guest})"
        return f"{who} {self.source} → {self.target}"

    def as_dict(self) -> dict[str, str]:
        return {
            "guest": self.guest,
            "name": self.name,
            "source": self.source,
            "target": self.target,
        }


@dataclass(frozen=True, slots=True)
class ProposalRecord:
    """A proposal as the history keeps it (see :mod:`opendrs.controller.history_file`)."""

    id: str
    decision: int
    at: float
    kind: str
    reason: str
    imbalance: float | None
    predicted: float | None
    moves: tuple[ProposedMove, ...]
    state: str = "open"
    #: The approved moves' 1-based numbers (``None``: all of them).
    chosen: tuple[int, ...] | None = None
    by: str | None = None
    decided: float | None = None
    note: str | None = None

    def chosen_moves(self) -> tuple[ProposedMove, ...]:
        """The moves approved (all of them when no subset was chosen)."""
        if self.chosen is None:
            return self.moves
        return tuple(self.moves[n - 1] for n in self.chosen if 1 <= n <= len(self.moves))

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "decision": self.decision,
            "at": self.at,
            "kind": self.kind,
            "reason": self.reason,
            "imbalance": self.imbalance,
            "predicted": self.predicted,
            "moves": [m.as_dict() for m in self.moves],
            "state": self.state,
            "chosen": None if self.chosen is None else list(self.chosen),
            "by": self.by,
            "decided": self.decided,
            "note": self.note,
        }


def verdict_object(proposal: ProposalRecord) -> dict[str, Any] | None:
    """The JSON object of an operator's verdict on ``proposal`` (``kind: verdict``, ``event``
    ``approved`` or ``rejected``, ``at`` when, ``by`` who, ``moves`` the moves approved), or
    ``None`` when no operator decided it. It holds the verdict as given, not what became of the
    proposal after (``opendrs proposals --all``): the decision log's line and ``opendrs history``
    show the same object."""
    if proposal.by is None or proposal.decided is None:
        return None
    rejected = proposal.state == "rejected"
    return {
        "kind": "verdict",
        "event": "rejected" if rejected else "approved",
        "at": proposal.decided,
        "time": iso_time(proposal.decided),
        "proposal": proposal.id,
        "decision": proposal.decision,
        "activity": proposal.kind,
        "by": proposal.by,
        "moves": [m.as_dict() for m in (proposal.moves if rejected else proposal.chosen_moves())],
    }


def proposal_id(at: float, moves: Sequence[ProposedMove]) -> str:
    """8 hex digits of a hash of the time and the moves: the same decision, the same id."""
    content = json.dumps([round(at, 3), [m.as_dict() for m in moves]], sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()[:8]


def proposal_columns(proposal: ProposalRecord) -> dict[str, object]:
    """The row of ``proposal`` (its state, verdict and note as they are)."""
    return {
        "id": proposal.id,
        "decision": proposal.decision,
        "at": proposal.at,
        "kind": proposal.kind,
        "reason": proposal.reason,
        "imbalance": proposal.imbalance,
        "predicted": proposal.predicted,
        "moves": json.dumps([m.as_dict() for m in proposal.moves]),
        "state": proposal.state,
    }


def proposal_record(row: sqlite3.Row) -> ProposalRecord:
    moves = tuple(ProposedMove(**m) for m in json.loads(row["moves"]))
    chosen = None if row["chosen"] is None else tuple(int(n) for n in json.loads(row["chosen"]))
    return ProposalRecord(
        id=row["id"],
        decision=int(row["decision"]),
        at=float(row["at"]),
        kind=row["kind"],
        reason=row["reason"],
        imbalance=row["imbalance"],
        predicted=row["predicted"],
        moves=moves,
        state=row["state"],
        chosen=chosen,
        by=row["by"],
        decided=row["decided"],
        note=row["note"],
    )


def choose_moves(proposal: ProposalRecord, items: Sequence[str]) -> tuple[int, ...]:
    """The 1-based numbers of the moves ``items`` name: numbers, guest ids or guest names.
    Raises ValueError for one the proposal does not have, or for none."""
    chosen: set[int] = set()
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        if item.isdigit() and 1 <= int(item) <= len(proposal.moves):
            chosen.add(int(item))
            continue
        found = [n for n, m in enumerate(proposal.moves, start=1) if item in (m.guest, m.name)]
        if not found:
            raise ValueError(
                f"proposal {proposal.id} has no move {item!r} (its moves: 1 to "
                f"{len(proposal.moves)}, or a guest's name or id)"
            )
        chosen.add(found[0])
    if not chosen:
        raise ValueError("no move named")
    return tuple(sorted(chosen))


def open_proposal(proposals: Sequence[ProposalRecord], proposal_id: str) -> ProposalRecord:
    """The open proposal ``proposal_id`` of ``proposals``. Raises LookupError when none has that
    id, ValueError when it is no longer open (one line each)."""
    by_id = {p.id: p for p in proposals}
    proposal = by_id.get(proposal_id.strip().lower())
    if proposal is None:
        waiting = ", ".join(p.id for p in proposals if p.state == "open") or "none"
        raise LookupError(f"no proposal {proposal_id!r} (open ones: {waiting})")
    if proposal.state != "open":
        why = f": {proposal.note}" if proposal.note else ""
        raise ValueError(f"proposal {proposal.id} is {proposal.state}, not open{why}")
    return proposal
