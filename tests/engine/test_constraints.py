"""Hard filters, movability, soft penalties and rule checks on small literal clusters."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from opendrs.engine.constraints import (
    Constraints,
    RejectionCode,
    check_rules,
    current_assign,
    hard_groups,
    movability,
)
from opendrs.model.cluster import Cluster, Disk, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3


def _nodes() -> tuple[Node, ...]:
    return (
        Node("n1", 8, 32 * GiB),
        Node("n2", 8, 32 * GiB),
        Node("n3", 8, 32 * GiB, arch="aarch64"),
        Node("n4", 8, 32 * GiB, maintenance=True),
        Node("n5", 8, 32 * GiB, online=False),
    )


def _masks(cons: Constraints, j: int) -> dict[str, list[bool]]:
    """The hard masks for guest ``j``, with the guest itself taken off its node."""
    assign = current_assign(cons.cluster)
    committed = cons.capacity.committed()
    committed[assign[j]] -= cons.guest_demand(j)
    assign[j] = -1
    headroom = cons.capacity.limit - committed
    return {name: mask.tolist() for name, mask in cons.hard_masks(j, assign, headroom)}


def test_forbidding_refuses_what_a_build_with_the_placements_refuses() -> None:
    guests = (Guest("1", "n1", cpu=1, memory=GiB), Guest("2", "n2", cpu=1, memory=GiB))
    cluster = Cluster(_nodes(), guests)
    forbidden = {("1", "n2"), ("2", "n1"), ("2", "nowhere"), ("ghost", "n1")}
    plain = Constraints.build(cluster)
    derived = plain.forbidding(forbidden)
    built = Constraints.build(cluster, forbidden)
    for j in range(len(guests)):
        assert _masks(derived, j) == _masks(built, j)
    assert _masks(derived, 0)["forbidden"] == [True, False, True, True, True]
    assert _masks(plain, 0)["forbidden"] == [True] * 5  # the original is left as it was
    assert plain.forbidding({("ghost", "n1")}) is plain


def test_node_state_and_architecture_filters() -> None:
    cluster = Cluster(_nodes(), (Guest("1", "n1", cpu=1, memory=GiB),))
    masks = _masks(Constraints.build(cluster), 0)
    assert masks["offline"] == [True, True, True, True, False]
    assert masks["maintenance"] == [True, True, True, False, True]
    assert masks["arch"] == [True, True, False, True, True]


def test_strict_node_affinity_uses_highest_usable_priority() -> None:
    rule = NodeAffinity("r", ("1",), {"n4": 3, "n2": 2, "n1": 2, "n3": 1}, strict=True)
    cluster = Cluster(_nodes(), (Guest("1", "n1", memory=GiB),), Rules(node_affinity=(rule,)))
    # n4 has the top priority but is in maintenance: n1 and n2 (priority 2) are the set.
    assert _masks(Constraints.build(cluster), 0)["node-affinity"] == [
        True,
        True,
        False,
        False,
        False,
    ]


def test_non_strict_node_affinity_is_a_penalty() -> None:
    rule = NodeAffinity("r", ("1",), {"n2": 1}, strict=False)
    cluster = Cluster(_nodes(), (Guest("1", "n1", memory=GiB),), Rules(node_affinity=(rule,)))
    cons = Constraints.build(cluster)
    assert all(_masks(cons, 0)["node-affinity"])
    assert cons.soft_penalty(0, current_assign(cluster)).tolist() == [1, 0, 1, 1, 1]


def test_hard_anti_affinity_and_implicit_negatives() -> None:
    guests = (
        Guest("1", "n1", memory=GiB),
        Guest("2", "n1", memory=GiB),
        Guest("3", "n2", memory=GiB),
    )
    rules = Rules(
        guest_affinity=(
            GuestAffinity("together", ("1", "2"), positive=True),
            GuestAffinity("apart", ("2", "3"), positive=False),
        )
    )
    cluster = Cluster(_nodes(), guests, rules)
    cons = Constraints.build(cluster)
    # 1 is kept with 2, and 2 apart from 3: so 1 is apart from 3 too (Proxmox's implicit rule).
    assert cons.hard_neg[0].tolist() == [2]
    assert sorted(cons.hard_neg[2].tolist()) == [0, 1]
    assert _masks(cons, 0)["anti-affinity"] == [True, False, True, True, True]
    assert [g.tolist() for g in cons.groups] == [[0, 1]]
    assert [g.tolist() for g in hard_groups(cluster)] == [[0, 1]]


def test_migrating_partner_blocks_its_target() -> None:
    guests = (Guest("1", "n1", memory=GiB), Guest("2", "n1", memory=GiB, migrating_to="n2"))
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("1", "2"), positive=False),))
    masks = _masks(Constraints.build(Cluster(_nodes(), guests, rules)), 0)
    assert masks["anti-affinity"] == [False, False, True, True, True]


def test_capacity_with_overcommit_and_reserves() -> None:
    nodes = (Node("n1", 4, 16 * GiB), Node("n2", 4, 16 * GiB, reserve_memory=10 * GiB))
    guests = (Guest("1", "n1", cpu=6, memory=8 * GiB), Guest("2", "n2", cpu=4, memory=4 * GiB))
    settings = Settings(mode="static", cpu_overcommit=2.5)
    cons = Constraints.build(Cluster(nodes, guests, settings=settings))
    # n2: 10 vCPUs allowed, 4 used -> 6 fit; memory 6 GiB allowed, 4 used -> 8 GiB does not.
    assert _masks(cons, 0)["capacity"] == [True, False]
    room = cons.capacity.limit - cons.capacity.committed()
    where = current_assign(cons.cluster)
    # The rejection as a value: the code, the node and each dimension short, in numbers.
    rejection = cons.rejection(RejectionCode.CAPACITY, 0, 1, where, room, cons.guest_demand(0))
    assert (rejection.code, rejection.node) == (RejectionCode.CAPACITY, "n2")
    assert [(str(s.resource), s.need, s.free) for s in rejection.shortfalls] == [
        ("memory", 8 * GiB, 2 * GiB)
    ]
    assert str(rejection) == "capacity: memory needs 8.0 GiB, free 2.0 GiB"


def test_local_storage_pool_capacity() -> None:
    nodes = (
        Node("n1", 8, 32 * GiB, storage={"zfs": 100 * GiB}),
        Node("n2", 8, 32 * GiB, storage={"zfs": 20 * GiB}),
        Node("n3", 8, 32 * GiB),
    )
    guest = Guest("1", "n1", memory=GiB, disks=(Disk("zfs", 50 * GiB), Disk("ceph", GiB, True)))
    cluster = Cluster(nodes, (guest,), settings=Settings(allow_local_disks=True))
    assert _masks(Constraints.build(cluster), 0)["capacity"] == [True, False, False]


def test_movability_reasons() -> None:
    settings = Settings(min_uptime=600)
    cluster = Cluster(
        _nodes(),
        (
            Guest("ok", "n1", memory=GiB, uptime=3600),
            Guest("young", "n1", memory=GiB, uptime=60),
            Guest("locked", "n1", memory=GiB, uptime=3600, lock="backup"),
            Guest("dev", "n1", memory=GiB, uptime=3600, devices=("hostpci0",)),
            Guest("disk", "n1", memory=GiB, uptime=3600, disks=(Disk("local", GiB),)),
            Guest("ct", "n1", kind="ct", memory=GiB, uptime=3600),
            Guest("off", "n1", memory=GiB, state="stopped"),
            Guest("ign", "n1", memory=GiB, uptime=3600),
        ),
        Rules(ignored=frozenset({"ign"})),
        settings,
    )
    held = {g.id: movability(g, cluster, "balance") for g in cluster.guests}
    assert held["ok"] is None
    assert held["young"] is not None and held["young"].code == "uptime"
    reasons = {g: str(h) for g, h in held.items()}
    assert reasons["young"] == "up for 1m, less than 10m"
    assert reasons["locked"] == "locked (backup)"
    assert reasons["dev"] == "local device hostpci0"
    assert reasons["disk"] == "local disks (1.0 GiB)"
    assert reasons["ct"] == "container: restart migration not allowed"
    assert reasons["off"] == "not running"
    assert reasons["ign"] == "ignored by a rule"
    # Evacuation moves stopped and young guests; recovery ignores locks.
    assert movability(cluster.guest("off"), cluster, "evacuate") is None
    assert movability(cluster.guest("young"), cluster, "evacuate") is None
    assert movability(cluster.guest("locked"), cluster, "recover") is None


def test_contradictory_rules_are_dropped_by_name() -> None:
    nodes = _nodes()[:3]
    rules = Rules(
        node_affinity=(
            NodeAffinity("pin-a", ("1",), {"n1": 0}, strict=True),
            NodeAffinity("pin-b", ("1",), {"n2": 0}, strict=True),
            NodeAffinity("only-n1", ("4", "5"), {"n1": 0}, strict=True),
        ),
        guest_affinity=(
            GuestAffinity("with", ("2", "3"), positive=True),
            GuestAffinity("without", ("2", "3"), positive=False),
            GuestAffinity("crowd", ("1", "2", "3", "4"), positive=False),
            GuestAffinity("split", ("4", "5"), positive=False),
        ),
    )
    guests = tuple(Guest(str(i), "n1", memory=GiB) for i in range(1, 6))
    kept, problems = check_rules(Cluster(nodes, guests, rules))
    messages = [str(p) for p in problems]
    assert messages == [
        "Drop rules 'pin-a', 'pin-b', because guest '1' is in more than one node-affinity rule",
        "Drop rule 'crowd', because it keeps 4 guests apart on only 3 nodes",
        "Drop rules 'with', 'without', because they keep guests '2', '3' both together and apart",
        "Drop rule 'split', because its 2 guests are confined to 1 nodes by strict node affinity",
    ]
    assert [r.name for r in kept.node_affinity] == ["only-n1"]
    assert kept.guest_affinity == ()


def test_a_node_out_of_use_keeps_a_hard_anti_affinity_rule() -> None:
    # Three replicas on three nodes, one in maintenance and one offline: Proxmox counts the
    # configured nodes, so the rule stays and the replicas stay apart where they can.
    nodes = _nodes()[:3]
    nodes = (nodes[0], replace(nodes[1], maintenance=True), replace(nodes[2], online=False))
    guests = tuple(Guest(str(i), f"n{i}", memory=GiB) for i in range(1, 4))
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("1", "2", "3"), positive=False),))
    kept, problems = check_rules(Cluster(nodes, guests, rules))
    assert problems == [] and kept.guest_affinity == rules.guest_affinity
    # Confinement counts every node a strict rule names, whatever its priority or state.
    pinned = Rules(
        node_affinity=(NodeAffinity("two", ("1", "2"), {"n1": 2, "n2": 1}, strict=True),),
        guest_affinity=(GuestAffinity("apart", ("1", "2"), positive=False),),
    )
    kept, problems = check_rules(Cluster(nodes, guests, pinned))
    assert problems == [] and kept.guest_affinity == pinned.guest_affinity


def test_positive_group_without_common_node_is_dropped() -> None:
    rules = Rules(
        node_affinity=(
            NodeAffinity("a-on-n1", ("a",), {"n1": 0}, strict=True),
            NodeAffinity("b-on-n2", ("b",), {"n2": 0}, strict=True),
        ),
        guest_affinity=(GuestAffinity("ab", ("a", "b"), positive=True),),
    )
    guests = (Guest("a", "n1", memory=GiB), Guest("b", "n2", memory=GiB))
    _kept, problems = check_rules(Cluster(_nodes(), guests, rules))
    assert [str(p) for p in problems] == [
        "Drop rule 'ab', because strict node affinity leaves their guests no common node"
    ]


def test_violations_of_a_full_placement() -> None:
    nodes = (Node("n1", 2, 4 * GiB), Node("n2", 2, 4 * GiB))
    guests = (Guest("1", "n1", cpu=1, memory=3 * GiB), Guest("2", "n2", cpu=1, memory=3 * GiB))
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("1", "2"), positive=False),))
    cons = Constraints.build(Cluster(nodes, guests, rules, Settings(mode="static")))
    assert cons.violations(np.array([0, 1])) == []
    assert cons.violations(np.array([0, 0])) == [
        "guest 1 shares n1 with a hard anti-affinity partner",
        "guest 2 shares n1 with a hard anti-affinity partner",
        "node n1 over capacity in memory",
    ]


def test_negative_rule_inside_a_merged_positive_group_is_dropped() -> None:
    guests = tuple(Guest(g, "n1", memory=GiB) for g in ("x", "y", "z"))
    rules = Rules(
        guest_affinity=(
            GuestAffinity("xy", ("x", "y"), positive=True),
            GuestAffinity("yz", ("y", "z"), positive=True),
            GuestAffinity("x-not-z", ("x", "z"), positive=False),
        )
    )
    kept, problems = check_rules(Cluster(_nodes(), guests, rules))
    assert [str(p) for p in problems] == [
        "Drop rules 'xy', 'yz', 'x-not-z', because they keep guests 'x', 'z' both together "
        "(through shared guests) and apart"
    ]
    assert kept.guest_affinity == ()


def test_implicit_negatives_are_symmetric_and_never_self() -> None:
    # (a, b) together, (c, d) together, b apart from c: every member of one pair is apart from
    # every member of the other, and no guest is its own partner.
    guests = tuple(Guest(g, "n1", memory=GiB) for g in ("a", "b", "c", "d", "e"))
    rules = Rules(
        guest_affinity=(
            GuestAffinity("ab", ("a", "b"), positive=True),
            GuestAffinity("cd", ("c", "d"), positive=True),
            GuestAffinity("b-not-c", ("b", "c"), positive=False),
            GuestAffinity("d-not-e", ("d", "e"), positive=False),
        )
    )
    cons = Constraints.build(Cluster(_nodes(), guests, rules))
    ids = [g.id for g in guests]
    partners = {ids[j]: sorted(ids[p] for p in cons.hard_neg[j].tolist()) for j in range(5)}
    assert partners == {
        "a": ["c", "d"],
        "b": ["c", "d"],
        "c": ["a", "b", "e"],
        "d": ["a", "b", "e"],
        "e": ["c", "d"],
    }
