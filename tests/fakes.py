"""A small scripted backend and clock for controller tests: exact control over every migration."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from opendrs.backends.base import (
    DONE,
    RUNNING,
    BackendError,
    Handle,
    Progress,
    StartGate,
    failed,
)
from opendrs.controller.executor import Executor, ExecutorConfig
from opendrs.controller.history import History
from opendrs.engine.constraints import Constraints, current_assign
from opendrs.model.cluster import Cluster, Guest, Move, Node, Settings

GIB = 1024**3


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)


def stepped_time(seconds: float) -> SimpleNamespace:
    """The ``time`` module of a host whose wall clock (``time.time``) was stepped ``seconds``
    forward, as NTP or a resumed VM does; its monotonic clock and its sleep are the real ones."""
    return SimpleNamespace(
        time=lambda: time.time() + seconds, monotonic=time.monotonic, sleep=time.sleep
    )


@dataclass
class _Op:
    handle: Handle
    ends: float
    fails: str | None
    hangs: bool = False
    #: How it really ended on the platform: ``done`` (the guest moved) or ``failed``.
    result: str | None = None


@dataclass
class FakeBackend:
    """Migrations take ``duration`` seconds (per guest in ``durations``), fail when scripted."""

    cluster: Cluster
    clock: FakeClock
    duration: float = 30.0
    durations: dict[str, float] = field(default_factory=dict)
    #: (guest, target) → reason: that migration fails at its end.
    failing: dict[tuple[str, str], str] = field(default_factory=dict)
    #: guests whose start is refused.
    refusing: set[str] = field(default_factory=set)
    #: guests whose migration starts but whose answer is lost (an uncertain error).
    losing_answer: set[str] = field(default_factory=set)
    #: guests whose migrations never end (until cancelled).
    hanging: set[str] = field(default_factory=set)
    cancelled: list[str] = field(default_factory=list)
    #: Whether a migration whose answer was lost can be found (``find_migration``).
    findable: bool = True
    observe_errors: int = 0
    name: str = "fake"
    read_only: bool = False
    starts: list[Move] = field(default_factory=list)
    ops: dict[str, _Op] = field(default_factory=dict)
    #: Hard-constraint violations seen in any state, with migrations in flight counted.
    violations: list[str] = field(default_factory=list)
    #: Called with each move between the reads of its start and its request (a signal that
    #: comes while the platform is read).
    during_reads: Callable[[Move], None] | None = None

    def _settle(self) -> None:
        now = self.clock.now()
        for op in self.ops.values():
            guest = self.cluster.guest(op.handle.move.guest)
            target = op.handle.move.target
            if (
                op.result is None
                and op.ends <= now
                and guest.migrating_to == target
                and not op.hangs
            ):
                node = guest.node if op.fails else op.handle.move.target
                op.result = "failed" if op.fails else "done"
                self._set(replace(guest, node=node, migrating_to=None))

    def _set(self, guest: Guest) -> None:
        guests = tuple(guest if g.id == guest.id else g for g in self.cluster.guests)
        self.cluster = replace(self.cluster, guests=guests)
        cons = Constraints.build(self.cluster)
        over = cons.capacity.over(cons.capacity.committed())
        for n in range(len(self.cluster.nodes)):
            if over[n].any():
                self.violations.append(f"{self.cluster.nodes[n].name} over capacity")
        self.violations.extend(cons.violations(current_assign(self.cluster)))

    def observe(self) -> Cluster:
        if self.observe_errors:
            self.observe_errors -= 1
            raise BackendError("fake API error")
        self._settle()
        return self.cluster

    def start_migration(self, move: Move, gate: StartGate | None = None) -> Handle:
        self._settle()
        if move.guest in self.refusing:
            raise BackendError(f"{move.guest} is locked", transient=False)
        guest = self.cluster.guest(move.guest)
        if guest.node != move.source or guest.migrating_to is not None:
            raise BackendError(f"{move.guest} is not on {move.source}", transient=False)
        if self.during_reads is not None:
            self.during_reads(move)
        if gate is not None:
            gate.enter(f"migration of {move.guest}")
        handle = Handle(f"op-{len(self.starts) + 1}", move, self.clock.now())
        self.starts.append(move)
        ends = self.clock.now() + self.durations.get(move.guest, self.duration)
        fails = self.failing.get((move.guest, move.target))
        self.ops[handle.id] = _Op(handle, ends, fails, move.guest in self.hanging)
        self._set(replace(guest, migrating_to=move.target))
        if move.guest in self.losing_answer:
            raise BackendError("no answer within 10s", uncertain=True)
        return handle

    def find_migration(self, move: Move, since: float) -> Handle | None:
        if not self.findable:
            return None
        for op in self.ops.values():
            if op.handle.move == move and op.handle.started >= since:
                return op.handle
        return None

    def cancel(self, handle: Handle) -> bool:
        op = self.ops.get(handle.id)
        if op is None:
            raise BackendError(f"no task {handle.id}", transient=False)
        self.cancelled.append(handle.id)
        guest = self.cluster.guest(handle.move.guest)
        if guest.migrating_to == handle.move.target:
            op.fails, op.hangs, op.ends = "cancelled", False, self.clock.now()
            op.result = "failed"
            self._set(replace(guest, migrating_to=None))
        return True

    def poll(self, handle: Handle) -> Progress:
        self._settle()
        op = self.ops.get(handle.id)
        if op is None:
            raise BackendError(f"no task {handle.id}", transient=False)
        if self.clock.now() < op.ends or op.hangs:
            return RUNNING
        return failed(op.fails) if op.fails else DONE

    def set_maintenance(self, node: str, enabled: bool) -> None:
        nodes = tuple(
            replace(n, maintenance=enabled) if n.name == node else n for n in self.cluster.nodes
        )
        self.cluster = replace(self.cluster, nodes=nodes)

    def close(self) -> None:
        return None


def node(name: str, cpu: float = 8, memory_gib: int = 16) -> Node:
    return Node(name, cpu=cpu, memory=memory_gib * GIB)


def guest(gid: str, where: str, memory_gib: float = 2, cpu: float = 1, used: float = 0.5) -> Guest:
    memory = int(memory_gib * GIB)
    return Guest(
        gid,
        where,
        cpu=cpu,
        memory=memory,
        cpu_used=used * cpu,
        memory_used=memory,
        uptime=86400,
    )


def cluster(nodes: list[Node], guests: list[Guest], **settings: object) -> Cluster:
    return Cluster(tuple(nodes), tuple(guests), settings=Settings(**settings))  # type: ignore[arg-type]


def run_executor(
    executor: Executor, clock: FakeClock, step: float = 5.0, limit: int = 2000
) -> float:
    """Tick ``executor`` every ``step`` seconds until it is idle; the seconds it took."""
    begin = clock.now()
    for _ in range(limit):
        executor.tick()
        if not executor.busy:
            return clock.now() - begin
        clock.sleep(step)
    raise AssertionError("the executor never went idle: " + "; ".join(map(str, executor.events)))


def setup_executor(
    c: Cluster, *, config: ExecutorConfig | None = None, **backend: object
) -> tuple[FakeBackend, FakeClock, History, Executor]:
    """A fake backend on ``c``, its clock, a history in memory and an executor over them."""
    clock = FakeClock()
    fake = FakeBackend(c, clock, **backend)  # type: ignore[arg-type]
    history = History(":memory:")
    executor = Executor(fake, clock, history, config or ExecutorConfig(poll_interval=5))
    return fake, clock, history, executor
