"""The daemon's promises as properties: the controller (policy, planner, streaming executor and
history) against a scripted platform that misbehaves at random.

Hypothesis draws a small cluster and a stream of events — migrations that fail, hang or lose
their answer, guests that get locked or shut down, nodes that go offline or into maintenance,
reloads between active and shadow mode, restarts of the daemon — and after every event checks:

* no migration starts while the controller is not in active mode;
* no state is over a node's capacity or breaks a hard anti-affinity rule, counting a migrating
  guest on both nodes — replayed here from the guests' sizes, independently of the engine's
  capacity code;
* the executor is never busy with nothing of its own in flight for longer than its stall
  timeout, so the policy always decides again;
* in the end every migration the platform performed has exactly one history row, with its real
  outcome, and nothing else has a row but refused requests.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes import GIB, FakeBackend, FakeClock
from opendrs.backends.base import Handle, StartGate
from opendrs.controller.config import BackendConfig, Config
from opendrs.controller.executor import ExecutorConfig
from opendrs.controller.history import History
from opendrs.controller.loop import Controller, Cycle
from opendrs.engine.policy import PolicyConfig
from opendrs.model.cluster import Cluster, Guest, Move, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules
from opendrs.report.reasons import explain

INTERVAL = 300
POLL = 10
TIMEOUT = 600
STALL = 900


class Broken(AssertionError):
    """An invariant did not hold."""


@dataclass
class Platform(FakeBackend):
    """The scripted platform, checking the invariants on every change."""

    controller: Controller | None = None
    anti: tuple[frozenset[str], ...] = ()
    refused_starts: list[Move] = field(default_factory=list)

    def start_migration(self, move: Move, gate: StartGate | None = None) -> Handle:
        if self.controller is None or not self.controller.config.active:
            raise Broken(f"a migration of {move.guest} started outside active mode")
        try:
            return super().start_migration(move, gate)
        except Broken:
            raise
        except Exception:
            if move.guest not in self.losing_answer:
                self.refused_starts.append(move)
            raise

    def _set(self, guest: Guest) -> None:
        super()._set(guest)
        self.check()

    def check(self) -> None:
        """Capacity and anti-affinity, a migrating guest counted on both of its nodes."""
        memory: dict[str, int] = defaultdict(int)
        vcpus: dict[str, float] = defaultdict(float)
        used: dict[str, float] = defaultdict(float)
        on: dict[str, set[str]] = defaultdict(set)
        for g in self.cluster.guests:
            if g.state == "stopped":
                continue
            for n in {g.node, g.migrating_to} - {None}:
                memory[n] += g.memory
                vcpus[n] += g.cpu
                used[n] += g.cpu_used
                on[n].add(g.id)
        for n in self.cluster.nodes:
            if memory[n.name] > n.memory:
                raise Broken(f"{n.name}: {memory[n.name]} bytes of memory > {n.memory}")
            if vcpus[n.name] > 4 * n.cpu + 1e-9 or used[n.name] > n.cpu + 1e-9:
                raise Broken(f"{n.name}: cpu over capacity")
            for group in self.anti:
                if len(group & on[n.name]) > 1:
                    raise Broken(f"{n.name}: anti-affinity partners {sorted(group & on[n.name])}")


@dataclass
class Event:
    at: float
    kind: str
    index: int


EVENT_KINDS = (
    "lock",
    "unlock",
    "stop",
    "offline",
    "online",
    "maintenance",
    "leave",
    "mode",
    "hang",
    "lose",
    "fail",
    "restart",
)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Cluster, list[Event], dict[str, float]]:
    n_nodes = draw(st.integers(3, 5))
    nodes = tuple(Node(f"n{i}", cpu=8, memory=16 * GIB) for i in range(n_nodes))
    n_guests = draw(st.integers(3, 12))
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=n_guests, max_size=n_guests))
    # Packed on the first nodes, within capacity: there is balancing to do.
    guests: list[Guest] = []
    room = {n.name: 16 for n in nodes}
    for i, size in enumerate(sizes):
        where = next((n for n in ("n0", "n1", *room) if room[n] >= size), None)
        if where is None:
            break
        room[where] -= size
        guests.append(
            Guest(
                str(100 + i),
                where,
                cpu=1,
                memory=size * GIB,
                cpu_used=0.5,
                memory_used=size * GIB,
                uptime=86400,
            )
        )
    rules = Rules()
    ids = [g.id for g in guests]
    if len(ids) >= 2 and draw(st.booleans()):
        pair = draw(st.lists(st.sampled_from(ids), min_size=2, max_size=2, unique=True))
        nodes_of = {g.id: g.node for g in guests}
        if nodes_of[pair[0]] != nodes_of[pair[1]]:
            rules = Rules(guest_affinity=(GuestAffinity("apart", tuple(pair), False, hard=True),))
    cluster = Cluster(nodes, tuple(guests), rules, Settings(max_parallel=2))
    events = draw(
        st.lists(
            st.builds(
                Event,
                st.floats(0, 6 * 3600, allow_nan=False),
                st.sampled_from(EVENT_KINDS),
                st.integers(0, 1000),
            ),
            max_size=12,
        )
    )
    durations = {g: draw(st.sampled_from([20.0, 90.0, 400.0])) for g in ids}
    return cluster, sorted(events, key=lambda e: e.at), durations


class Driver:
    """Runs the controller on a fake clock, applying the world's events on the way."""

    def __init__(self, cluster: Cluster, durations: dict[str, float]) -> None:
        self.clock = FakeClock()
        anti = tuple(frozenset(r.guests) for r in cluster.rules.guest_affinity if not r.positive)
        self.platform = Platform(cluster, self.clock, durations=durations, anti=anti)
        self.history = History(":memory:")
        policy = PolicyConfig(
            interval=INTERVAL,
            hold=1,
            smoothing=0,
            threshold=0.05,
            target=0.02,
            margin=0.0,
            min_uptime=0,
            cooldown=0,
            no_return=0,
        )
        self.config = Config(
            file="<test>",
            backend=BackendConfig("file", path="<none>"),
            history=":memory:",
            lock="<none>",
            mode="active",
            policy=policy,
            executor=ExecutorConfig(
                timeout=TIMEOUT,
                poll_interval=POLL,
                stall_timeout=STALL,
                avoid_after_failure=1800,
                cooldown=0,
            ),
        )
        #: When the policy last made a decision of its own (not "a plan is still executing").
        self.decided = 0.0
        self.controller = self._controller()

    def _controller(self) -> Controller:
        controller = Controller(
            self.config,
            self.platform,
            self.clock,
            self.history,
            on_event=lambda _e: self.check(),
            on_cycle=self._cycle,
        )
        self.platform.controller = controller
        return controller

    def _cycle(self, cycle: Cycle) -> None:
        if cycle.decision is not None and "still executing" not in explain(cycle.decision):
            self.decided = cycle.at
        self.check()

    def check(self) -> None:
        """Every invariant that holds at any moment."""
        self.platform.check()
        executor = self.controller.executor
        now = self.clock.now()
        # Waiting for our own migrations is bounded by their timeout; a queue with none of them
        # in flight may hold the policy back at most for the stall timeout.
        if executor.busy and not executor.in_flight:
            if now - self.decided > STALL + 2 * INTERVAL + 2 * POLL:
                raise Broken(f"the policy has not decided since {self.decided}")
        else:
            self.decided = now

    def run_until(self, until: float) -> None:
        self.controller.run(until=until)
        self.check()

    def apply(self, event: Event) -> None:
        p = self.platform
        guests = p.cluster.guests
        nodes = p.cluster.nodes
        g = guests[event.index % len(guests)]
        n = nodes[event.index % len(nodes)]
        if event.kind == "lock":
            self._guest(g.id, lock="backup")
        elif event.kind == "unlock":
            self._guest(g.id, lock=None)
        elif event.kind == "stop":
            self._fail_ops(lambda op: op.handle.move.guest == g.id, "guest shut down")
            self._guest(g.id, state="stopped", cpu_used=0.0)
        elif event.kind in ("offline", "online", "maintenance", "leave"):
            online = event.kind != "offline" if event.kind in ("offline", "online") else n.online
            maintenance = (
                event.kind == "maintenance"
                if event.kind in ("maintenance", "leave")
                else n.maintenance
            )
            if not online:
                self._fail_ops(
                    lambda op: n.name in (op.handle.move.source, op.handle.move.target), "node down"
                )
            nodes = tuple(
                replace(x, online=online, maintenance=maintenance) if x.name == n.name else x
                for x in nodes
            )
            p.cluster = replace(p.cluster, nodes=nodes)
        elif event.kind == "mode":
            mode = "shadow" if self.controller.config.active else "active"
            self.config = replace(self.config, mode=mode)
            self.controller.reload(self.config)
        elif event.kind == "hang":
            p.hanging.add(g.id)
        elif event.kind == "lose":
            p.losing_answer.add(g.id)
        elif event.kind == "fail":
            for target in nodes:
                p.failing[(g.id, target.name)] = "migration aborted"
        elif event.kind == "restart":
            self.controller = self._controller()
        self.check()

    def _guest(self, gid: str, **changes: object) -> None:
        p = self.platform
        guests = tuple(replace(x, **changes) if x.id == gid else x for x in p.cluster.guests)
        p.cluster = replace(p.cluster, guests=guests)

    def _fail_ops(self, which, why: str) -> None:  # type: ignore[no-untyped-def]
        p = self.platform
        for op in p.ops.values():
            if op.result is None and which(op):
                op.fails, op.hangs, op.ends = why, False, self.clock.now()
        p._settle()

    def quiet(self) -> None:
        """The world keeps still: faults stop, every node comes back; run until all settles."""
        p = self.platform
        p.hanging.clear()
        p.losing_answer.clear()
        p.failing.clear()
        for op in p.ops.values():
            op.hangs = False
        end = self.clock.now() + 2 * TIMEOUT + STALL + 4 * INTERVAL
        self.run_until(end)


def check_history(driver: Driver) -> None:
    p = driver.platform
    rows = driver.history.migrations()
    assert not [r for r in rows if r.in_flight], "migrations still in flight after the quiet"
    by_move: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in rows:
        by_move[(r.move.guest, r.move.source, r.move.target)].append(r.outcome or "")
    performed: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for op in p.ops.values():
        m = op.handle.move
        assert op.result is not None, f"the platform's migration of {m.guest} never ended"
        performed[(m.guest, m.source, m.target)].append(op.result)
    for m in p.refused_starts:
        performed[(m.guest, m.source, m.target)].append("failed")
    assert {k: sorted(v) for k, v in by_move.items()} == {
        k: sorted(v) for k, v in performed.items()
    }


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(worlds())
def test_the_controller_keeps_its_promises_in_a_misbehaving_world(
    world: tuple[Cluster, list[Event], dict[str, float]],
) -> None:
    cluster, events, durations = world
    driver = Driver(cluster, durations)
    for event in events:
        driver.run_until(event.at)
        driver.apply(event)
    driver.quiet()
    executor = driver.controller.executor
    assert not executor.busy
    last = driver.controller.cycles[-1]
    assert last.decision is not None and "still executing" not in explain(last.decision)
    check_history(driver)
