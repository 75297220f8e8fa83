"""HA recovery after a node failure as Proxmox VE's HA manager makes it
(:mod:`opendrs.compat.pve.recovery`), and the simulator's hourly failover check built on it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opendrs.backends.sim.failover_probe import FailoverProbe, stranded_by_failure
from opendrs.compat.pve.recovery import recover_node, recover_nodes
from opendrs.model.cluster import Cluster, Disk, Guest, Move, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3


def _cluster(
    nodes: dict[str, int], guests: list[tuple[str, str, int, bool]], rules: Rules | None = None
) -> Cluster:
    """Nodes of 16 cores (name → memory in GiB), running guests (id, node, GiB, HA)."""
    return Cluster(
        tuple(Node(name, cpu=16, memory=gib * GiB) for name, gib in nodes.items()),
        tuple(
            Guest(gid, node, cpu=1, memory=gib * GiB, ha=ha, uptime=86_400)
            for gid, node, gib, ha in guests
        ),
        rules or Rules(),
        Settings(mode="static"),
    )


def test_static_mode_recovers_to_the_node_with_the_most_room_as_upstream_test_crs_static1() -> None:
    # pve-ha-manager src/test/test-crs-static1: vm:102 (2 cores, 4e9 B) on node1 is recovered to
    # node3, the node with the most memory (32 cores each; 100e9, 200e9, 300e9 B).
    cluster = Cluster(
        tuple(Node(f"node{i}", cpu=32, memory=i * 100_000_000_000) for i in (1, 2, 3)),
        (Guest("102", "node1", cpu=2, memory=4_000_000_000, ha=True),),
    )
    static = recover_node(cluster, "node1", "static")
    assert static.restarts == (Move("102", "node1", "node3"),) and static.stranded == ()
    # basic mode: every node has no service, so the first by name.
    assert recover_node(cluster, "node1", "basic").restarts == (Move("102", "node1", "node2"),)


def test_basic_mode_recovers_in_service_id_order_each_restart_counted_by_the_next() -> None:
    cluster = _cluster(
        {"a": 64, "b": 64, "c": 64},
        [("101", "a", 2, True), ("102", "a", 2, True), ("103", "a", 2, True), ("9", "b", 2, True)],
    )
    recovery = recover_node(cluster, "a", "basic")
    # b has one service: vm:101 goes to c, vm:102 to b (one each, b first by name), vm:103 to c.
    assert recovery.restarts == (
        Move("101", "a", "c"),
        Move("102", "a", "b"),
        Move("103", "a", "c"),
    )
    assert recovery.ha_guests == 3 and recovery.stranded == ()


def test_a_start_without_room_is_relocated_once_then_left_down() -> None:
    # basic mode picks b (one service, c has two); vm:101 has no room there, so it is relocated
    # to the next node, c (max_relocate 1), where it fits ...
    guests = [("101", "a", 20, True), ("201", "b", 20, False), ("301", "c", 2, False)]
    roomy = _cluster({"a": 32, "b": 32, "c": 32}, [*guests, ("302", "c", 2, False)])
    assert recover_node(roomy, "a", "basic").restarts == (Move("101", "a", "c"),)
    # ... unless c has no room either: it is left down.
    full = _cluster({"a": 32, "b": 32, "c": 32}, [*guests, ("302", "c", 14, False)])
    recovery = recover_node(full, "a", "basic")
    assert recovery.restarts == ()
    assert recovery.stranded == (("101", "no room to start on b and c"),)
    # The failover headroom check finds no node either, in its own way.
    assert stranded_by_failure(full, "opendrs")[0] == (1, 0)


def test_the_ha_rules_can_leave_a_guest_no_node() -> None:
    pinned = Rules(node_affinity=(NodeAffinity("only-a", ("101",), {"a": 1}, strict=True),))
    cluster = _cluster({"a": 32, "b": 32}, [("101", "a", 2, True)], pinned)
    recovery = recover_node(cluster, "a", "static")
    assert recovery.stranded == (("101", "no node allowed (the HA rules)"),)
    apart = Rules(
        guest_affinity=(GuestAffinity("apart", ("101", "102"), positive=False, hard=True),)
    )
    two = _cluster(
        {"a": 32, "b": 32, "c": 32}, [("101", "a", 2, True), ("102", "b", 2, True)], apart
    )
    # Kept apart from vm:102 on b: c, although basic mode would pick b first by name.
    assert recover_node(two, "a", "basic").restarts == (Move("101", "a", "c"),)


def test_local_disks_hold_a_guest_and_opendrs_ignore_rules_do_not() -> None:
    cluster = _cluster({"a": 32, "b": 32}, [("101", "a", 2, True), ("102", "a", 2, True)])
    local = replace(cluster.guests[0], disks=(Disk("local-lvm", 8 * GiB),))
    ignored = replace(cluster.rules, ignored=frozenset({"102"}))
    cluster = replace(cluster, guests=(local, cluster.guests[1]), rules=ignored)
    recovery = recover_node(cluster, "a", "static")
    assert recovery.held == ("101",)
    assert recovery.restarts == (Move("102", "a", "b"),) and recovery.stranded == ()


@pytest.mark.parametrize("mode", ["basic", "static", "opendrs"])
def test_the_probe_counts_each_failure_and_keeps_a_placement_it_checked(mode: str) -> None:
    guests = [("101", "a", 20, True), ("201", "b", 20, False), ("301", "c", 2, False)]
    full = _cluster({"a": 32, "b": 32, "c": 32}, [*guests, ("302", "c", 14, False)])
    probe = FailoverProbe((mode,), every=3600.0)
    assert probe.due(0.0)
    probe.check(0.0, full)
    assert not probe.due(1800.0) and probe.due(3600.0)
    probe.check(3600.0, full)
    tally = probe.tallies[mode]
    # Two checks of three node failures: only a's leaves its HA guest down.
    assert (probe.checks, tally.cases, tally.short_cases, tally.stranded, tally.worst) == (
        2,
        6,
        2,
        2,
        1,
    )
    assert probe.as_dict()[mode] == {
        "cases": 6,
        "short_cases": 2,
        "stranded": 2,
        "worst": 1,
        "held": 0,
    }


def test_the_probe_skips_an_hour_when_a_node_is_down_or_in_maintenance() -> None:
    cluster = _cluster({"a": 32, "b": 32, "c": 32}, [("101", "a", 2, True)])
    nodes = (replace(cluster.nodes[0], maintenance=True), *cluster.nodes[1:])
    probe = FailoverProbe(("static",))
    probe.check(0.0, replace(cluster, nodes=nodes))
    assert (probe.checks, probe.skipped, probe.tallies["static"].cases) == (0, 1, 0)
    assert not probe.due(1800.0)
    probe.check(3600.0, cluster)
    assert (probe.checks, probe.skipped, probe.tallies["static"].cases) == (1, 1, 3)


def test_the_probe_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="failover modes: dynamic"):
        FailoverProbe(("dynamic",))


def test_two_nodes_failing_at_once_recover_together_in_service_id_order() -> None:
    guests = [("101", "a", 6, True), ("102", "b", 6, True), ("201", "c", 20, False)]
    cluster = _cluster({"a": 32, "b": 32, "c": 32, "d": 32}, guests)
    recovery = recover_nodes(cluster, ("a", "b"), "static")
    assert recovery.failed == "a, b" and recovery.ha_guests == 2
    # Each onto d, the node with the most room, the second seeing the first.
    assert recovery.restarts == (Move("101", "a", "d"), Move("102", "b", "d"))
    assert recovery.stranded == () and recovery.held == ()
