"""The executor: carries out a plan as a streaming queue of live migrations.

The next migration starts as soon as one finishes — not in waves — within ``max_parallel``
migrations in the cluster and ``max_node_inflow`` into any one node. A move may start once every
move of an earlier step that shares a node with it has finished: the planner's order is kept where
it matters (a node must be emptied before it is filled) and moves on other nodes run ahead.

Before each start the executor re-checks the move's preconditions on a fresh observation: the guest
is still on its source, not migrating, may move; the target is usable and has room for it with
every migration in flight counted on both of its nodes; no hard rule breaks (anti-affinity with a
guest on or arriving at the target, strict node affinity, architecture). A precondition that may
still come true (room that an outgoing migration will free) waits; one that will not (the guest is
gone, the target went into maintenance) makes the executor re-plan the rest of its queue from the
real state with :func:`opendrs.engine.planner.plan_moves`.

Every migration is followed to its end, with a timeout. A failure is recorded in the history, the
guest is kept off that target for a while (``avoid_after_failure``), and the rest of the queue is
re-planned from the real state. A migration that finished gets its guest a cooldown. Nothing here
sleeps: the controller calls :meth:`Executor.tick` on its clock.

Durations — a migration's ``timeout``, ``stall_timeout``, ``unseen_grace``, how long a guest has
been watched — are measured on the clock's ``monotonic`` time, so a step of the wall clock (NTP
correcting it) neither times out a migration in flight nor prolongs a wait; the wall clock
(``now``) is what the history records and the operator reads. A migration taken over after a
restart is known only by its wall-clock start: its timeout counts from when this process first
sees it.

The history tells what happened to the cluster, not what the executor hoped:

* the intent is recorded *before* the request, so a daemon killed between the request and the
  answer leaves a row that the next start reconciles;
* when the answer to a request is lost, the platform cannot be asked about the migration any more,
  or the migration is given up after ``timeout`` (the platform is asked to stop it first), the
  migration is *settled* by looking at where the guest is: on its target it is recorded ``done``
  (with its cooldown and no-return), back on its source ``failed``, gone or elsewhere ``lost``.
  A guest on its target whose source was seen offline before it got there was started again
  by HA, not migrated: ``failed``. A request whose answer was lost is looked for on the platform
  (:meth:`Backend.find_migration`) while it is watched: once found, it is followed (and stopped
  when given up on) by its task. A guest still migrating after another ``timeout`` is followed in
  the background: it no longer holds the policy back (which counts it on both nodes meanwhile)
  and is recorded when it ends; the controller ticks the executor every ``poll_interval`` while
  anything is watched or in the background.

No plan can hold the executor forever: a move whose guest may no longer move is dropped with its
reason, a re-plan never brings back a move the preconditions refused, and a queue that starts
nothing for ``stall_timeout`` while nothing of it is in flight is abandoned, so that the policy
decides afresh.

Nothing starts unless :attr:`Executor.active` (the controller's mode) is true and
:attr:`Executor.hold` (a reload or stop request pending) gives no reason: checked before each
start, and again by the backend right before the request that moves the guest, through the
:class:`~opendrs.backends.base.StartGate` every start carries — a reload or a stop that comes
while the backend reads what the start needs (a guest's status, its config, the platform's
precheck) ends those reads and the request is not sent. Such a start leaves no migration row (it
never happened): its move stays queued, and the next tick starts it or drops it as the reloaded
configuration says. A backend whose ``standby()``
gives a reason (Incus with ``leader_only``: this member no longer leads the cluster) has the queue
dropped at the next tick, its moves skipped with that reason — the new leader's instance decides
now, and two instances must not migrate at once; migrations in flight are followed to their end.
A backend whose ``platform_motions()`` names moves the platform makes itself (Proxmox: the HA
manager's migrations and relocations, queued or under way) has nothing started while one that is
not the executor's own is there, as Proxmox's own balancer waits; the queue waits (within
``stall_timeout``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from opendrs.backends.base import (
    Abandoned,
    Backend,
    BackendError,
    Clock,
    Handle,
    PlatformMotions,
    Progress,
    Standby,
    StartGate,
)
from opendrs.controller.history import History
from opendrs.engine.constraints import Rejection, movability
from opendrs.engine.placement import PlacementState
from opendrs.engine.planner import Plan, PlannedMove, final_placement, plan_moves
from opendrs.engine.view import CycleView
from opendrs.json_data import iso_time
from opendrs.model.cluster import Cluster, Guest, Move, guest_label
from opendrs.model.units import format_duration
from opendrs.records import PENDING

log = logging.getLogger(__name__)

EventKind = Literal["started", "done", "failed", "skipped", "replanned", "lost", "watching"]
#: What became of one start: the request went (or may have: followed), the platform refused it,
#: or it was held back before its request (starts are no longer allowed; its move stays queued).
StartOutcome = Literal["started", "refused", "held"]


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """Limits and timing of the executor."""

    #: Migrations at once in the cluster / into one node; ``None``: the cluster's settings.
    max_parallel: int | None = None
    max_node_inflow: int | None = None
    #: A migration still running after this many seconds is given up as failed.
    timeout: int = 3600
    #: Seconds between two looks at the migrations in flight.
    poll_interval: int = 10
    #: After a migration to a node failed, the guest is kept off that node this long.
    avoid_after_failure: int = 3600
    #: After a migration finished, the guest is not moved again for this long.
    cooldown: int = 6 * 3600
    #: A queue that starts nothing for this long, with none of its migrations in flight, is
    #: abandoned (the policy then decides afresh).
    stall_timeout: int = 900
    #: A migration whose request got no answer may take this long to show on the platform.
    unseen_grace: int = 120


@dataclass(frozen=True, slots=True)
class Event:
    """Something the executor did or saw, for logs, the live display and reports."""

    at: float
    kind: EventKind
    move: Move | None
    detail: str = ""

    def __str__(self) -> str:
        return self.describe()

    def describe(self, label: Callable[[str], str] = str) -> str:
        """The event in a line, its guest as ``label`` names it (default: its id)."""
        move = self.move
        what = f"{label(move.guest)} {move.source} → {move.target}" if move else ""
        return " ".join(p for p in (self.kind, what, self.detail) if p)


PreconditionCode = Literal["wait", "gone", "moved", "held", "target-unusable", "refused"]


@dataclass(frozen=True, slots=True)
class Precondition:
    """A precondition a queued move fails when it is about to start: ``wait`` (it may start
    later: a migration in flight holds the room or the partner it needs) or why it never will as
    planned — its guest or target is gone (``gone``), someone else moved the guest (``moved``),
    the guest may not move (``held``), the target is offline or in maintenance
    (``target-unusable``), a hard filter refuses it (``refused``)."""

    code: PreconditionCode
    text: str = ""


_WAIT = Precondition("wait")


@dataclass(slots=True)
class _Running:
    record: int
    handle: Handle
    step: int
    parking: bool
    #: When this process started it or, after a restart, first saw it (the clock's
    #: ``monotonic``): what its timeout counts from, whatever steps the wall clock takes.
    since: float
    #: Taken over from a previous process (after a restart): how long it took is only known on
    #: the wall clock (``handle.started``).
    adopted: bool = False
    poll_errors: int = 0
    #: Why it is followed by where its guest is instead of by the platform's task (``None``:
    #: by the task), and since when (``monotonic``).
    watch: str | None = None
    watch_since: float = 0.0
    #: The platform said the migration failed, with this reason.
    reported: str | None = None
    #: Watched for longer than ``timeout`` and still migrating: it no longer holds the queue
    #: (the policy decides meanwhile, counting it on both nodes) and is recorded when it ends.
    background: bool = False
    #: Its source node was seen offline while the guest had not reached the target: the live
    #: migration cannot have finished, whatever node the guest is restarted on afterwards.
    source_lost: bool = False


@dataclass(slots=True)
class _Queued:
    move: PlannedMove
    decision: int | None


class Executor:
    """Runs plans against a backend, one tick at a time."""

    def __init__(
        self,
        backend: Backend,
        clock: Clock,
        history: History,
        config: ExecutorConfig | None = None,
        *,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.history = history
        self.config = config or ExecutorConfig()
        self._on_event = on_event
        #: Whether migrations may start at all (the controller's mode is ``active``).
        self.active = True
        #: Asked before every start and right before its request: while it gives a reason (a
        #: reload or a stop is pending) nothing starts.
        self.hold: Callable[[], str | None] = lambda: None
        #: Why the queue's activity (``balance``, ``repair``…) may start nothing now — its
        #: migration window closed, a blackout began (``policy.windows``) —, or None: asked at
        #: every tick; the queue is then dropped, migrations in flight followed to their end.
        self.closed: Callable[[str], str | None] = lambda _activity: None
        #: What the queued plan does (:attr:`~opendrs.engine.policy.Decision.activity`).
        self._activity: str | None = None
        self._queue: list[_Queued] = []
        self._running: dict[str, _Running] = {}  # guest id → migration in flight
        #: Steps of the unfinished moves out of each node: the ordering rule.
        self._leaving: dict[str, Counter[int]] = {}
        #: Ticks in a row in which nothing could start although nothing was in flight.
        self._stalls = 0
        #: (guest, target) moves the preconditions refused since the queue was last empty.
        self._refused: set[tuple[str, str]] = set()
        #: When the queue last made progress (a plan came, a migration started or ended), on the
        #: clock's ``monotonic``.
        self._progress = clock.monotonic()
        self.events: list[Event] = []
        #: The view of the last fresh observation, which the preconditions and re-planning read.
        self._view: CycleView | None = None
        #: Each guest's name, from the last observation and, for a guest queued or in flight
        #: that has gone since, from when it was seen (or the history recorded it).
        self._names: dict[str, str] = {}
        #: Each guest's node, likewise: where a guest gone since was last seen.
        self._nodes: dict[str, str] = {}
        #: The platform's own moves the queue last waited for (logged when they change).
        self._platform_wait: str | None = None
        #: Guests migrating that the executor did not start → when it first saw each so (wall).
        self._foreign_since: dict[str, float] = {}
        #: Those the queue last waited for, with nothing of its own in flight (logged once).
        self._foreign_wait: frozenset[str] = frozenset()

    # -- state -------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A plan is being carried out: moves queued or in flight (but for those followed in the
        background, which no longer hold the policy back)."""
        return bool(self._queue) or any(not r.background for r in self._running.values())

    @property
    def watching(self) -> bool:
        """Some migration is followed outside the plan: by where its guest is (see
        :meth:`settle`) or in the background."""
        return any(r.watch is not None or r.background for r in self._running.values())

    @property
    def in_flight(self) -> tuple[Move, ...]:
        """Migrations in flight that the plan waits for."""
        return tuple(r.handle.move for r in self._running.values() if not r.background)

    @property
    def queued(self) -> tuple[PlannedMove, ...]:
        return tuple(q.move for q in self._queue)

    def _emit(self, kind: EventKind, move: Move | None, detail: str = "") -> Event:
        event = Event(self.clock.now(), kind, move, detail)
        self.events.append(event)
        level = (
            logging.WARNING if kind in ("failed", "lost", "skipped", "watching") else logging.INFO
        )
        # the log names the guest as the operator knows it, a gone one as it was last seen
        log.log(level, "%s", event.describe(self._label))
        if self._on_event is not None:
            self._on_event(event)
        return event

    def _label(self, guest: str) -> str:
        """``name (id)`` of ``guest`` as it was last seen (its id alone if it never had a name)."""
        return guest_label(guest, self._names.get(guest, ""))

    def _remember_names(self, cluster: Cluster) -> None:
        """The names and nodes of ``cluster``'s guests, and still those of gone guests queued or
        in flight."""
        busy = set(self._running) | {q.move.guest for q in self._queue}
        kept = {g: n for g, n in self._names.items() if g in busy}
        self._names = kept | {g.id: g.name for g in cluster.guests if g.name}
        self._nodes = {g: n for g, n in self._nodes.items() if g in busy} | {
            g.id: g.node for g in cluster.guests
        }

    def _last_node(self, cluster: Cluster, guest: str, planned: str) -> str:
        """The node ``guest`` is on in ``cluster``, else the one it was last seen on (else the
        one its move was planned from)."""
        if guest in cluster.guest_index:
            return cluster.guest(guest).node
        return self._nodes.get(guest, planned)

    # -- plans ---------------------------------------------------------------------------------

    def submit(self, plan: Plan, decision: int | None = None, activity: str | None = None) -> None:
        """Queue the moves of ``plan`` (after what is queued already); ``activity``: what it
        does, as migration windows name it (None: any time)."""
        if not self._queue:
            self._refused = set()
            self._activity = activity
        for move in plan.moves:
            self._queue.append(_Queued(move, decision))
        self._progress = self.clock.monotonic()
        self._index_steps()

    def halt(self, why: str) -> None:
        """Start nothing more of the queue; migrations in flight are still followed to their end."""
        if not self._queue:
            return
        for q in self._queue:
            self._emit("skipped", Move(q.move.guest, q.move.source, q.move.target), why)
        self._queue = []
        self._stalls = 0
        self._index_steps()

    def _index_steps(self) -> None:
        leaving: dict[str, Counter[int]] = {}
        for move, step in self._unfinished():
            leaving.setdefault(move.source, Counter())[step] += 1
        self._leaving = leaving

    def _unfinished(self) -> list[tuple[Move, int]]:
        out: list[tuple[Move, int]] = [(q.move, q.move.step) for q in self._queue]
        out.extend((r.handle.move, r.step) for r in self._running.values())
        return out

    def _blocked_by_order(self, move: PlannedMove, ahead: list[PlannedMove]) -> bool:
        """Whether an earlier move this one depends on is unfinished.

        A move depends on the earlier steps' moves *out of its target* (they make room and end
        anti-affinity there) and on the same guest's earlier moves (a parked guest moves on).
        Moves out of its source or into its target may run ahead: the live checks keep them safe.
        """
        steps = self._leaving.get(move.target)
        if steps and any(step < move.step for step in steps):
            return True
        if move.guest in self._running:
            return True
        return any(
            m.step < move.step and (m.source == move.target or m.guest == move.guest) for m in ahead
        )

    # -- restart -------------------------------------------------------------------------------

    def reconcile(self) -> list[Event]:
        """Take over the migrations the history says are in flight (after a restart).

        Each is polled: still running → followed from now on; finished → its outcome recorded.
        One the backend cannot be asked about (its request was never answered, or the platform
        no longer knows its task) is settled by where its guest is. None is ever started again.

        A migration's start is known to this process only on the wall clock, which may have been
        stepped since: its timeout (and any watch) counts from now, when this process first sees
        it, so after a restart a migration in flight gets a whole ``timeout`` again.
        """
        events: list[Event] = []
        seen = self.clock.monotonic()
        for record in self.history.in_flight():
            if record.guest in self._running:
                continue  # followed already
            move = record.move
            handle = record.as_handle()
            running = _Running(record.id, handle, 0, record.parking, seen, adopted=True)
            self._running[record.guest] = running
            if record.name and record.guest not in self._names:
                self._names[record.guest] = record.name
            if record.handle == PENDING:
                self._watch(running, "its request was not answered before a restart")
                continue
            try:
                progress = self.backend.poll(handle)
            except BackendError as exc:
                if not exc.transient:
                    self._watch(running, f"after a restart: {exc.reason}")
                continue
            if progress.state == "running":
                events.append(self._emit("started", move, "still running after a restart"))
            else:
                self._running.pop(record.guest)
                events.extend(self._finish(running, progress.state, progress.reason, progress))
        self._index_steps()
        return events

    # -- the tick ------------------------------------------------------------------------------

    def tick(self) -> list[Event]:
        """Follow the migrations in flight and start the ones that may start now."""
        start = len(self.events)
        self._poll_running()
        if self._queue and not self.active:
            self.halt("the controller is not in active mode")
        if not (self._queue or self.watching):
            return self.events[start:]
        try:
            cluster = self.backend.observe()
        except BackendError as exc:
            log.warning("cannot observe the cluster, no migration starts now: %s", exc)
            return self.events[start:]
        replan = self.settle(cluster)
        standby = self._standby()
        if standby is not None:
            self.halt(standby)
        if not self._queue or self.hold() is not None:
            return self.events[start:]
        closed = None if self._activity is None else self.closed(self._activity)
        if closed is not None:
            self.halt(closed)
        elif self._stalled():
            self.halt(
                f"no migration of the plan could start for "
                f"{format_duration(self.config.stall_timeout)}: the policy decides afresh"
            )
        elif replan:
            self._replan(cluster, "a migration failed")
        else:
            self._start_ready(cluster)
        return self.events[start:]

    def _standby(self) -> str | None:
        """Why this instance must stay idle, as the backend's last observation says (Incus's
        ``leader_only``: the member no longer leads), or ``None``."""
        return self.backend.standby() if isinstance(self.backend, Standby) else None

    def _stalled(self) -> bool:
        """A queue with nothing of it in flight that has not moved for ``stall_timeout``."""
        now = self.clock.monotonic()
        if any(not r.background for r in self._running.values()):
            self._progress = now  # waiting for a migration in flight is progress, and bounded
            return False
        return now - self._progress >= self.config.stall_timeout

    def _poll_running(self) -> None:
        """Poll every migration in flight; one that ended otherwise than done is watched (its
        outcome is then read from where its guest is)."""
        for guest in list(self._running):
            running = self._running[guest]
            if running.watch is not None and not self._found(running):
                continue
            try:
                progress = self.backend.poll(running.handle)
            except BackendError as exc:
                running.poll_errors += 1
                if not exc.transient:
                    self._watch(running, f"cannot follow its task: {exc.reason}")
                elif self._followed(running) > self.config.timeout:
                    self._give_up(running)
                else:
                    log.warning("cannot poll %s: %s", running.handle.id, exc)
                continue
            if progress.state == "done":
                self._running.pop(guest)
                self._finish(running, "done", None, progress)
            elif progress.state == "failed":
                # Where the guest is says more than the task: settled on the next observation.
                running.reported = progress.reason or "the migration failed"
                self._watch(running, running.reported, quiet=True)
            elif self._followed(running) > self.config.timeout:
                self._give_up(running)
        self._index_steps()

    def _found(self, running: _Running) -> bool:
        """For a request whose answer was lost: whether the platform now shows the migration it
        started, which is then followed (and stopped, if given up on) by its task."""
        if running.handle.id != PENDING:
            return False
        move = running.handle.move
        try:
            handle = self.backend.find_migration(move, running.handle.started)
        except BackendError as exc:
            log.debug("cannot look for the migration of %s: %s", move.guest, exc)
            return False
        if handle is None:
            return False
        self.history.migration_handle(running.record, handle.id, started=handle.started)
        running.handle = handle
        running.watch = None
        self._emit("watching", move, f"found its migration {handle.id}: followed by its task")
        return True

    def _followed(self, running: _Running) -> float:
        """Seconds since ``running`` started, or since this process took it over, on the
        monotonic clock: a step of the wall clock neither times it out nor prolongs it."""
        return self.clock.monotonic() - running.since

    def _took(self, running: _Running) -> int:
        """Whole seconds ``running`` has taken: on the monotonic clock, or on the wall clock for
        one taken over after a restart (its start is known only there)."""
        if running.adopted:
            return max(0, int(self.clock.now() - running.handle.started))
        return max(0, int(self._followed(running)))

    def _watch(self, running: _Running, why: str, *, quiet: bool = False) -> None:
        """Follow ``running`` by where its guest is from now on."""
        running.watch = why
        running.watch_since = self.clock.monotonic()
        if not quiet:
            self._emit("watching", running.handle.move, f"{why}: settled by where the guest is")

    def _give_up(self, running: _Running) -> None:
        """A migration past its timeout: ask the platform to stop it, then watch the guest."""
        took = format_duration(self._took(running))
        why = f"timed out after {took}"
        try:
            if self.backend.cancel(running.handle):
                why += ", the platform was asked to stop it"
        except BackendError as exc:
            why += f" (could not stop it: {exc.reason})"
        self._watch(running, why)

    def settle(self, cluster: Cluster) -> bool:
        """Record the watched migrations whose guest is at rest in ``cluster`` (an observation);
        True when one failed."""
        failed = False
        now = self.clock.monotonic()
        for guest in list(self._running):
            running = self._running[guest]
            if running.watch is None:
                continue
            outcome = self._where(cluster, running, now)
            if outcome is None:
                continue
            state, reason = outcome
            self._running.pop(guest)
            # No reason to keep a guest off the node it runs on (HA started it there).
            arrived = guest in cluster.guest_index and cluster.guest(guest).node == (
                running.handle.move.target
            )
            self._finish(running, state, reason, avoid=not arrived)
            failed |= state != "done"
        self._index_steps()
        return failed

    def _where(
        self, cluster: Cluster, running: _Running, now: float
    ) -> tuple[Literal["done", "failed", "lost"], str | None] | None:
        """The outcome a watched migration's guest shows, or ``None`` while it is not at rest
        (``now``: the clock's ``monotonic``)."""
        move = running.handle.move
        why = running.watch or ""
        waited = now - running.watch_since
        if move.guest not in cluster.guest_index:
            return "lost", f"{why}; the guest is no longer in the cluster"
        guest = cluster.guest(move.guest)
        if guest.node != move.target and not _online(cluster, move.source):
            running.source_lost = True
        if guest.migrating_to is not None:
            if waited >= self.config.timeout and not running.background:
                running.background = True
                self._emit(
                    "watching",
                    move,
                    f"still migrating after another {format_duration(int(waited))}: followed in "
                    "the background, the policy decides meanwhile",
                )
            return None
        if guest.node == move.target:
            if running.source_lost:
                return "failed", (
                    f"{why}; {move.source} went offline before the guest reached {move.target}, "
                    "where it was started again"
                )
            return "done", None
        if guest.node == move.source:
            if running.reported is not None:
                return "failed", running.reported
            if running.handle.id == PENDING and waited < self.config.unseen_grace:
                return None  # the platform may not show the migration yet
            return "failed", f"{why}; the guest is still on {move.source}"
        return "lost", f"{why}; the guest is on {guest.node}"

    def _finish(
        self,
        running: _Running,
        state: str,
        reason: str | None,
        progress: Progress | None = None,
        *,
        avoid: bool = True,
    ) -> list[Event]:
        """Record how a migration ended; ``progress`` is the backend's word on a done one (how
        long it stopped the guest)."""
        now = self.clock.now()
        move = running.handle.move
        self._progress = self.clock.monotonic()
        if state == "done":
            downtime = progress.downtime if progress is not None else None
            self.history.migration_finished(
                running.record, at=now, outcome="done", downtime=downtime
            )
            self.history.set_cooldown(move.guest, now + self.config.cooldown, "moved")
            took = format_duration(self._took(running))
            detail = f"in {took}"
            if downtime is not None:
                how = f" {progress.reason}" if progress is not None and progress.reason else ""
                detail += f",{how}: the guest was stopped for {downtime:.1f} s"
            return [self._emit("done", move, detail)]
        why = reason or "unknown error"
        if state == "lost":
            self.history.migration_finished(running.record, at=now, outcome="lost", error=why)
            return [self._emit("lost", move, why)]
        self.history.migration_finished(running.record, at=now, outcome="failed", error=why)
        if avoid:
            self.history.avoid(
                move.guest, move.target, now + self.config.avoid_after_failure, f"failed: {why}"
            )
        return [self._emit("failed", move, why)]

    # -- starting ------------------------------------------------------------------------------

    def _limits(self, cluster: Cluster) -> tuple[int, int]:
        settings = cluster.settings
        parallel = self.config.max_parallel or settings.max_parallel
        inflow = self.config.max_node_inflow or settings.max_node_inflow
        return parallel, inflow

    def held(self) -> str | None:
        """Why no migration may start now (the controller is not in active mode, a reload or a
        stop is pending), or ``None``: the gate of every start."""
        if not self.active:
            return "the controller is not in active mode"
        return self.hold()

    def _may_start(self) -> bool:
        return self.held() is None

    def _platform_moving(self) -> bool:
        """Whether the platform moves guests itself now (the backend's ``platform_motions``),
        other than the executor's own migrations: nothing starts meanwhile."""
        if not isinstance(self.backend, PlatformMotions):
            return False
        try:
            motions = self.backend.platform_motions()
        except BackendError as exc:
            log.warning("no migration starts now: %s", exc)
            return True
        foreign = sorted(text for guest, text in motions.items() if guest not in self._running)
        text = ", ".join(foreign) or None
        if text != self._platform_wait:
            if text is not None:
                log.info("waiting while the platform moves guests itself: %s", text)
            else:
                log.info("the platform's own moves are over: migrations may start")
            self._platform_wait = text
        return text is not None

    def _start_ready(self, cluster: Cluster) -> None:
        if self._platform_moving():
            return
        parallel, inflow_limit = self._limits(cluster)
        migrating = [g for g in cluster.guests if g.migrating_to is not None]
        inflow = Counter(g.migrating_to for g in migrating)
        seen = {g.id for g in migrating}
        # Ours that the observation does not show migrating yet (or any more) count too.
        inflow.update(r.handle.move.target for g, r in self._running.items() if g not in seen)
        in_flight = len(seen | set(self._running))
        started: list[PlannedMove] = []
        state: PlacementState | None = None
        #: Guests started towards each node in this tick (the observation does not show them).
        arriving: dict[str, list[int]] = {}
        index = 0
        while index < len(self._queue) and in_flight < parallel and self._may_start():
            group = self._bundle_at(index)
            moves = [self._queue[i].move for i in group]
            if any(self._blocked_by_order(m, started) for m in moves):
                index += 1
                continue
            target = moves[0].target
            if inflow[target] + len(moves) > inflow_limit and not (
                inflow[target] == 0 and in_flight == 0
            ):
                index += 1
                continue
            if len(moves) > 1 and in_flight + len(moves) > parallel and in_flight > 0:
                index += 1
                continue
            if state is None:
                state = PlacementState.build(cluster, self._view_of(cluster).constraints)
            verdict = self._check(cluster, state, moves, arriving)
            if verdict is not None and verdict.code == "wait":
                index += 1
                continue
            if verdict is not None:
                self._refused.update((m.guest, m.target) for m in moves)
                self._replan(cluster, verdict.text)
                return
            outcome: StartOutcome = "started"
            begun: list[int] = []
            for i in group:
                queued = self._queue[i]
                outcome = self._start(queued)
                if outcome != "started":
                    break
                begun.append(i)
                started.append(queued.move)
            # A start held back before its request stays queued (with the rest of its bundle).
            for i in sorted(begun if outcome == "held" else group, reverse=True):
                self._queue.pop(i)
            if outcome == "held":
                self._index_steps()
                return
            if outcome == "refused":
                self._index_steps()
                self._replan(self._observe_or(cluster), "a migration was refused")
                return
            in_flight += len(moves)
            inflow[target] += len(moves)
            # Count the new migrations on their targets too for the next checks (they stay on
            # their sources in ``state``, as they do in reality while they run).
            assert state is not None
            n = cluster.node_index[target]
            for move in moves:
                j = cluster.guest_index[move.guest]
                state.committed[n] += state.constraints.guest_demand(j)
                arriving.setdefault(target, []).append(j)
            self._index_steps()
        self._say_foreign_wait(migrating, bool(started))
        if started:
            self._stalls = 0
        elif not self._running and self._queue and not migrating and self._may_start():
            # Nothing in flight can free room or end an order: the queue is stuck as it is.
            self._stalls += 1
            if self._stalls > 1:
                self._drop_queue(cluster, "no queued migration can start, even after re-planning")
            else:
                self._replan(cluster, "no queued migration can start")

    def _say_foreign_wait(self, migrating: list[Guest], started: bool) -> None:
        """Log once (INFO) the migrations the executor did not start that a queue which started
        nothing, with nothing of its own in flight, waits for: each guest, its node, since when it
        is seen migrating, and until when the queue waits at most (``stall_timeout``)."""
        now = self.clock.now()
        foreign = [g for g in migrating if g.id not in self._running]
        self._foreign_since = {g.id: self._foreign_since.get(g.id, now) for g in foreign}
        idle = not started and not any(not r.background for r in self._running.values())
        waiting = frozenset(self._foreign_since) if idle else frozenset()
        if waiting == self._foreign_wait:
            return
        self._foreign_wait = waiting
        if not waiting:
            return
        left = self._progress + self.config.stall_timeout - self.clock.monotonic()
        what = "; ".join(
            f"{guest_label(g.id, g.name)} on {g.node} → {g.migrating_to}, "
            f"migrating since {iso_time(self._foreign_since[g.id])} at least"
            for g in foreign
        )
        log.info(
            "waiting for migrations opendrs did not start (they count against max_parallel): "
            "%s; the plan waits until %s at most (executor.stall_timeout)",
            what,
            iso_time(now + max(0.0, left)),
        )

    def _drop_queue(self, cluster: Cluster, why: str) -> None:
        for q in self._queue:
            source = self._last_node(cluster, q.move.guest, q.move.source)
            self._emit("skipped", Move(q.move.guest, source, q.move.target), why)
        self._queue = []
        self._stalls = 0
        self._index_steps()

    def _observe_or(self, cluster: Cluster) -> Cluster:
        try:
            return self.backend.observe()
        except BackendError:
            return cluster

    def _bundle_at(self, index: int) -> list[int]:
        """Queue positions of the moves that must start together with the one at ``index``.

        Members of a hard-affinity bundle move in the same step to the same node; the planner
        puts them together, and so are they started.
        """
        move = self._queue[index].move
        return [
            i
            for i, q in enumerate(self._queue)
            if i == index
            or (
                q.move.step == move.step
                and q.move.target == move.target
                and q.move.source == move.source
                and q.decision == self._queue[index].decision
            )
        ]

    def _check(
        self,
        cluster: Cluster,
        state: PlacementState,
        moves: list[PlannedMove],
        arriving: dict[str, list[int]],
    ) -> Precondition | None:
        """``None`` if ``moves`` may start now, else the precondition that fails (``wait``: they
        may start later)."""
        index = cluster.guest_index
        members: list[int] = []
        for move in moves:
            j = index.get(move.guest)
            if j is None:
                return Precondition("gone", f"guest {self._label(move.guest)} is gone")
            guest = cluster.guests[j]
            if guest.node != move.source:
                return Precondition(
                    "moved", f"guest {guest.label} is on {guest.node}, not {move.source}"
                )
            if move.target not in cluster.node_index:
                return Precondition("gone", f"node {move.target} is gone")
            if guest.migrating_to is not None:
                return _WAIT
            reason = _not_movable(guest, cluster, move.parking)
            if reason is not None:
                return Precondition("held", f"guest {guest.label} may not move: {reason}")
            members.append(j)
        target = cluster.node(moves[0].target)
        if not target.usable:
            state_name = "offline" if not target.online else "in maintenance"
            return Precondition("target-unusable", f"node {target.name} is {state_name}")
        bundle = np.array(sorted(members), dtype=np.intp)
        coming = arriving.get(target.name, ())
        if coming and any(
            p in coming for j in members for p in state.constraints.hard_neg[j].tolist()
        ):
            return _WAIT  # an anti-affinity partner was just started towards the target
        n = cluster.node_index[target.name]
        refusal = _refusal(state, bundle, n)
        if refusal is None:
            return None
        # Room and anti-affinity can come free as migrations in flight end: wait for them.
        in_flight = self._running or any(g.migrating_to for g in cluster.guests)
        if in_flight and refusal.code in ("capacity", "anti-affinity"):
            return _WAIT
        who = cluster.guest_label(moves[0].guest)
        return Precondition("refused", f"{who} → {target.name}: {refusal}")

    def _start(self, queued: _Queued) -> StartOutcome:
        """Start one migration: the intent is recorded first, then the backend reads what it
        needs and sends the request if the gate (:meth:`held`) still lets it."""
        move = queued.move
        plain = Move(move.guest, move.source, move.target)
        if self.held() is not None:
            # The second guard: whatever the caller did, nothing starts while starts are held.
            return "held"
        now = self.clock.now()
        record = self.history.migration_started(
            decision=queued.decision,
            move=plain,
            handle=PENDING,
            at=now,
            parking=move.parking,
            name=self._names.get(move.guest),
        )
        since = self.clock.monotonic()
        running = _Running(record, Handle(PENDING, plain, now), move.step, move.parking, since)
        self._progress = since
        try:
            handle = self.backend.start_migration(plain, StartGate(self.held))
        except BackendError as exc:
            if exc.uncertain:
                # The request may have reached the platform: where the guest goes tells.
                self._running[move.guest] = running
                self._watch(running, f"no answer to the request: {exc.reason}")
                return "started"
            if isinstance(exc, Abandoned):
                # Given up on before its request was sent (a reload or a stop came meanwhile):
                # nothing happened on the platform, so nothing is recorded or avoided.
                self.history.migration_withdrawn(record)
                why = self.held() or exc.reason
                log.warning(
                    "not started: %s %s → %s: %s", plain.guest, plain.source, plain.target, why
                )
                return "held"
            self.history.avoid(
                move.guest, move.target, now + self.config.avoid_after_failure, f"refused: {exc}"
            )
            self.history.migration_finished(record, at=now, outcome="failed", error=exc.reason)
            self._emit("failed", plain, f"refused: {exc.reason}")
            return "refused"
        self.history.migration_handle(record, handle.id, started=handle.started)
        self._running[move.guest] = replace(running, handle=handle)
        detail = "parking, to break a cycle" if move.parking else f"step {move.step}"
        self._emit("started", plain, detail)
        return "started"

    # -- re-planning ---------------------------------------------------------------------------

    def _view_of(self, cluster: Cluster) -> CycleView:
        """The view of a fresh observation: its constraints built once for the preconditions and
        the re-planning of one tick. Capacity is checked on the usage as observed — what is true
        now, not the policy's recent usage: a precondition is about the moment a migration
        starts."""
        if self._view is None or self._view.observed is not cluster:
            self._view = CycleView(cluster)
            self._remember_names(cluster)
        return self._view

    def _replan(self, cluster: Cluster, why: str) -> None:
        """Order the rest of the queue again from the real state (``cluster``).

        Moves whose guest may not move now, moves the preconditions refused, and targets a
        migration of that guest failed on are dropped with their reason: a re-plan never brings
        back what was just refused.
        """
        if not self._queue:
            return
        self._view_of(cluster)  # the names and nodes of the queued guests, before they go
        decision = self._queue[0].decision
        final = final_placement(q.move for q in self._queue)
        expected: dict[str, str] = {}
        parking: set[str] = set()
        for q in self._queue:
            expected.setdefault(q.move.guest, q.move.source)
            if q.move.parking:
                parking.add(q.move.guest)
        avoided = self.history.avoided(self.clock.now())
        dropped: list[tuple[str, str, str]] = []
        target: dict[str, str] = {}
        for guest, node in final.items():
            reason = self._drop_reason(cluster, guest, node, expected[guest], guest in parking)
            if reason is None and (guest, node) in avoided:
                reason = "a migration there failed"
            if reason is not None:
                dropped.append((guest, node, reason))
            else:
                target[guest] = node
        self._queue = []
        plan = plan_moves(
            cluster,
            target,
            max_parallel=self._limits(cluster)[0],
            max_node_inflow=self._limits(cluster)[1],
            constraints=self._view_of(cluster).constraints,
        )
        for guest, node, reason in dropped:
            source = self._last_node(cluster, guest, expected[guest])
            self._emit("skipped", Move(guest, source, node), reason)
        for guest, node in plan.unreachable:
            self._emit("skipped", Move(guest, cluster.guest(guest).node, node), "unreachable now")
        if any((m.guest, m.target) in self._refused for m in plan.moves):
            # The new order needs a move (a parking one) that the preconditions just refused.
            for move in plan.moves:
                self._emit(
                    "skipped",
                    Move(move.guest, move.source, move.target),
                    "the new order needs a move the preconditions refused",
                )
            plan = replace(plan, moves=())
        # Steps continue after those in flight, so the ordering rule keeps them behind.
        offset = max((r.step for r in self._running.values()), default=0)
        for move in plan.moves:
            self._queue.append(_Queued(replace(move, step=move.step + offset), decision))
        self._index_steps()
        self._emit("replanned", None, f"{why}: {len(plan.moves)} migration(s) left")

    def _drop_reason(
        self, cluster: Cluster, guest: str, node: str, expected: str, parking: bool
    ) -> str | None:
        """Why the queued move of ``guest`` to ``node`` cannot be planned again, or ``None``."""
        if guest not in cluster.guest_index:
            return "the guest is no longer in the cluster"
        if node not in cluster.node_index:
            return f"its target {node} is no longer in the cluster"
        if guest in self._running:
            return "already migrating"
        current = cluster.guest(guest)
        if current.node != expected:
            return f"moved by someone else (now on {current.node})"
        reason = _not_movable(current, cluster, parking)
        if reason is not None:
            return f"may not move: {reason}"
        if (guest, node) in self._refused:
            return "refused by the preconditions"
        return None


def _refusal(state: PlacementState, bundle: np.ndarray, n: int) -> Rejection | None:
    """The first hard filter that refuses moving ``bundle`` to node ``n`` now, with its details;
    ``None`` when the move may start.

    As in the planner's model of the states in between, hard affinity refuses a move only when
    it would part a guest from partners it is with now: a guest already apart from them (a
    repair parks it, or brings it to them in steps) may go where the plan sends it.
    """
    cons = state.constraints
    assign = _without(state.assign, bundle)
    headroom = cons.capacity.limit - _committed_without(state, bundle)
    demand = sum(
        (cons.guest_demand(j) for j in bundle.tolist()), np.zeros(len(cons.capacity.dimensions))
    )
    for j in bundle.tolist():
        for name, mask in cons.hard_masks(j, assign, headroom, demand):
            if mask[n] or (name == "affinity" and not _with_partners(state, j, bundle)):
                continue
            return cons.rejection(name, j, n, assign, headroom, demand)
    return None


def _with_partners(state: PlacementState, j: int, bundle: np.ndarray) -> bool:
    """Whether guest ``j`` shares its node with a hard-affinity partner outside ``bundle``."""
    partners = np.setdiff1d(state.constraints.hard_pos[j], bundle)
    return bool(np.any(state.assign[partners] == state.assign[j]))


def _online(cluster: Cluster, node: str) -> bool:
    """Whether ``node`` is in ``cluster`` and online (in maintenance or not)."""
    index = cluster.node_index.get(node)
    return index is not None and cluster.nodes[index].online


def _not_movable(guest: Guest, cluster: Cluster, parking: bool) -> str | None:
    """Why ``guest`` may not start a queued move now (its minimum uptime was the policy's)."""
    purpose = "evacuate" if parking else "balance"
    source = (
        cluster.nodes[cluster.node_index[guest.node]] if guest.node in cluster.node_index else None
    )
    if source is not None and not source.usable:
        purpose = "evacuate"
    held = movability(guest, cluster, purpose)
    if held is None or held.code == "uptime":
        return None
    return str(held)


def _without(assign: np.ndarray, members: np.ndarray) -> np.ndarray:
    out = assign.copy()
    out[members] = -1
    return out


def _committed_without(state: PlacementState, members: np.ndarray) -> np.ndarray:
    committed = state.committed.copy()
    for j in members.tolist():
        n = int(state.assign[j])
        if n >= 0:
            committed[n] -= state.constraints.guest_demand(j)
    return committed
