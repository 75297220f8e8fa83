"""Rule semantics an operator relies on (issue #12): soft rules never drop hard ones, node
priorities are tiers a full node falls through, and HA states the HA manager handles hold."""

from __future__ import annotations

import numpy as np
import pytest

from opendrs.engine.constraints import HA_HELD, Constraints, check_rules, current_assign, movability
from opendrs.engine.placement import evacuate, place_guest
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3


def _nodes(*names: str, memory: int = 16) -> tuple[Node, ...]:
    return tuple(Node(n, 8, memory * GiB) for n in names)


def _static(nodes: tuple[Node, ...], guests: tuple[Guest, ...], rules: Rules) -> Cluster:
    return Cluster(nodes, guests, rules, Settings(mode="static"))


# --------------------------------------------------------------------------------------------
# A soft rule never causes a hard rule to be dropped


def test_a_soft_positive_rule_never_drops_a_hard_negative_one() -> None:
    guests = (Guest("1", "a", memory=GiB), Guest("2", "b", memory=GiB))
    soft = GuestAffinity("soft-together", ("1", "2"), positive=True, hard=False)
    hard = GuestAffinity("apart", ("1", "2"), positive=False)
    kept, problems = check_rules(
        _static(_nodes("a", "b"), guests, Rules(guest_affinity=(soft, hard)))
    )
    assert kept.guest_affinity == (hard,)
    assert [str(p) for p in problems] == [
        "Drop rule 'soft-together', because hard rule 'apart' keeps guests '1', '2' apart"
    ]


def test_a_soft_negative_rule_never_drops_a_hard_positive_one() -> None:
    guests = (Guest("1", "a", memory=GiB), Guest("2", "a", memory=GiB))
    hard = GuestAffinity("together", ("1", "2"), positive=True)
    soft = GuestAffinity("soft-apart", ("1", "2"), positive=False, hard=False)
    kept, problems = check_rules(
        _static(_nodes("a", "b"), guests, Rules(guest_affinity=(hard, soft)))
    )
    assert kept.guest_affinity == (hard,)
    assert [str(p) for p in problems] == [
        "Drop rule 'soft-apart', because hard rule 'together' keeps guests '1', '2' together"
    ]


def test_rules_alike_in_strength_are_both_dropped() -> None:
    guests = (Guest("1", "a", memory=GiB), Guest("2", "b", memory=GiB))
    pos = GuestAffinity("with", ("1", "2"), positive=True, hard=False)
    neg = GuestAffinity("without", ("1", "2"), positive=False, hard=False)
    kept, problems = check_rules(
        _static(_nodes("a", "b"), guests, Rules(guest_affinity=(pos, neg)))
    )
    assert kept.guest_affinity == ()
    assert [p.rules for p in problems] == [("with", "without")]


def test_evacuation_keeps_the_hard_rule_a_soft_one_contradicts() -> None:
    # b is the emptier node, so balance alone would send 1 to b, next to its hard partner 2.
    nodes = (Node("a", 8, 16 * GiB, maintenance=True), *_nodes("b", "c"))
    guests = (
        Guest("1", "a", memory=2 * GiB),
        Guest("2", "b", memory=GiB),
        Guest("3", "c", memory=8 * GiB),
    )
    rules = Rules(
        guest_affinity=(
            GuestAffinity("soft-together", ("1", "2"), positive=True, hard=False),
            GuestAffinity("apart", ("1", "2"), positive=False),
        )
    )
    result = evacuate(_static(nodes, guests, rules), "a")
    assert [(m.guest, m.target) for m in result.moves] == [("1", "c")]


# --------------------------------------------------------------------------------------------
# Strict node affinity: priorities are tiers, a tier without room is passed over


def _tiered(*guests: Guest, strict: bool = True, ha: bool = False) -> Cluster:
    """n1 (priority 2) holds the 14 GiB guest 'big' pinned there: 2 GiB free of 16."""
    rule = NodeAffinity("tiers", tuple(g.id for g in guests), {"n1": 2, "n2": 1}, strict=strict)
    pin = NodeAffinity("keep", ("big",), {"n1": 0}, strict=True)
    members = tuple(Guest(g.id, g.node, memory=g.memory, ha=ha) for g in guests)
    return _static(
        _nodes("n1", "n2", "n3"),
        (Guest("big", "n1", memory=14 * GiB), *members),
        Rules(node_affinity=(pin, rule)),
    )


def test_a_full_top_priority_node_passes_the_guest_to_the_next_priority() -> None:
    cons = Constraints.build(_tiered(Guest("1", "n3", memory=4 * GiB)))
    assert cons.strict_ok[1].tolist() == [False, True, False]
    placement = place_guest(cons.cluster, "1")
    assert placement.best == "n2"
    assert dict((r.node, str(r)) for r in placement.rejected)["n1"] == (
        "strict node affinity (tiers): priority 2 has no room for it, priority 1 is used"
    )


def test_the_top_priority_is_used_while_it_has_room() -> None:
    cons = Constraints.build(_tiered(Guest("1", "n3", memory=2 * GiB)))
    assert cons.strict_ok[1].tolist() == [True, False, False]
    placement = place_guest(cons.cluster, "1")
    assert placement.best == "n1"
    assert dict((r.node, str(r)) for r in placement.rejected)["n2"] == (
        "strict node affinity (tiers): priority 1, while priority 2 can take it"
    )


def test_a_guest_on_a_full_top_node_keeps_its_own_room() -> None:
    cluster = _tiered(Guest("1", "n1", memory=GiB))
    cluster = Cluster(
        cluster.nodes,
        (Guest("big", "n1", memory=15 * GiB), *cluster.guests[1:]),
        cluster.rules,
        cluster.settings,
    )
    cons = Constraints.build(cluster)
    assert cons.strict_ok[1].tolist() == [True, False, False]
    assert cons.violations(current_assign(cluster)) == []


def test_guests_of_a_rule_do_not_count_on_the_same_room() -> None:
    # n1 has room for one of the two: the first claims it, the second uses n2.
    cluster = _tiered(Guest("1", "n3", memory=2 * GiB), Guest("2", "n3", memory=2 * GiB))
    cons = Constraints.build(cluster)
    assert cons.strict_ok[1:].tolist() == [[True, False, False], [False, True, False]]
    drained = Cluster(
        (*cluster.nodes[:2], Node("n3", 8, 16 * GiB, maintenance=True)),
        cluster.guests,
        cluster.rules,
        cluster.settings,
    )
    result = evacuate(drained, "n3")
    assert sorted((m.guest, m.target) for m in result.moves) == [("1", "n1"), ("2", "n2")]
    assert result.stuck == ()


def test_hard_anti_affine_guests_of_a_rule_spread_over_its_priorities() -> None:
    # n1 has room for both, but they must be apart: the second uses n2, as the rule check that
    # counts every node of the rule promises (a 2-replica rule on {n1: 2, n2: 1} is feasible).
    nodes = (*_nodes("n1", "n2"), Node("n3", 8, 16 * GiB, maintenance=True))
    guests = (Guest("1", "n3", memory=GiB), Guest("2", "n3", memory=GiB))
    rules = Rules(
        node_affinity=(NodeAffinity("tiers", ("1", "2"), {"n1": 2, "n2": 1}, strict=True),),
        guest_affinity=(GuestAffinity("apart", ("1", "2"), positive=False),),
    )
    cluster = _static(nodes, guests, rules)
    cons = Constraints.build(cluster)
    assert cons.problems == []
    assert cons.strict_ok.dense().tolist() == [[True, False, False], [False, True, False]]
    result = evacuate(cluster, "n3")
    assert sorted((m.guest, m.target) for m in result.moves) == [("1", "n1"), ("2", "n2")]
    assert result.stuck == ()
    reasons = {r.node: str(r) for r in place_guest(cluster, "2").rejected}
    assert reasons["n1"] == (
        "strict node affinity (tiers): priority 2 holds its hard anti-affinity partner 1, "
        "priority 1 is used"
    )


def test_an_ha_managed_guest_keeps_the_top_priority_as_proxmox_fails_it_back() -> None:
    cons = Constraints.build(_tiered(Guest("1", "n3", memory=4 * GiB), ha=True))
    assert cons.strict_ok[1].tolist() == [True, False, False]
    placement = place_guest(cons.cluster, "1")
    assert placement.best is None
    assert dict((r.node, str(r)) for r in placement.rejected)["n1"].startswith("capacity: ")


def test_a_non_strict_rule_prefers_the_next_priority_when_the_top_is_full() -> None:
    cons = Constraints.build(_tiered(Guest("1", "n3", memory=4 * GiB), strict=False))
    assert cons.preferred[1].tolist() == [False, True, False]
    assert cons.strict_ok[1].all()
    assert place_guest(cons.cluster, "1").best == "n2"


def test_tiers_are_deterministic_under_node_order() -> None:
    one = _tiered(Guest("1", "n3", memory=2 * GiB), Guest("2", "n3", memory=2 * GiB))
    two = Cluster(one.nodes[::-1], one.guests[::-1], one.rules, one.settings)
    tiers_one = dict(
        zip([g.id for g in one.guests], Constraints.build(one).tier.tolist(), strict=True)
    )
    tiers_two = dict(
        zip([g.id for g in two.guests], Constraints.build(two).tier.tolist(), strict=True)
    )
    assert tiers_one == tiers_two == {"big": 0, "1": 2, "2": 1}


# --------------------------------------------------------------------------------------------
# HA states the HA manager (or an operator) handles: never migrated by a plan


@pytest.mark.parametrize("state", sorted(HA_HELD - {"ignored"}))
def test_ha_states_in_hand_hold_the_guest(state: str) -> None:
    guest = Guest("1", "a", memory=GiB, uptime=86400, ha=True, ha_state=state)
    cluster = _static(_nodes("a", "b"), (guest,), Rules())
    assert str(movability(guest, cluster, "balance")) == f"HA state {state}"
    assert str(movability(guest, cluster, "evacuate")) == f"HA state {state}"
    # Recovery is the HA manager's own business for a guest on a failed node: ranked as before.
    assert movability(guest, cluster, "recover") is None


def test_a_started_ha_guest_may_move() -> None:
    guest = Guest("1", "a", memory=GiB, uptime=86400, ha=True, ha_state="started")
    assert movability(guest, _static(_nodes("a", "b"), (guest,), Rules()), "balance") is None


def test_evacuation_leaves_a_guest_in_ha_state_error_and_says_why() -> None:
    nodes = (Node("a", 8, 16 * GiB, maintenance=True), *_nodes("b"))
    guests = (
        Guest("1", "a", memory=GiB, uptime=86400, ha=True, ha_state="error"),
        Guest("2", "a", memory=GiB, uptime=86400, ha=True, ha_state="started"),
    )
    result = evacuate(_static(nodes, guests, Rules()), "a")
    assert [(m.guest, m.target) for m in result.moves] == [("2", "b")]
    assert result.stuck == (("1", "HA state error"),)


def test_place_recover_never_ranks_the_failed_node() -> None:
    guests = (
        Guest("1", "a", memory=GiB),
        Guest("2", "b", memory=8 * GiB),
        Guest("3", "c", memory=8 * GiB),
    )
    placement = place_guest(_static(_nodes("a", "b", "c"), guests, Rules()), "1", "recover")
    assert [s.node for s in placement.ranking] == ["b", "c"]
    assert [(r.node, str(r)) for r in placement.rejected] == [("a", "node offline")]
    assert not np.any([s.current for s in placement.ranking])
