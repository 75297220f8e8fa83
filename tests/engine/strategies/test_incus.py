"""incus: Incus's automatic cluster rebalancing (its feature request), with its bugs fixed.

Hand-checked cases (static mode: sizes are the configured ``limits``, as in Incus; nodes of 10 cores
and 1000 MiB, so a guest of c cores and 100·c MiB adds 10·c to its node's score), the fixed bugs,
edge cases and properties.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from clusters import assert_moves_safe, clusters
from opendrs.engine.strategies.base import Proposal, Request
from opendrs.engine.strategies.incus import IncusOptions, propose_incus, relative_gap, server_scores
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import NodeAffinity, Rules

MiB = 1024**2
STATIC = Settings(mode="static")


def _incus(
    cluster: Cluster,
    forbidden: Iterable[tuple[str, str]] = (),
    *,
    cooldown_until: Mapping[str, float] | None = None,
    now: float | None = None,
    **options: Any,
) -> Proposal:
    """:func:`propose_incus` on a bare cluster's view, the cooldown asked, the options typed."""
    request = Request(frozenset(forbidden), cooldown_until=cooldown_until, now=now)
    return propose_incus(CycleView(cluster), request, IncusOptions(**options))


def _node(name: str, arch: str = "x86_64") -> Node:
    return Node(name, 10, 1000 * MiB, arch=arch)


def _vm(vmid: int, node: str, cores: float, **kw: object) -> Guest:
    guest = Guest(f"vm:{vmid}", node, cpu=cores, memory=round(cores * 100) * MiB)
    return replace(guest, **kw)  # type: ignore[arg-type]


def _cluster(*extra: Guest, nodes: tuple[Node, ...] = (), **kw: object) -> Cluster:
    # Scores: node1 (2 + 0.5 + 4 cores of 10, 650 of 1000 MiB) = 65, node2 20, node3 30.
    guests = (
        _vm(101, "node1", 2),
        _vm(102, "node1", 0.5),
        _vm(103, "node1", 4),
        _vm(104, "node2", 2),
        _vm(105, "node3", 3),
        *extra,
    )
    base = (_node("node1"), _node("node2"), _node("node3"))
    kw.setdefault("settings", STATIC)
    return Cluster((*base, *nodes), guests, **kw)  # type: ignore[arg-type]


def test_scores_and_gap() -> None:
    load = np.array([[6.5, 650.0], [2.0, 200.0], [20.0, 900.0]])
    cap = np.array([[10.0, 1000.0]] * 3)
    # (65 + 65)/2 = 65; (20 + 20)/2 = 20; (200 + 90)/2 = 145 — Incus's uint8 maths would wrap the
    # sum 200 + 90 = 290 to 34 and report 17 for the busiest node.
    assert server_scores(load, cap).tolist() == pytest.approx([65.0, 20.0, 145.0])
    assert relative_gap(np.array([65.0, 20.0, 30.0])) == pytest.approx(45 / 65 * 100)
    assert relative_gap(np.array([0.0, 0.0])) == 0.0


def test_one_move_per_run_by_default() -> None:
    # Gap (65 − 20)/65 = 69.2 % ≥ 20 %: node1 is the source, node2 the least loaded target, the
    # midpoint (65 + 20)/2 = 42.5. vm:101 would bring node2 to 40 (fits), vm:102 to 25 (fits),
    # vm:103 to 60 (too much). The largest fitting impact first: vm:101 (+20). Batch 1: done.
    proposal = _incus(_cluster())
    assert [(m.guest, m.source, m.target) for m in proposal.moves] == [("vm:101", "node1", "node2")]
    (move,) = proposal.moves
    # After: node1 45, node2 40, node3 30: gap (45 − 30)/45 = 33.3 %.
    assert move.metric == "gap"
    assert move.before == pytest.approx(69.23076923076923)
    assert move.after == pytest.approx(100 / 3)
    assert move.reason == (
        "x86_64 gap 69.2%: node1 score 65.0 -> 45.0, node2 20.0 -> 40.0 (midpoint 42.5)"
    )
    assert proposal.stopped == "x86_64: batch of 1 spent"
    assert proposal.options == {"threshold": 20.0, "max_moves": 1, "now": None, "in_cooldown": []}


def test_source_and_target_are_recomputed_after_every_move() -> None:
    # Move 2: node1 45 is still the busiest, node3 30 now the least loaded: midpoint 37.5; vm:102
    # brings node3 to 35 (fits), vm:103 to 70 (no). Then node1 40, node2 40, node3 35: the gap
    # (40 − 35)/40 = 12.5 % is below 20 %: stop, with one move of the batch unused.
    proposal = _incus(_cluster(), max_moves=3)
    assert [(m.guest, m.target) for m in proposal.moves] == [
        ("vm:101", "node2"),
        ("vm:102", "node3"),
    ]
    assert proposal.moves[1].reason == (
        "x86_64 gap 33.3%: node1 score 45.0 -> 40.0, node3 30.0 -> 35.0 (midpoint 37.5)"
    )
    assert proposal.stopped == "x86_64: gap 12.5% below threshold 20%"


def test_reaching_the_midpoint_is_too_much() -> None:
    # vm:102 made 1 core / 100 MiB: node1 70. After vm:101 (node2 20 -> 40 < 45): node1 50,
    # node2 40, node3 30; midpoint with node3 is 40 and vm:102 would bring node3 exactly to 40.
    guests = tuple(_vm(102, "node1", 1) if g.id == "vm:102" else g for g in _cluster().guests)
    cluster = replace(_cluster(), guests=guests)
    proposal = _incus(cluster, max_moves=3)
    assert [m.guest for m in proposal.moves] == ["vm:101"]
    assert proposal.stopped == "x86_64: no VM on node1 fits below a target's midpoint"


def test_threshold_cooldown_and_containers() -> None:
    assert _incus(_cluster(), threshold=80).stopped == ("x86_64: gap 69.2% below threshold 80%")
    # vm:101 cools down until t=2000: at t=1000 the next fit, vm:102 (+5, node2 20 -> 25), moves;
    # then node1 60, node2 25: vm:103 (+40) does not fit below 42.5 and vm:101 may not move.
    cooling = _incus(_cluster(), max_moves=3, cooldown_until={"vm:101": 2000.0}, now=1000.0)
    assert [(m.guest, m.target) for m in cooling.moves] == [("vm:102", "node2")]
    assert cooling.options["in_cooldown"] == ["vm:101"]
    assert [
        m.guest for m in _incus(_cluster(), cooldown_until={"vm:101": 2000.0}, now=3000.0).moves
    ] == ["vm:101"]
    with pytest.raises(ValueError, match="cooldown_until needs now"):
        _incus(_cluster(), cooldown_until={"vm:101": 2000.0})
    # A container the size of vm:101 is never moved, even with restart migration allowed.
    ct = Guest("ct:106", "node1", kind="ct", cpu=2, memory=200 * MiB)
    with_ct = _cluster(ct, settings=Settings(mode="static", allow_restart_migration=True))
    assert all(m.guest != "ct:106" for m in _incus(with_ct, max_moves=5).moves)


def test_architectures_in_sorted_order_and_one_batch_for_all() -> None:
    # aarch64 (sorted first): arm1 (6 + 1 cores) 70, arm2 idle 0: gap 100 %, midpoint 35;
    # vm:401 (+60) does not fit, vm:402 (+10) does. The batch of 1 is then spent: x86_64 waits.
    arm = (_node("arm1", "aarch64"), _node("arm2", "aarch64"))
    guests = (_vm(401, "arm1", 6), _vm(402, "arm1", 1))
    cluster = _cluster(*guests, nodes=arm)
    proposal = _incus(cluster)
    assert [(m.guest, m.target) for m in proposal.moves] == [("vm:402", "arm2")]
    assert proposal.stopped == ("aarch64: batch of 1 spent; x86_64: not visited, batch of 1 spent")
    both = _incus(cluster, max_moves=2)
    assert [(m.guest, m.target) for m in both.moves] == [("vm:402", "arm2"), ("vm:101", "node2")]


def test_overloaded_node_is_the_busiest_not_wrapped_to_idle() -> None:
    # Dynamic mode, 4-core nodes: node1 carries 6 + 2 cores busy (fraction 2.0) and 900 MiB:
    # score (200 + 90)/2 = 145 (Incus: uint8(200) + uint8(90) wraps to 34, score 17 — idle).
    # node2: 1 core, 500 MiB: (25 + 50)/2 = 37.5. Midpoint 91.25. vm:502 (2 cores, 300 MiB) brings
    # node2 to (75 + 80)/2 = 77.5 and fits; vm:501 (6 cores) would overflow node2's 4 cores.
    # node1 keeps 6 cores and 600 MiB: (150 + 60)/2 = 105.
    nodes = (Node("node1", 4, 1000 * MiB), Node("node2", 4, 1000 * MiB))
    guests = (
        Guest("vm:501", "node1", cpu=8, memory=600 * MiB, cpu_used=6.0),
        Guest("vm:502", "node1", cpu=2, memory=300 * MiB, cpu_used=2.0),
        Guest("vm:503", "node2", cpu=1, memory=500 * MiB, cpu_used=1.0),
    )
    proposal = _incus(Cluster(nodes, guests))
    assert [(m.guest, m.source, m.target) for m in proposal.moves] == [("vm:502", "node1", "node2")]
    assert proposal.moves[0].reason == (
        "x86_64 gap 74.1%: node1 score 145.0 -> 105.0, node2 37.5 -> 77.5 (midpoint 91.2)"
    )


def test_constraints_pick_the_target() -> None:
    # vm:101 may only run on node1 or node3 (strict node affinity): its target is node3 (30),
    # midpoint 47.5, +20 -> 50 does not fit; vm:102 (+5 on node2) is the largest that fits.
    rules = Rules(
        node_affinity=(NodeAffinity("pin", ("vm:101",), {"node1": 1, "node3": 1}, strict=True),)
    )
    proposal = _incus(_cluster(rules=rules))
    assert [(m.guest, m.target) for m in proposal.moves] == [("vm:102", "node2")]
    forbidden = _incus(_cluster(), forbidden=[("vm:101", "node2")])
    assert [(m.guest, m.target) for m in forbidden.moves] == [("vm:102", "node2")]


def test_idle_single_member_and_nothing_movable() -> None:
    idle = Cluster((_node("node1"), _node("node2")), (), settings=STATIC)
    assert _incus(idle).stopped == "x86_64: busiest member node1 is idle"
    lonely = _cluster(nodes=(_node("arm1", "aarch64"),))
    assert _incus(lonely).stopped.startswith("aarch64: fewer than 2 members; ")
    locked = replace(_cluster(), guests=tuple(replace(g, lock="backup") for g in _cluster().guests))
    assert _incus(locked).stopped == "x86_64: no VM on node1 fits below a target's midpoint"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_proposals_are_safe_and_deterministic(cluster: Cluster) -> None:
    proposal = _incus(cluster, threshold=5, max_moves=5)
    assert proposal.as_dict() == _incus(cluster, threshold=5, max_moves=5).as_dict()
    assert len({m.guest for m in proposal.moves}) == len(proposal.moves)  # once per run
    for move in proposal.moves:
        assert cluster.guest(move.guest).kind == "vm"
        source, target = cluster.node(move.source), cluster.node(move.target)
        assert source.arch == target.arch
    assert_moves_safe(cluster, proposal.moves)
