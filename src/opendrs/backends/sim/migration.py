"""A migration in the simulator's books: :class:`Migration`, mutable until it ends."""

from __future__ import annotations

from opendrs.model.cluster import Move

from .results import Cause, MigrationRecord, Outcome

__all__ = ["Migration"]


class Migration:
    """A migration in the simulator's books (mutable until it ends)."""

    __slots__ = (
        "bytes",
        "cause",
        "ended",
        "guest",
        "handle",
        "hangs",
        "lost_answer",
        "move",
        "outcome",
        "reason",
        "restart",
        "source",
        "started",
        "target",
    )

    def __init__(
        self,
        handle: str,
        move: Move,
        guest: int,
        source: int,
        target: int,
        started: float,
        cause: Cause,
        size: int,
        restart: bool = False,
    ) -> None:
        self.handle = handle
        self.move = move
        self.guest = guest
        self.source = source
        self.target = target
        self.started = started
        self.cause: Cause = cause
        self.bytes = size
        self.restart = restart
        self.ended: float | None = None
        self.outcome: Outcome = "running"
        self.reason: str | None = None
        #: It hangs: it ends only when cancelled or when one of its nodes fails.
        self.hangs = False
        #: The request's answer is lost: ``start_migration`` raises although it started.
        self.lost_answer = False

    def record(self) -> MigrationRecord:
        return MigrationRecord(
            self.handle,
            self.move.guest,
            self.move.source,
            self.move.target,
            self.started,
            self.ended,
            self.outcome,
            self.reason,
            self.cause,
            self.bytes,
            self.restart,
        )
