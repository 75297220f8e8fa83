"""The simulated cluster: opendrs.backends.sim and its workload patterns."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import clusters
from opendrs.backends.base import DONE, RUNNING, Backend, BackendError, Clock, Handle
from opendrs.backends.scenario import Fault, MigrationModel, Scenario, builtin_scenario
from opendrs.backends.sim import MigrationRecord, NodeEvent, Simulator
from opendrs.backends.sim.statistics import HOT, HOT_WINDOW, StepStatistics, steps_in
from opendrs.backends.workload import (
    Diurnal,
    Pattern,
    Ramp,
    Selector,
    Spikes,
    Surge,
    Trace,
    TraceSeries,
    UsageGenerator,
    Walk,
    Weekly,
    Workload,
)
from opendrs.engine.imbalance import balance_spread
from opendrs.engine.usage import CapacityModel, LoadModel
from opendrs.model.cluster import HA_STATES, Cluster, Disk, Guest, Move, Node, Settings
from opendrs.model.rules import NodeAffinity, Rules
from opendrs.model.snapshot import dumps

GiB = 1024**3
MiB = 1024**2
HOUR = 3600.0
DAY = 86400.0


def node(name: str, cpu: float = 16, memory: int = 64 * GiB, **fields: object) -> Node:
    return Node(name, cpu, memory, **fields)  # type: ignore[arg-type]


def guest(gid: str, on: str, **fields: object) -> Guest:
    values: dict[str, object] = {
        "cpu": 4.0,
        "memory": 8 * GiB,
        "cpu_used": 2.0,
        "memory_used": 4 * GiB,
    }
    values.update(fields)
    return Guest(gid, on, **values)  # type: ignore[arg-type]


def simulator(
    nodes: tuple[Node, ...],
    guests: tuple[Guest, ...],
    *,
    days: float | None = None,
    threshold: float = 0.15,
    window: float = 0.0,
    cluster_settings: Settings | None = None,
    **scenario: object,
) -> Simulator:
    cluster = Cluster(nodes, guests, settings=cluster_settings or Settings())
    return Simulator(
        Scenario(cluster, **scenario),  # type: ignore[arg-type]
        days=days,
        threshold=threshold,
        window=window,
    )


def two_nodes(**scenario: object) -> Simulator:
    return simulator((node("a"), node("b")), (guest("1", "a"),), **scenario)


# --------------------------------------------------------------------------------------------
# Clock and backend


def test_it_is_a_backend_and_a_clock() -> None:
    sim = two_nodes()
    assert isinstance(sim, Backend) and isinstance(sim, Clock)
    assert (sim.name, sim.read_only) == ("sim", False)
    assert sim.now() == 0.0 and sim.end == DAY and not sim.finished


def test_the_snapshots_ha_scheduler_mode_is_observed() -> None:
    """What ``failover_recovery: auto`` judges by in the simulator, as on the live cluster."""
    cluster = Cluster((node("a"), node("b")), (guest("1", "a"),), ha_scheduler="static")
    sim = Simulator(Scenario(cluster), days=None, threshold=0.15, window=0.0)
    assert sim.observe().ha_scheduler == "static"
    assert two_nodes().observe().ha_scheduler is None


def test_sleep_advances_and_stops_at_the_end() -> None:
    sim = two_nodes(step=60, duration=2 * HOUR)
    sim.sleep(90)
    assert sim.now() == 90.0
    sim.sleep(-5)
    sim.sleep(0)
    assert sim.now() == 90.0
    sim.sleep(10 * DAY)
    assert sim.now() == 2 * HOUR and sim.finished
    sim.sleep(60)
    assert sim.now() == 2 * HOUR
    assert sim.stats().steps == 120 and sim.stats().seconds == 2 * HOUR


def test_days_override_the_duration() -> None:
    sim = two_nodes(duration=DAY)
    assert Simulator(sim.scenario, days=0.25).end == 6 * HOUR
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="days"):
            Simulator(sim.scenario, days=bad)
    with pytest.raises(ValueError, match="threshold"):
        Simulator(sim.scenario, threshold=-0.1)


def test_close_refuses_further_calls() -> None:
    sim = two_nodes()
    sim.close()
    with pytest.raises(BackendError) as info:
        sim.observe()
    assert not info.value.transient
    sim.sleep(60)  # the clock still works
    assert sim.now() == 60


# --------------------------------------------------------------------------------------------
# Migrations


def test_migration_takes_setup_plus_memory_over_bandwidth() -> None:
    # 4 GiB in use, 1 GiB/s, 10 s setup: 14 s.
    sim = two_nodes(migration=MigrationModel(bandwidth=GiB, setup=10))
    handle = sim.start_migration(Move("1", "a", "b"))
    assert handle == Handle("sim-1", Move("1", "a", "b"), 0.0)
    sim.sleep(13)
    assert sim.poll(handle) == RUNNING
    moving = sim.observe().guest("1")
    assert (moving.node, moving.migrating_to) == ("a", "b")
    sim.sleep(1)
    assert sim.poll(handle) == DONE
    moved = sim.observe().guest("1")
    assert (moved.node, moved.migrating_to) == ("b", None)
    assert sim.migrations == (
        MigrationRecord("sim-1", "1", "a", "b", 0.0, 14.0, "done", None, "controller", 4 * GiB),
    )
    stats = sim.stats()
    assert (stats.migrations, stats.migrations_done, stats.migrated_bytes) == (1, 1, 4 * GiB)


def test_local_disks_are_copied_too() -> None:
    disk = (Disk("local", 2 * GiB),)
    sim = simulator(
        (node("a", storage={"local": 10 * GiB}), node("b", storage={"local": 10 * GiB})),
        (guest("1", "a", disks=disk),),
        migration=MigrationModel(bandwidth=GiB, setup=10),
    )
    sim.start_migration(Move("1", "a", "b"))
    sim.sleep(16)
    assert sim.migrations[0].ended == 16.0 and sim.migrations[0].bytes == 6 * GiB


def test_a_migrating_guest_loads_both_nodes() -> None:
    # 4 GiB at 64 MiB/s + 10 s = 74 s: steps at 0 (before), 60 (during) and 120 (after).
    sim = two_nodes(migration=MigrationModel(bandwidth=64 * MiB, setup=10), step=60)
    sim.start_migration(Move("1", "a", "b"))
    sim.sleep(30)
    now = sim.node_fractions()
    assert now.names == ("a", "b")
    assert now.cpu == (0.125, 0.125) and now.memory == (0.0625, 0.0625)
    sim.sleep(90)
    # Cores: 2 of 16 on the loaded node(s); the spread is 0.125 before and after, 0 during.
    assert sim.imbalance_series().tolist() == [0.125, 0.0, 0.125]
    assert sim.node_fractions().cpu == (0.0, 0.125)
    assert sim.stats().max_node_load == 0.125


def test_a_container_restarts_when_it_moves() -> None:
    sim = simulator(
        (node("a"), node("b")),
        (guest("1", "a", kind="ct", uptime=1000),),
        migration=MigrationModel(setup=0),
    )
    sim.start_migration(Move("1", "a", "b"))
    sim.sleep(10)
    assert sim.observe().guest("1").uptime == 6  # ended after 4 s, 6 s ago


def refusing_cluster() -> Simulator:
    nodes = (node("a"), node("b"), node("c", online=False), node("m", maintenance=True))
    guests = (
        guest("1", "a"),
        guest("2", "a", state="stopped"),
        guest("3", "a", devices=("hostpci0",)),
        guest("4", "a"),
    )
    sim = simulator(nodes, guests, migration=MigrationModel(setup=100))
    sim.start_migration(Move("4", "a", "b"))
    return sim


@pytest.mark.parametrize(
    ("move", "reason", "transient"),
    [
        (Move("9", "a", "b"), "guest 9 does not exist", False),
        (Move("1", "a", "x"), "node x does not exist", False),
        (Move("1", "b", "a"), "guest 1 is on a, not on b", False),
        (Move("1", "a", "a"), "guest 1 is already on a", False),
        (Move("4", "a", "b"), "guest 4 is already migrating to b", True),
        (Move("2", "a", "b"), "guest 2 is not running", False),
        (Move("3", "a", "b"), "local device hostpci0", False),
        (Move("1", "a", "c"), "node c is offline", True),
        (Move("1", "a", "m"), "node m is in maintenance", True),
    ],
)
def test_refused_migrations(move: Move, reason: str, transient: bool) -> None:
    sim = refusing_cluster()
    with pytest.raises(BackendError) as info:
        sim.start_migration(move)
    assert reason in str(info.value) and info.value.transient is transient
    assert len(sim.migrations) == 1


def test_poll_accepts_a_handle_rebuilt_from_stored_values() -> None:
    sim = simulator((node("a"), node("b")), (guest("1", "a"), guest("2", "a")))
    first = sim.start_migration(Move("1", "a", "b"))
    second = sim.start_migration(Move("2", "a", "b"))
    assert (first.id, second.id) == ("sim-1", "sim-2")
    stored = (second.id, second.move.guest, second.move.source, second.move.target, 0.0)
    sim.sleep(3600)
    rebuilt = Handle(stored[0], Move(*stored[1:4]), stored[4])
    assert sim.poll(rebuilt) == DONE
    with pytest.raises(BackendError, match="unknown migration sim-3") as info:
        sim.poll(Handle("sim-3", Move("1", "a", "b"), 0.0))
    assert not info.value.transient
    with pytest.raises(BackendError, match="moves 1 from a to b, not 2"):
        sim.poll(Handle("sim-1", Move("2", "a", "b"), 0.0))


def test_random_failures_fail_part_way_and_leave_the_guest_on_its_source() -> None:
    sim = two_nodes(migration=MigrationModel(bandwidth=GiB, setup=10, failure_rate=1.0))
    handle = sim.start_migration(Move("1", "a", "b"))
    sim.sleep(14)
    progress = sim.poll(handle)
    assert progress.state == "failed" and progress.reason == "simulated migration failure"
    (record,) = sim.migrations
    assert record.outcome == "failed" and record.ended is not None
    assert 0.1 * 14 <= record.ended <= 0.9 * 14
    assert sim.observe().guest("1").node == "a"
    assert sim.stats().migrations_failed == 1


def test_scheduled_migration_failure_hits_the_next_migration_of_its_guest_once() -> None:
    sim = simulator(
        (node("a"), node("b")),
        (guest("1", "a"), guest("2", "a")),
        faults=(Fault("migration-failure", at=100.0, guest="1"),),
    )
    sim.start_migration(Move("1", "a", "b"))  # before `at`: fine
    sim.sleep(120)
    sim.start_migration(Move("2", "a", "b"))  # another guest: fine
    sim.start_migration(Move("1", "b", "a"))  # fails
    sim.sleep(60)
    sim.start_migration(Move("1", "b", "a"))  # only once
    sim.sleep(60)
    outcomes = [(r.guest, r.outcome, r.reason) for r in sim.migrations]
    assert outcomes == [
        ("1", "done", None),
        ("2", "done", None),
        ("1", "failed", "simulated migration failure (scheduled)"),
        ("1", "done", None),
    ]


def test_scheduled_failure_without_a_guest_hits_any_guest() -> None:
    sim = two_nodes(faults=(Fault("migration-failure", at=0.0),))
    sim.start_migration(Move("1", "a", "b"))
    sim.sleep(60)
    assert sim.migrations[0].outcome == "failed"


def test_a_migration_in_flight_in_the_snapshot_goes_on() -> None:
    sim = simulator((node("a"), node("b")), (guest("1", "a", migrating_to="b"),))
    assert sim.observe().guest("1").migrating_to == "b"
    sim.sleep(14)
    assert sim.observe().guest("1").node == "b"
    assert sim.migrations[0].cause == "snapshot" and sim.stats().migrations == 0


# --------------------------------------------------------------------------------------------
# Faults


def failing_cluster(**scenario: object) -> Simulator:
    nodes = (node("a"), node("b"), node("c"))
    guests = (
        guest("h1", "a", ha=True, ha_state="started", uptime=5000),
        guest("n1", "a", uptime=5000),
        guest("m1", "a"),
        guest("x", "c", cpu=8, memory=32 * GiB, cpu_used=6.0, memory_used=24 * GiB),
    )
    scenario.setdefault("faults", (Fault("node-failure", at=100.0, node="a", duration=3600.0),))
    return simulator(nodes, guests, recovery_delay=120.0, **scenario)


def test_node_failure_and_ha_recovery() -> None:
    sim = failing_cluster(migration=MigrationModel(bandwidth=16 * MiB, setup=10))
    moving = sim.start_migration(Move("m1", "a", "b"))  # 266 s: still running at 100
    sim.sleep(150)
    assert sim.poll(moving).reason == "node a failed"
    cluster = sim.observe()
    assert not cluster.node("a").online
    h1, n1 = cluster.guest("h1"), cluster.guest("n1")
    assert (h1.node, h1.state, h1.ha_state, h1.cpu_used, h1.memory_used) == (
        "a",
        "stopped",
        "fence",
        0.0,
        0,
    )
    assert (n1.state, cluster.guest("m1").state) == ("stopped", "stopped")
    assert sim.events == (NodeEvent(100.0, "a", "failed", "fault"),)
    with pytest.raises(BackendError, match="not running") as info:
        sim.start_migration(Move("h1", "a", "b"))
    assert not info.value.transient
    with pytest.raises(BackendError, match="offline") as info:
        sim.start_migration(Move("x", "c", "a"))
    assert info.value.transient
    # After the recovery delay the HA guest restarts on b (c is busier); the others stay down.
    sim.sleep(80)  # t = 230
    cluster = sim.observe()
    h1 = cluster.guest("h1")
    assert (h1.node, h1.state, h1.ha_state, h1.uptime) == ("b", "running", "started", 10)
    assert cluster.guest("n1").state == "stopped"
    recovery = sim.migrations[-1]
    assert (recovery.guest, recovery.source, recovery.target, recovery.started) == (
        "h1",
        "a",
        "b",
        220.0,
    )
    assert (recovery.cause, recovery.outcome, recovery.handle) == ("recovery", "done", "recovery-1")
    # The node returns at 3700: the others start there again.
    sim.sleep(3700 - 230 + 5)
    cluster = sim.observe()
    assert cluster.node("a").online
    for gid in ("n1", "m1"):
        assert (cluster.guest(gid).node, cluster.guest(gid).state) == ("a", "running")
        assert cluster.guest(gid).uptime == 5
    assert cluster.guest("h1").node == "b"
    assert sim.events[-1] == NodeEvent(3700.0, "a", "recovered", "fault")
    stats = sim.stats()
    assert (stats.node_failures, stats.recoveries, stats.migrations_failed) == (1, 1, 1)


def test_a_guest_that_fits_nowhere_waits_for_its_node() -> None:
    nodes = (node("a"), node("b", memory=4 * GiB))
    faults = (Fault("node-failure", at=0.0, node="a", duration=7200.0),)
    sim = simulator(
        nodes, (guest("h1", "a", ha=True, ha_state="started"),), faults=faults, recovery_delay=60
    )
    sim.sleep(30)
    assert sim.observe().guest("h1").ha_state == "fence"
    sim.sleep(570)
    assert sim.observe().guest("h1").ha_state == "recovery"
    sim.sleep(7200)
    h1 = sim.observe().guest("h1")
    assert (h1.node, h1.state, h1.ha_state) == ("a", "running", "started")
    assert sim.stats().recoveries == 0


def test_permanent_failure() -> None:
    sim = failing_cluster(faults=(Fault("node-failure", at=0.0, node="a"),))
    sim.sleep(DAY)
    assert not sim.observe().node("a").online
    assert sim.observe().guest("n1").state == "stopped"


def test_maintenance_window_sets_the_flag_and_moves_nothing() -> None:
    sim = simulator(
        (node("a"), node("b")),
        (guest("1", "a"), guest("2", "b")),
        faults=(Fault("maintenance", at=60.0, node="b", duration=600.0),),
    )
    sim.sleep(100)
    cluster = sim.observe()
    assert cluster.node("b").maintenance and cluster.guest("2").node == "b"
    with pytest.raises(BackendError, match="maintenance") as info:
        sim.start_migration(Move("1", "a", "b"))
    assert info.value.transient
    # The controller's own switch: b stays in maintenance until both are off.
    sim.set_maintenance("b", True)
    sim.sleep(600)
    assert sim.observe().node("b").maintenance
    sim.set_maintenance("b", False)
    assert not sim.observe().node("b").maintenance
    sim.set_maintenance("a", True)
    assert sim.observe().node("a").maintenance
    assert sim.events == (
        NodeEvent(60.0, "b", "maintenance-on", "fault"),
        NodeEvent(700.0, "b", "maintenance-off", "controller"),
        NodeEvent(700.0, "a", "maintenance-on", "controller"),
    )
    with pytest.raises(BackendError, match="node z does not exist"):
        sim.set_maintenance("z", True)


def test_api_error_window() -> None:
    sim = two_nodes(faults=(Fault("api-error", at=100.0, duration=50.0),))
    handle = sim.start_migration(Move("1", "a", "b"))
    sim.sleep(120)
    calls = (
        sim.observe,
        lambda: sim.start_migration(Move("1", "b", "a")),
        lambda: sim.poll(handle),
        lambda: sim.set_maintenance("a", True),
    )
    for call in calls:
        with pytest.raises(BackendError, match="simulated API error") as info:
            call()
        assert info.value.transient
    sim.sleep(30)
    assert sim.poll(handle) == DONE and sim.observe().guest("1").node == "b"
    assert sim.stats().api_errors == 4


def test_api_errors_by_probability_are_deterministic() -> None:
    def outcomes() -> list[bool]:
        sim = two_nodes(faults=(Fault("api-error", probability=0.5),), seed=3)
        out = []
        for _ in range(200):
            try:
                sim.observe()
                out.append(True)
            except BackendError:
                out.append(False)
            sim.sleep(60)
        return out

    first = outcomes()
    assert first == outcomes()
    assert 60 <= first.count(False) <= 140


def test_a_hanging_migration_runs_until_it_is_cancelled() -> None:
    sim = simulator(
        (node("a"), node("b")),
        (guest("1", "a"), guest("2", "a")),
        days=3,
        faults=(
            Fault("migration-hang", at=100.0, guest="1"),
            Fault("migration-failure", at=100.0),
        ),
    )
    sim.sleep(120)
    hung = sim.start_migration(Move("1", "a", "b"))
    sim.sleep(DAY)  # it never ends by itself
    assert sim.poll(hung) == RUNNING
    observed = sim.observe().guest("1")
    assert (observed.node, observed.migrating_to) == ("a", "b")
    fractions = sim.node_fractions()
    assert fractions.memory[1] > 0  # it loads its target meanwhile
    # The failure armed for the same moment waits for the next migration.
    other = sim.start_migration(Move("2", "a", "b"))
    sim.sleep(60)
    assert sim.cancel(hung) and sim.cancel(hung)  # twice: nothing more happens
    progress = sim.poll(hung)
    assert progress.state == "failed" and progress.reason == "cancelled by the controller"
    assert sim.observe().guest("1").node == "a"
    records = {r.handle: r for r in sim.migrations}
    assert records[other.id].reason == "simulated migration failure (scheduled)"
    assert sim.stats().hung_migrations == 1 and sim.stats().migrations_failed == 2


def test_a_hanging_migration_ends_when_its_node_fails() -> None:
    sim = simulator(
        (node("a"), node("b"), node("c")),
        (guest("1", "a", ha=True),),
        faults=(
            Fault("migration-hang", at=0.0),
            Fault("node-failure", at=HOUR, node="b", duration=HOUR),
        ),
    )
    handle = sim.start_migration(Move("1", "a", "b"))
    sim.sleep(2 * HOUR)
    progress = sim.poll(handle)
    assert progress.state == "failed" and progress.reason == "node b failed"
    assert sim.observe().guest("1").node == "a"


def test_hangs_by_probability_are_deterministic_and_per_guest() -> None:
    def hung(seed: int) -> list[tuple[str, str]]:
        sim = simulator(
            (node("a"), node("b")),
            (guest("1", "a"), guest("2", "a")),
            faults=(Fault("migration-hang", probability=0.3, guest="1"),),
            seed=seed,
            days=5,
        )
        handles: list[Handle] = []
        for _ in range(100):
            for gid in ("1", "2"):
                g = sim.observe().guest(gid)
                if g.migrating_to is None:
                    target = "b" if g.node == "a" else "a"
                    handles.append(sim.start_migration(Move(gid, g.node, target)))
            sim.sleep(60)
            for handle in handles:  # what is still running after 10 minutes hangs: stop it
                if sim.poll(handle) == RUNNING and handle.started < sim.now() - 600:
                    sim.cancel(handle)
        return [(r.guest, r.reason or "") for r in sim.migrations]

    first = hung(4)
    assert first == hung(4) and first != hung(5)
    cancelled = [g for g, reason in first if reason == "cancelled by the controller"]
    assert cancelled and set(cancelled) == {"1"}
    ones = sum(1 for g, _ in first if g == "1")
    assert 0.15 * ones <= len(cancelled) <= 0.45 * ones


def test_a_lost_answer_starts_the_migration_and_says_it_is_uncertain() -> None:
    sim = simulator(
        (node("a"), node("b")),
        (guest("1", "a"), guest("2", "a", devices=("hostpci0",))),
        faults=(Fault("api-lost-answer", at=60.0),),
    )
    sim.sleep(60)
    with pytest.raises(BackendError, match="cannot be live-migrated"):
        sim.start_migration(Move("2", "a", "b"))  # refused: the lost answer waits
    with pytest.raises(BackendError, match="simulated lost answer") as info:
        sim.start_migration(Move("1", "a", "b"))
    assert info.value.transient and info.value.uncertain
    (record,) = sim.migrations
    assert (record.guest, record.outcome, record.cause) == ("1", "running", "controller")
    assert sim.observe().guest("1").migrating_to == "b"
    sim.sleep(60)
    handle = Handle(record.handle, Move("1", "a", "b"), record.started)
    assert sim.poll(handle) == DONE and sim.observe().guest("1").node == "b"
    again = sim.start_migration(Move("1", "b", "a"))  # only once
    assert again.id == "sim-2"
    assert sim.stats().lost_answers == 1


def test_lost_answers_by_probability_are_deterministic() -> None:
    def lost(seed: int) -> list[bool]:
        sim = two_nodes(faults=(Fault("api-lost-answer", probability=0.5),), seed=seed)
        out = []
        for _ in range(100):
            g = sim.observe().guest("1")
            target = "b" if g.node == "a" else "a"
            try:
                sim.start_migration(Move("1", g.node, target))
                out.append(False)
            except BackendError as exc:
                assert exc.uncertain
                out.append(True)
            sim.sleep(60)
        assert len(sim.migrations) == 100 and sim.stats().lost_answers == out.count(True)
        return out

    first = lost(3)
    assert first == lost(3) and first != lost(4)
    assert 30 <= first.count(True) <= 70


def test_faults_of_new_kinds_leave_the_old_draws_alone() -> None:
    # Each migration's failure and its time are drawn as before the hang and lost-answer faults.
    def outcomes(*faults: Fault) -> list[tuple[str, float | None]]:
        sim = two_nodes(migration=MigrationModel(failure_rate=0.5), faults=faults, seed=9, days=2)
        for _ in range(40):
            g = sim.observe().guest("1")
            if g.migrating_to is None:
                target = "b" if g.node == "a" else "a"
                with contextlib.suppress(BackendError):
                    sim.start_migration(Move("1", g.node, target))
            sim.sleep(60)
        return [(r.outcome, r.ended) for r in sim.migrations]

    assert outcomes() == outcomes(Fault("api-lost-answer", probability=0.5))


def test_peek_is_what_observe_sees_without_faults_or_draws() -> None:
    faults = (Fault("api-error", probability=0.5), Fault("api-error", at=600.0, duration=600.0))

    def run(peek: bool) -> list[object]:
        sim = two_nodes(faults=faults, seed=3)
        out: list[object] = []
        for _ in range(40):
            if peek:
                assert dumps(sim.peek()) == dumps(sim.peek())
            try:
                cluster = sim.observe()
                out.append(dumps(cluster))
                assert sim.peek() is cluster
            except BackendError as exc:
                out.append(str(exc))
            sim.sleep(60)
        out.append(sim.stats())
        return out

    assert run(True) == run(False)
    sim = two_nodes(faults=faults)
    sim.sleep(700)
    with pytest.raises(BackendError):
        sim.observe()
    assert sim.peek().guest("1").node == "a"


def test_random_node_faults_pick_among_their_nodes() -> None:
    nodes = tuple(node(n) for n in ("a", "b", "c", "d"))
    faults = (Fault("node-failure", per_day=2.0, duration=HOUR, nodes=("b", "c")),)
    sim = simulator(nodes, (guest("1", "a"),), faults=faults, seed=5, days=10)
    sim.sleep(10 * DAY)
    failed = [e for e in sim.events if e.kind == "failed"]
    assert 8 <= len(failed) <= 35
    assert {e.node for e in failed} <= {"b", "c"}
    again = simulator(nodes, (guest("1", "a"),), faults=faults, seed=5, days=10)
    again.sleep(10 * DAY)
    assert again.events == sim.events


def test_random_maintenance_and_api_outages() -> None:
    faults = (
        Fault("maintenance", per_day=3.0, duration=HOUR, nodes=("b",)),
        Fault("api-error", per_day=12.0, duration=600.0),
    )
    sim = simulator((node("a"), node("b")), (guest("1", "a"),), faults=faults, seed=2, days=2)
    refused = 0
    while not sim.finished:
        sim.sleep(60)
        try:
            sim.observe()
        except BackendError:
            refused += 1
    kinds = {(e.node, e.kind, e.cause) for e in sim.events}
    assert kinds == {("b", "maintenance-on", "fault"), ("b", "maintenance-off", "fault")}
    # About 24 outages of 10 minutes in two days: a few hundred refused calls, not all.
    assert 50 <= refused <= 600 and refused == sim.stats().api_errors


# --------------------------------------------------------------------------------------------
# Workloads and traces


def generate(
    patterns: list[tuple[Pattern | None, Pattern | None]],
    *,
    step: float = HOUR,
    steps: int = 24 * 7,
    guests: list[Guest] | None = None,
    block: int = 24,
    seed: int = 1,
    trace: Trace | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(cpu fractions, memory fractions) over ``steps`` steps, for 4-vCPU 8 GiB guests."""
    guests = guests or [
        guest(str(i), "a", cpu_used=1.0, memory_used=2 * GiB) for i in range(len(patterns))
    ]
    generator = UsageGenerator(guests, patterns, seed=seed, step=step, block=block, trace=trace)
    blocks = [generator.block(b) for b in range(-(-steps // block))]
    cpu = np.concatenate([b[0] for b in blocks], axis=1)[:, :steps]
    memory = np.concatenate([b[1] for b in blocks], axis=1)[:, :steps]
    size = np.array([[g.cpu, g.memory] for g in guests])
    return cpu / size[:, :1], memory / size[:, 1:]


def test_default_is_the_measured_use() -> None:
    cpu, memory = generate([(None, None)])
    assert np.all(cpu == 0.25) and np.all(memory == 0.25)


def test_memory_is_whole_bytes() -> None:
    guests = [guest("1", "a", memory=8 * GiB + 1)]
    patterns = [(None, Pattern(constant=1 / 3, noise=0.1))]
    _, memory = UsageGenerator(guests, patterns, seed=1, step=60, block=100).block(0)
    assert np.all(memory == np.rint(memory)) and len(set(memory[0].tolist())) > 50


def test_constant_diurnal_weekly_and_ramp_shapes() -> None:
    patterns = [
        (Pattern(constant=0.3), Pattern(constant=1 / 3)),
        (Pattern(constant=0.5, diurnal=Diurnal(0.2, 14.0)), None),
        (Pattern(constant=0.4, weekly=Weekly(weekday=1.0, weekend=0.5)), None),
        (Pattern(ramp=Ramp(to=0.8, over=2 * DAY, start=0.2, begin=DAY)), None),
        (Pattern(constant=0.9, diurnal=Diurnal(0.3, 0.0)), None),
    ]
    cpu, memory = generate(patterns)
    assert np.all(cpu[0] == 0.3)
    assert np.allclose(memory[0] * 8 * GiB, round(8 * GiB / 3), rtol=0, atol=1e-3)
    diurnal = cpu[1]
    assert diurnal[14] == pytest.approx(0.7) and diurnal[2] == pytest.approx(0.3)
    assert diurnal[8] == pytest.approx(0.5) and diurnal[24 + 14] == pytest.approx(0.7)
    weekly = cpu[2]  # time 0 is a Monday
    assert weekly[0] == 0.4 and weekly[4 * 24 + 23] == 0.4
    assert weekly[5 * 24] == 0.2 and weekly[6 * 24 + 23] == 0.2
    ramp = cpu[3]
    assert ramp[0] == pytest.approx(0.2) and ramp[24] == pytest.approx(0.2)
    assert ramp[48] == pytest.approx(0.5) and ramp[72] == pytest.approx(0.8)
    assert ramp[100] == pytest.approx(0.8)
    clipped = cpu[4]
    assert clipped[0] == 1.0 and clipped[12] == pytest.approx(0.6)


def test_walk_starts_at_its_mean_stays_in_bounds_and_reverts() -> None:
    walk = Walk(mean=0.5, volatility=0.1, half_life=3 * HOUR, low=0.3, high=0.8)
    cpu, _ = generate([(Pattern(walk=walk), None)], step=600, steps=6 * 24 * 60)
    assert cpu[0, 0] == 0.5
    assert cpu.min() >= 0.3 and cpu.max() <= 0.8
    assert cpu.min() < 0.45 and cpu.max() > 0.55  # it does move
    assert abs(cpu.mean() - 0.5) < 0.05


def test_spikes_have_their_height_duration_and_rate() -> None:
    spikes = Spikes(rate=4.0, height=0.5, duration=1800.0)
    cpu, _ = generate([(Pattern(constant=0.1, spikes=spikes), None)], step=60, steps=30 * 1440)
    values = np.round(cpu[0], 9)
    assert set(values.tolist()) == {0.1, 0.6}
    on = values > 0.3
    edges = np.flatnonzero(np.diff(np.r_[0, on.astype(int), 0]))
    runs = edges[1::2] - edges[::2]
    assert runs.min() >= 30  # 30 minutes at least (overlapping bursts run longer)
    expected = 1 - np.exp(-4 * 0.5 / 24)  # share of time in a burst
    assert abs(on.mean() - expected) < 0.03


def test_surges_rise_hold_fall_and_add_up() -> None:
    first = Surge(at=3600.0, height=0.4, last=7200.0, rise=1800.0)
    second = Surge(at=3600.0 + 2400.0, height=0.3, last=600.0)
    cpu, _ = generate([(Pattern(constant=0.1, surges=(first, second)), None)], step=60, steps=360)
    at = {minute: round(float(cpu[0, minute]), 9) for minute in (59, 60, 75, 90, 150, 225, 240)}
    # 0.1 before; half way up after 15 of 30 minutes; 0.5 held (with the second surge from 100 to
    # 110 minutes on top); half way down 15 minutes into the fall; 0.1 after 4 hours.
    assert at == {59: 0.1, 60: 0.1, 75: 0.3, 90: 0.5, 150: 0.5, 225: 0.3, 240: 0.1}
    assert round(float(cpu[0, 100]), 9) == 0.8 and round(float(cpu[0, 110]), 9) == 0.5


def test_noise_has_its_standard_deviation() -> None:
    cpu, _ = generate([(Pattern(constant=0.5, noise=0.05), None)], steps=20000, block=1000)
    assert abs(np.std(cpu[0] - 0.5) - 0.05) < 0.003
    assert abs(np.mean(cpu[0] - 0.5)) < 0.003


RANDOM_PATTERNS = [
    (Pattern(walk=Walk(), noise=0.02), Pattern(spikes=Spikes(6.0, 0.3, 1200.0))),
    (Pattern(constant=0.2, spikes=Spikes(3.0, 0.4, 3600.0)), Pattern(noise=0.05)),
    (None, Pattern(walk=Walk(mean=0.6, volatility=0.2))),
]


def test_block_size_does_not_matter() -> None:
    small = generate(RANDOM_PATTERNS, step=300, steps=2000, block=7)
    large = generate(RANDOM_PATTERNS, step=300, steps=2000, block=1440)
    assert np.array_equal(small[0], large[0]) and np.array_equal(small[1], large[1])


@settings(max_examples=15, deadline=None)
@given(st.text(alphabet="abcxyz0123", min_size=1, max_size=6), st.integers(0, 3))
def test_adding_a_guest_changes_no_other(extra_id: str, position: int) -> None:
    guests = [guest(f"g{i}", "a") for i in range(3)]
    patterns = RANDOM_PATTERNS
    if any(g.id == extra_id for g in guests):
        return
    base = generate(list(patterns), guests=guests, step=300, steps=300)
    more_guests = [*guests[:position], guest(extra_id, "a"), *guests[position:]]
    more_patterns = [*patterns[:position], RANDOM_PATTERNS[0], *patterns[position:]]
    more = generate(more_patterns, guests=more_guests, step=300, steps=300)
    keep = [i for i in range(4) if i != position]
    assert np.array_equal(base[0], more[0][keep]) and np.array_equal(base[1], more[1][keep])


def test_trace_overrides_the_pattern_and_holds_until_the_next_sample() -> None:
    trace = Trace(
        "t.csv",
        (
            TraceSeries("1", (0.0, 120.0, 300.0), (1.0, 3.0, 100.0), (GiB, 2 * GiB, 100 * GiB)),
            TraceSeries("2", (120.0,), (0.5,), (GiB,)),
        ),
    )
    sim = simulator(
        (node("a"), node("b")),
        (guest("1", "a"), guest("2", "a")),
        workloads=(Workload(Selector(), cpu=Pattern(constant=0.75)),),
        trace=trace,
    )
    seen = []
    for _ in range(6):
        cluster = sim.observe()
        seen.append(
            tuple((cluster.guest(g).cpu_used, cluster.guest(g).memory_used) for g in ("1", "2"))
        )
        sim.sleep(60)
    assert seen == [
        ((1.0, GiB), (3.0, 4 * GiB)),  # guest 2: its pattern (cpu) and measured use (memory)
        ((1.0, GiB), (3.0, 4 * GiB)),
        ((3.0, 2 * GiB), (0.5, GiB)),
        ((3.0, 2 * GiB), (0.5, GiB)),
        ((3.0, 2 * GiB), (0.5, GiB)),
        ((4.0, 8 * GiB), (0.5, GiB)),  # clipped to the configured size
    ]


def test_unchanged_guests_are_reused() -> None:
    sim = simulator((node("a"), node("b")), (guest("1", "a"), guest("2", "a", state="stopped")))
    first = sim.observe()
    assert sim.observe() is first  # nothing happened
    sim.sleep(60)
    second = sim.observe()
    assert second.guest("2") is first.guest("2")  # stopped: nothing changed
    assert second.guest("1") is not first.guest("1")  # running: its uptime grew
    assert second.guest("1") == replace(first.guest("1"), uptime=first.guest("1").uptime + 60)


def test_observed_usage_follows_the_patterns() -> None:
    sim = two_nodes(
        workloads=(
            Workload(Selector(guests=("1",)), cpu=Pattern(constant=0.5, diurnal=Diurnal(0.25, 12))),
        ),
        step=HOUR,
    )
    sim.sleep(12 * HOUR)
    assert sim.observe().guest("1").cpu_used == pytest.approx(3.0)
    sim.sleep(30 * 60)  # within the same step
    assert sim.observe().guest("1").cpu_used == pytest.approx(3.0)


# --------------------------------------------------------------------------------------------
# Determinism and accounting


def mixed_scenario(seed: int = 11) -> Scenario:
    nodes = (
        node("a", base_cpu=0.5, base_memory=GiB),
        node("b", reserve_memory=4 * GiB),
        node("c", cpu=8, memory=32 * GiB),
    )
    guests = tuple(
        guest(str(100 + i), "abc"[i % 2], ha=i % 3 != 0, ha_state="started" if i % 3 == 1 else None)
        for i in range(9)
    )
    cluster = Cluster(nodes, guests, settings=Settings(reserve_cpu=1.0))
    return Scenario(
        cluster,
        seed=seed,
        step=60,
        duration=DAY,
        migration=MigrationModel(bandwidth=256 * MiB, setup=10, failure_rate=0.2),
        workloads=(
            Workload(Selector(match="10[0-4]"), cpu=Pattern(walk=Walk(), noise=0.05)),
            Workload(
                Selector(), cpu=Pattern(spikes=Spikes(12, 0.5, 600)), memory=Pattern(noise=0.05)
            ),
        ),
        faults=(
            Fault("node-failure", per_day=6.0, duration=1800.0),
            Fault("maintenance", per_day=4.0, duration=1200.0),
            Fault("api-error", probability=0.05),
        ),
    )


def drive(sim: Simulator, actions: list[tuple[int, int, int]]) -> list[object]:
    """Sleep, observe, and start a migration; record everything the controller would see."""
    log: list[object] = []
    handles: list[Handle] = []
    for wait, pick, target in actions:
        sim.sleep(wait)
        try:
            cluster = sim.observe()
        except BackendError as exc:
            log.append(str(exc))
            continue
        log.append(dumps(cluster))
        g = cluster.guests[pick % len(cluster.guests)]
        n = cluster.nodes[target % len(cluster.nodes)]
        try:
            handles.append(sim.start_migration(Move(g.id, g.node, n.name)))
        except BackendError as exc:
            log.append((str(exc), exc.transient))
        for handle in handles:
            try:
                log.append(sim.poll(handle))
            except BackendError as exc:
                log.append(str(exc))
    log.extend([sim.stats(), sim.migrations, sim.events, sim.node_fractions()])
    return log


actions = st.lists(
    st.tuples(st.integers(0, 1800), st.integers(0, 50), st.integers(0, 5)), min_size=1, max_size=25
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions)
def test_same_scenario_and_calls_give_the_same_results(steps: list[tuple[int, int, int]]) -> None:
    first = drive(Simulator(mixed_scenario()), steps)
    second = drive(Simulator(mixed_scenario()), steps)
    assert first == second
    assert repr(first) == repr(second)


def test_another_seed_gives_another_run() -> None:
    steps = [(600, i, i + 1) for i in range(20)]
    assert drive(Simulator(mixed_scenario(1)), steps) != drive(Simulator(mixed_scenario(2)), steps)


@st.composite
def sim_clusters(draw: st.DrawFn) -> Cluster:
    """Random clusters with HA-managed guests and migrations in flight."""
    cluster = draw(clusters(max_nodes=5, max_guests=14))
    names = [n.name for n in cluster.nodes]
    guests = []
    for g in cluster.guests:
        ha = draw(st.booleans())
        ha_state = draw(st.none() | st.sampled_from(HA_STATES)) if ha else None
        others = [n for n in names if n != g.node]
        moving = draw(st.none() | st.sampled_from(others)) if others else None
        guests.append(replace(g, ha=ha, ha_state=ha_state, migrating_to=moving))
    nodes = tuple(
        replace(
            n,
            base_cpu=draw(st.sampled_from([0.0, 0.5, 1.5])),
            base_memory=draw(st.sampled_from([0, GiB, 3 * GiB])),
            reserve_cpu=draw(st.sampled_from([None, 1.0])),
        )
        for n in cluster.nodes
    )
    weights = draw(st.sampled_from([(1.0, 1.0), (1.0, 0.0), (0.0, 2.0)]))
    settings = replace(cluster.settings, weight_cpu=weights[0], weight_memory=weights[1])
    return Cluster(nodes, tuple(guests), cluster.rules, settings)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sim_clusters(),
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 99), st.integers(0, 9)), min_size=1, max_size=6
    ),
)
def test_accounting_matches_load_and_capacity_models(
    cluster: Cluster, rounds: list[tuple[int, int, int]]
) -> None:
    first = cluster.nodes[0].name
    scenario = Scenario(
        cluster,
        step=60,
        migration=MigrationModel(bandwidth=32 * MiB, setup=5),
        workloads=(Workload(Selector(), cpu=Pattern(noise=0.1), memory=Pattern(noise=0.1)),),
        faults=(
            Fault("node-failure", at=150.0, node=first, duration=400.0),
            Fault("maintenance", per_day=50.0, duration=300.0),
        ),
        recovery_delay=30.0,
    )
    sim = Simulator(scenario, threshold=0.1, window=0)
    weights = [cluster.settings.weight_cpu, cluster.settings.weight_memory]
    for wait, pick, target in rounds:
        sim.sleep(60 * (wait - 1))
        before = sim.stats()
        sim.sleep(60)  # exactly one more step: taken now, before anything else happens
        observed = sim.observe()
        after = sim.stats()
        loads = LoadModel.build(observed, "dynamic")
        fractions = loads.fractions()
        shown = sim.node_fractions()
        np.testing.assert_allclose(shown.cpu, fractions[:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(shown.memory, fractions[:, 1], rtol=1e-12, atol=1e-12)
        usable = np.array([n.usable for n in observed.nodes])
        expected = balance_spread(fractions[usable], weights)
        assert after.last_imbalance == pytest.approx(expected, rel=1e-9, abs=1e-12)
        capacity = CapacityModel.build(observed)
        over = int(capacity.over(capacity.committed()).any(axis=1).sum())
        assert after.capacity_violations - before.capacity_violations == over
        online = np.array([n.online for n in observed.nodes])
        current = fractions[online][np.isfinite(fractions[online])]
        if current.size:
            assert after.max_node_load >= current.max() - 1e-12
        assert after.steps == before.steps + 1
        # Act, so that migrations are in flight at the next check.
        candidates = [g for g in observed.guests if g.state != "stopped" and not g.migrating_to]
        if candidates:
            g = candidates[pick % len(candidates)]
            with contextlib.suppress(BackendError):
                sim.start_migration(
                    Move(g.id, g.node, observed.nodes[target % len(observed.nodes)].name)
                )


def test_steps_above_threshold_are_counted() -> None:
    # Spread 0.125 while the guest is on a or on b, 0 in the one step it spends on both.
    sim = two_nodes(threshold=0.1, duration=HOUR, migration=MigrationModel(bandwidth=64 * MiB))
    sim.sleep(30 * 60)
    sim.start_migration(Move("1", "a", "b"))  # 74 s: the step at 31 min sees it on both
    sim.sleep(HOUR)
    stats = sim.stats()
    assert (stats.steps, stats.steps_above) == (60, 59)
    assert stats.max_imbalance == 0.125 and stats.last_imbalance == 0.125
    assert stats.mean_imbalance == pytest.approx(59 * 0.125 / 60)
    assert stats.fraction_above == pytest.approx(59 / 60)


# --------------------------------------------------------------------------------------------
# The built-in month


def balanced(cluster: Cluster) -> Cluster:
    """The cluster with its guests spread evenly: biggest first onto the least loaded node."""
    cap = {n.name: float(n.memory) for n in cluster.nodes}
    used = dict.fromkeys(cap, 0.0)
    placement: dict[str, str] = {}
    groups = {g: set(r.guests) for r in cluster.rules.guest_affinity for g in r.guests}
    for g in sorted(cluster.guests, key=lambda g: (-g.memory, g.id)):
        taken = {placement[p] for p in groups.get(g.id, ()) if p in placement}
        target = min((n for n in cap if n not in taken), key=lambda n: (used[n] / cap[n], n))
        placement[g.id] = target
        used[target] += g.memory
    return cluster.with_placement(placement)


def test_the_month_fits_when_balanced() -> None:
    month = builtin_scenario("month")
    # Through the node failure (day 9), the maintenance (day 16) and the end of the cache ramp
    # (day 24), when memory use peaks.
    sim = Simulator(replace(month, cluster=balanced(month.cluster)), days=24.5)
    sim.sleep(month.duration)
    stats = sim.stats()
    assert stats.capacity_violations == 0
    assert stats.max_node_load < 0.85
    assert stats.node_failures == 1 and stats.recoveries > 0
    kinds = [e.kind for e in sim.events]
    assert kinds == ["failed", "recovered", "maintenance-on", "maintenance-off"]


def statistics(window_steps: int, hot_steps: int = 5) -> StepStatistics:
    """The statistics of a two-node run (hot window: 5 one-minute steps, the default)."""
    return StepStatistics(
        2, weights=(1.0, 1.0), dynamic=True, hot=HOT, window_steps=window_steps, hot_steps=hot_steps
    )


def test_the_spread_is_taken_on_loads_averaged_over_the_window() -> None:
    assert steps_in(0.0, 60.0) == 1  # window 0: instantaneous
    assert steps_in(120.0, 60.0) == 2  # two one-minute steps
    assert steps_in(HOT_WINDOW, 60.0) == 5
    windowed = statistics(2)
    f_cpu = np.array([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    f_mem = np.zeros_like(f_cpu)
    (cpu, _), (hot_cpu, _) = windowed.averaged(f_cpu[:, :2], f_mem[:, :2])
    assert cpu[0].tolist() == [0.0, 0.5]  # a one-step spike counts half
    assert hot_cpu[0].tolist() == [0.0, 0.5]  # over 5 steps: what there is of them so far
    (cpu, _), (hot_cpu, _) = windowed.averaged(f_cpu[:, 2:], f_mem[:, 2:])  # continued
    assert cpu[0].tolist() == [0.5, 0.0]
    assert cpu[1].tolist() == [0.0, 0.0]
    assert hot_cpu[0].tolist() == [1 / 3, 0.25]
    # Blocks of one step each keep the longer window's tail whole.
    stepwise = statistics(2)
    seen = [stepwise.averaged(f_cpu[:, k : k + 1], f_mem[:, k : k + 1]) for k in range(4)]
    assert [float(s[0][0][0, 0]) for s in seen] == [0.0, 0.5, 0.5, 0.0]
    assert [float(s[1][0][0, 0]) for s in seen] == [0.0, 0.5, 1 / 3, 0.25]


def test_hot_spots_are_counted_per_node_on_the_five_minute_load() -> None:
    # a: 14 of 16 cores used (0.875, hot above 0.85); b: 2 of 32 (0.0625).
    sim = simulator(
        (node("a"), node("b", cpu=32)),
        (guest("1", "a", cpu=16.0, cpu_used=14.0), guest("2", "b")),
        step=60,
        duration=2 * HOUR,
        migration=MigrationModel(bandwidth=64 * MiB, setup=10),
    )
    sim.sleep(HOUR)
    stats = sim.stats()
    assert stats.steps == 61  # the steps at 0, 60, …, 3600 s
    assert (stats.hot, stats.hot_steps, stats.max_hot_steps) == (0.85, 61, 61)
    assert stats.p95_node_load == 0.875
    # Moved to b (0.4375 + 0.0625 there): a still counts while the migration runs (the step at
    # 3660 s), then its 5-minute average falls to 0.7 and it never runs hot again; b never does.
    sim.start_migration(Move("1", "a", "b"))
    sim.sleep(HOUR)
    stats = sim.stats()
    assert stats.steps == 120
    assert stats.hot_steps == 62 and stats.max_hot_steps == 62
    assert stats.p95_node_load == 0.875  # more than half the steps still had a at 0.875
    quiet = simulator(
        (node("a"), node("b", cpu=32)),
        (guest("1", "a", cpu=16.0, cpu_used=14.0),),
        step=60,
        duration=2 * HOUR,
    )
    assert Simulator(quiet.scenario, hot=0.9).stats().hot_steps == 0
    with pytest.raises(ValueError, match="hot must be a load fraction"):
        Simulator(quiet.scenario, hot=0)


@pytest.mark.parametrize("failback", [True, False])
def test_the_ha_manager_fails_a_guest_back_to_its_top_tier(failback: bool) -> None:
    # HA guest 1 prefers a (priority 2) to b (priority 1), non-strict; moved to b by the
    # controller, it is moved back to a a round later — unless failback is off.
    nodes = (node("a"), node("b"), node("c"))
    guests = (guest("1", "a", ha=True, ha_state="started", failback=failback),)
    rules = Rules(node_affinity=(NodeAffinity("prefer-a", ("1",), {"a": 2, "b": 1}),))
    sim = Simulator(
        Scenario(Cluster(nodes, guests, rules), migration=MigrationModel(bandwidth=GiB, setup=0)),
        threshold=0.15,
    )
    handle = sim.start_migration(Move("1", "a", "b"))
    sim.sleep(4)
    assert sim.poll(handle) == DONE
    sim.sleep(20)
    back = [(r.source, r.target, r.outcome) for r in sim.migrations if r.cause == "failback"]
    assert back == ([("b", "a", "done")] if failback else [])
    assert sim.observe().guest("1").node == ("a" if failback else "b")
