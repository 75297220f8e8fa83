"""pve-bruteforce and pve-topsis by default: what a Proxmox VE 9.1+ operator gets (pve-ha-manager
5.2.0, proxmox-resource-scheduling 2.1.0) — only started HA resources move, only to the top tier
of their node affinity, against the normalised imbalance."""

from __future__ import annotations

import math
from typing import Any

import pytest

from opendrs.engine.policy import PRESETS, PolicyState, decide, measure
from opendrs.engine.policy.state import PastMigrations
from opendrs.engine.strategies import get_strategy, pve
from opendrs.engine.strategies.base import Proposal, Request
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Node
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.report.reasons import explain

GiB = 1024**3


def propose_bruteforce(cluster: Cluster, **options: Any) -> Proposal:
    return pve.propose_bruteforce(CycleView(cluster), Request(), pve.PveOptions(**options))


def propose_topsis(cluster: Cluster, **options: Any) -> Proposal:
    return pve.propose_topsis(CycleView(cluster), Request(), pve.PveOptions(**options))


PROPOSE = (propose_bruteforce, propose_topsis)


def _guest(gid: str, *, ha: bool = True, ha_state: str | None = "started", **kw: object) -> Guest:
    fields: dict[str, object] = {
        "cpu": 2,
        "memory": 4 * GiB,
        "cpu_used": 1.0,
        "memory_used": 4 * GiB,
        "ha": ha,
        "ha_state": ha_state if ha else None,
        **kw,
    }
    return Guest(gid, str(fields.pop("node", "node1")), **fields)  # type: ignore[arg-type]


def _cluster(*guests: Guest, rules: Rules | None = None) -> Cluster:
    nodes = tuple(Node(f"node{i}", 24, 32 * GiB) for i in (1, 2, 3))
    return Cluster(nodes, guests, rules=rules or Rules())


@pytest.mark.parametrize("propose", PROPOSE)
def test_only_started_ha_resources_move(propose) -> None:  # type: ignore[no-untyped-def]
    cluster = _cluster(
        _guest("vm:101", ha=False),
        _guest("vm:102", ha=False),
        _guest("vm:103", ha_state="error"),
        _guest("vm:104"),
        _guest("vm:105"),
    )
    moved = {m.guest for m in propose(cluster).moves}
    assert moved and moved <= {"vm:104", "vm:105"}
    everyone = {m.guest for m in propose(cluster, scope="all").moves}
    assert everyone - {"vm:104", "vm:105"}


@pytest.mark.parametrize("propose", PROPOSE)
def test_a_cluster_without_ha_resources_is_left_alone(propose) -> None:  # type: ignore[no-untyped-def]
    cluster = _cluster(*(_guest(f"vm:{100 + i}", ha=False) for i in range(1, 5)))
    proposal = propose(cluster)
    assert proposal.moves == ()
    assert proposal.stopped == "no started HA resource has an allowed target"


def _pair(partner_state: str) -> Cluster:
    """vm:101 started, its strict positive partner vm:102 not started (``partner_state``, not
    running), vm:103 and vm:104 started; all on node1."""
    pair = GuestAffinity("pair", ("vm:101", "vm:102"), positive=True)
    partner = _guest("vm:102", ha_state=partner_state, state="stopped", cpu_used=0.0)
    rest = (_guest("vm:103"), _guest("vm:104"))
    return _cluster(_guest("vm:101"), partner, *rest, rules=Rules(guest_affinity=(pair,)))


def test_partners_not_started_move_along_and_weigh_nothing() -> None:
    # vm:101's bundle weighs vm:101 alone, as much as vm:103 or vm:104: the tie goes to the
    # smallest sid, and the partner about to start moves along
    proposal = propose_bruteforce(_pair("request_start"), max_moves=1)
    assert [(m.guest, m.target) for m in proposal.moves] == [
        ("vm:101", "node2"),
        ("vm:102", "node2"),
    ]
    # a partner the HA manager holds stopped is never moved by opendrs: its bundle stays
    held = propose_bruteforce(_pair("stopped"))
    assert {m.guest for m in held.moves} <= {"vm:103", "vm:104"}
    # a bundle whose members are none of them started never forms
    lone = _cluster(
        _guest("vm:102", ha_state="request_start", state="stopped", cpu_used=0.0),
        *(_guest(f"vm:{200 + i}", node="node2") for i in range(3)),
    )
    assert "vm:102" not in {m.guest for m in propose_bruteforce(lone).moves}


@pytest.mark.parametrize("failback", [True, False], ids=["failback", "no-failback"])
@pytest.mark.parametrize("propose", PROPOSE)
def test_targets_only_on_the_top_tier_without_fallback(propose, failback: bool) -> None:  # type: ignore[no-untyped-def]
    """A non-strict rule preferring node1 and node2: node3 is never a target, even though it is
    allowed and emptiest; a rule preferring the guests' own node alone leaves them there —
    whether failback binds the HA resources to their top tier (a hard filter) or not."""
    ids = tuple(f"vm:{100 + i}" for i in range(1, 5))
    top = NodeAffinity("top", ids, {"node1": 2, "node2": 2, "node3": 1})
    guests = [_guest(g, failback=failback) for g in ids]
    cluster = _cluster(*guests, rules=Rules(node_affinity=(top,)))
    targets = {m.target for m in propose(cluster).moves}
    assert targets == {"node2"}
    own = NodeAffinity("own", ids, {"node1": 2, "node2": 1, "node3": 1})
    alone = _cluster(*guests, rules=Rules(node_affinity=(own,)))
    assert propose(alone).moves == ()


def test_the_imbalance_is_normalised_by_the_square_root_of_n_minus_1() -> None:
    """Node loads 33 %, 16 %, 16 %: a raw CV of 0.39, above 0.3, but 0.27 normalised — Proxmox
    9.1+ holds where the test logs' scale would move."""
    cluster = _cluster(
        _guest("vm:101", cpu_used=7.0, memory_used=12 * GiB),
        _guest("vm:102", node="node2", cpu_used=3.0, memory_used=6 * GiB),
        _guest("vm:103", node="node3", cpu_used=3.0, memory_used=6 * GiB),
    )
    raw, normalised = measure(cluster, "cv"), measure(cluster, "pve-imbalance")
    assert raw == pytest.approx(0.3878, abs=1e-4)
    assert normalised == pytest.approx(raw / math.sqrt(2))
    held = propose_bruteforce(cluster)
    assert held.moves == ()
    assert held.stopped == f"imbalance {normalised:.3f} at or below threshold 0.3"
    assert "at or below" not in propose_bruteforce(cluster, imbalance="raw").stopped


def test_a_threshold_written_as_thirty_is_refused_with_the_fix() -> None:
    options = get_strategy("pve-bruteforce").options
    with pytest.raises(ValueError, match=r"threshold: 30 as a fraction is 3000 %") as refused:
        options.parse("pve-bruteforce", {"threshold": 30})
    # The fix it names is one an option takes: the percentage, or the fraction.
    assert "did you mean 30 %? (write 30% or 0.3)" in str(refused.value)
    assert options.parse("pve-bruteforce", {"threshold": 0.3}).threshold == 0.3
    assert options.parse("pve-bruteforce", {"threshold": "30%"}).threshold == 0.3
    with pytest.raises(ValueError, match="scope: expected ha or all"):
        options.parse("pve-bruteforce", {"scope": "vms"})
    # A raw coefficient of variation may pass 1: written as a percentage, it is taken.
    raw = options.parse("pve-bruteforce", {"threshold": "3000%", "imbalance": "raw"})
    assert raw.threshold == 30
    with pytest.raises(ValueError, match=r"threshold: 1.5 is above 1"):
        options.parse("pve-bruteforce", {"threshold": "150%"})


def _preset_decide(cluster: Cluster, state: PolicyState, now: float = 0.0):  # type: ignore[no-untyped-def]
    return decide(cluster, now, PRESETS["proxmox"], state, PastMigrations(), busy=False)


def test_the_proxmox_preset_waits_while_any_guest_moves() -> None:
    """A guest moving by someone else's hand (an HA relocate) holds every decision, and the
    hold count stands still — Proxmox's ``any_resource_motion_queued_or_running``."""
    four = [_guest(f"vm:{100 + i}") for i in range(1, 5)]
    moving = _guest("ct:200", kind="ct", node="node2", ha_state="relocate")
    decision = _preset_decide(_cluster(*four, moving), PolicyState())
    assert decision.code == "busy" and not decision.act
    assert explain(decision).startswith("ct:200 is moving: no new decision until it ends")
    assert decision.state == PolicyState()
    acting = _preset_decide(_cluster(*four), PolicyState())
    assert acting.act and acting.code == "plan" and acting.proposal is not None
    assert len(acting.proposal.moves) == 1  # one move per round


def test_the_proxmox_preset_reads_its_threshold_in_percent() -> None:
    four = _cluster(*(_guest(f"vm:{100 + i}") for i in range(1, 5)))
    decision = _preset_decide(four, PolicyState())
    assert "above threshold 30 %" in explain(decision), explain(decision)
    config = PRESETS["proxmox"]
    assert (config.metric, config.threshold, config.interval, config.hold) == (
        "pve-imbalance",
        0.3,
        60,
        1,
    )
