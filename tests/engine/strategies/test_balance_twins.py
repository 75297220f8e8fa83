"""balance's cheaper-twin pass: a moved guest leaves no cheaper guest that balances alike, rule-free
and unmoved, on its source that could take its place (#30)."""

from __future__ import annotations

from bench.twins import twin_figures
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import assert_moves_safe, clusters
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.model.cluster import Cluster, Disk, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules

GiB = 1024**3
STATIC = Settings(mode="static", allow_local_disks=True)


def _cluster(*guests: Guest, rules: Rules | None = None) -> Cluster:
    nodes = tuple(Node(n, 16, 32 * GiB, storage={"local": 500 * GiB}) for n in "abc")
    return Cluster(nodes, guests, rules or Rules(), STATIC)


def _guest(gid: str, node: str, disk: int = 0) -> Guest:
    disks = (Disk("local", disk * GiB),) if disk else ()
    return Guest(gid, node, cpu=4, memory=8 * GiB, disks=disks)


def _three_on_a() -> tuple[Guest, ...]:
    """Three guests of 4 vCPUs and 8 GiB on a, the first with a 100 GiB local disk; one of
    2 vCPUs and 4 GiB on b and on c. Two of a's guests must go."""
    small = (Guest(gid, node, cpu=2, memory=4 * GiB) for gid, node in (("103", "b"), ("104", "c")))
    return (_guest("100", "a", disk=100), _guest("101", "a"), _guest("102", "a"), *small)


def test_the_diskless_twins_move() -> None:
    cluster = _cluster(*_three_on_a())
    proposal = propose_balance(cluster)
    assert sorted(m.guest for m in proposal.net_moves()) == ["101", "102"]
    assert all(m.reason.startswith("balance") for m in proposal.moves)


def test_a_twin_with_a_rule_is_not_taken() -> None:
    # 102 is kept apart from 105 (on b): a guest bound by a rule is no twin, even where it
    # could go (to c); 101 stands in for one of a's moves, 100 with its disk for the other.
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("102", "105"), positive=False),))
    cluster = _cluster(*_three_on_a(), Guest("105", "b", cpu=1, memory=GiB), rules=rules)
    moved = sorted(m.guest for m in propose_balance(cluster).net_moves())
    assert "100" in moved and "101" in moved and "102" not in moved


@st.composite
def twin_clusters(draw: st.DrawFn) -> Cluster:
    """Small static clusters of a few guest sizes, a third with local disks, some rules: many
    guests balance alike, and the nodes' loads differ."""
    n_nodes = draw(st.integers(2, 5))
    nodes = tuple(
        Node(f"n{i}", 16, draw(st.sampled_from([16, 32])) * GiB, storage={"local": 200 * GiB})
        for i in range(n_nodes)
    )
    guests = []
    for j in range(draw(st.integers(2, 20))):
        cpu, memory = draw(st.sampled_from([(1, 1), (2, 2), (2, 4)]))
        guests.append(
            Guest(
                str(100 + j),
                f"n{draw(st.integers(0, n_nodes - 1)) if draw(st.booleans()) else 0}",
                cpu=cpu,
                memory=memory * GiB,
                disks=draw(st.sampled_from([(), (), (Disk("local", 20 * GiB),)])),
            )
        )
    ids = [g.id for g in guests]
    pairs = st.tuples(st.sampled_from(ids), st.sampled_from(ids), st.booleans())
    groups = tuple(
        GuestAffinity(f"g{k}", (a, b), positive=together)
        for k, (a, b, together) in enumerate(draw(st.lists(pairs, max_size=2)))
        if a != b
    )
    return Cluster(nodes, tuple(guests), Rules(guest_affinity=groups), STATIC)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(twin_clusters() | clusters())
def test_no_cheaper_twin_is_left_behind(cluster: Cluster) -> None:
    proposal = propose_balance(cluster)
    assert_moves_safe(cluster, proposal.net_moves())
    placement = {m.guest: m.target for m in proposal.net_moves()}
    assert twin_figures(cluster, placement).with_twin == 0
