"""Why not, every time (issue 12, part 5): a decision over the threshold that moves nothing names
what stopped it — the candidates (running guests on usable nodes) counted by what excludes each.

Small literal clusters: nodes of 10 cores and 100 GiB, guests of c cores and 10·c GiB; four
guests of 2 cores on n1 make a spread of 80 pp, far over the threshold.
"""

from __future__ import annotations

from dataclasses import replace

from opendrs.engine.constraints import Constraints
from opendrs.engine.policy import (
    Decision,
    PastMigrations,
    PolicyConfig,
    PolicyState,
    decide,
    why_not,
)
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.report.reasons import explain, why_not_words

GiB = 1024**3
DAY = 86400
NOW = 1_000_000.0
TRIGGER = "spread 80.0 pp above threshold 15 pp for 1 of 1 observations; "
NOTHING = TRIGGER + "strategy balance proposes no migration; "
#: Act on the first observation above the threshold, no guard unless a test sets one.
EAGER = PolicyConfig(hold=1, margin=0.0, cooldown=0, no_return=0, min_uptime=0, smoothing=0)


def _nodes(count: int = 3) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", 10, 100 * GiB) for i in range(1, count + 1))


def _g(gid: str, node: str = "n1", cores: float = 2, **kw: object) -> Guest:
    guest = Guest(gid, node, cpu=cores, memory=int(cores * 10 * GiB), uptime=DAY)
    return replace(guest, **kw)  # type: ignore[arg-type]


def _four(**kw: object) -> list[Guest]:
    return [_g(gid, **kw) for gid in "abcd"]


def _decide(
    guests: list[Guest],
    config: PolicyConfig = EAGER,
    memory: PastMigrations | None = None,
    *,
    nodes: tuple[Node, ...] | None = None,
    settings: Settings | None = None,
    rules: Rules | None = None,
) -> Decision:
    cluster = Cluster(
        nodes or _nodes(),
        tuple(guests),
        rules or Rules(),
        settings or Settings(mode="static"),
    )
    decision = decide(cluster, NOW, config, PolicyState(), memory or PastMigrations(), busy=False)
    assert not decision.act and decision.plan is not None
    return decision


def test_all_younger_than_the_policys_min_uptime() -> None:
    # Before: "… proposes no migration (no allowed move pays for itself …)".
    decision = _decide(_four(uptime=120), replace(EAGER, min_uptime=600))
    assert explain(decision) == (
        NOTHING + "4 candidates, all excluded: 4 up for less than min_uptime 10m"
    )


def test_the_clusters_min_uptime_reads_alike_and_groups_with_the_policys() -> None:
    settings = Settings(mode="static", min_uptime=600)
    decision = _decide(_four(uptime=120), settings=settings)
    assert explain(decision).endswith(
        "4 candidates, all excluded: 4 up for less than min_uptime 10m"
    )
    young = [_g("a", uptime=60), _g("b", uptime=300), _g("c", uptime=599), _g("d", uptime=30)]
    decision = _decide(young, replace(EAGER, min_uptime=600), settings=replace(settings))
    assert explain(decision).endswith("all excluded: 4 up for less than min_uptime 10m")


def test_cooldown() -> None:
    memory = PastMigrations(cooldown_until={gid: NOW + 600 for gid in "abcd"})
    assert explain(_decide(_four(), memory=memory)) == (
        NOTHING + "4 candidates, all excluded: 4 in cooldown"
    )


def test_no_return() -> None:
    # Two nodes: each guest left n2 an hour ago and may not go back there for a day.
    memory = PastMigrations(departures={gid: (("n2", NOW - 3600),) for gid in "abcd"})
    decision = _decide(_four(), replace(EAGER, no_return=DAY), memory, nodes=_nodes(2))
    assert explain(decision) == (
        NOTHING + "4 candidates, all excluded: 4 with no node to go to (no_return 1d)"
    )


def test_no_return_and_no_room_together() -> None:
    # n2 is barred by no-return, the small n3 has no room: both named, in that order.
    nodes = (*_nodes(2), Node("n3", 10, 20 * GiB))
    locked = _g("z", "n3", 1, memory=18 * GiB, lock="backup")
    memory = PastMigrations(departures={gid: (("n2", NOW - 3600),) for gid in "abcd"})
    decision = _decide([*_four(), locked], replace(EAGER, no_return=DAY), memory, nodes=nodes)
    assert explain(decision).endswith(
        "5 candidates, all excluded: 4 with no node to go to (no_return 1d, no room), "
        "1 locked (backup)"
    )


def test_a_failed_migration() -> None:
    memory = PastMigrations(avoid={(gid, "n2"): NOW + 60 for gid in "abcd"})
    decision = _decide(_four(), memory=memory, nodes=_nodes(2))
    assert explain(decision).endswith(
        "all excluded: 4 with no node to go to (avoided after a failed migration)"
    )


def test_locks() -> None:
    guests = [_g("a", lock="backup"), _g("b", lock="backup"), _g("c", lock="migrate"), _g("d")]
    decision = _decide(guests, memory=PastMigrations(cooldown_until={"d": NOW + 1}))
    assert explain(decision) == (
        NOTHING + "4 candidates, all excluded: 2 locked (backup), 1 in cooldown, 1 locked (migrate)"
    )


def test_ha_states() -> None:
    guests = [_g(gid, ha=True, ha_state="error") for gid in "abc"]
    guests.append(_g("d", ha=True, ha_state="freeze"))
    assert explain(_decide(guests)).endswith(
        "4 candidates, all excluded: 3 in HA state error, 1 in HA state freeze"
    )


def test_ignored() -> None:
    decision = _decide(_four(), rules=Rules(ignored=frozenset("abcd")))
    assert explain(decision).endswith("4 candidates, all excluded: 4 ignored by a rule")


def test_local_devices_and_disks_are_grouped_whatever_the_device() -> None:
    guests = [_g("a", devices=("hostpci0",)), _g("b", devices=("usb1",)), *_four()[2:]]
    decision = _decide(guests, memory=PastMigrations(cooldown_until={"c": NOW + 1, "d": NOW + 1}))
    assert explain(decision).endswith("all excluded: 2 in cooldown, 2 with local devices")


def test_capacity() -> None:
    # n2 has 2 GiB free, each guest on n1 needs 20 GiB; n2's own guest is locked.
    nodes = (Node("n1", 10, 100 * GiB), Node("n2", 10, 20 * GiB))
    locked = _g("z", "n2", 1, memory=18 * GiB, lock="backup")
    decision = _decide([*_four(), locked], nodes=nodes)
    assert explain(decision).endswith(
        "5 candidates, all excluded: 4 with no node that has room, 1 locked (backup)"
    )


def test_strict_node_affinity() -> None:
    pin = NodeAffinity("pin", tuple("abcd"), {"n1": 1}, strict=True)
    decision = _decide(_four(), rules=Rules(node_affinity=(pin,)))
    assert explain(decision).endswith(
        "4 candidates, all excluded: 4 with no node their rules allow (pin)"
    )


def test_hard_anti_affinity() -> None:
    # b on n2 keeps a and c (on n1) away from n2, and they keep b away from n1.
    apart = (GuestAffinity("ab", ("a", "b"), False), GuestAffinity("cb", ("c", "b"), False))
    guests = [_g("a", cores=4), _g("b", "n2", 1), _g("c", cores=4)]
    decision = _decide(guests, rules=Rules(guest_affinity=apart), nodes=_nodes(2))
    assert explain(decision).endswith(
        "3 candidates, all excluded: 3 with no node their rules allow"
    )


def test_a_bundle_is_held_by_its_partner() -> None:
    together = (GuestAffinity("all", tuple("abcd"), True),)
    guests = [*_four()[:3], _g("d", lock="backup")]
    decision = _decide(guests, rules=Rules(guest_affinity=together))
    assert explain(decision).endswith(
        "4 candidates, all excluded: 3 with hard-affinity partners that may not move, "
        "1 locked (backup)"
    )


def test_some_may_move_but_nothing_pays_for_itself() -> None:
    # One big guest that may move (moving it only swaps the nodes' roles), a young one on each.
    young = [_g("x", cores=1, uptime=60), _g("y", "n2", 1, uptime=60)]
    decision = _decide(
        [_g("big", cores=6), *young], replace(EAGER, min_uptime=600), nodes=_nodes(2)
    )
    assert explain(decision).startswith("spread 60.0 pp above threshold 15 pp")
    assert "; strategy balance proposes no migration (" in explain(decision)
    assert explain(decision).endswith(
        "); 3 candidates: 1 may move; 2 up for less than min_uptime 10m"
    )


def test_all_may_move() -> None:
    decision = _decide([_g("big", cores=6)], nodes=_nodes(2))
    assert "proposes no migration (" in explain(decision)
    assert explain(decision).endswith("); 1 candidate, all may move")


def test_stopped_guests_and_unusable_nodes_are_no_candidates() -> None:
    nodes = (*_nodes(2), Node("n3", 10, 100 * GiB, online=False))
    guests = [*_four(uptime=60), _g("off", state="stopped"), _g("gone", "n3", 1)]
    decision = _decide(guests, replace(EAGER, min_uptime=600), nodes=nodes)
    assert explain(decision).endswith(
        "4 candidates, all excluded: 4 up for less than min_uptime 10m"
    )


def test_groups_by_count_then_text_and_repeatable() -> None:
    guests = [
        _g("a", uptime=60),
        _g("b", lock="backup"),
        _g("c"),
        _g("d", uptime=60),
        _g("e", cores=1),
    ]
    memory = PastMigrations(cooldown_until={"c": NOW + 1, "e": NOW + 1})
    config = replace(EAGER, min_uptime=600)
    cluster = Cluster(_nodes(), tuple(guests), settings=Settings(mode="static"))
    first = why_not(cluster, NOW, config, memory, Constraints.build(cluster))
    assert first.excluded == (
        ("in cooldown", 2),
        ("up for less than min_uptime 10m", 2),
        ("locked (backup)", 1),
    )
    again = why_not(cluster, NOW, config, memory, Constraints.build(cluster))
    assert again == first and why_not_words(again) == (
        "5 candidates, all excluded: 2 in cooldown, 2 up for less than min_uptime 10m, "
        "1 locked (backup)"
    )
