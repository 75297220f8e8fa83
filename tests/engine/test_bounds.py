"""Lower bounds on the reachable spread and on the migrations needed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from clusters import clusters
from opendrs.engine.bounds import lower_bounds, migration_lower_bound, spread_lower_bound
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model import snapshot
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules

GiB = 1024**3
STATIC = Settings(mode="static", cpu_overcommit=8.0)


def test_immovable_load_bounds_the_spread() -> None:
    nodes = (Node("a", 16, 16 * GiB), Node("b", 16, 16 * GiB))
    guests = (Guest("big", "a", memory=12 * GiB, lock="backup"), Guest("s", "b", memory=2 * GiB))
    bound = spread_lower_bound(Cluster(nodes, guests, Rules(), STATIC))
    # a keeps 12 of 16 GiB (0.75); the mean is 14/32 = 0.4375: spread ≥ 0.3125.
    assert bound["memory"] == pytest.approx(0.3125)


def test_migration_bound_counts_the_largest_guests() -> None:
    nodes = (Node("a", 16, 16 * GiB), Node("b", 16, 16 * GiB))
    guests = tuple(Guest(str(i), "a", memory=size * GiB) for i, size in enumerate([4, 4, 2, 2]))
    bound = migration_lower_bound(
        Cluster(nodes, guests, Rules(), STATIC), {"memory": 0.0, "cpu": 1.0}
    )
    # a must shed 6 GiB: the two largest guests (4 + 4) are needed at least; b must receive 6 GiB
    # too: two guests. 6 GiB of memory moves at least.
    assert bound.migrations == 2
    assert bound.moved_bytes == 6 * GiB


def test_maintenance_nodes_must_empty() -> None:
    nodes = (Node("a", 16, 16 * GiB), Node("m", 16, 16 * GiB, maintenance=True))
    guests = (Guest("1", "m", memory=GiB), Guest("2", "m", memory=GiB))
    bound = lower_bounds(Cluster(nodes, guests, Rules(), STATIC))
    assert bound.migrations == 2


def _bundle_across_architectures() -> Cluster:
    """Found by the deep profile: a hard-affinity bundle with a member on an (offline) aarch64
    node may not move; cut by architecture, its x86_64 members must not count as free to go."""
    nodes = (
        Node("n0", 2, 4 * GiB, maintenance=True),
        Node("n1", 2, 4 * GiB),
        Node("n2", 2, 4 * GiB),
        Node("n3", 2, 4 * GiB, online=False),
        Node("n4", 2, 4 * GiB, arch="aarch64", online=False),
    )
    where = {"107": "n4", "108": "n3", "109": "n3"}
    guests = tuple(
        Guest(str(i), where.get(str(i), "n0"), cpu=1, memory=GiB, uptime=3600)
        for i in range(100, 112)
    )
    rules = Rules(
        guest_affinity=(GuestAffinity("g0", ("100", "101", "102", "107"), positive=True),)
    )
    return Cluster(nodes, guests, rules, Settings(mode="basic"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
@example(_bundle_across_architectures())
def test_bounds_never_exceed_what_balance_achieves(cluster: Cluster) -> None:
    proposal = propose_balance(cluster)
    after = {r: m.spread for r, m in proposal.after.resources.items()}
    bound = migration_lower_bound(cluster, after)
    if not any("could not repair" in n for n in proposal.notes):
        assert bound.migrations <= len(proposal.net_moves())
    for resource, spread in bound.spread.items():
        assert spread <= after[resource] + 1e-9


def test_joint_bound_sees_that_cpu_and_memory_move_together() -> None:
    # a: two (6 cpu, 8 GiB) guests and six (2 cpu, 1 GiB): (24, 22); b is empty. At spread 0 a
    # must shed exactly (12 cpu, 11 GiB). Per resource two guests would do (6 + 6 cpu, 8 + 8 GiB),
    # but the two big ones together carry 16 GiB: the fewest guests that carry both are one big
    # and three small ones (12 cpu, 11 GiB): four migrations.
    nodes = (Node("a", 16, 32 * GiB), Node("b", 16, 32 * GiB))
    guests = tuple(Guest(f"B{i}", "a", cpu=6, memory=8 * GiB) for i in range(2)) + tuple(
        Guest(f"S{i}", "a", cpu=2, memory=GiB) for i in range(6)
    )
    cluster = Cluster(nodes, guests, Rules(), STATIC)
    assert migration_lower_bound(cluster, 1e-9).migrations == 4
    # With any cpu spread allowed only memory counts: 11 GiB, at least two guests of at most 8
    # (the bound is a relaxation: that 11 GiB takes 8 + 1 + 1 + 1 here is beyond it).
    assert migration_lower_bound(cluster, {"cpu": 10.0, "memory": 1e-9}).migrations == 2


def test_joint_bound_counts_arrivals_that_make_room() -> None:
    # a: two (3 cpu, 1 GiB) guests, b: two (1 cpu, 3 GiB). At spread 0 both end at (4, 4): a must
    # lose cpu and gain memory, which no departure alone does; one exchange does it.
    nodes = (Node("a", 16, 16 * GiB), Node("b", 16, 16 * GiB))
    guests = (
        Guest("c1", "a", cpu=3, memory=GiB),
        Guest("c2", "a", cpu=3, memory=GiB),
        Guest("m1", "b", cpu=1, memory=3 * GiB),
        Guest("m2", "b", cpu=1, memory=3 * GiB),
    )
    assert migration_lower_bound(Cluster(nodes, guests, Rules(), STATIC), 0.0).migrations == 2


@st.composite
def tiny_clusters(draw: st.DrawFn) -> tuple[Cluster, int]:
    """A cluster small enough to try every placement, and which placement sets the target."""
    n_nodes = draw(st.integers(2, 3))
    maintenance = draw(st.integers(-1, n_nodes - 1)) if n_nodes == 3 else -1
    nodes = tuple(
        Node(
            f"n{i}",
            cpu=draw(st.sampled_from([2, 4, 8])),
            memory=draw(st.sampled_from([4, 8, 16])) * GiB,
            maintenance=i == maintenance,
        )
        for i in range(n_nodes)
    )
    guests = tuple(
        Guest(
            str(j),
            draw(st.sampled_from(nodes)).name,
            cpu=draw(st.integers(1, 4)),
            memory=draw(st.sampled_from([1, 2, 3, 6])) * GiB,
            state=draw(st.sampled_from(["running"] * 5 + ["stopped"])),
            lock=draw(st.sampled_from([None] * 4 + ["backup"])),
        )
        for j in range(draw(st.integers(1, 6)))
    )
    return Cluster(nodes, guests, Rules(), STATIC), draw(st.integers(0, 10**6))


def _every_placement(cluster: Cluster) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every placement a rebalancing may reach: (P, G) node per guest, (P, R) spreads, (P,) moved.

    Guests that may not move (locked, stopped) stay; the others go to any usable node, or stay
    where they are if that node is usable (guests on a node in maintenance must leave).
    """
    loads = LoadModel.build(cluster)
    usable = [i for i, n in enumerate(cluster.nodes) if n.usable]
    options = []
    for j, guest in enumerate(cluster.guests):
        here = int(loads.assign[j])
        if guest.lock or not loads.active[j]:
            options.append([here])
        else:
            options.append(sorted(set(usable) | ({here} if here in usable else set())))
    placements = np.array(list(itertools.product(*options)), dtype=np.intp)
    node_loads = np.zeros((len(placements), len(cluster.nodes), loads.demand.shape[1]))
    for j in range(len(cluster.guests)):
        if loads.active[j]:
            node_loads[np.arange(len(placements)), placements[:, j]] += loads.demand[j]
    fractions = node_loads[:, usable] / loads.capacity[usable]
    spreads = fractions.max(axis=1) - fractions.min(axis=1)
    moved = placements != loads.assign[None, :]
    return placements, spreads, moved


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_clusters())
def test_bounds_never_exceed_the_exhaustive_optimum(case: tuple[Cluster, int]) -> None:
    cluster, pick = case
    placements, spreads, moved = _every_placement(cluster)
    target = spreads[pick % len(placements)]
    reach = np.all(spreads <= target + 1e-12, axis=1)
    fewest = int(moved[reach].sum(axis=1).min())
    memory = np.array([g.memory for g in cluster.guests], dtype=float)
    least_bytes = float((moved[reach] * memory).sum(axis=1).min())
    bound = migration_lower_bound(cluster, dict(zip(RESOURCES, target.tolist(), strict=True)))
    assert bound.migrations <= fewest
    assert bound.moved_bytes <= least_bytes
    for r, best in zip(RESOURCES, spreads.min(axis=0).tolist(), strict=True):
        assert bound.spread[r] <= best + 1e-9


def test_a_wide_spread_asked_places_the_window_not_a_box_twice_as_wide() -> None:
    # Two nodes at 60 %, two at 0 %, guests of 10 %: within 30 pp, the nodes end in one window
    # [α, α + 30 %] with α between 0 and 30 %, so 4 migrations at least (2 off each full node,
    # or 1 off each and 1 onto each empty one, ...). The box [m − s, m + s] = [0, 60 %] holds
    # every node as it is: it bounded nothing (0).
    nodes = "".join(f"  n{i}: {{cpu: 64, memory: 100GiB}}\n" for i in range(4))
    guests = "".join(
        f"  - {{id: {10 * n + k}, node: n{n}, cpu: 1, memory: 10GiB}}\n"
        for n in (0, 1)
        for k in range(6)
    )
    text = f"version: 1\nsettings: {{mode: static}}\nnodes:\n{nodes}guests:\n{guests}"
    cluster = snapshot.loads(text, filename="w.yaml")
    bound = migration_lower_bound(cluster, {"cpu": 1.0, "memory": 0.3}, resources=["memory"])
    assert bound.migrations == 4
    # 15 GiB off each full node and onto each empty one, at least (as a fluid: 30 GiB).
    assert 29 * 1024**3 < bound.moved_bytes <= 30 * 1024**3
