"""Lower bounds on the reachable spread and on the migrations needed."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from clusters import clusters
from opendrs.engine.bounds import lower_bounds, migration_lower_bound, spread_lower_bound
from opendrs.engine.strategies.balance import propose_balance
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import Rules

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_bounds_never_exceed_what_balance_achieves(cluster: Cluster) -> None:
    proposal = propose_balance(cluster)
    after = {r: m.spread for r, m in proposal.after.resources.items()}
    bound = migration_lower_bound(cluster, after)
    if not any("could not repair" in n for n in proposal.notes):
        assert bound.migrations <= len(proposal.net_moves())
    for resource, spread in bound.spread.items():
        assert spread <= after[resource] + 1e-9
