"""The simulator as an Incus cluster (``platform: incus``): architectures, containers that move
only by a restart, ``cluster.rebalance.*`` as policy defaults; and the scenario keys that say so."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.backends.base import DONE, RUNNING, BackendError
from opendrs.backends.scenario import Fault, MigrationModel, Scenario, loads_scenario
from opendrs.backends.sim import Simulator
from opendrs.model.cluster import Cluster, Disk, Guest, Move, Node, Settings
from opendrs.model.document import DocumentError

GiB = 1024**3
HOUR = 3600.0

NODES = (
    Node("x1", 16, 64 * GiB, storage={"local": 100 * GiB}),
    Node("x2", 16, 64 * GiB, storage={"local": 100 * GiB}),
    Node("a1", 16, 64 * GiB, arch="aarch64", storage={"local": 100 * GiB}),
    Node("a2", 16, 64 * GiB, arch="aarch64", storage={"local": 100 * GiB}),
)


def _guest(gid: str, on: str, kind: str = "vm", **fields: object) -> Guest:
    values: dict[str, object] = {"cpu": 4.0, "memory": 8 * GiB, "cpu_used": 2.0}
    values["memory_used"] = 4 * GiB
    values.update(fields)
    return Guest(gid, on, kind=kind, **values)  # type: ignore[arg-type]


GUESTS = (
    _guest("vm1", "x1", uptime=1000),
    _guest("ct1", "x1", "ct", uptime=1000, disks=(Disk("local", 2 * GiB),)),
    _guest("vm2", "a1"),
    _guest("ct2", "a1", "ct"),
)


def incus_sim(
    *,
    restart: bool = True,
    platform: str = "incus",
    faults: tuple[Fault, ...] = (),
    server_config: dict[str, str] | None = None,
) -> Simulator:
    settings = Settings(allow_restart_migration=restart, allow_local_disks=True)
    scenario = Scenario(
        Cluster(NODES, GUESTS, settings=settings),
        migration=MigrationModel(bandwidth=GiB, setup=10),
        faults=faults,
        platform=platform,  # type: ignore[arg-type]
        server_config=server_config or {},
    )
    return Simulator(scenario, days=1, window=0)


# --------------------------------------------------------------------------------------------
# Containers move by a restart


def test_a_running_container_moves_by_a_restart_stopped_meanwhile() -> None:
    sim = incus_sim()
    handle = sim.start_migration(Move("ct1", "x1", "x2"))
    # Its local disk is copied (2 GiB at 1 GiB/s), its memory is not: 10 + 2 = 12 s.
    sim.sleep(6)
    moving = sim.observe().guest("ct1")
    assert (moving.state, moving.node, moving.migrating_to, moving.uptime) == (
        "stopped",
        "x1",
        "x2",
        0,
    )
    assert sim.poll(handle) == RUNNING
    fractions = sim.node_fractions()
    assert fractions.cpu[:2] == (2.0 / 16, 0.0)  # vm1 alone on x1; ct1 loads no member
    sim.sleep(10)
    assert sim.poll(handle) == DONE
    moved = sim.observe().guest("ct1")
    assert (moved.state, moved.node, moved.migrating_to, moved.uptime) == ("running", "x2", None, 4)
    (record,) = sim.migrations
    assert (record.restart, record.bytes, record.ended) == (True, 2 * GiB, 12.0)
    stats = sim.stats()
    assert (stats.restart_migrations, stats.restart_downtime) == (1, 12.0)


def test_a_container_does_not_move_without_restart_migration() -> None:
    sim = incus_sim(restart=False)
    with pytest.raises(BackendError, match="allow_restart_migration") as info:
        sim.start_migration(Move("ct1", "x1", "x2"))
    assert not info.value.transient and sim.migrations == ()
    sim.start_migration(Move("vm1", "x1", "x2"))  # a VM moves live all the same
    assert sim.migrations[0].restart is False


def test_a_vm_moves_live_and_is_no_restart() -> None:
    sim = incus_sim()
    sim.start_migration(Move("vm1", "x1", "x2"))
    sim.sleep(1)
    moving = sim.observe().guest("vm1")
    assert (moving.state, moving.migrating_to, moving.uptime) == ("running", "x2", 1001)
    sim.sleep(60)
    assert sim.migrations[0].bytes == 4 * GiB and sim.migrations[0].restart is False
    assert sim.stats().restart_migrations == 0


def test_a_failed_restart_move_starts_the_container_again_on_its_source() -> None:
    sim = incus_sim(faults=(Fault("migration-failure", at=0.0, guest="ct1"),))
    handle = sim.start_migration(Move("ct1", "x1", "x2"))
    sim.sleep(60)
    assert sim.poll(handle).state == "failed"
    after = sim.observe().guest("ct1")
    assert (after.state, after.node, after.migrating_to) == ("running", "x1", None)
    record = sim.migrations[0]
    assert record.ended is not None
    assert sim.stats().restart_downtime == pytest.approx(record.ended - record.started)


def test_a_container_whose_source_fails_during_its_restart_move_stays_down() -> None:
    sim = incus_sim(faults=(Fault("node-failure", at=5.0, node="x1", duration=HOUR),))
    sim.start_migration(Move("ct1", "x1", "x2"))
    sim.sleep(30)
    assert sim.migrations[0].outcome == "failed"
    down = sim.observe().guest("ct1")
    assert (down.state, down.node) == ("stopped", "x1")
    sim.sleep(HOUR)
    assert sim.observe().guest("ct1").state == "running"


def test_on_proxmox_a_container_still_moves_as_before() -> None:
    sim = incus_sim(platform="proxmox", restart=False)
    sim.start_migration(Move("ct1", "x1", "x2"))
    sim.sleep(1)
    assert sim.observe().guest("ct1").state == "running"
    sim.sleep(60)
    record = sim.migrations[0]
    assert (record.restart, record.bytes, record.outcome) == (False, 6 * GiB, "done")


# --------------------------------------------------------------------------------------------
# Architectures


@pytest.mark.parametrize("platform", ["incus", "proxmox"])
def test_no_move_crosses_architectures(platform: str) -> None:
    sim = incus_sim(platform=platform)
    for move in (Move("vm1", "x1", "a2"), Move("vm2", "a1", "x1"), Move("ct2", "a1", "x2")):
        with pytest.raises(BackendError, match="another architecture") as info:
            sim.start_migration(move)
        assert not info.value.transient
    assert sim.migrations == ()
    sim.start_migration(Move("vm2", "a1", "a2"))  # within its architecture it moves


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([g.id for g in GUESTS]),
            st.sampled_from([n.name for n in NODES]),
            st.integers(0, 120),
        ),
        max_size=25,
    ),
    st.booleans(),
)
def test_whatever_is_asked_no_container_moves_live_and_no_guest_changes_architecture(
    asks: list[tuple[str, str, int]], restart: bool
) -> None:
    sim = incus_sim(restart=restart)
    arch = {g.id: sim.observe().guest_arch(g) for g in GUESTS}
    for gid, target, wait in asks:
        with_source = Move(gid, sim.observe().guest(gid).node, target)
        with contextlib.suppress(BackendError):  # refusals are part of the test
            sim.start_migration(with_source)
        sim.sleep(wait)
        for guest in sim.observe().guests:
            node = sim.observe().node(guest.node)
            assert node.arch == arch[guest.id]
            if guest.kind == "ct" and guest.migrating_to is not None:
                assert guest.state == "stopped"
    kinds = {g.id: g.kind for g in GUESTS}
    for record in sim.migrations:
        assert record.restart == (kinds[record.guest] == "ct")
        assert restart or kinds[record.guest] == "vm"


# --------------------------------------------------------------------------------------------
# cluster.rebalance.* as the policy's defaults


def test_the_incus_keys_become_the_policy_defaults_as_the_backend_reads_them() -> None:
    config = {
        "cluster.rebalance.threshold": "30",
        "cluster.rebalance.cooldown": "2H",
        "cluster.rebalance.batch": "3",
    }
    sim = incus_sim(server_config=config)
    fields, notes = sim.policy_defaults("incus")
    assert fields == {"cooldown": 7200, "batch": 3, "options": {"threshold": 30.0}}
    assert notes == []
    assert incus_sim(platform="proxmox").policy_defaults("incus") == ({}, [])


# --------------------------------------------------------------------------------------------
# The scenario keys


def _scenario(extra: str) -> Scenario:
    cluster = Cluster(NODES, GUESTS)
    return loads_scenario(f"version: 1\n{extra}", filename="s.yaml", cluster=cluster)


def test_the_platform_key_and_the_incus_section_are_read() -> None:
    assert _scenario("").platform == "proxmox"
    scenario = _scenario(
        "platform: incus\nincus:\n  config:\n    cluster.rebalance.threshold: 12.5\n"
        "    cluster.rebalance.cooldown: 1d 3H\n    cluster.rebalance.batch: 2\n"
        "    cluster.rebalance.interval: 0\n"
    )
    assert scenario.platform == "incus"
    assert scenario.server_config == {
        "cluster.rebalance.threshold": "12.5",
        "cluster.rebalance.cooldown": "1d 3H",
        "cluster.rebalance.batch": "2",
        "cluster.rebalance.interval": "0",
    }


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("platform: lxc", "s.yaml: platform: expected one of proxmox, incus, got 'lxc'"),
        ("platform: incsu", "s.yaml: platform: unknown value 'incsu' (did you mean 'incus'?)"),
        ("incus: {config: {}}", "s.yaml: incus: only with `platform: incus`"),
        ("platform: incus\nincus: {conf: {}}", "s.yaml: incus.conf: unknown key (did you mean"),
        (
            "platform: incus\nincus: {config: {cluster.rebalance.treshold: 5}}",
            's.yaml: incus.config["cluster.rebalance.treshold"]: unknown key (did you mean '
            "'cluster.rebalance.threshold'?)",
        ),
        (
            "platform: incus\nincus: {config: {cluster.rebalance.cooldown: 6 hours}}",
            's.yaml: incus.config["cluster.rebalance.cooldown"]: expected an Incus duration',
        ),
        (
            "platform: incus\nincus: {config: {cluster.rebalance.threshold: 150}}",
            's.yaml: incus.config["cluster.rebalance.threshold"]: must not be more than 100',
        ),
        (
            "platform: incus\nincus: {config: {cluster.rebalance.batch: -1}}",
            's.yaml: incus.config["cluster.rebalance.batch"]: must be between 0 and',
        ),
        (
            "platform: incus\nincus: {config: {cluster.rebalance.interval: soon}}",
            's.yaml: incus.config["cluster.rebalance.interval"]: expected a number',
        ),
        ("platform: incus\nincus: {config: []}", "s.yaml: incus.config: expected a mapping"),
    ],
)
def test_bad_platform_keys_are_one_line_errors(extra: str, message: str) -> None:
    with pytest.raises(DocumentError) as info:
        _scenario(extra)
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text
