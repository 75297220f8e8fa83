"""policy: when to act — metrics, threshold and hold, margin, guards, repairs, smoothing, presets.

Small literal clusters. Unless said otherwise nodes have 10 cores and 100 GiB and guests use cores
and GiB in proportion (c cores, 10·c GiB), so cpu and memory fractions read alike: a guest of
c cores is c/10 of a node.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import assert_moves_safe, clusters
from opendrs.engine.planner import PlannedMove
from opendrs.engine.policy import (
    PRESETS,
    Decision,
    DecisionCode,
    PastMigrations,
    PolicyConfig,
    PolicyState,
    UsageWindow,
    decide,
    forbidden_placements,
    may_need_repair,
    measure,
    parse_policy,
    repairs_needed,
    track_evacuations,
    truncate,
)
from opendrs.engine.policy.decision import Balanced, Holding, Measurement, Planned
from opendrs.engine.policy.guards import hot_targets
from opendrs.engine.policy.needs import (
    Broken,
    BrokenKind,
    FailoverNeeded,
    GoingBack,
    TowardFailover,
    need_sentence,
)
from opendrs.engine.policy.repair import Repair
from opendrs.engine.strategies.base import Proposal, ProposedMove, cluster_imbalance
from opendrs.engine.usage import with_usage
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.document import DocumentError, Reader
from opendrs.model.rules import GuestAffinity, Rules
from opendrs.report.reasons import decision_dict, explain

GiB = 1024**3
STATIC = Settings(mode="static")
DAY = 86400
NOW = 1_000_000.0


def _nodes(count: int = 3, **kw: object) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", 10, 100 * GiB, **kw) for i in range(1, count + 1))  # type: ignore[arg-type]


def _g(gid: str, node: str, cores: float, **kw: object) -> Guest:
    guest = Guest(gid, node, cpu=cores, memory=int(cores * 10 * GiB), uptime=DAY)
    return replace(guest, **kw)  # type: ignore[arg-type]


def _cluster(*guests: Guest, nodes: tuple[Node, ...] | None = None, **kw: object) -> Cluster:
    kw.setdefault("settings", STATIC)
    return Cluster(nodes or _nodes(), guests, **kw)  # type: ignore[arg-type]


def _skewed() -> Cluster:
    # n1 80 % (a, b, c, d of 2 cores), n2 and n3 empty: spread 80 pp.
    return _cluster(_g("a", "n1", 2), _g("b", "n1", 2), _g("c", "n1", 2), _g("d", "n1", 2))


#: Act on the first observation above the threshold, no other guard.
EAGER = PolicyConfig(hold=1, margin=0.0, cooldown=0, no_return=0, min_uptime=0, smoothing=0)


def _decide(
    cluster: Cluster,
    config: PolicyConfig = EAGER,
    state: PolicyState | None = None,
    memory: PastMigrations | None = None,
    *,
    busy: bool = False,
    now: float = NOW,
) -> Decision:
    return decide(
        cluster, now, config, state or PolicyState(), memory or PastMigrations(), busy=busy
    )


def _moved(decision: Decision) -> list[tuple[str, str, str]]:
    assert decision.plan is not None
    return [(m.guest, m.source, m.target) for m in decision.plan.moves]


# --------------------------------------------------------------------------------------------
# Metrics


def test_metrics_hand_checked() -> None:
    # cpu fractions 0.5, 0.2, 0; memory 0.3, 0.2, 0 (a: 5 cores/30 GiB, b: 2 cores/20 GiB).
    # Combined (cpu + memory)/2: 0.4, 0.2, 0 — mean 0.2, σ = √((0.04 + 0 + 0.04)/3) = 0.163299,
    # CV = 0.816497. Spread: the larger of cpu 0.5 and memory 0.3. Memory spread 0.3.
    # A fourth node in maintenance, whatever its load, takes no part.
    nodes = (*_nodes(), Node("n4", 10, 100 * GiB, maintenance=True))
    guests = (
        Guest("a", "n1", cpu=5, memory=30 * GiB),
        Guest("b", "n2", cpu=2, memory=20 * GiB),
        Guest("z", "n4", cpu=9, memory=90 * GiB),
    )
    cluster = Cluster(nodes, guests, settings=STATIC)
    assert measure(cluster, "cv") == pytest.approx(math.sqrt(0.08 / 3) / 0.2)
    assert measure(cluster, "cv") == pytest.approx(0.816496580927726)
    assert measure(cluster, "spread") == pytest.approx(0.5)
    assert measure(cluster, "memory-spread") == pytest.approx(0.3)
    assert measure(cluster, "none") == 0.0
    memory_only = replace(cluster, settings=Settings(mode="static", weight_cpu=0.0))
    assert measure(memory_only, "spread") == pytest.approx(0.3)
    with pytest.raises(ValueError, match="unknown metric"):
        measure(cluster, "rms")


def test_metrics_of_an_empty_or_single_node_cluster_are_zero() -> None:
    one = Cluster(_nodes(1), (_g("a", "n1", 5),), settings=STATIC)
    assert measure(one, "spread") == measure(one, "cv") == measure(one, "memory-spread") == 0.0


# --------------------------------------------------------------------------------------------
# Threshold, hold, margin, busy


def test_threshold_and_hold_counting_with_reset() -> None:
    config = replace(EAGER, hold=3)
    skewed, even = _skewed(), _cluster(_g("a", "n1", 2), _g("b", "n2", 2), _g("c", "n3", 2))
    state = PolicyState()
    first = _decide(skewed, config, state)
    assert not first.act and first.state.hold == 1 and first.code == "holding"
    assert explain(first) == (
        "spread 80.0 pp above threshold 15 pp for 1 of 3 observations; waiting"
    )
    second = _decide(skewed, config, first.state)
    assert not second.act and second.state.hold == 2
    # Balanced in between: the count starts again.
    reset = _decide(even, config, second.state)
    assert not reset.act and reset.state.hold == 0 and reset.code == "balanced"
    assert explain(reset) == "spread 0.0 pp at or below threshold 15 pp: nothing to do"
    state = reset.state
    for expected in (1, 2):
        decision = _decide(skewed, config, state)
        assert not decision.act and decision.state.hold == expected
        state = decision.state
    third = _decide(skewed, config, state, now=NOW + 5)
    assert third.act and third.kind == "plan" and third.code == "plan"
    assert explain(third).startswith(
        "spread 80.0 pp above threshold 15 pp for 3 of 3 observations;"
    )
    assert third.state == PolicyState(hold=0, last_attempt=NOW + 5, last_action=NOW + 5)


def test_a_decision_holds_its_code_and_facts_and_explain_says_them() -> None:
    config = replace(EAGER, hold=3)
    first = _decide(_skewed(), config)
    assert first.code is DecisionCode.HOLDING and not first.act and first.kind == "none"
    assert isinstance(first.facts, Holding)
    trigger = first.facts.trigger
    assert (trigger.count, trigger.need, trigger.hastened) == (1, 3, None)
    assert trigger.measured == Measurement("spread", (("x86_64", pytest.approx(0.8)),))
    assert explain(first) == decision_dict(first)["reason"] and "reason" not in first.as_dict()
    # The same kind of reason, another count: the same gist; another code: another gist.
    second = _decide(_skewed(), config, first.state)
    assert explain(second) != explain(first) and second.gist() == first.gist()
    even = _decide(_cluster(_g("a", "n1", 2), _g("b", "n2", 2), _g("c", "n3", 2)), config)
    assert isinstance(even.facts, Balanced) and even.gist() != first.gist()
    acted = _decide(_skewed())
    assert acted.code is DecisionCode.PLAN and acted.act and acted.kind == "plan"
    assert isinstance(acted.facts, Planned) and acted.facts.migrations == len(_moved(acted))


def test_at_threshold_is_not_above() -> None:
    # Spread exactly 20 pp with threshold 0.2: nothing to do.
    cluster = _cluster(_g("a", "n1", 2), _g("b", "n2", 0), _g("c", "n3", 0))
    assert measure(cluster, "spread") == pytest.approx(0.2)
    decision = _decide(cluster, replace(EAGER, threshold=0.2))
    assert not decision.act and "at or below" in explain(decision)


def test_margin_refusal_and_acceptance() -> None:
    # n1 60 % (a 3, b 3), n2 10 % (c 1), n3 missing: two nodes only. Spread 50 pp; balance moves
    # a to n2: 30/40, spread 10 pp — an improvement of (50 − 10)/50 = 80 %.
    nodes = _nodes(2)
    cluster = _cluster(_g("a", "n1", 3), _g("b", "n1", 3), _g("c", "n2", 1), nodes=nodes)
    refused = _decide(cluster, replace(EAGER, margin=0.9))
    assert not refused.act and refused.kind == "none" and refused.code == "below-margin"
    assert refused.predicted == pytest.approx(0.1)
    assert explain(refused).endswith(
        "the plan would bring it to 10.0 pp with 1 migration, 80 % better, "
        "less than the margin 90 %"
    )
    # An attempt, even refused, restarts the hold count (as Proxmox does).
    assert refused.state.hold == 0 and refused.state.last_attempt == NOW
    assert refused.state.last_action is None
    accepted = _decide(cluster, replace(EAGER, margin=0.8))
    assert accepted.act and accepted.predicted == pytest.approx(0.1)
    assert _moved(accepted) == [("a", "n1", "n2")]


def test_busy_decides_nothing_and_does_not_count() -> None:
    state = PolicyState(hold=2, last_attempt=5.0)
    decision = _decide(_skewed(), replace(EAGER, hold=3), state, busy=True)
    assert not decision.act and decision.plan is None and decision.state == state
    assert decision.code == "busy"
    assert explain(decision) == "a plan is still executing: no new decision (spread 80.0 pp)"
    # Even a repair waits for the running plan.
    cluster = _cluster(
        _g("m", "n3", 1), nodes=(*_nodes(2), Node("n3", 10, 100 * GiB, maintenance=True))
    )
    assert not _decide(cluster, busy=True).act


def test_no_migration_proposed() -> None:
    # One big guest: moving it only swaps the nodes' roles, balance proposes nothing.
    cluster = _cluster(_g("a", "n1", 6), nodes=_nodes(2))
    decision = _decide(cluster)
    assert not decision.act and decision.proposal is not None
    assert "strategy balance proposes no migration" in explain(decision)
    assert decision.state.hold == 0


# --------------------------------------------------------------------------------------------
# Guards: cooldown, no return, avoid, minimum uptime, batch


def test_cooldown_no_return_and_avoid_are_honoured() -> None:
    cluster = _skewed()
    memory = PastMigrations(
        cooldown_until={"a": NOW + 60, "b": NOW - 1},  # b's cooldown is over
        departures={"c": (("n2", NOW - 3600),), "d": (("n3", NOW - 2 * DAY),)},
        avoid={("d", "n2"): NOW + 10, ("b", "n3"): NOW - 10},
    )
    config = replace(EAGER, no_return=DAY)
    forbidden = forbidden_placements(cluster, NOW, config, memory)
    assert forbidden == {("a", "n2"), ("a", "n3"), ("c", "n2"), ("d", "n2")}
    decision = _decide(cluster, config, memory=memory)
    assert decision.act and decision.forbidden == forbidden
    moves = _moved(decision)
    assert moves and not {(g, t) for g, _s, t in moves} & forbidden
    assert "a" not in {g for g, _s, _t in moves}
    # Without the memory, the same cluster may move a.
    plain = _decide(cluster, config)
    assert plain.act


def test_minimum_uptime() -> None:
    cluster = _cluster(
        _g("young", "n1", 4, uptime=60),
        _g("old", "n1", 4, uptime=DAY),
        _g("stopped", "n1", 1, uptime=0, state="stopped"),
    )
    config = replace(EAGER, min_uptime=600)
    forbidden = forbidden_placements(cluster, NOW, config, PastMigrations())
    assert forbidden == {("young", "n2"), ("young", "n3")}
    decision = _decide(cluster, config)
    assert decision.act
    assert {g for g, _s, _t in _moved(decision)} == {"old"}


def test_batch_limits_migrations() -> None:
    # Eight guests of 1 core on n1: balance would move five; batch 2 passes max_moves=2.
    cluster = _cluster(*(_g(f"g{i}", "n1", 1) for i in range(8)))
    decision = _decide(cluster, replace(EAGER, batch=2))
    assert decision.act and len(decision.plan.moves) == 2  # type: ignore[union-attr]
    assert decision.proposal is not None and decision.proposal.options["max_moves"] == 2
    # static-greedy has no max_moves: its proposal is cut to the batch.
    cut = _decide(cluster, replace(EAGER, batch=3, strategy="static-greedy"))
    assert cut.act and len(cut.plan.moves) == 3  # type: ignore[union-attr]
    assert "(batch 3)" in cut.proposal.stopped  # type: ignore[union-attr]


def _proposal(cluster: Cluster, moves: list[tuple[str, str, str]]) -> Proposal:
    before = cluster_imbalance(cluster)
    return Proposal(
        "test",
        tuple(ProposedMove(g, s, t, "m", 0.0, 0.0, 1) for g, s, t in moves),
        before,
        before,
        "done",
    )


def test_truncate_keeps_bundles_whole() -> None:
    rules = Rules(guest_affinity=(GuestAffinity("pair", ("b1", "b2"), positive=True),))
    cluster = _cluster(
        _g("a", "n1", 1), _g("b1", "n1", 1), _g("b2", "n1", 1), _g("c", "n1", 1), rules=rules
    )
    proposal = _proposal(
        cluster,
        [("a", "n1", "n2"), ("b1", "n1", "n3"), ("b2", "n1", "n3"), ("c", "n1", "n2")],
    )
    # Batch 2: a (1), then the bundle b1+b2 (2) does not fit, c (1) does.
    cut = truncate(cluster, proposal, 2)
    assert [m.guest for m in cut.moves] == ["a", "c"]
    assert cut.stopped == "done; cut to 2 of 4 migrations (batch 2)"
    assert cut.after.resources["cpu"].max == pytest.approx(0.2)
    # Batch 3: a and the bundle.
    assert [m.guest for m in truncate(cluster, proposal, 3).moves] == ["a", "b1", "b2"]
    assert truncate(cluster, proposal, 0) is proposal
    assert truncate(cluster, proposal, 4) is proposal


# --------------------------------------------------------------------------------------------
# Repairs


def _with_maintenance(*guests: Guest) -> Cluster:
    nodes = (*_nodes(2), Node("n3", 10, 100 * GiB, maintenance=True))
    return _cluster(*guests, nodes=nodes)


def test_repair_bypasses_threshold_and_hold() -> None:
    # Balanced usable nodes (20/20 %) and a guest on n3, in maintenance: repaired at the first
    # observation, although hold is 3 and the spread is below the threshold.
    cluster = _with_maintenance(_g("a", "n1", 2), _g("b", "n2", 2), _g("m", "n3", 1))
    assert _needed(cluster) == ("m is on n3, in maintenance",)
    config = PolicyConfig(min_uptime=0)
    decision = _decide(cluster, config)
    assert decision.act and decision.kind == "repair" and decision.code == "repair"
    assert explain(decision) == (
        "repair: m is on n3, in maintenance; 1 migration, bypassing threshold, hold and margin"
    )
    # The history's form carries the need as typed details.
    assert decision.as_dict()["need"] == {"kind": "maintenance", "node": "n3", "guest": "m"}
    assert [(g, s) for g, s, _t in _moved(decision)] == [("m", "n3")]
    assert decision.state == PolicyState(hold=0, last_attempt=NOW, last_action=NOW)
    # With maintenance_return, the policy remembers where m came from.
    remembered = _decide(cluster, PolicyConfig(min_uptime=0, maintenance_return=True))
    assert remembered.state.evacuated == {"m": "n3"}


def test_repair_honours_forbidden_placements() -> None:
    cluster = _with_maintenance(_g("a", "n1", 2), _g("b", "n2", 2), _g("m", "n3", 1))
    # m in cooldown (or just started): the guards would keep it on n3, in maintenance; a repair
    # is made whatever it costs, so it overrides them — and says so.
    for memory, config in (
        (PastMigrations(cooldown_until={"m": NOW + 600}), PolicyConfig(min_uptime=0)),
        (PastMigrations(), PolicyConfig(min_uptime=10**9)),
    ):
        decision = _decide(cluster, config, memory=memory)
        assert decision.kind == "repair" and [g for g, _s, _t in _moved(decision)] == ["m"]
        assert explain(decision).endswith(
            "bypassing threshold, hold and margin and the cooldown and minimum uptime it could "
            "not keep"
        )
    # Lifting its cooldown, the repair still keeps m off the node it left (n1): it goes to n2.
    cooling = {"m": NOW + 600}
    back = PastMigrations(cooldown_until=cooling, departures={"m": (("n1", NOW - 60),)})
    decision = _decide(cluster, PolicyConfig(min_uptime=0), memory=back)
    assert _moved(decision) == [("m", "n3", "n2")]
    assert explain(decision).endswith("the cooldown and minimum uptime it could not keep")
    # Only where no other node takes it does it go back, and the decision says so.
    both = PastMigrations(
        cooldown_until=cooling, departures={"m": (("n1", NOW - 60), ("n2", NOW - 60))}
    )
    decision = _decide(cluster, PolicyConfig(min_uptime=0), memory=both)
    assert [g for g, _s, _t in _moved(decision)] == ["m"]
    assert explain(decision).endswith(
        "the cooldown, minimum uptime and no-return it could not keep"
    )
    # Where the guards leave a way, they hold: a no-return to n1 sends m to n2.
    departed = PastMigrations(departures={"m": (("n1", NOW - 60),)})
    decision = _decide(cluster, PolicyConfig(min_uptime=0), memory=departed)
    assert _moved(decision) == [("m", "n3", "n2")] and "could not keep" not in explain(decision)
    # m may not go to n1: it goes to n2.
    avoid = PastMigrations(avoid={("m", "n1"): NOW + 600})
    decision = _decide(cluster, PolicyConfig(min_uptime=0), memory=avoid)
    assert decision.kind == "repair" and _moved(decision) == [("m", "n3", "n2")]


def test_evacuations_are_tracked_until_the_guest_is_back() -> None:
    in_maintenance = _with_maintenance(_g("a", "n1", 2), _g("m", "n3", 1), _g("k", "n3", 1))
    assert track_evacuations(in_maintenance, {}) == {"m": "n3", "k": "n3"}
    # Evacuated twice (m to n1, then n1 into maintenance): it still belongs to n3.
    nodes = (Node("n1", 10, 100 * GiB, maintenance=True), *_nodes(3)[1:])
    twice = _cluster(_g("m", "n1", 1), _g("k", "n2", 1), nodes=nodes)
    assert track_evacuations(twice, {"m": "n3", "k": "n3"}) == {"m": "n3", "k": "n3"}
    # Back on n3 out of maintenance: m's entry goes; a guest or node that is gone goes too.
    back = _cluster(_g("m", "n3", 1), _g("k", "n2", 1))
    assert track_evacuations(back, {"m": "n3", "k": "n3", "z": "n1", "k2": "n9"}) == {"k": "n3"}


def test_maintenance_return_brings_guests_back_at_once() -> None:
    # m and k left n3 for maintenance; n3 is back. With maintenance_return they go back at once,
    # whatever the threshold, hold, cooldown and no-return (going back is the point) — but not
    # onto a target a failed migration keeps them off.
    cluster = _cluster(_g("a", "n1", 2), _g("m", "n1", 1), _g("k", "n2", 1))
    state = PolicyState(evacuated={"m": "n3", "k": "n3"})
    memory = PastMigrations(
        cooldown_until={"m": NOW + 600, "k": NOW + 600},
        departures={"m": (("n3", NOW - 60),), "k": (("n3", NOW - 60),)},
    )
    config = PolicyConfig(maintenance_return=True)
    decision = _decide(cluster, config, state, memory)
    assert decision.act and decision.kind == "repair"
    assert decision.code == "return"
    assert explain(decision).startswith("2 guests back to n3, out of maintenance")
    assert sorted(_moved(decision)) == [("k", "n2", "n3"), ("m", "n1", "n3")]
    assert decision.proposal is not None and decision.proposal.strategy == "maintenance-return"
    avoid = PastMigrations(avoid={("m", "n3"): NOW + 600})
    assert _moved(_decide(cluster, config, state, avoid)) == [("k", "n2", "n3")]
    # batch 1: one at a time, in guest order.
    assert _moved(_decide(cluster, replace(config, batch=1), state)) == [("k", "n2", "n3")]
    # Off (opendrs's default): the balance decides; here the spread is below the threshold.
    assert not _decide(cluster, PolicyConfig(), state, memory).act
    # Not while n3 is still in maintenance: the guests stay where the evacuation put them.
    held = _with_maintenance(_g("a", "n1", 2), _g("m", "n1", 1), _g("k", "n2", 1))
    assert not _decide(held, config, state, memory).act


def test_maintenance_return_leaves_out_what_does_not_fit() -> None:
    # n3 came back with a 9-core guest started on it; m (2 cores) no longer fits (10 cores,
    # overcommit 1 in STATIC): only k (1 core) goes back.
    cluster = _cluster(_g("m", "n1", 2), _g("k", "n2", 1), _g("big", "n3", 9))
    decision = _decide(
        cluster,
        PolicyConfig(maintenance_return=True),
        PolicyState(evacuated={"m": "n3", "k": "n3"}),
    )
    assert _moved(decision) == [("k", "n2", "n3")]


def _needed(cluster: Cluster) -> tuple[str, ...]:
    """What :func:`repairs_needed` finds, as the operator reads it."""
    return tuple(need_sentence(need) for need in repairs_needed(cluster))


def test_each_need_is_one_flat_object_whose_kind_says_which() -> None:
    """A need's details: flat (no object within an object of the same name), each kind its own
    — a repair toward the failover headroom is not a cluster short of it."""
    needs = [
        Broken(BrokenKind.HOT, None, "n1", ("cpu_used",), level=0.85, forecast=True),
        GoingBack(2, ("n3",)),
        TowardFailover(3),
        FailoverNeeded("no, 1 HA guest cannot restart when n2 fails"),
    ]
    details = [need.as_dict() for need in needs]
    assert [d["kind"] for d in details] == ["hot", "return", "toward-failover", "failover-needed"]
    assert all(
        "need" not in d and not any(isinstance(v, dict) for v in d.values()) for d in details
    )
    assert details[0] == {
        "kind": "hot",
        "node": "n1",
        "dimensions": ["cpu_used"],
        "level": 0.85,
        "forecast": True,
    }


def test_repairs_needed_sees_broken_rules_and_capacity() -> None:
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("x", "y"), positive=False),))
    cluster = _cluster(_g("x", "n1", 1), _g("y", "n1", 1), rules=rules)
    assert _needed(cluster) == (
        "x shares n1 with a hard anti-affinity partner",
        "y shares n1 with a hard anti-affinity partner",
    )
    # 12 vCPUs on 2 cores with overcommit 4 (8): n1 over capacity; a locked guest cannot move.
    over = _cluster(
        _g("p", "n1", 6),
        _g("q", "n1", 6, lock="backup"),
        nodes=(Node("n1", 2, 200 * GiB), Node("n2", 10, 200 * GiB)),
    )
    assert _needed(over) == ("n1 is over capacity (vcpus)",)
    assert repairs_needed(_skewed()) == ()


# --------------------------------------------------------------------------------------------
# Smoothing


def _measured(cpu_a: float, memory_a: int, base: float = 0.0) -> Cluster:
    nodes = (Node("n1", 10, 100 * GiB, base_cpu=base), Node("n2", 10, 100 * GiB))
    guests = (
        Guest("a", "n1", cpu=8, memory=80 * GiB, cpu_used=cpu_a, memory_used=memory_a, uptime=DAY),
        Guest("b", "n2", cpu=8, memory=80 * GiB, cpu_used=1.0, memory_used=10 * GiB, uptime=DAY),
    )
    return Cluster(nodes, guests)


def test_smoothing_averages_exactly() -> None:
    window = UsageWindow()
    for k in range(5):
        window = window.add(NOW + 300 * k, _measured(1.0, 10 * GiB), 1800)
    spike = _measured(8.0, 70 * GiB + 1, base=3.0)
    window = window.add(NOW + 1500, spike, 1800)
    assert len(window) == 6
    smoothed = window.smoothed(spike)
    a = smoothed.guest("a")
    assert a.cpu_used == (5 * 1.0 + 8.0) / 6
    assert a.memory_used == round((50 * GiB + 70 * GiB + 1) / 6)
    assert smoothed.node("n1").base_cpu == 0.5
    assert smoothed.guest("b") is spike.guest("b")  # unchanged guests are kept as they are
    # 1800 s after the first sample it leaves the window: the mean is over the last six.
    later = window.add(NOW + 1800, _measured(1.0, 10 * GiB), 1800)
    assert len(later) == 6
    assert later.smoothed(_measured(1.0, 10 * GiB)).guest("a").cpu_used == (4 + 8 + 1) / 6


def test_recent_usage_lets_a_lasting_rise_count_at_once() -> None:
    def window_of(*values: float) -> UsageWindow:
        window = UsageWindow()
        for k, cpu in enumerate(values):
            window = window.add(NOW + 300 * k, _measured(cpu, 10 * GiB, base=cpu), 3600)
        return window

    def seen(window: UsageWindow, cluster: Cluster, span: float) -> tuple[float, float]:
        recent = window.recent(cluster, span)
        checked = with_usage(cluster, recent)
        # The arrays and the cluster written from them agree.
        assert (recent.cpu[0], recent.base_cpu[0]) == (
            checked.guest("a").cpu_used,
            checked.node("n1").base_cpu,
        )
        return checked.guest("a").cpu_used, checked.node("n1").base_cpu  # type: ignore[return-value]

    rising = window_of(1.0, 1.0, 1.0, 4.0, 7.0)
    now = _measured(7.0, 10 * GiB, base=7.0)
    assert rising.smoothed(now).guest("a").cpu_used == 14 / 5
    # The last 600 s, (NOW + 600, NOW + 1200]: the samples at 900 and 1200, higher than the mean.
    assert seen(rising, now, 600) == (5.5, 5.5)
    assert seen(rising, now, 0) == (7.0, 7.0)  # at least the last sample
    assert seen(rising, now, 10**6) == (14 / 5, 14 / 5)
    # A fall is seen only as the window forgets the higher samples.
    falling = window_of(7.0, 7.0, 7.0, 4.0, 1.0)
    assert seen(falling, _measured(1.0, 10 * GiB, base=1.0), 600) == (26 / 5, 26 / 5)
    with pytest.raises(ValueError, match="span must be ≥ 0"):
        rising.recent(now, -1)
    with pytest.raises(ValueError, match="another cluster"):
        with_usage(_spiky(1.0), rising.recent(now, 600))
    # Both usages at once, the same as each alone.
    average, recent = rising.usage(now, 600)
    assert with_usage(now, average) == rising.smoothed(now)
    assert with_usage(now, recent) == with_usage(now, rising.recent(now, 600))
    # An empty window knows nothing: the cluster's own values stand.
    assert with_usage(now, UsageWindow().recent(now, 600)) is now


def _filling(used_a: int, used_c: int = 40 * GiB) -> Cluster:
    # Dynamic, memory overcommitted 1.5×: n1 holds a (80 GiB configured, used_a used) and b
    # (30 GiB used), n2 holds c (used_c); 100 GiB each.
    nodes = _nodes(2)
    guests = (
        Guest("a", "n1", cpu=2, memory=80 * GiB, cpu_used=1.0, memory_used=used_a, uptime=DAY),
        Guest("b", "n1", cpu=2, memory=40 * GiB, cpu_used=1.0, memory_used=30 * GiB, uptime=DAY),
        Guest("c", "n2", cpu=2, memory=80 * GiB, cpu_used=1.0, memory_used=used_c, uptime=DAY),
    )
    return Cluster(nodes, guests, settings=Settings(memory_overcommit=1.5))


def _decide_on(cluster: Cluster, risen: Cluster, config: PolicyConfig) -> Decision:
    # ``risen``: the same cluster with the usage of the last half hour (higher than the mean).
    window = UsageWindow().add(NOW - 3600, cluster, 6 * 3600).add(NOW, risen)
    recent = window.recent(cluster, 1800)
    assert with_usage(cluster, recent) == risen
    return decide(cluster, NOW, config, PolicyState(), PastMigrations(), busy=False, recent=recent)


def test_capacity_is_checked_on_the_recent_rise() -> None:
    config = PolicyConfig(min_uptime=0)
    averaged = _filling(20 * GiB)  # n1 50 GiB, n2 40 GiB: 10 pp, nothing to do
    risen = _filling(75 * GiB)  # a's last half hour: n1 105 GiB, over its 100 GiB
    alone = _decide(averaged, config)
    assert not alone.act and explain(alone).startswith("spread 10.0 pp at or below")
    # The overload is repaired before the average shows it; the metric stays the average's.
    decision = _decide_on(averaged, risen, config)
    assert decision.act and decision.kind == "repair"
    assert explain(decision) == (
        "repair: n1 is over capacity (memory_used); 1 migration, "
        "bypassing threshold, hold and margin"
    )
    assert _moved(decision) == [("b", "n1", "n2")]  # a (75 GiB) would overload n2
    # (on the average: n1 holds a's 20 GiB, n2 70 GiB)
    assert decision.metric == pytest.approx(0.10) and decision.predicted == pytest.approx(0.50)
    # Without room anywhere, the policy says what it could not repair.
    full = _filling(75 * GiB, used_c=75 * GiB)
    refused = _decide_on(averaged, full, config)
    assert not refused.act
    assert explain(refused).endswith(
        "; repair needed (n1 is over capacity (memory_used)) but no allowed migration reaches it"
    )
    assert refused.as_dict()["blocked"] == {
        "kind": "capacity",
        "node": "n1",
        "dimensions": ["memory_used"],
        "more": 0,
    }

    # Balancing: on the average n2 (70 + 20 GiB) should give d (20 GiB) to n1 (50 GiB): 70 GiB
    # each. But a has risen to 65 GiB: n1 has no room for d, and no plan is made.
    def heavy(used_a: int) -> Cluster:
        cluster = _filling(used_a, used_c=70 * GiB)
        d = Guest("d", "n2", cpu=2, memory=20 * GiB, cpu_used=1.0, memory_used=20 * GiB, uptime=DAY)
        return replace(cluster, guests=(*cluster.guests, d))

    eager = replace(EAGER, smoothing=0)
    assert _moved(_decide(heavy(20 * GiB), eager)) == [("d", "n2", "n1")]
    kept = _decide_on(heavy(20 * GiB), heavy(65 * GiB), eager)
    assert not kept.act
    # (the planner refused d → n1; asked again without it, balance has nothing else)
    assert "strategy balance proposes no migration" in explain(kept)


def _spiky(cpu_a: float) -> Cluster:
    # n1: a (cpu_a cores) and c (1 core), n2: b (2 cores); 20 GiB used on each node.
    nodes = _nodes(2)
    guests = (
        _g("a", "n1", 8, cpu_used=cpu_a, memory_used=10 * GiB),
        _g("c", "n1", 2, cpu_used=1.0, memory_used=10 * GiB),
        _g("b", "n2", 8, cpu_used=2.0, memory_used=20 * GiB),
    )
    return Cluster(nodes, guests)


def test_a_one_observation_spike_does_not_trigger() -> None:
    config = replace(EAGER, smoothing=1800)
    window = UsageWindow()
    for k in range(5):
        window = window.add(NOW + 300 * k, _spiky(1.0), config.smoothing)
    spike = _spiky(6.0)
    # Raw, the spike (n1 7 cores, n2 2: 50 pp) would trigger a move of c.
    raw = _decide(spike, config)
    assert raw.act and _moved(raw) == [("c", "n1", "n2")]
    window = window.add(NOW + 1500, spike, config.smoothing)
    smoothed = window.smoothed(spike)
    # Smoothed, a uses (5·1 + 6)/6 cores: n1 2.83 against n2 2, 8.3 pp, below 15.
    assert smoothed.guest("a").cpu_used == pytest.approx(11 / 6)
    assert measure(smoothed, "spread") == pytest.approx((11 / 6 - 1) / 10)
    decision = _decide(smoothed, config)
    assert not decision.act and explain(decision).startswith("spread 8.3 pp at or below")
    # The observation with the window's average as arrays decides the same, without a cluster
    # written from them.
    arrays = decide(
        spike,
        NOW,
        config,
        PolicyState(),
        PastMigrations(),
        busy=False,
        average=window.average(spike),
    )
    assert (arrays.act, explain(arrays), arrays.metric) == (
        decision.act,
        explain(decision),
        decision.metric,
    )


def test_window_follows_the_guest_set_and_time() -> None:
    window = UsageWindow().add(NOW, _measured(2.0, 10 * GiB), 600)
    grown = replace(
        _measured(4.0, 10 * GiB),
        guests=(
            *_measured(4.0, 10 * GiB).guests,
            Guest("new", "n2", cpu=1, memory=GiB, cpu_used=0.25, memory_used=GiB // 2),
        ),
    )
    window = window.add(NOW + 300, grown)  # the window keeps its 600 s
    assert window.smoothing == 600 and window.guest_ids == ("a", "b", "new")
    smoothed = window.smoothed(grown)
    assert smoothed.guest("a").cpu_used == 3.0
    assert smoothed.guest("new").cpu_used == 0.25  # seen once: its own value
    # A cluster the window has not seen keeps its values where it has no samples.
    other = Cluster(_nodes(1), (Guest("zz", "n1", cpu_used=0.5, memory_used=GiB),))
    assert window.smoothed(other).guest("zz").cpu_used == 0.5
    # An unmeasured guest stays unmeasured.
    unmeasured = replace(grown, guests=(replace(grown.guests[0], cpu_used=None), *grown.guests[1:]))
    assert window.smoothed(unmeasured).guest("a").cpu_used is None
    # Same time again: the sample is replaced; earlier: refused.
    again = window.add(NOW + 300, _measured(6.0, 10 * GiB))
    assert len(again) == 2 and again.smoothed(_measured(6.0, 10 * GiB)).guest("a").cpu_used == 4.0
    with pytest.raises(ValueError, match="time went back"):
        window.add(NOW, grown)
    # smoothing 0 keeps the last sample only: no averaging.
    assert len(window.add(NOW + 301, grown, 0)) == 1
    assert not window.times.flags.writeable


def test_window_at_scale_is_cheap() -> None:
    nodes = _nodes(20)
    guests = tuple(
        Guest(str(i), f"n{i % 20 + 1}", cpu=2, memory=4 * GiB, cpu_used=0.5, memory_used=GiB)
        for i in range(20_000)
    )
    cluster = Cluster(nodes, guests)
    window = UsageWindow()
    for k in range(4):
        window = window.add(NOW + 300 * k, cluster, 1800)
    assert window.cpu.shape == (4, 20_000)
    assert window.smoothed(cluster) is cluster  # nothing changed: the same value back


# --------------------------------------------------------------------------------------------
# Presets, determinism


def test_presets_are_faithful_and_runnable() -> None:
    assert set(PRESETS) == {"opendrs", "proxmox", "incus", "proxlb"}
    assert PRESETS["opendrs"] == PolicyConfig()
    proxmox = PRESETS["proxmox"]
    assert (proxmox.metric, proxmox.threshold, proxmox.hold, proxmox.margin) == (
        "pve-imbalance",
        0.3,
        1,
        0.1,
    )
    assert proxmox.wait_for_motions and not PRESETS["opendrs"].wait_for_motions
    assert (proxmox.batch, proxmox.cooldown, proxmox.strategy, proxmox.max_parallel) == (
        1,
        0,
        "pve-bruteforce",
        1,
    )
    incus = PRESETS["incus"]
    assert (incus.interval, incus.metric, incus.batch, incus.cooldown) == (900, "none", 1, 6 * 3600)
    proxlb = PRESETS["proxlb"]
    assert (proxlb.interval, proxlb.metric, proxlb.threshold, proxlb.batch) == (
        12 * 3600,
        "memory-spread",
        0.10,
        0,
    )
    assert (proxlb.strategy, proxlb.max_parallel, proxlb.hold, proxlb.margin) == (
        "proxlb-greedy",
        5,
        1,
        0.0,
    )
    skewed = _skewed()
    # Proxmox moves HA resources alone: its preset is given the same guests, HA-managed
    ha = [replace(g, ha=True, ha_state="started") for g in skewed.guests]
    for name, config in PRESETS.items():
        cluster = replace(skewed, guests=tuple(ha)) if name == "proxmox" else skewed
        config = replace(config, min_uptime=0)
        state = PolicyState()
        for k in range(config.hold or 1):
            decision = _decide(cluster, config, state, now=NOW + k)
            state = decision.state
        assert decision.act, name
        assert_moves_safe(cluster, decision.plan.moves)  # type: ignore[union-attr]
        guests = {m.guest for m in decision.plan.moves}  # type: ignore[union-attr]
        assert config.batch == 0 or len(guests) <= config.batch, name


def test_incus_preset_passes_cooldowns_to_its_strategy() -> None:
    decision = _decide(
        _skewed(), PRESETS["incus"], memory=PastMigrations(cooldown_until={"a": NOW + 1})
    )
    assert decision.act and decision.proposal is not None
    assert decision.proposal.options["in_cooldown"] == ["a"]
    assert explain(decision).startswith("no policy metric: strategy incus's own trigger decides;")


def test_deterministic() -> None:
    memory = PastMigrations(cooldown_until={"b": NOW + 5})
    first = _decide(_skewed(), memory=memory)
    second = _decide(_skewed(), memory=memory)
    assert explain(first) == explain(second) and first.plan == second.plan
    assert first.as_dict() == second.as_dict()


def test_unknown_option_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"strategy balance has no option 'nope' \(options: "):
        replace(EAGER, options={"nope": 1})


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="policy metric"):
        PolicyConfig(metric="rms")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="policy hold"):
        PolicyConfig(hold=-1)
    with pytest.raises(ValueError, match="policy interval"):
        PolicyConfig(interval=0)
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        PolicyConfig(strategy="nope")
    with pytest.raises(ValueError, match="policy max_parallel"):
        PolicyConfig(max_parallel=0)


# --------------------------------------------------------------------------------------------
# parse_policy


def _parse(value: object, **kw: object) -> PolicyConfig:
    return parse_policy(Reader("opendrs.yaml"), value, ("policy",), **kw)  # type: ignore[arg-type]


def test_parse_policy_reads_every_key() -> None:
    config = _parse(
        {
            "name": "mine",
            "interval": "5m",
            "metric": "cv",
            "threshold": 0.25,
            "target": "4%",
            "hold": 2,
            "margin": "20%",
            "cooldown": "1d 6h",
            "no_return": 3600,
            "batch": 4,
            "min_uptime": "10m",
            "smoothing": 0,
            "avoid_after_failure": "2h",
            "strategy": "balance",
            "options": {"margin": 1, "swaps": False},
            "max_parallel": 2,
            "max_node_inflow": None,
            "maintenance_return": True,
        }
    )
    assert config == PolicyConfig(
        name="mine",
        interval=300,
        metric="cv",
        threshold=0.25,
        target=0.04,
        hold=2,
        margin=0.2,
        cooldown=30 * 3600,
        no_return=3600,
        batch=4,
        min_uptime=600,
        smoothing=0,
        avoid_after_failure=7200,
        options={"margin": 1.0, "swaps": False},
        max_parallel=2,
        maintenance_return=True,
    )
    assert isinstance(config.options["margin"], float)


def test_parse_policy_presets_and_strategy_options() -> None:
    proxmox = _parse({"preset": "proxmox", "hold": 5})
    assert proxmox == replace(PRESETS["proxmox"], hold=5)
    # A new strategy starts without the old one's options.
    base = PolicyConfig(options={"swaps": False})
    assert _parse({"strategy": "static-greedy"}, base=base).options == {}
    assert _parse({}, base=base).options == {"swaps": False}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"treshold": 0.2},
            "opendrs.yaml: policy.treshold: unknown key (did you mean 'threshold'?)",
        ),
        (
            {"strategy": "balanse"},
            "opendrs.yaml: policy.strategy: unknown strategy 'balanse' (known: balance, ",
        ),
        ({"preset": "vmware"}, "opendrs.yaml: policy.preset: expected one of opendrs, "),
        ({"metric": "spred"}, "opendrs.yaml: policy.metric: unknown value 'spred' (did you mean"),
        ({"interval": "0s"}, "opendrs.yaml: policy.interval: must be at least 1 second"),
        ({"cooldown": "6 hours"}, "opendrs.yaml: policy.cooldown: cannot read '6 hours'"),
        ({"threshold": "x%"}, "opendrs.yaml: policy.threshold: cannot read 'x%' as a percentage"),
        ({"hold": 1.5}, "opendrs.yaml: policy.hold: expected a whole number, got 1.5"),
        ({"max_parallel": 0}, "opendrs.yaml: policy.max_parallel: must be between 1 and"),
        (
            {"options": {"wide": "x"}},
            "opendrs.yaml: policy.options.wide: expected a whole number, got 'x'",
        ),
        (
            {"options": {"widee": 3}},
            "opendrs.yaml: policy.options.widee: unknown key (did you mean 'wide'?) "
            "for strategy balance",
        ),
        ([1], "opendrs.yaml: policy: expected a mapping, got a list"),
        ({"maintenance_return": "yes"}, "opendrs.yaml: policy.maintenance_return: expected"),
    ],
)
def test_parse_policy_errors_are_one_line(value: object, message: str) -> None:
    with pytest.raises(DocumentError) as info:
        _parse(value)
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text


# --------------------------------------------------------------------------------------------
# Property


_FAST = ("balance", "static-greedy", "pve-bruteforce", "incus", "proxlb-greedy")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(max_nodes=5, max_guests=16), st.data())
def test_property_decisions_respect_the_guards(cluster: Cluster, data: st.DataObject) -> None:
    ids = [g.id for g in cluster.guests]
    names = [n.name for n in cluster.nodes]
    times = st.floats(NOW - 2 * DAY, NOW + DAY)
    memory = PastMigrations(
        cooldown_until=data.draw(st.dictionaries(st.sampled_from(ids), times, max_size=4)),
        departures=data.draw(
            st.dictionaries(
                st.sampled_from(ids),
                st.lists(st.tuples(st.sampled_from(names), times), max_size=2).map(tuple),
                max_size=4,
            )
        ),
        avoid=data.draw(
            st.dictionaries(
                st.tuples(st.sampled_from(ids), st.sampled_from(names)), times, max_size=4
            )
        ),
    )
    config = PolicyConfig(
        metric=data.draw(st.sampled_from(["spread", "cv", "memory-spread", "none"])),
        threshold=data.draw(st.sampled_from([0.0, 0.05])),
        hold=1,
        margin=data.draw(st.sampled_from([0.0, 0.1])),
        batch=data.draw(st.sampled_from([0, 1, 3])),
        min_uptime=data.draw(st.sampled_from([0, 7200])),
        strategy=data.draw(st.sampled_from(_FAST)),
        max_parallel=data.draw(st.sampled_from([None, 1, 3])),
    )
    decision = _decide(cluster, config, memory=memory)
    guarded = forbidden_placements(cluster, NOW, config, memory)
    # No guest onto a node seen running hot (this observation's included).
    guarded |= hot_targets(cluster, decision.state.hot_seen)
    # A repair keeps to the guards where it can; else only failed targets stay off limits, and
    # the returns to a node a guest left that its plan would make, where it can do without.
    failed = frozenset(pair for pair, until in memory.avoid.items() if until > NOW)
    returns = forbidden_placements(
        cluster, NOW, replace(config, min_uptime=0), replace(memory, cooldown_until={}, avoid={})
    )
    lifted = failed <= decision.forbidden <= failed | returns and decision.forbidden != guarded
    relaxed = decision.kind == "repair" and lifted
    assert decision.forbidden == guarded or relaxed
    assert relaxed == ("it could not keep" in explain(decision))
    # It says it lifted the no-return only when a guest goes back.
    moves = decision.plan.moves if decision.plan is not None else ()
    back = any((m.guest, m.target) in returns for m in moves)
    assert back == (relaxed and "no-return it could not keep" in explain(decision))
    assert explain(decision) and "\n" not in explain(decision)
    if decision.plan is None:
        return
    moves = decision.plan.moves
    cooling = {g for g, until in memory.cooldown_until.items() if until > NOW}
    assert relaxed or not {m.guest for m in moves} & cooling
    assert not {(m.guest, m.target) for m in moves} & decision.forbidden
    assert_moves_safe(cluster, moves)
    if config.batch:
        assert len({m.guest for m in moves}) <= config.batch
    if not decision.act:
        return
    assert decision.kind in ("plan", "repair") and moves
    if decision.kind == "plan" and config.metric != "none" and config.margin:
        assert decision.predicted is not None
        assert decision.metric - decision.predicted >= config.margin * decision.metric - 1e-9


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_the_repair_screen_never_misses_a_repair(cluster: Cluster) -> None:
    """Hypothesis found a 4-vCPU guest on a 2-core node once: the vCPU check used the memory
    dimension's rounding slack (bytes). See also the explicit case below."""
    if repairs_needed(cluster):
        assert may_need_repair(cluster)


def test_the_repair_screen_sees_vcpus_over_a_small_node() -> None:
    cluster = Cluster(
        (Node("n0", cpu=2, memory=4 * GiB), Node("n1", cpu=2, memory=4 * GiB)),
        (Guest("100", "n0", cpu=4, memory=GiB),),
        settings=Settings(mode="basic", cpu_overcommit=1.0),
    )
    assert repairs_needed(cluster)
    assert may_need_repair(cluster)


def test_a_parking_move_to_a_node_left_is_no_return(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repair parks m on n1, a node it left, on its way to n2: it does not go back, so the
    decision says the no-return was kept."""
    cluster = _with_maintenance(_g("a", "n1", 2), _g("b", "n2", 2), _g("m", "n3", 1))
    cooling = {"m": NOW + 600}
    back = PastMigrations(cooldown_until=cooling, departures={"m": (("n1", NOW - 60),)})
    decide_module = importlib.import_module("opendrs.engine.policy.decide")
    real = decide_module.repair_within_guards

    def parked(*args: Any) -> tuple[Repair, frozenset[tuple[str, str]]]:
        made, kept = real(*args)
        assert made.plan is not None and made.plan.moves
        moves = (PlannedMove("m", "n3", "n1", 1, parking=True), PlannedMove("m", "n1", "n2", 2))
        return replace(made, plan=replace(made.plan, moves=moves)), kept

    monkeypatch.setattr(decide_module, "repair_within_guards", parked)
    decision = _decide(cluster, PolicyConfig(min_uptime=0), memory=back)
    assert decision.kind == "repair"
    assert explain(decision).endswith("the cooldown and minimum uptime it could not keep")
