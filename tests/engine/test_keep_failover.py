"""``policy.keep_failover``: a cluster short of the failover headroom is repaired toward it, a
balancing plan that would lose it is refused, and after a repair that found nothing none is
searched for six hours — every decision meanwhile saying which HA guests cannot restart and
why no move gives the headroom back; judged by the placement engine or by Proxmox's own
recovery (``failover_recovery``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opendrs.engine.headroom import failover_headroom
from opendrs.engine.policy import PastMigrations, PolicyConfig, PolicyState, decide
from opendrs.engine.policy.decision import Decision, DecisionCode
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.report.reasons import explain
from opendrs.report.words import decision_words

GiB = 1024**3

#: Node a's three HA guests of 10 GiB cannot all restart on b and c (8 GiB free each once the
#: first two are placed); moving the guest of 14 GiB from b to c leaves b room for all three.
FRAGMENTED = Cluster(
    (
        Node("a", cpu=16, memory=32 * GiB),
        Node("b", cpu=16, memory=32 * GiB),
        Node("c", cpu=16, memory=32 * GiB),
    ),
    (
        Guest("101", "a", name="h1", cpu=2, memory=10 * GiB, ha=True, uptime=7200),
        Guest("102", "a", name="h2", cpu=2, memory=10 * GiB, ha=True, uptime=7200),
        Guest("103", "a", name="h3", cpu=2, memory=10 * GiB, ha=True, uptime=7200),
        Guest("201", "b", name="n1", cpu=2, memory=14 * GiB, uptime=7200),
        Guest("202", "c", name="n2", cpu=2, memory=14 * GiB, uptime=7200),
    ),
    settings=Settings(mode="static"),
)

KEEP = PolicyConfig(keep_failover=1, hold=1)


def _decide(
    cluster: Cluster, config: PolicyConfig, state: PolicyState, now: float = 0.0
) -> Decision:
    return decide(cluster, now, config, state, PastMigrations(), busy=False)


def test_a_cluster_short_of_it_is_repaired_toward_it() -> None:
    assert failover_headroom(FRAGMENTED).unrestartable == 1
    decision = _decide(FRAGMENTED, KEEP, PolicyState())
    assert decision.code is DecisionCode.REPAIR and decision.act
    assert explain(decision).startswith(
        "repair: failover headroom: no, 1 HA guest cannot restart when a fails; 1 migration"
    )
    assert decision.plan is not None
    repaired = FRAGMENTED.apply(decision.plan.moves)
    assert failover_headroom(repaired).ok
    assert decision.as_dict()["failover"]["unrestartable"] == 1  # type: ignore[index]


def test_a_plan_that_would_lose_it_is_refused_and_without_the_policy_made() -> None:
    first = _decide(FRAGMENTED, KEEP, PolicyState())
    assert first.plan is not None
    repaired = FRAGMENTED.apply(first.plan.moves)
    refused = _decide(repaired, KEEP, first.state, 300.0)
    assert refused.code is DecisionCode.FAILOVER and not refused.act
    assert "would lose the failover headroom" in explain(refused)
    assert refused.plan is not None and refused.plan.moves
    assert not failover_headroom(repaired.apply(refused.plan.moves)).ok
    made = _decide(repaired, PolicyConfig(hold=1), PolicyState(), 300.0)
    assert made.code is DecisionCode.PLAN


def test_off_by_default_and_no_search_twice_on_one_placement() -> None:
    assert PolicyConfig().keep_failover == 0
    assert _decide(FRAGMENTED, PolicyConfig(hold=1), PolicyState()).state.failover is None
    # b and c hold one 24 GiB guest each: no move makes room for a's 10 GiB guests.
    stuck = Cluster(
        FRAGMENTED.nodes,
        (
            *FRAGMENTED.guests[:3],
            Guest("201", "b", cpu=2, memory=24 * GiB, uptime=7200),
            Guest("202", "c", cpu=2, memory=24 * GiB, uptime=7200),
        ),
        settings=FRAGMENTED.settings,
    )
    decision = _decide(stuck, KEEP, PolicyState())
    assert decision.code is not DecisionCode.REPAIR
    check = decision.state.failover
    assert check is not None and check.repair_tried == 0.0 and check.unrestartable == 3
    again = _decide(stuck, KEEP, decision.state, 60.0)
    assert again.state.failover is check  # kept: the same placement, not checked again
    short = "failover headroom short: h1 (101), h2 (102), h3 (103) cannot restart when a fails"
    for each in (decision, again):
        said = decision_words(each, lambda g: f"h{g[-1]} ({g})")
        assert said.endswith(f"; {short}, and no allowed move gives it back"), said
        assert explain(each).endswith(
            "; failover headroom: no, 3 HA guests cannot restart when a fails: "
            "no move gives it back"
        ), explain(each)
    assert again.gist() == decision.gist()


#: x (8 GiB, HA) on a; b and c hold 28 GiB each, d six guests of 1 GiB. The best node with
#: room for x is d; Proxmox's basic mode picks b or c (one guest each against d's six), finds
#: no room there, tries the other, and leaves x down.
FEWEST_GUESTS = Cluster(
    tuple(Node(name, cpu=16, memory=32 * GiB) for name in "abcd"),
    (
        Guest("101", "a", name="x", cpu=2, memory=8 * GiB, ha=True, uptime=7200),
        Guest("201", "b", cpu=2, memory=28 * GiB, uptime=7200),
        Guest("301", "c", cpu=2, memory=28 * GiB, uptime=7200),
        *(Guest(f"40{i}", "d", cpu=1, memory=GiB, uptime=7200) for i in range(6)),
    ),
    settings=Settings(mode="static"),
)


def test_judged_by_proxmox_basic_recovery_it_is_repaired_where_best_fit_sees_no_need() -> None:
    assert failover_headroom(FEWEST_GUESTS, 1, "best-fit").ok
    assert not failover_headroom(FEWEST_GUESTS, 1, "pve-basic").ok
    best_fit = replace(KEEP, failover_recovery="best-fit")
    assert _decide(FEWEST_GUESTS, best_fit, PolicyState()).code is not DecisionCode.REPAIR
    basic = replace(KEEP, failover_recovery="pve-basic")
    decision = _decide(FEWEST_GUESTS, basic, PolicyState())
    assert decision.code is DecisionCode.REPAIR and decision.plan is not None
    # x on d: when d fails, basic mode restarts it on a, the node with no guest, which has room.
    assert [(m.guest, m.target) for m in decision.plan.moves] == [("101", "d")]
    assert failover_headroom(FEWEST_GUESTS.apply(decision.plan.moves), 1, "pve-basic").ok


def test_auto_follows_the_scheduler_mode_the_backend_read_else_best_fit() -> None:
    assert KEEP.failover_recovery == "auto"
    assert _decide(FEWEST_GUESTS, KEEP, PolicyState()).code is not DecisionCode.REPAIR
    proxmox_basic = replace(FEWEST_GUESTS, ha_scheduler="basic")
    assert _decide(proxmox_basic, KEEP, PolicyState()).code is DecisionCode.REPAIR
    proxmox_static = replace(FEWEST_GUESTS, ha_scheduler="static")
    assert _decide(proxmox_static, KEEP, PolicyState()).code is not DecisionCode.REPAIR


def test_an_unknown_recovery_is_refused() -> None:
    with pytest.raises(ValueError, match="failover_recovery: expected one of auto, best-fit"):
        PolicyConfig(failover_recovery="pve-dynamic")


def test_the_settings_recoveries_are_the_headrooms() -> None:
    from opendrs.engine.headroom import RECOVERIES
    from opendrs.engine.policy.config import FAILOVER_RECOVERIES

    assert ("auto", *RECOVERIES) == FAILOVER_RECOVERIES
