"""static-greedy: the static-usage scheduler series' balancer idea on opendrs's placement scores.

Hand-checked cases (static mode, cpu and memory in proportion so that both resources read alike;
the arithmetic is in the comments), the keep tolerance, edge cases and properties.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings

from clusters import assert_moves_safe, clusters
from opendrs.engine.placement import PlacementState
from opendrs.engine.strategies.base import Proposal, Request
from opendrs.engine.strategies.greedy import GreedyOptions, badness, balance_sigma, propose_greedy
from opendrs.engine.strategies.pve import movable_bundles
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3

MiB = 1024**2
STATIC = Settings(mode="static")


def _greedy(
    cluster: Cluster, forbidden: Iterable[tuple[str, str]] = (), **options: Any
) -> Proposal:
    """:func:`propose_greedy` on a bare cluster's view, the options typed."""
    return propose_greedy(
        CycleView(cluster), Request(frozenset(forbidden)), GreedyOptions(**options)
    )


def _nodes(count: int = 3) -> tuple[Node, ...]:
    # 10 cores and 1000 MiB: a guest of c cores and 100·c MiB is c/10 of a node in both.
    return tuple(Node(f"node{i}", 10, 1000 * MiB) for i in range(1, count + 1))


def _guest(gid: str, node: str, cores: float, **kw: object) -> Guest:
    return replace(Guest(gid, node, cpu=cores, memory=round(cores * 100) * MiB), **kw)  # type: ignore[arg-type]


def _abc(**kw: object) -> Cluster:
    guests = (_guest("A", "node1", 4), _guest("B", "node1", 2), _guest("C", "node2", 2))
    return Cluster(_nodes(), guests, settings=STATIC, **kw)  # type: ignore[arg-type]


def test_badness_is_the_share_of_the_nodes_excess() -> None:
    # Fractions 0.6, 0.2, 0 (both resources); the mean is 0.8/3 = 0.2667, so node1 is 0.3333 above
    # it and node2 below. A puts 0.4 on node1 but only 0.3333 is excess: badness 1/3. B puts 0.2:
    # badness 0.2. C is on a node below the mean: 0.
    state = PlacementState.build(_abc())
    bundles = movable_bundles(state, state.cluster)
    assert [b.leader for b in bundles] == ["A", "B", "C"]
    assert badness(state, bundles).tolist() == pytest.approx([1 / 3, 0.2, 0.0])
    # σ of (0.6, 0.2, 0): deviations 1/3, −1/15, −4/15: variance 0.06222, σ = 0.2494.
    assert balance_sigma(state) == pytest.approx(0.24944382578492943)


def test_worst_guest_first_each_to_its_best_node() -> None:
    # A (badness 1/3) first. Taken off node1 the fractions are (0.2, 0.2, 0); with A on
    #   node1: (0.6, 0.2, 0)  σ 0.2494       node2: (0.2, 0.6, 0)  σ 0.2494
    #   node3: (0.2, 0.2, 0.4): deviations −1/15, −1/15, 2/15, variance 0.008889, σ 0.0943
    # node3 beats node1 by 0.155 ≥ 0.005: A moves. B next: off node1 (0, 0.2, 0.4); on node1
    # (0.2, 0.2, 0.4) σ 0.0943 beats node2 (0, 0.4, 0.4) σ 0.1886 and node3 σ 0.2494: B stays,
    # and C likewise.
    proposal = _greedy(_abc())
    assert [(m.guest, m.source, m.target) for m in proposal.moves] == [("A", "node1", "node3")]
    (move,) = proposal.moves
    assert move.metric == "score"
    assert move.before == pytest.approx(0.24944382578492943)
    assert move.after == pytest.approx(0.09428090415820634)
    assert move.reason == (
        "badness 0.3333; score 0.2494 on node1 -> 0.0943 on node3 (balance 0.0943, penalty 0)"
    )
    assert proposal.stopped == "1 pass done"
    assert proposal.options == {"keep": 0.005, "passes": 1}


def _two_nodes(small_cores: float = 0.04) -> Cluster:
    guests = (
        _guest("vm:101", "node1", 5),
        _guest("vm:102", "node1", small_cores),
        _guest("vm:103", "node2", 5 - small_cores),
    )
    return Cluster(_nodes(2), guests, settings=STATIC)


def test_keep_tolerance() -> None:
    # Two equal nodes at 0.504 and 0.496: σ = |0.504 − 0.496| / 2 = 0.004. Moving vm:102 (0.004)
    # would make them equal (σ 0), but 0.004 − 0 < keep 0.005: it stays. With keep 0.003 it moves.
    # (vm:101 and vm:102 tie on badness 0.004, the excess; vm:101 goes first and stays.)
    kept = _greedy(_two_nodes())
    assert kept.moves == ()
    assert kept.stopped == "pass 1 moved nothing: every guest is within 0.005 of its best node"
    moved = _greedy(_two_nodes(), keep=0.003)
    assert [(m.guest, m.target) for m in moved.moves] == [("vm:102", "node2")]
    assert moved.moves[0].before == pytest.approx(0.004)
    assert moved.moves[0].after == pytest.approx(0.0, abs=1e-12)


def test_soft_rules_weigh_in_the_score() -> None:
    # A prefers node2 (non-strict node affinity): node3 now scores 0.0943 + 1 (a broken soft
    # rule), node1 0.2494 + 1, node2 0.2494: A goes to node2 (1.2494 -> 0.2494). Then C, taken off
    # node2 (0.2, 0.4, 0), is best on node3 (0.2, 0.4 → 0.2, 0.2): (0.2, 0.4, 0.2) σ 0.0943.
    rules = Rules(node_affinity=(NodeAffinity("pref", ("A",), {"node2": 1}),))
    proposal = _greedy(_abc(rules=rules))
    assert [(m.guest, m.target) for m in proposal.moves] == [("A", "node2"), ("C", "node3")]
    assert proposal.moves[0].before == pytest.approx(1.2494438257849294)
    assert proposal.moves[0].after == pytest.approx(0.24944382578492943)


def test_a_node_that_is_not_allowed_any_more_is_left_whatever_keep() -> None:
    nodes = (replace(_nodes()[0], maintenance=True), *_nodes()[1:])
    cluster = Cluster(nodes, (_guest("A", "node1", 1), _guest("B", "node2", 1)), settings=STATIC)
    proposal = _greedy(cluster, keep=10.0)
    assert [(m.guest, m.target) for m in proposal.moves] == [("A", "node3")]
    assert proposal.moves[0].reason.endswith("; node1 is not allowed any more")


def test_passes_stop_when_a_pass_moves_nothing() -> None:
    proposal = _greedy(_abc(), passes=3)
    assert [m.guest for m in proposal.moves] == ["A"]
    assert proposal.stopped.startswith("pass 2 moved nothing")


def test_bundles_move_together_and_edge_cases() -> None:
    # {A, B} (0.6 of node1) is one bundle: on node3 the fractions are (0, 0.2, 0.6), σ 0.2494 —
    # a tie with staying, and the current node wins ties: nothing moves (C ties likewise).
    pair = Rules(guest_affinity=(GuestAffinity("pair", ("A", "B"), positive=True),))
    assert _greedy(_abc(rules=pair)).moves == ()
    # A bundle split over two nodes (A on node1, C on node2) is skipped, as Proxmox does; B alone
    # goes from (0.4 + 0.2, 0.2, 0) to node3: (0.4, 0.2, 0.2), σ 0.0943.
    split = Rules(guest_affinity=(GuestAffinity("split", ("A", "C"), positive=True),))
    moved = _greedy(_abc(rules=split))
    assert [(m.guest, m.target) for m in moved.moves] == [("B", "node3")]
    locked = Cluster(
        _nodes(), tuple(replace(g, lock="backup") for g in _abc().guests), settings=STATIC
    )
    assert _greedy(locked).stopped == "no movable guest"
    assert _greedy(_abc(), passes=0).stopped == "no pass requested"


def test_forbidden_and_registry() -> None:
    proposal = _greedy(_abc(), forbidden=[("A", "node3")])
    assert all(not (m.guest == "A" and m.target == "node3") for m in proposal.moves)


def _moved_twice() -> Cluster:
    """Found by the deep profile: the second pass moves 101 back and 102 onto 101's first target;
    judged where each guest ends, no partners share a node."""
    nodes = (
        Node("n0", 4, 8 * GiB),
        Node("n1", 2, 4 * GiB),
        Node("n2", 2, 4 * GiB, online=False),
        Node("n3", 8, 4 * GiB),
        Node("n4", 16, 4 * GiB),
    )
    guests = (
        Guest("100", "n2", cpu=1, memory=GiB, uptime=3600),
        Guest("101", "n0", cpu=1, memory=4 * GiB, uptime=3600),
        Guest("102", "n0", cpu=2, memory=GiB, uptime=3600),
    )
    rules = Rules(
        guest_affinity=(
            GuestAffinity("g0", ("100", "101", "102"), positive=False),
            GuestAffinity("g1", ("100", "101"), positive=False, hard=False),
        )
    )
    return Cluster(nodes, guests, rules, Settings(mode="static"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
@example(_moved_twice())
def test_proposals_are_safe_and_deterministic(cluster: Cluster) -> None:
    proposal = _greedy(cluster, passes=2)
    assert proposal.as_dict() == _greedy(cluster, passes=2).as_dict()
    assert_moves_safe(cluster, proposal.moves)
