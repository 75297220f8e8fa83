"""A node that runs hot — its recent measured load above the policy's hot level — is relieved
like an overload, with the fewest migrations that bring it under, and no plan makes one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opendrs.engine.policy import PastMigrations, PolicyConfig, PolicyState, decide
from opendrs.engine.policy.config import PRESETS
from opendrs.engine.policy.reading import parse_policy
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.document import DocumentError, Reader
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.report.reasons import explain

GiB = 2**30
NOW = 1_000_000.0
DAY = 86_400
EAGER = PolicyConfig(
    hold=1, margin=0.0, cooldown=0, no_return=0, min_uptime=0, smoothing=0, hot=0.85
)


def _cluster(used: tuple[float, ...], on_n2: float = 2.0) -> Cluster:
    """n1 holds guests using ``used`` cores, n2 one guest using ``on_n2``; 10 cores each."""
    nodes = (Node("n1", 10, 64 * GiB), Node("n2", 10, 64 * GiB), Node("n3", 10, 64 * GiB))
    guests = [
        Guest(f"g{k}", "n1", cpu=4, memory=4 * GiB, cpu_used=c, memory_used=2 * GiB, uptime=DAY)
        for k, c in enumerate(used)
    ]
    guests.append(
        Guest("b", "n2", cpu=4, memory=4 * GiB, cpu_used=on_n2, memory_used=2 * GiB, uptime=DAY)
    )
    return Cluster(nodes, tuple(guests), settings=Settings(mode="dynamic"))


def _decide(cluster: Cluster, config: PolicyConfig) -> object:
    return decide(cluster, NOW, config, PolicyState(), PastMigrations(), busy=False)


def test_a_hot_node_is_relieved_before_balancing_with_the_fewest_migrations() -> None:
    # n1 at 9.2 cores of 10 (92 %): above 85 % but within its capacity. A hold of two: balance
    # waits; the relief does not, with one migration — of a guest large enough: both 0.3-core
    # guests together would still leave n1 at 86 %.
    config = replace(EAGER, hold=2)
    hot = _cluster((5.0, 3.6, 0.3, 0.3))
    decision = _decide(hot, config)
    assert decision.act and decision.code == "repair"
    assert explain(decision).startswith("repair: n1 runs hot (cpu_used above 85 %); 1 migration")
    assert explain(decision).endswith("bypassing hold and margin")
    assert decision.plan is not None and len(decision.plan.moves) == 1
    move = decision.plan.moves[0]
    assert move.source == "n1" and move.guest in ("g0", "g1")
    # Without a hot level the same cluster waits for the hold: nothing is over its capacity.
    off = _decide(hot, replace(config, hot=None))
    assert not off.act and off.code == "holding"
    # At 80 % nothing runs hot.
    assert not _decide(_cluster((4.0, 2.0, 1.0, 1.0)), config).act


def test_a_hot_node_is_relieved_at_once_even_while_the_average_is_balanced() -> None:
    # The same hot node with the metric at or below the threshold: it is relieved all the same
    # (a lasting hot spot starts as a rise the average does not show yet), and the decision
    # remembers n1 as seen running hot.
    hot = _cluster((5.0, 3.6, 0.3, 0.3))
    decision = _decide(hot, replace(EAGER, threshold=1.0))
    assert decision.act and decision.code == "repair"
    assert dict(decision.state.hot_seen) == {"n1": NOW}


def test_no_guest_goes_to_a_node_seen_running_hot_lately() -> None:
    # n2 ran hot an hour ago (its load taking turns, idle now): n1's relief goes to n3, and no
    # plan may fill n2 either; once the memory (the longer of smoothing and no-return) is over,
    # n2 is a target again.
    config = replace(EAGER, no_return=DAY)
    hot = _cluster((5.0, 3.6, 0.3, 0.3))
    seen = PolicyState(hot_seen={"n2": NOW - 3600})
    decision = decide(hot, NOW, config, seen, PastMigrations(), busy=False)
    assert decision.act and decision.code == "repair" and decision.plan is not None
    assert {m.target for m in decision.plan.moves} == {"n3"}
    assert ("g2", "n2") in decision.forbidden
    assert dict(decision.state.hot_seen) == {"n1": NOW, "n2": NOW - 3600}
    later = decide(hot, NOW + DAY, config, seen, PastMigrations(), busy=False)
    assert dict(later.state.hot_seen) == {"n1": NOW + DAY}
    assert ("g2", "n2") not in later.forbidden


def test_relief_goes_as_deep_as_pinned_guests_let_it_and_empties_no_node_for_nothing() -> None:
    # n1 at 8.9 cores of 10: a pinned guest uses 8.0 of them (80 %, above the relief level of
    # 75 %), three movable ones 0.3 each. Moving the three brings n1 to 80 %, 5 pp under the
    # hot level (a pinned job near it is relieved of all it can be): all three move.
    cluster = _cluster((8.0, 0.3, 0.3, 0.3))
    rules = replace(cluster.rules, ignored=frozenset({"g0"}))
    decision = _decide(replace(cluster, rules=rules), EAGER)
    assert decision.act and decision.code == "repair" and decision.plan is not None
    assert {m.guest for m in decision.plan.moves} == {"g1", "g2", "g3"}
    # Pinned at 8.35 (83.5 %), no margin can be reached: the relief moves the fewest that bring
    # n1 under 85 % — two — and leaves the small one.
    cluster = _cluster((8.35, 1.0, 0.5, 0.1))
    rules = replace(cluster.rules, ignored=frozenset({"g0"}))
    decision = _decide(replace(cluster, rules=rules), EAGER)
    assert decision.act and decision.code == "repair" and decision.plan is not None
    assert {m.guest for m in decision.plan.moves} == {"g1", "g2"}


def test_a_hot_node_no_guest_may_leave_is_named_by_every_decision() -> None:
    # n1 at 8.7 cores of 10 (87 %), all of it guests ignored by a rule — a pinned job, and an
    # ignored guest of another node's job that the HA manager restarted there —: no relief
    # reaches it, no migration is made, and the decision says so rather than only the spread.
    cluster = _cluster((7.9, 0.8))
    rules = replace(cluster.rules, ignored=frozenset({"g0", "g1"}))
    pinned = replace(cluster, rules=rules)
    decision = _decide(pinned, replace(EAGER, hold=3))
    assert not decision.act and decision.code == "holding"
    assert explain(decision).endswith("; n1 runs hot (above 85 %) with no guest that may move")
    assert dict(decision.state.hot_seen) == {"n1": NOW}
    # A node with a guest that may move is relieved instead; a cool one is not named.
    assert _decide(cluster, EAGER).code == "repair"
    cool = _decide(replace(_cluster((6.0, 0.8)), rules=rules), replace(EAGER, hold=3))
    assert "runs hot" not in explain(cool)


def test_a_guest_a_hard_rule_keeps_on_the_hot_node_counts_as_unable_to_move() -> None:
    # n1 at 87 %: g0 pinned there, g1 bound to g0 by a hard affinity — the bundle stays —, g2
    # ignored. No relief reaches n1 and every decision says so; with g1 free of g0, it may move.
    cluster = _cluster((7.9, 0.5, 0.3))
    pin = NodeAffinity("pin-g0", ("g0",), {"n1": 0}, strict=True)
    bundle = GuestAffinity("together", ("g0", "g1"), positive=True)
    rules = Rules(node_affinity=(pin,), guest_affinity=(bundle,), ignored=frozenset({"g2"}))
    decision = _decide(replace(cluster, rules=rules), replace(EAGER, hold=3))
    assert explain(decision).endswith("; n1 runs hot (above 85 %) with no guest that may move")
    free = _decide(replace(cluster, rules=replace(rules, guest_affinity=())), EAGER)
    assert free.code == "repair" and "no guest that may move" not in explain(free)


def test_relief_never_makes_another_node_hot() -> None:
    # n1 at 9.5 cores, n2 at 7.9, n3 at 7.9: moving the 1.5-core guest anywhere makes the target
    # hot (9.4 of 10); nothing can bring n1 under, and the decision says so.
    nodes = (Node("n1", 10, 64 * GiB), Node("n2", 10, 64 * GiB), Node("n3", 10, 64 * GiB))

    def g(gid: str, node: str, used: float) -> Guest:
        return Guest(gid, node, cpu=4, memory=GiB, cpu_used=used, memory_used=GiB, uptime=DAY)

    cluster = Cluster(
        nodes,
        (g("a", "n1", 8.0), g("b", "n1", 1.5), g("c", "n2", 7.9), g("d", "n3", 7.9)),
        settings=Settings(mode="dynamic"),
    )
    decision = _decide(cluster, replace(EAGER, hold=2))
    assert not decision.act
    assert "repair needed (n1 runs hot (cpu_used above 85 %)) but no allowed migration" in (
        explain(decision)
    )


def test_the_hot_level_is_read_checked_and_off_for_the_peers() -> None:
    reader = Reader("p.yaml")
    assert parse_policy(reader, {"hot": "90%"}, ("policy",)).hot == 0.9
    assert parse_policy(reader, {"hot": 0.8}, ("policy",)).hot == 0.8
    assert parse_policy(reader, {"hot": None}, ("policy",)).hot is None
    # On by default at the simulator's hot level; the emulated peers have none.
    assert PolicyConfig().hot == PRESETS["opendrs"].hot == 0.85
    assert all(p.hot is None for name, p in PRESETS.items() if name != "opendrs")
    for bad, why in (
        (0, "must be above 0"),
        (1.5, r"1.5 is more than 1 \(100 %\)"),
        (85, r"did you mean 85 %\?"),
        ("101%", "not be more than 100%"),
        ("x", "cannot read 'x' as a fraction or a percentage"),
    ):
        with pytest.raises(DocumentError, match=why):
            parse_policy(reader, {"hot": bad}, ("policy",))
    with pytest.raises(ValueError, match="policy hot"):
        PolicyConfig(hot=2.0)


def test_relief_lifts_only_the_cooldown_where_the_guards_leave_the_node_hot() -> None:
    config = replace(EAGER, hold=2, cooldown=6 * 3600, no_return=DAY)
    hot = _cluster((5.0, 3.6, 0.3, 0.3))
    cooling = {g: NOW + 3600 for g in ("g0", "g1", "g2", "g3")}
    # Every guest of n1 in cooldown (a plan has just moved them there): the relief moves one
    # all the same, and says so.
    decision = decide(
        hot, NOW, config, PolicyState(), PastMigrations(cooldown_until=cooling), busy=False
    )
    assert decision.act and decision.code == "repair" and decision.plan is not None
    assert explain(decision).endswith(
        "bypassing hold and margin and the cooldown it could not keep"
    )
    # No return to a node a guest left holds still: with g0 and g1 come from n2 and n3 lately,
    # only the small guests move (n1 stays hot: the repair names what is stuck).
    left = {g: (("n2", NOW - 60), ("n3", NOW - 60)) for g in ("g0", "g1")}
    past = PastMigrations(cooldown_until=cooling, departures=left)
    kept = decide(hot, NOW, config, PolicyState(), past, busy=False)
    assert kept.plan is not None and {m.guest for m in kept.plan.moves} == {"g2", "g3"}
    assert {g for g, _why in kept.stuck} == {"g0", "g1"}
    # With n2 and n3 seen running hot, no other node has room: rather than leave n1 hot, the
    # last resort moves onto them, and says so — no return still holds.
    seen = PolicyState(hot_seen={"n2": NOW - 60, "n3": NOW - 60})
    onto = decide(hot, NOW, config, seen, PastMigrations(cooldown_until=cooling), busy=False)
    assert onto.act and onto.plan is not None
    assert {m.target for m in onto.plan.moves} <= {"n2", "n3"}
    assert explain(onto).endswith(
        "bypassing hold and margin and the cooldown it could not keep, onto "
        f"{', '.join(sorted({m.target for m in onto.plan.moves}))}, seen running hot lately: "
        "no other node had room"
    )
    still = decide(hot, NOW, config, seen, past, busy=False)
    assert still.plan is not None and {m.guest for m in still.plan.moves} == {"g2", "g3"}
    # With g1 out of its cooldown, the last resort keeps the cooldown: g1 goes, g0 stays.
    g0_cooling = PastMigrations(cooldown_until={"g0": NOW + 3600})
    kept_cool = decide(hot, NOW, config, seen, g0_cooling, busy=False)
    assert kept_cool.plan is not None and [m.guest for m in kept_cool.plan.moves] == ["g1"]
    target = kept_cool.plan.moves[0].target
    assert explain(kept_cool).endswith(
        f"bypassing hold and margin, onto {target}, seen running hot lately: no other node had room"
    )
    # A node over its capacity itself is repaired whatever the cooldown.
    full = _cluster((5.0, 3.6, 1.5, 0.3))
    forced = decide(
        full, NOW, config, PolicyState(), PastMigrations(cooldown_until=cooling), busy=False
    )
    assert forced.act and "over capacity (cpu_used)" in explain(forced)


def test_a_hotter_node_is_relieved_as_deep_as_a_cooler_one() -> None:
    # n1 at 95 %: the deeper relief brings it 10 points under the hot level (75 %) as it would
    # a node at 87 % — the margin is not cut to what is left of its capacity (that left it at
    # 80 %: one 1.5-core guest moved, where the 2-core one brings it to 75 %).
    hot = _cluster((1.5, 1.5, 1.5, 1.5, 1.5, 2.0))
    decision = _decide(hot, EAGER)
    assert decision.act and decision.code == "repair" and decision.plan is not None
    gone = {m.guest for m in decision.plan.moves}
    left = sum(g.cpu_used for g in hot.guests if g.node == "n1" and g.id not in gone)
    assert left <= 7.5 + 1e-9, (decision.plan.moves, left)
