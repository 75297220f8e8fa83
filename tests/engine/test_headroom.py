"""The failover headroom check (:mod:`opendrs.engine.headroom`): a property — a failure the
check says is covered restarts its HA guests within capacity when they are placed as it says —
and the limits of the cases it checks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tests.clusters import GiB, clusters

from opendrs.engine.constraints import Constraints, committed_for, current_assign
from opendrs.engine.headroom import MAX_CASES, RECOVERIES, failover_headroom, ha_guests
from opendrs.model.cluster import Cluster, Guest, Node, Settings


@st.composite
def ha_clusters(draw: st.DrawFn) -> Cluster:
    cluster = draw(clusters(max_nodes=5, max_guests=16))
    size = len(cluster.guests)
    marks = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    guests = tuple(replace(g, ha=mark) for g, mark in zip(cluster.guests, marks, strict=True))
    return replace(cluster, guests=guests)


def _broken(cluster: Cluster, failed: tuple[str, ...]) -> Cluster:
    nodes = tuple(replace(n, online=False) if n.name in failed else n for n in cluster.nodes)
    return replace(cluster, nodes=nodes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ha_clusters(), st.integers(1, 2))
def test_a_covered_failure_restarts_every_ha_guest_within_capacity(
    cluster: Cluster, failures: int
) -> None:
    assume(failures < sum(n.online for n in cluster.nodes))
    headroom = failover_headroom(cluster, failures)
    counted = {g.id for g in ha_guests(cluster)[0]}
    for case in headroom.cases:
        broken = _broken(cluster, case.failed)
        on_failed = {g.id for g in broken.guests if g.id in counted and g.node in case.failed}
        restarted = {m.guest for m in case.restarts} & on_failed
        stranded = {g for g, _why in case.stranded}
        assert restarted | stranded == on_failed and not restarted & stranded
        assert case.covered == (restarted == on_failed)
        if not case.covered:
            continue
        placed = broken.apply(case.restarts)
        cons = Constraints.build(placed)
        committed = committed_for(cons, current_assign(placed))
        before = committed_for(Constraints.build(broken), current_assign(broken))
        over = cons.capacity.over(committed)
        for m in case.restarts:
            n = placed.node_index[m.target]
            assert m.target not in case.failed and placed.nodes[n].usable
            # A node that takes a restart is within capacity where it was before.
            assert not (over[n] & ~cons.capacity.over(before)[n]).any()
    assert headroom.ok == all(c.covered for c in headroom.cases)
    assert headroom.unrestartable == max((len(c.stranded) for c in headroom.cases), default=0)


def _ring(nodes: int) -> Cluster:
    names = [f"n{i:02}" for i in range(nodes)]
    return Cluster(
        tuple(Node(n, cpu=16, memory=64 * GiB) for n in names),
        tuple(Guest(str(100 + i), n, memory=(i + 1) * GiB, ha=True) for i, n in enumerate(names)),
    )


def test_every_combination_up_to_the_limit_then_the_heaviest_first() -> None:
    small = failover_headroom(_ring(6), 2)
    assert small.exhaustive and len(small.cases) == 15 and small.ok
    big = failover_headroom(_ring(12), 2)
    assert not big.exhaustive and len(big.cases) == MAX_CASES
    # The heaviest nodes (the last ones: their guest is the biggest) fail first.
    assert big.cases[0].failed == ("n10", "n11")


def test_failures_out_of_range_are_refused() -> None:
    for failures in (0, 6):
        try:
            failover_headroom(_ring(6), failures)
        except ValueError as exc:
            assert "fewer than the online nodes" in str(exc)
        else:
            raise AssertionError(f"{failures} failures accepted")
    assert np.isfinite(failover_headroom(_ring(2)).cases[0].worst_memory)


def test_an_ha_guest_opendrs_ignores_still_needs_room_to_restart() -> None:
    """Ignore rules hold opendrs's moves, not the platform's restart: the guest is counted."""
    nodes = (
        Node("a", cpu=16, memory=32 * GiB),
        Node("b", cpu=16, memory=32 * GiB),
        Node("c", cpu=16, memory=12 * GiB),
    )
    guests = (
        Guest("101", "a", cpu=2, memory=16 * GiB, ha=True),
        Guest("201", "b", cpu=2, memory=20 * GiB),
        Guest("301", "c", cpu=2, memory=GiB),
    )
    cluster = Cluster(nodes, guests, settings=Settings(mode="static"))
    ignored = replace(cluster, rules=replace(cluster.rules, ignored=frozenset({"101"})))
    for recovery in RECOVERIES:
        [case] = [c for c in failover_headroom(ignored, 1, recovery).cases if c.failed == ("a",)]
        assert [g for g, _why in case.stranded] == ["101"] and not case.held, recovery
    # With room on b, it restarts there whatever the rule says.
    roomy = replace(ignored, guests=(guests[0], replace(guests[1], memory=8 * GiB), guests[2]))
    for recovery in RECOVERIES:
        [case] = [c for c in failover_headroom(roomy, 1, recovery).cases if c.failed == ("a",)]
        assert [(m.guest, m.target) for m in case.restarts] == [("101", "b")], recovery


def test_an_ha_guest_in_ha_state_ignored_waits_for_its_node() -> None:
    nodes = tuple(Node(name, cpu=16, memory=32 * GiB) for name in "ab")
    guest = Guest("101", "a", cpu=2, memory=GiB, ha=True, ha_state="ignored")
    for recovery in RECOVERIES:
        headroom = failover_headroom(Cluster(nodes, (guest,)), 1, recovery)
        [case] = [c for c in headroom.cases if c.failed == ("a",)]
        assert case.held == {"101"} and headroom.shortfall == (0, 0), recovery
