"""proxlb-greedy: ProxLB 2.3.0's greedy balancer, within opendrs's hard constraints.

Hand-checked runs on three nodes of 100 GiB (memory used in GiB is then the percentage), what
ProxLB's choices are in each step (in the comments), the redirects, the constraints ProxLB does not
check, and properties. Where ProxLB itself is installed (the ``bench`` extra), random rule-free
clusters are also run through it and must give the same migrations.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import assert_moves_safe, clusters
from opendrs.engine.strategies.base import Proposal, Request
from opendrs.engine.strategies.proxlb_greedy import ProxlbGreedyOptions, propose_proxlb_greedy
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3


def _proxlb_greedy(
    cluster: Cluster, forbidden: Iterable[tuple[str, str]] = (), **options: Any
) -> Proposal:
    """:func:`propose_proxlb_greedy` on a bare cluster's view, the options typed."""
    return propose_proxlb_greedy(
        CycleView(cluster), Request(frozenset(forbidden)), ProxlbGreedyOptions(**options)
    )


def _nodes(*maintenance: str) -> tuple[Node, ...]:
    return tuple(Node(n, 16, 100 * GiB, maintenance=n in maintenance) for n in ("n1", "n2", "n3"))


def _g(gid: str, node: str, used: float, configured: float | None = None, **kw: object) -> Guest:
    memory = int((configured if configured is not None else used) * GiB)
    guest = Guest(gid, node, cpu=1, memory=memory, cpu_used=0.5, memory_used=int(used * GiB))
    return replace(guest, **kw)  # type: ignore[arg-type]


def _abcde(**kw: object) -> Cluster:
    # Memory used: n1 60 % (a 10, b 20, c 30), n2 20 % (d), n3 10 % (e). Spread 50 pp.
    guests = (
        _g("a", "n1", 10),
        _g("b", "n1", 20),
        _g("c", "n1", 30),
        _g("d", "n2", 20),
        _g("e", "n3", 10),
    )
    return Cluster(kw.pop("nodes", _nodes()), guests, **kw)  # type: ignore[arg-type]


def _moves(proposal: object) -> list[tuple[str, str, str]]:
    return [(m.guest, m.source, m.target) for m in proposal.moves]  # type: ignore[attr-defined]


def test_smaller_groups_first_and_the_break_rule() -> None:
    # Groups by memory used, ascending: a 10, e 10, b 20, d 20, c 30 (ties keep guest order).
    # a: spread 50 > 10; most free n3 (10 %); a's n1 is the busiest -> n3.  n1 50, n2 20, n3 20.
    # e: most free n2 (tie 20/20: the first node); e's n3 is not the busiest (n1 50): skipped.
    # b: spread 30; most free n2; n1 is the busiest -> n2.                  n1 30, n2 40, n3 20.
    # d: spread 20; most free n3; d's n2 is now the busiest (40) -> n3.     n1 30, n2 20, n3 40.
    # c: spread 20; c's n1 (30) is not the busiest (n3 40): skipped. ProxLB ends at a 20 pp spread.
    proposal = _proxlb_greedy(_abcde())
    assert _moves(proposal) == [("a", "n1", "n3"), ("b", "n1", "n2"), ("d", "n2", "n3")]
    assert [round(m.before, 6) for m in proposal.moves] == [50, 30, 20]
    assert [round(m.after, 6) for m in proposal.moves] == [30, 20, 20]
    assert proposal.stopped == "every group visited"
    assert proposal.after.resources["memory"].spread == pytest.approx(0.2)


def test_larger_guests_first() -> None:
    # c 30, b 20, d 20, a 10, e 10. c: n1 busiest, most free n3 -> n3: n1 30, n2 20, n3 40.
    # b (n1 30) and d (n2 20) and a (n1): not the busiest. e: n3 is -> most free n2: 30/30/30.
    proposal = _proxlb_greedy(_abcde(), larger_first=True)
    assert _moves(proposal) == [("c", "n1", "n3"), ("e", "n3", "n2")]
    assert proposal.after.resources["memory"].spread == pytest.approx(0.0)


def test_balanciness_stops_the_run() -> None:
    # With 25 pp allowed: a moves (50 -> 30 pp), then e's check finds 30 > 25 and skips it, b moves
    # (30 -> 20 pp), and at d the spread 20 ≤ 25 ends the run.
    proposal = _proxlb_greedy(_abcde(), balanciness=25)
    assert _moves(proposal) == [("a", "n1", "n3"), ("b", "n1", "n2")]
    assert proposal.stopped.startswith("balanced: memory used spread 20.0 pp ≤ balanciness 25 pp")
    # Balanced from the start: nothing at all.
    still = _proxlb_greedy(_abcde(), balanciness=50)
    assert still.moves == () and still.stopped.startswith("balanced")


def test_assigned_mode_uses_configured_sizes() -> None:
    # Configured: n1 a 10 + b 20 = 30, n2 d 50, n3 e 10. The trigger and the most free node read
    # the configured percentages, the break rule the used ones (ProxLB reads "used" there always):
    # used n1 30, n2 5, n3 10. Groups: a (10), e (10), b (20), d (5 used!) — by used memory:
    # d 5, a 10, e 10, b 20. d: n2 is not the busiest by use (n1 30): skipped. a: n1 busiest;
    # most free by configuration n3 (10) -> n3: assigned 20/50/20, used 20/5/20 (n1 and n3 tie,
    # n1 first). e: not on n1: skipped. b: n1 busiest; most free n1 (20, first of the tie) = its own
    # node: stays.
    guests = (_g("a", "n1", 10), _g("b", "n1", 20), _g("d", "n2", 5, 50), _g("e", "n3", 10))
    cluster = Cluster(_nodes(), guests)
    proposal = _proxlb_greedy(cluster, mode="assigned")
    assert _moves(proposal) == [("a", "n1", "n3")]
    assert "memory assigned" in proposal.moves[0].reason


def test_cpu_method() -> None:
    # 16 cores each: cpu used n1 8 (two guests of 4), n2 0, n3 2. Groups by memory: a, b, c.
    # a (4 cores): n1 busiest, most free n2 -> n2: 4/4/2, spread 2/16 = 12.5 pp > 10. b: n1 (4)
    # ties with n2 (4): the busiest is the first, n1 -> most free n3 (2): 0/4/6, spread 37.5 pp.
    # c: n3 is the busiest, n1 the most free (its 100 GiB free > c's 90) -> n1: 2/4/4.
    guests = (
        replace(_g("a", "n1", 1), cpu=4, cpu_used=4.0),
        replace(_g("b", "n1", 1), cpu=4, cpu_used=4.0),
        replace(_g("c", "n3", 90), cpu=2, cpu_used=2.0),
    )
    proposal = _proxlb_greedy(Cluster(_nodes(), guests), method="cpu")
    assert _moves(proposal) == [("a", "n1", "n2"), ("b", "n1", "n3"), ("c", "n3", "n1")]


def test_maintenance_first_to_the_most_free_node_each() -> None:
    # n3 in maintenance with f (30) and g (5). f -> the most free other node: n2 (20 < 60) -> 50;
    # g -> n2 again (50 < 60) -> 55. A guest on a maintenance node
    # breaks ProxLB's affinity check, so the balancing goes on regardless of balanciness.
    guests = (
        _g("a", "n1", 10),
        _g("b", "n1", 20),
        _g("c", "n1", 30),
        _g("d", "n2", 20),
        _g("f", "n3", 30),
        _g("g", "n3", 5),
    )
    proposal = _proxlb_greedy(Cluster(_nodes("n3"), guests), balanciness=90)
    assert _moves(proposal)[:2] == [("f", "n3", "n2"), ("g", "n3", "n2")]
    assert "n3 is in maintenance" in proposal.moves[0].reason
    # Then, with the flag set, groups g 5, a 10, b 20, d 20, c 30, f 30; n3 (in maintenance) is no
    # target. g and f moved already (one move per run). a: n1 (60) busiest, n2 (55) most free ->
    # n1 50, n2 65. b: n1 is not the busiest. d: n2 is -> n1: 70/45. c: n1 is -> n2: 40/75.
    assert _moves(proposal)[2:] == [("a", "n1", "n2"), ("d", "n2", "n1"), ("c", "n1", "n2")]


def test_memory_check_is_strict_and_against_the_most_free_node() -> None:
    # n1 holds a guest using 80 GiB; n2 is the most free with 80 GiB free: 80 < 80 fails, it stays.
    guests = (_g("big", "n1", 80), _g("x", "n2", 20), _g("y", "n3", 25))
    proposal = _proxlb_greedy(Cluster(_nodes(), guests))
    assert proposal.moves == ()
    assert any("memory check" in note and "big" in note for note in proposal.notes)


def test_anti_affinity_sends_to_the_first_unused_node() -> None:
    # x and y (soft anti-affinity) share n1 with z: n1 70, n2 10, n3 20. Groups: x 10, y 20, z 40.
    # x: n1 busiest, most free n2; the anti-affinity group has used no node yet: the first node,
    # n1 — x's own node — so x stays (ProxLB does just that). y: the first unused node is now n2.
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("x", "y"), positive=False, hard=False),))
    guests = (_g("x", "n1", 10), _g("y", "n1", 20), _g("z", "n1", 40), _g("w", "n3", 20))
    proposal = _proxlb_greedy(Cluster(_nodes(), guests, rules))
    assert _moves(proposal)[0] == ("y", "n1", "n2")
    assert "anti-affinity group apart" in proposal.moves[0].reason
    assert "x" not in {m.guest for m in proposal.moves}


def test_hard_anti_affinity_filters_the_first_unused_node() -> None:
    # Hard rule: x (with z on n1, 60 %) and y (n2, 5 %). Groups y 5, x 10, w 20, z 50. y: n2 is not
    # the busiest. x: n2 holds y, so x's most free allowed node is n3; the group has used no node
    # yet and the first allowed one is n1, x's own: x stays. z: n1 busiest, most free n2 -> n2.
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("x", "y"), positive=False),))
    guests = (_g("x", "n1", 10), _g("z", "n1", 50), _g("y", "n2", 5), _g("w", "n3", 20))
    proposal = _proxlb_greedy(Cluster(_nodes(), guests, rules))
    assert _moves(proposal) == [("z", "n1", "n2")]


def test_pins_go_to_the_most_free_pinned_node() -> None:
    # p (strict to n1, n2) on the busiest n1: most free overall n3, but pinned: n2.
    strict = Rules(node_affinity=(NodeAffinity("pin", ("p",), {"n1": 1, "n2": 1}, strict=True),))
    guests = (_g("p", "n1", 10), _g("q", "n1", 50), _g("r", "n2", 30), _g("s", "n3", 20))
    proposal = _proxlb_greedy(Cluster(_nodes(), guests, strict))
    assert _moves(proposal)[0] == ("p", "n1", "n2")
    assert "pinned by pin" in proposal.moves[0].reason
    # Non-strict: ProxLB adds the most free node overall to the list, which then wins: n3.
    loose = Rules(node_affinity=(NodeAffinity("pin", ("p",), {"n2": 1}, strict=False),))
    proposal = _proxlb_greedy(Cluster(_nodes(), guests, loose))
    assert _moves(proposal)[0] == ("p", "n1", "n3")


def test_bundles_move_whole() -> None:
    # a and b (hard affinity) form one group of 2, after the single guests e 10, d 20, c 30.
    # e (n3) and d (n2) are not on the busiest node. c: n1 (60) busiest, most free n3 (10) -> n3:
    # n1 30, n3 40. The group a+b, on n1, is no longer on the busiest node: it stays.
    rules = Rules(guest_affinity=(GuestAffinity("together", ("a", "b"), positive=True),))
    proposal = _proxlb_greedy(_abcde(rules=rules))
    assert _moves(proposal) == [("c", "n1", "n3")]
    # Alone on the busiest node, the bundle moves as one: both members, one target.
    guests = (_g("a", "n1", 20), _g("b", "n1", 20), _g("d", "n2", 5), _g("e", "n3", 10))
    proposal = _proxlb_greedy(Cluster(_nodes(), guests, rules))
    assert _moves(proposal) == [("a", "n1", "n2"), ("b", "n1", "n2")]


def test_never_breaks_capacity_that_proxlb_does_not_check() -> None:
    # ProxLB checks used memory only. n3 is the most free by memory but has 4 cores and no
    # overcommit: a (8 vCPUs) may not go there; the next most free allowed node is n2.
    nodes = (Node("n1", 16, 100 * GiB), Node("n2", 16, 100 * GiB), Node("n3", 4, 100 * GiB))
    guests = (
        replace(_g("a", "n1", 10), cpu=8),
        _g("b", "n1", 50),
        _g("c", "n2", 30),
        replace(_g("d", "n3", 5), cpu=2),
    )
    cluster = Cluster(nodes, guests, settings=Settings(cpu_overcommit=1.0))
    proposal = _proxlb_greedy(cluster)
    assert _moves(proposal)[0] == ("a", "n1", "n2")
    assert_moves_safe(cluster, proposal.moves)


def test_forbidden_is_honoured() -> None:
    proposal = _proxlb_greedy(_abcde(), forbidden={("a", "n3"), ("b", "n2")})
    # a: the most free allowed node is n2 (20) -> n1 50, n2 30, n3 10. e: n3 is not the busiest.
    # b: the most free allowed node is n3 (n2 is forbidden) -> 30/30/30, balanced.
    assert _moves(proposal) == [("a", "n1", "n2"), ("b", "n1", "n3")]


def test_immovable_guests_stay_and_max_moves() -> None:
    cluster = replace(_abcde(), rules=Rules(ignored=frozenset({"a"})))
    # a is ignored: b goes first to n3 (10): n1 40, n3 30; then d (n2 20) is not the busiest, c
    # on n1 (40) is: -> n2 (20): 10/50/30; e not on the busiest.
    assert _moves(_proxlb_greedy(cluster)) == [("b", "n1", "n3"), ("c", "n1", "n2")]
    limited = _proxlb_greedy(_abcde(), max_moves=1)
    assert _moves(limited) == [("a", "n1", "n3")]
    assert limited.stopped == "move limit 1 reached"


def test_notes_about_guests_that_stay_are_capped() -> None:
    # 30 locked guests on n3, in maintenance: 20 notes, then a count.
    guests = tuple(_g(f"l{i}", "n3", 1, lock="backup") for i in range(30))
    proposal = _proxlb_greedy(Cluster(_nodes("n3"), guests))
    assert proposal.moves == ()
    assert len(proposal.notes) == 21
    assert proposal.notes[0] == "maintenance: l0: locked (backup), it stays on n3"
    assert proposal.notes[-1] == "… and 10 more guests that stay"


def test_options_are_checked() -> None:
    for kwargs, word in (
        ({"method": "io"}, "method"),
        ({"mode": "psi"}, "psi is not supported"),
        ({"balanciness": -1}, "balanciness"),
        ({"larger_first": 1}, "larger_first"),
        ({"max_moves": -2}, "max_moves"),
    ):
        with pytest.raises(ValueError, match=word):
            _proxlb_greedy(_abcde(), **kwargs)  # type: ignore[arg-type]


def test_deterministic() -> None:
    first = _proxlb_greedy(_abcde(), larger_first=True)
    second = _proxlb_greedy(_abcde(), larger_first=True)
    assert first.moves == second.moves and first.stopped == second.stopped


def test_no_running_guest() -> None:
    cluster = Cluster(_nodes(), (replace(_g("a", "n1", 10), state="stopped"),))
    assert _proxlb_greedy(cluster).stopped == "no running guest to balance"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clusters(),
    st.sampled_from(["memory", "cpu", "disk"]),
    st.sampled_from(["used", "assigned"]),
    st.booleans(),
    st.data(),
)
def test_property_safe_and_forbidden(
    cluster: Cluster, method: str, mode: str, larger: bool, data: st.DataObject
) -> None:
    pairs = [(g.id, n.name) for g in cluster.guests for n in cluster.nodes]
    forbidden = set(data.draw(st.lists(st.sampled_from(pairs), max_size=8)))
    proposal = _proxlb_greedy(
        cluster, forbidden=forbidden, method=method, mode=mode, larger_first=larger, balanciness=2
    )
    assert_moves_safe(cluster, proposal.moves)
    assert not {(m.guest, m.target) for m in proposal.moves} & forbidden
    assert len({m.guest for m in proposal.moves}) == len(proposal.moves)


# --------------------------------------------------------------------------------------------
# Against ProxLB itself (skipped unless the bench extra is installed)


def _random_cluster(seed: int) -> Cluster:
    """Nodes with room to spare (so opendrs's capacity checks never bite), some in maintenance."""
    rnd = random.Random(seed)
    nodes = tuple(
        Node(
            f"n{i}",
            64,
            rnd.choice([64, 128, 256]) * GiB,
            maintenance=i > 0 and rnd.random() < 0.15,
        )
        for i in range(rnd.randint(2, 5))
    )
    guests = []
    for j in range(rnd.randint(1, 14)):
        memory = rnd.choice([1, 2, 4, 8, 16]) * GiB
        guests.append(
            Guest(
                str(100 + j),
                rnd.choice(nodes).name,
                cpu=2,
                memory=memory,
                cpu_used=rnd.random(),
                memory_used=int(memory * rnd.uniform(0.3, 1.0)),
            )
        )
    # ProxLB notices a broken rule one guest late: end with a guest that breaks none.
    guests.append(Guest("999", "n0", cpu=1, memory=GiB // 4, memory_used=GiB // 8))
    settings = Settings(mode="static", cpu_overcommit=100.0, memory_overcommit=10.0)
    return Cluster(nodes, tuple(guests), settings=settings)


def test_same_migrations_as_proxlb() -> None:
    pytest.importorskip("proxlb")
    root = str(Path(__file__).resolve().parents[3])
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench.peers import proxlb_greedy as peer

    for seed in range(150):
        cluster = _random_cluster(seed)
        for mode in ("used", "assigned"):
            expected = peer.run(cluster, mode=mode, balanciness=5).placement
            proposal = _proxlb_greedy(cluster, mode=mode, balanciness=5)
            assert {m.guest: m.target for m in proposal.moves} == expected, (seed, mode)
