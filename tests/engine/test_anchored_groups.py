"""A split hard-affinity group anchored by a member that cannot move (issue 26, item 6): the
movable members join the anchor's node when capacity and rules allow — in ``balance``, in the
repair of ``opendrs plan`` and of the daemon — and when they cannot, the why-not says why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import opendrs, run_once
from opendrs.engine.constraints import Constraints, movability
from opendrs.engine.policy.repair import repair
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.model.cluster import Cluster, Guest, Node
from opendrs.model.rules import GuestAffinity, Rules

GiB = 1024**3

SPLIT = """\
version: 1
name: split
nodes:
  pve1: {cpu: 16, memory: 64GiB}
  pve2: {cpu: 16, memory: 64GiB}
  pve3: {cpu: 16, memory: 64GiB}
guests:
  - {id: 100, node: pve1, cpu: 2, memory: 4GiB, devices: [hostpci0], usage: {cpu: 1, memory: 3GiB}}
  - {id: 101, node: pve2, cpu: 2, memory: 4GiB, usage: {cpu: 1, memory: 3GiB}}
  - {id: 102, node: pve3, cpu: 2, memory: 4GiB, usage: {cpu: 1, memory: 3GiB}}
rules:
  - {type: affinity, name: together, guests: [100, 101]}
"""


def test_plan_moves_the_movable_member_to_the_anchor(tmp_path: Path) -> None:
    (tmp_path / "split.yaml").write_text(SPLIT, encoding="utf-8")
    done = opendrs("plan", str(tmp_path / "split.yaml"), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert "repair stuck" not in done.stderr
    moves = [(m["guest"], m["source"], m["target"]) for m in json.loads(done.stdout)["moves"]]
    assert moves == [("101", "pve2", "pve1")]


def test_a_group_that_cannot_join_its_anchor_says_why_without_contradiction(
    tmp_path: Path,
) -> None:
    """The anchor's node lacks room: the why-not names the room it lacks, and the nodes where
    the guest alone would be allowed name the partner that cannot move — never 'allowed, but'."""
    text = SPLIT.replace("pve1: {cpu: 16, memory: 64GiB}", "pve1: {cpu: 4, memory: 6GiB}")
    text = text.replace("guests: [100, 101]", "guests: [100, 101, 102]")
    (tmp_path / "split.yaml").write_text(text, encoding="utf-8")
    done = opendrs("plan", str(tmp_path / "split.yaml"))
    assert done.returncode == 1, done.stderr
    stuck = [line for line in done.stderr.splitlines() if line.startswith("repair stuck: 101")]
    assert len(stuck) == 1, done.stderr
    # the unit is judged whole: 101 with its partners 100 and 102, their memory summed
    assert (
        "with its hard-affinity partners 100, 102: pve1: capacity: memory needs 12.0 GiB, free 6.0"
        in stuck[0]
    )
    assert "pve3: its hard-affinity partner 100 cannot move from pve1 (local device" in stuck[0]
    assert "allowed, but" not in done.stdout + done.stderr


# -- the property ----------------------------------------------------------------------------


@st.composite
def anchored_clusters(draw: st.DrawFn) -> Cluster:
    """Random clusters with one split hard-affinity group whose first member cannot move (a
    local device), the rest anywhere; other guests anywhere, some of them immovable too."""
    n_nodes = draw(st.integers(2, 5))
    nodes = tuple(
        Node(
            f"n{i}",
            cpu=draw(st.sampled_from([4, 8, 16])),
            memory=draw(st.sampled_from([8, 16, 32])) * GiB,
        )
        for i in range(n_nodes)
    )
    names = [n.name for n in nodes]
    guests: list[Guest] = []
    for j in range(draw(st.integers(0, 12))):
        guests.append(
            Guest(
                str(200 + j),
                draw(st.sampled_from(names)),
                cpu=draw(st.sampled_from([1, 2, 4])),
                memory=draw(st.sampled_from([1, 2, 4, 8])) * GiB,
                uptime=86400,
                devices=draw(st.sampled_from([(), (), ("hostpci0",)])),
            )
        )
    size = draw(st.integers(2, 4))
    anchor = draw(st.sampled_from(names))
    members = [
        Guest(
            "100",
            anchor,
            cpu=draw(st.sampled_from([1, 2])),
            memory=draw(st.sampled_from([1, 2, 4])) * GiB,
            uptime=86400,
            devices=("hostpci0",),
        )
    ]
    for k in range(1, size):
        members.append(
            Guest(
                str(100 + k),
                draw(st.sampled_from(names)),
                cpu=draw(st.sampled_from([1, 2])),
                memory=draw(st.sampled_from([1, 2, 4])) * GiB,
                uptime=86400,
            )
        )
    # Split: at least one movable member away from the anchor.
    if all(g.node == anchor for g in members[1:]):
        other = next(n for n in names if n != anchor)
        members[1] = Guest(
            members[1].id, other, cpu=members[1].cpu, memory=members[1].memory, uptime=86400
        )
    rule = GuestAffinity("together", tuple(g.id for g in members), positive=True, hard=True)
    return Cluster(nodes, (*members, *guests), Rules(guest_affinity=(rule,)))


def _joinable(cluster: Cluster) -> str | None:
    """The anchor's node when the group's movable members fit there as the cluster is now (no
    other guest moved), and nothing else breaks a hard constraint; else None."""
    cons = Constraints.build(cluster)
    if cons.problems:
        return None
    guests = cluster.guests
    anchor = guests[0].node
    n = cluster.node_index[anchor]
    committed = cons.capacity.committed()
    if cons.capacity.over(committed).any():
        return None  # a node over capacity is another repair
    away = [
        j
        for j in range(1, len(guests))
        if guests[j].id in cluster.rules.guest_affinity[0].guests and guests[j].node != anchor
    ]
    if any(movability(guests[j], cluster, "balance") is not None for j in away):
        return None
    need = sum(cons.guest_demand(j) for j in away)
    room = cons.capacity.limit[n] - committed[n]
    return anchor if bool((need <= room + 1e-6).all()) else None


def _gathered(cluster: Cluster, moves: dict[str, str], anchor: str) -> bool:
    group = cluster.rules.guest_affinity[0].guests
    return all(moves.get(g.id, g.node) == anchor for g in cluster.guests if g.id in group)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(anchored_clusters())
def test_balance_and_the_repair_join_the_anchor_whenever_there_is_room(cluster: Cluster) -> None:
    anchor = _joinable(cluster)
    if anchor is None:
        return
    proposal = propose_balance(cluster)
    moves = {m.guest: m.target for m in proposal.net_moves()}
    assert _gathered(cluster, moves, anchor), (proposal.notes, moves)
    fixed = repair(cluster)
    assert fixed.plan is not None and fixed.plan.feasible, fixed
    planned = {m.guest: m.target for m in fixed.plan.moves}
    assert _gathered(cluster, planned, anchor), (fixed.stuck, planned)
    assert not fixed.stuck


# -- the daemon ------------------------------------------------------------------------------


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Any]:
    """A split group on the fake Proxmox API: ``plb_affinity_db`` on VM 100 (a PCI device ties
    it to pve1) and VM 101 on pve2."""
    pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
    pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")
    from backends.fakepve_fixture import three_nodes

    cluster = three_nodes(str(tmp_path))
    config = {"cores": 1, "memory": 2048, "tags": "plb_affinity_db"}
    for vmid, node, more in (
        (100, "pve1", {"hostpci0": "0000:01:00.0"}),
        (101, "pve2", {}),
    ):
        vm = cluster.pve.add_vm(
            vmid,
            f"vm{vmid}",
            node=node,
            status="running",
            config={**config, "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G", **more},
        )
        vm.stats.update(cpu=0.1, mem=1 * GiB)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_the_daemon_joins_the_movable_member_to_its_anchor(tmp_path: Path, fake: Any) -> None:
    from backends.fakepve_fixture import shadow_config

    done = run_once(shadow_config(tmp_path, fake))
    assert done.returncode == 0, done.stderr
    assert "repair stuck" not in done.stderr, done.stderr
    assert "shadow: would migrate vm101 (101) pve2 → pve1 (step 1)" in done.stderr, done.stderr
    repaired = "decision (shadow): repair: vm101 (101) is apart from its hard-affinity partners"
    assert repaired in done.stderr
