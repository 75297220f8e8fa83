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
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from opendrs.backends.base import Backend, BackendError, Clock, Handle
from opendrs.controller.history import History
from opendrs.engine.constraints import movability
from opendrs.engine.placement import PlacementState
from opendrs.engine.planner import Plan, PlannedMove, plan_moves
from opendrs.model.cluster import Cluster, Move
from opendrs.model.units import format_duration

log = logging.getLogger(__name__)

EventKind = Literal["started", "done", "failed", "skipped", "replanned", "lost"]


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


@dataclass(frozen=True, slots=True)
class Event:
    """Something the executor did or saw, for logs, the live display and reports."""

    at: float
    kind: EventKind
    move: Move | None
    detail: str = ""

    def __str__(self) -> str:
        what = f"{self.move.guest} {self.move.source} → {self.move.target}" if self.move else ""
        return " ".join(p for p in (self.kind, what, self.detail) if p)


@dataclass(slots=True)
class _Running:
    record: int
    handle: Handle
    step: int
    parking: bool
    poll_errors: int = 0


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
        self._queue: list[_Queued] = []
        self._running: dict[str, _Running] = {}  # guest id → migration in flight
        #: Steps of the unfinished moves out of each node: the ordering rule.
        self._leaving: dict[str, Counter[int]] = {}
        #: Ticks in a row in which nothing could start although nothing was in flight.
        self._stalls = 0
        self.events: list[Event] = []

    # -- state -------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A plan is being carried out: moves queued or in flight."""
        return bool(self._queue or self._running)

    @property
    def in_flight(self) -> tuple[Move, ...]:
        return tuple(r.handle.move for r in self._running.values())

    @property
    def queued(self) -> tuple[PlannedMove, ...]:
        return tuple(q.move for q in self._queue)

    def _emit(self, kind: EventKind, move: Move | None, detail: str = "") -> Event:
        event = Event(self.clock.now(), kind, move, detail)
        self.events.append(event)
        level = logging.WARNING if kind in ("failed", "lost", "skipped") else logging.INFO
        log.log(level, "%s", event)
        if self._on_event is not None:
            self._on_event(event)
        return event

    # -- plans ---------------------------------------------------------------------------------

    def submit(self, plan: Plan, decision: int | None = None) -> None:
        """Queue the moves of ``plan`` (after what is queued already)."""
        for move in plan.moves:
            self._queue.append(_Queued(move, decision))
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

        Each is polled: still running → followed from now on; finished → its outcome recorded;
        unknown to the backend → recorded as ``lost``. None is ever started again.
        """
        events: list[Event] = []
        for record in self.history.in_flight():
            move = record.move
            handle = record.as_handle()
            try:
                progress = self.backend.poll(handle)
            except BackendError as exc:
                if exc.transient:
                    self._running[record.guest] = _Running(record.id, handle, 0, record.parking)
                    continue
                self.history.migration_finished(
                    record.id, at=self.clock.now(), outcome="lost", error=exc.reason
                )
                events.append(self._emit("lost", move, f"after a restart: {exc.reason}"))
                continue
            if progress.state == "running":
                self._running[record.guest] = _Running(record.id, handle, 0, record.parking)
                events.append(self._emit("started", move, "still running after a restart"))
            else:
                events.extend(self._finish(record.id, handle, progress.state, progress.reason))
        self._index_steps()
        return events

    # -- the tick ------------------------------------------------------------------------------

    def tick(self) -> list[Event]:
        """Follow the migrations in flight and start the ones that may start now."""
        start = len(self.events)
        replan = self._poll_running()
        if self._queue:
            try:
                cluster = self.backend.observe()
            except BackendError as exc:
                log.warning("cannot observe the cluster, no migration starts now: %s", exc)
                return self.events[start:]
            if replan:
                self._replan(cluster, "a migration failed")
            else:
                self._start_ready(cluster)
        return self.events[start:]

    def _poll_running(self) -> bool:
        """Poll every migration in flight; True when one failed (the queue is re-planned)."""
        failed = False
        now = self.clock.now()
        for guest in list(self._running):
            running = self._running[guest]
            try:
                progress = self.backend.poll(running.handle)
            except BackendError as exc:
                running.poll_errors += 1
                if not exc.transient:
                    self._running.pop(guest)
                    self.history.migration_finished(
                        running.record, at=now, outcome="lost", error=exc.reason
                    )
                    self._emit("lost", running.handle.move, exc.reason)
                    failed = True
                elif now - running.handle.started > self.config.timeout:
                    failed |= self._give_up(guest, running, now)
                else:
                    log.warning("cannot poll %s: %s", running.handle.id, exc)
                continue
            if progress.state != "running":
                self._running.pop(guest)
                self._finish(running.record, running.handle, progress.state, progress.reason)
                failed |= progress.state == "failed"
            elif now - running.handle.started > self.config.timeout:
                failed |= self._give_up(guest, running, now)
        self._index_steps()
        return failed

    def _give_up(self, guest: str, running: _Running, now: float) -> bool:
        self._running.pop(guest)
        reason = f"timed out after {format_duration(int(now - running.handle.started))}"
        self._finish(running.record, running.handle, "failed", reason)
        return True

    def _finish(self, record: int, handle: Handle, state: str, reason: str | None) -> list[Event]:
        now = self.clock.now()
        move = handle.move
        if state == "done":
            self.history.migration_finished(record, at=now, outcome="done")
            self.history.set_cooldown(move.guest, now + self.config.cooldown, "moved")
            took = format_duration(max(0, int(now - handle.started)))
            return [self._emit("done", move, f"in {took}")]
        why = reason or "unknown error"
        self.history.migration_finished(record, at=now, outcome="failed", error=why)
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

    def _start_ready(self, cluster: Cluster) -> None:
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
        while index < len(self._queue) and in_flight < parallel:
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
                state = PlacementState.build(cluster)
            verdict = self._check(cluster, state, moves, arriving)
            if verdict == "wait":
                index += 1
                continue
            if verdict is not None:
                self._replan(cluster, verdict)
                return
            ok = True
            for i in group:
                queued = self._queue[i]
                if not self._start(queued):
                    ok = False
                    break
                started.append(queued.move)
            for i in sorted(group, reverse=True):
                self._queue.pop(i)
            if not ok:
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
        if started:
            self._stalls = 0
        elif not self._running and self._queue and not migrating:
            # Nothing in flight can free room or end an order: the queue is stuck as it is.
            self._stalls += 1
            if self._stalls > 1:
                self._drop_queue(cluster, "no queued migration can start, even after re-planning")
            else:
                self._replan(cluster, "no queued migration can start")

    def _drop_queue(self, cluster: Cluster, why: str) -> None:
        for q in self._queue:
            guest = q.move.guest
            source = cluster.guest(guest).node if guest in cluster.guest_index else q.move.source
            self._emit("skipped", Move(guest, source, q.move.target), why)
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
    ) -> str | None:
        """``None`` if ``moves`` may start now, ``"wait"`` if they may later, else why not."""
        index = cluster.guest_index
        members: list[int] = []
        for move in moves:
            j = index.get(move.guest)
            if j is None:
                return f"guest {move.guest} is gone"
            guest = cluster.guests[j]
            if guest.node != move.source:
                return f"guest {move.guest} is on {guest.node}, not {move.source}"
            if move.target not in cluster.node_index:
                return f"node {move.target} is gone"
            if guest.migrating_to is not None:
                return "wait"
            purpose = "evacuate" if move.parking else "balance"
            source = cluster.node(move.source)
            if not source.usable:
                purpose = "evacuate"
            reason = movability(guest, cluster, purpose)
            if reason is not None and not reason.startswith("up for"):
                return f"guest {move.guest} may not move: {reason}"
            members.append(j)
        target = cluster.node(moves[0].target)
        if not target.usable:
            return f"node {target.name} is {'offline' if not target.online else 'in maintenance'}"
        bundle = np.array(sorted(members), dtype=np.intp)
        coming = arriving.get(target.name, ())
        if coming and any(
            p in coming for j in members for p in state.constraints.hard_neg[j].tolist()
        ):
            return "wait"  # an anti-affinity partner was just started towards the target
        # Partners of the bundle that are not in this group stay where they are.
        allowed = state.allowed(bundle)
        n = cluster.node_index[target.name]
        if allowed[n]:
            return None
        reason = state.constraints.rejection(
            int(bundle[0]),
            n,
            _without(state.assign, bundle),
            state.constraints.capacity.limit - _committed_without(state, bundle),
            sum(
                (state.constraints.guest_demand(j) for j in bundle.tolist()),
                np.zeros(len(state.constraints.capacity.dims)),
            ),
        )
        # Room and anti-affinity can come free as migrations in flight end: wait for them.
        in_flight = self._running or any(g.migrating_to for g in cluster.guests)
        if in_flight and (reason is None or reason.startswith(("capacity", "hard anti-affinity"))):
            return "wait"
        return f"{moves[0].guest} → {target.name}: {reason or 'not allowed'}"

    def _start(self, queued: _Queued) -> bool:
        move = queued.move
        plain = Move(move.guest, move.source, move.target)
        try:
            handle = self.backend.start_migration(plain)
        except BackendError as exc:
            now = self.clock.now()
            self.history.avoid(
                move.guest, move.target, now + self.config.avoid_after_failure, f"refused: {exc}"
            )
            record = self.history.migration_started(
                decision=queued.decision,
                move=plain,
                handle="(refused)",
                at=now,
                parking=move.parking,
            )
            self.history.migration_finished(record, at=now, outcome="failed", error=exc.reason)
            self._emit("failed", plain, f"refused: {exc.reason}")
            return False
        record = self.history.migration_started(
            decision=queued.decision,
            move=plain,
            handle=handle.id,
            at=handle.started,
            parking=move.parking,
        )
        self._running[move.guest] = _Running(record, handle, move.step, move.parking)
        detail = "parking, to break a cycle" if move.parking else f"step {move.step}"
        self._emit("started", plain, detail)
        return True

    # -- re-planning ---------------------------------------------------------------------------

    def _replan(self, cluster: Cluster, why: str) -> None:
        """Order the rest of the queue again from the real state (``cluster``)."""
        if not self._queue:
            return
        decision = self._queue[0].decision
        # Where each guest should end: the last move of each guest in the queue.
        final: dict[str, str] = {}
        expected: dict[str, str] = {}
        for q in self._queue:
            final[q.move.guest] = q.move.target
            expected.setdefault(q.move.guest, q.move.source)
        avoided = self.history.avoided(self.clock.now())
        dropped: list[tuple[str, str, str]] = []
        target: dict[str, str] = {}
        for guest, node in final.items():
            if guest not in cluster.guest_index or node not in cluster.node_index:
                dropped.append((guest, node, "no longer in the cluster"))
            elif guest in self._running:
                dropped.append((guest, node, "already migrating"))
            elif cluster.guest(guest).node != expected[guest]:
                where = cluster.guest(guest).node
                dropped.append((guest, node, f"moved by someone else (now on {where})"))
            elif (guest, node) in avoided:
                dropped.append((guest, node, "a migration there failed"))
            else:
                target[guest] = node
        self._queue = []
        plan = plan_moves(
            cluster,
            target,
            max_parallel=self._limits(cluster)[0],
            max_node_inflow=self._limits(cluster)[1],
        )
        for guest, node, reason in dropped:
            source = cluster.guest(guest).node if guest in cluster.guest_index else "?"
            self._emit("skipped", Move(guest, source, node), reason)
        for guest, node in plan.unreachable:
            self._emit("skipped", Move(guest, cluster.guest(guest).node, node), "unreachable now")
        # Steps continue after those in flight, so the ordering rule keeps them behind.
        offset = max((r.step for r in self._running.values()), default=0)
        for move in plan.moves:
            self._queue.append(_Queued(replace(move, step=move.step + offset), decision))
        self._index_steps()
        self._emit("replanned", None, f"{why}: {len(plan.moves)} migration(s) left")


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
