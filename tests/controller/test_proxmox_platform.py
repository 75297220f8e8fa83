"""Proxmox VE as it ships today, through ``opendrs run`` against the fake Proxmox API.

Each test runs the command as an operator does — ``opendrs run --once`` or the daemon, as a
subprocess — against a fake that does what Proxmox VE 9 does:

* a replicated VM live-migrates only to a replication target (``/cluster/replication``);
* a container's move is checked with the containers' own precondition, which names the nodes HA
  rules block;
* a mapped PCI device moves with its VM to where its mapping exists, when the mapping is marked
  live-migration capable; a raw host PCI device does not move;
* the HA manager's own moves, queued or under way, hold opendrs's migrations back;
* with ``leader_only``, only the daemon on the HA manager's master acts, and a master that moves
  mid-plan ends the plan.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster, GiB, proxmox_config, three_nodes
from daemon import Daemon, eventually, fetch, served
from daemon import opendrs as run_opendrs

NODES = ("pve1", "pve2", "pve3")
DEADLINE = 120.0


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    """Three nodes of 8 cores and 32 GiB, shared Ceph storage, no guests yet."""
    cluster = three_nodes(str(tmp_path))
    try:
        yield cluster
    finally:
        cluster.stop()


def add_vm(fake: FakeCluster, vmid: int, node: str, gib: int, **config: object) -> None:
    vm = fake.pve.add_vm(
        vmid,
        f"vm{vmid}",
        node=node,
        status="running",
        config={
            "cores": 1,
            "memory": gib * 1024,
            "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G",
            **config,
        },
    )
    vm.stats.update(cpu=0.1, mem=gib * GiB)


def write_config(
    tmp_path: Path, fake: FakeCluster, *, mode: str = "active", backend: str = "", extra: str = ""
) -> Path:
    config = proxmox_config(
        tmp_path,
        fake,
        mode=mode,
        extra="log: {level: debug}\n" + extra,
    )
    if backend:
        text = config.read_text().replace("  retries: 1\n", "  retries: 1\n" + backend)
        config.write_text(text)
    return config


def opendrs(*args: str) -> subprocess.CompletedProcess[str]:
    return run_opendrs(*args, timeout=DEADLINE, columns=160)


def migrations(tmp_path: Path) -> list[tuple[str, str, str, str | None, str | None]]:
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        return db.execute(
            "SELECT guest, source, target, outcome, error FROM migrations ORDER BY id"
        ).fetchall()


def decisions(tmp_path: Path) -> list[str]:
    path = tmp_path / "history.sqlite"
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT action FROM decisions ORDER BY id")]


def migration_requests(fake: FakeCluster) -> list[str]:
    """The paths of the requests that move a guest (plain or through the HA stack)."""
    return [
        path
        for method, path, _ in fake.pve.requests
        if method == "POST" and path.endswith(("/migrate", "/relocate"))
    ]


def placement(fake: FakeCluster) -> dict[int, str]:
    return {g.vmid: g.node for g in [*fake.pve.vms, *fake.pve.cts]}


def live_snapshot(tmp_path: Path, config: Path) -> dict[str, dict[str, object]]:
    result = opendrs("snapshot", "--config", str(config))
    assert result.returncode == 0, result.stderr
    return {str(g["id"]): g for g in yaml.safe_load(result.stdout)["guests"]}


# --------------------------------------------------------------------------------------------
# Replication


def replicated_cluster(fake: FakeCluster) -> None:
    """VM 100 (8 GiB), the one VM on pve1 that may move (VM 101 has a host PCI device), is
    replicated to pve3, which is in HA maintenance; pve2 is empty."""
    fake.pve.ha_maintenance = {"pve3"}
    add_vm(fake, 100, "pve1", 8)
    add_vm(fake, 101, "pve1", 6, hostpci0="0000:01:00.0")
    fake.pve.replication_jobs = [
        {"id": "100-0", "type": "local", "guest": 100, "target": "pve3", "source": "pve1"}
    ]


def test_a_replicated_vm_is_kept_to_its_replication_targets(
    tmp_path: Path, fake: FakeCluster
) -> None:
    replicated_cluster(fake)
    config = write_config(tmp_path, fake)
    guests = live_snapshot(tmp_path, config)
    (limit,) = guests["100"]["limits"]  # type: ignore[misc]
    assert limit["nodes"] == ["pve1", "pve3"]
    assert "not a replication target" in limit["reason"] and "100-0" in limit["reason"]
    assert "limits" not in guests["101"]
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    moved = migrations(tmp_path)
    # The replicated VM stays: its replication target is in maintenance and pve2 is not one,
    # so no move of it was asked for, and none failed.
    assert moved == [] and migration_requests(fake) == []
    assert "1 with no node the platform can move it to" in result.stderr
    assert placement(fake)[100] == "pve1"
    # Once pve3 is back, the VM goes there.
    fake.pve.ha_maintenance = set()
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    assert [m[:4] for m in migrations(tmp_path)] == [("100", "pve1", "pve3", "done")]


def test_the_daemon_moves_a_replicated_vm_only_to_its_target(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """Over a few cycles of the daemon, the replicated VM goes to its replication target once
    that has room, never elsewhere."""
    add_vm(fake, 100, "pve1", 8)
    add_vm(fake, 101, "pve1", 8)
    fake.pve.replication_jobs = [
        {"id": "100-0", "type": "local", "guest": 100, "target": "pve3", "source": "pve1"}
    ]
    config = write_config(tmp_path, fake)
    with Daemon(config) as daemon:
        daemon.wait_for(r"done vm10[01] \(10[01]\) pve1 → ")
        eventually(lambda: len(migrations(tmp_path)) >= 1 and not any(v.lock for v in fake.pve.vms))
        assert daemon.stop() == 0
    for guest, _source, target, outcome, _error in migrations(tmp_path):
        assert outcome == "done"
        if guest == "100":
            assert target == "pve3"


# --------------------------------------------------------------------------------------------
# The containers' own precondition


def test_a_container_move_is_checked_with_the_containers_precondition(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """CT 200 (HA) must stay apart from VM 300 on pve2, by an HA rule opendrs is told not to
    read: the containers' precondition refuses pve2 before anything is asked of the HA stack.
    (VM 101 has a host PCI device; pve3 is in HA maintenance: the container is the one move.)"""
    pve = fake.pve
    config = {"cores": 1, "memory": 6144, "rootfs": "ceph:subvol-200-disk-0,size=8G"}
    ct = pve.add_ct(200, "ct200", node="pve1", status="running", config=config)
    ct.stats.update(cpu=0.1, mem=6 * GiB)
    ct.ha_state = "started"
    add_vm(fake, 101, "pve1", 6, hostpci0="0000:01:00.0")
    add_vm(fake, 300, "pve2", 1)
    pve.guest(300).ha_state = "started"
    pve.ha_maintenance = {"pve3"}
    pve.ha_rules = [
        {
            "rule": "apart",
            "type": "resource-affinity",
            "resources": "ct:200,vm:300",
            "affinity": "negative",
        }
    ]
    path = write_config(
        tmp_path,
        fake,
        backend="  ha_rules: false\n",
        extra="settings: {allow_restart_migration: true}\n",
    )
    result = opendrs("run", "--config", str(path), "--once")
    assert result.returncode == 0, result.stderr
    ((guest, source, target, outcome, error),) = migrations(tmp_path)
    assert (guest, source, target, outcome) == ("200", "pve1", "pve2", "failed")
    assert "vm:300 (resource-affinity) block it" in str(error)
    assert any(p.endswith("/lxc/200/migrate") for m, p, _ in pve.requests if m == "GET")
    assert migration_requests(fake) == []
    assert placement(fake)[200] == "pve1"


# --------------------------------------------------------------------------------------------
# Mapped PCI devices


def test_mapped_pci_devices_move_where_their_mapping_is(tmp_path: Path, fake: FakeCluster) -> None:
    """VM 100's GPU is mapped (live-migration capable) on pve1 and pve2 only: it moves, to pve2,
    although pve3 is emptier. VM 101's raw host PCI device and VM 102's mapping without live
    migration keep them where they are."""
    pve = fake.pve
    pve.pci_mappings = {
        "gpu": {
            "map": ["node=pve1,path=0000:01:00.0,id=10de:2230", "node=pve2,path=0000:01:00.0"],
            "live-migration-capable": 1,
        },
        "nic": {"map": [f"node={n},path=0000:02:00.0" for n in NODES]},
    }
    add_vm(fake, 100, "pve1", 10, hostpci0="mapping=gpu,pcie=1")
    add_vm(fake, 101, "pve1", 6, hostpci0="0000:03:00.0")
    add_vm(fake, 102, "pve1", 6, hostpci0="mapping=nic")
    add_vm(fake, 104, "pve2", 4, hostpci0="0000:04:00.0")
    config = write_config(tmp_path, fake)
    guests = live_snapshot(tmp_path, config)
    assert "devices" not in guests["100"]
    assert guests["100"]["limits"][0]["nodes"] == ["pve1", "pve2"]  # type: ignore[index]
    assert guests["101"]["devices"] == ["hostpci0"]
    assert guests["102"]["devices"] == ["hostpci0 (mapping nic, not live-migration capable)"]
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    moved = migrations(tmp_path)
    assert [m[:4] for m in moved] == [("100", "pve1", "pve2", "done")], moved
    assert placement(fake) == {100: "pve2", 101: "pve1", 102: "pve1", 104: "pve2"}


# --------------------------------------------------------------------------------------------
# The HA manager's own moves


def ha_motion_cluster(fake: FakeCluster) -> None:
    """Four VMs of 3 GiB on pve1 to balance; HA-managed VM 300 on pve3, which an operator asks
    the HA manager to move to pve2."""
    for vmid in (100, 101, 102, 103):
        add_vm(fake, vmid, "pve1", 3)
    add_vm(fake, 300, "pve3", 6)
    fake.pve.guest(300).ha_state = "started"


def test_a_queued_ha_move_counts_as_under_way(tmp_path: Path, fake: FakeCluster) -> None:
    ha_motion_cluster(fake)
    fake.pve.queue_ha_motion(300, "pve2")
    guests = live_snapshot(tmp_path, write_config(tmp_path, fake))
    assert guests["300"]["migrating_to"] == "pve2"
    assert "migrating_to" not in guests["100"]


@pytest.mark.parametrize("once", [True, False], ids=["once", "daemon"])
def test_no_migration_starts_while_the_ha_manager_moves_a_guest(
    tmp_path: Path, fake: FakeCluster, once: bool
) -> None:
    """The plan waits while the HA manager has a move queued, then under way; it starts once the
    HA manager's move is over — ``opendrs run --once`` and the daemon alike."""
    ha_motion_cluster(fake)
    pve = fake.pve
    pve.migrate_secs = 300  # three seconds of real time: a few executor ticks
    pve.queue_ha_motion(300, "pve2")
    config = write_config(tmp_path, fake)
    with Daemon(config, *(["--once"] if once else [])) as daemon:
        daemon.wait_for(
            r"waiting while the platform moves guests itself: vm:300 \(migrate from pve3 to "
            r"pve2, queued\)"
        )
        # Some executor ticks: nothing of opendrs's starts.
        asked = len([p for m, p, _ in pve.requests if p.endswith("/manager_status")])
        eventually(
            lambda: (
                len([p for m, p, _ in pve.requests if p.endswith("/manager_status")]) >= asked + 3
            )
        )
        assert migration_requests(fake) == []
        fake.run(pve.carry_out_ha_motions())
        daemon.wait_for(r"under way\)")
        assert migration_requests(fake) == []
        daemon.wait_for("the platform's own moves are over: migrations may start")
        daemon.wait_for(r"started vm10[0-3] \(10[0-3]\) pve1 → ")
        assert placement(fake)[300] == "pve2"
        if once:
            assert daemon.process.wait(DEADLINE) == 0
        else:
            # every migration started has ended before the daemon is stopped
            eventually(lambda: {m[3] for m in migrations(tmp_path)} == {"done"})
            assert daemon.stop() == 0
    assert {m[3] for m in migrations(tmp_path)} <= {"done"}


# --------------------------------------------------------------------------------------------
# Leader only


def leader_config(tmp_path: Path, fake: FakeCluster, node: str, *, http: bool = False) -> Path:
    return write_config(
        tmp_path,
        fake,
        backend=f"  leader_only: true\n  node: {node}\n",
        extra="http: {listen: '127.0.0.1:0'}\n" if http else "",
    )


def test_leader_only_acts_on_the_ha_managers_master(tmp_path: Path, fake: FakeCluster) -> None:
    for vmid in (100, 101, 102, 103):
        add_vm(fake, vmid, "pve1", 3)
    fake.pve.ha_master = "pve2"
    config = leader_config(tmp_path, fake, "pve1")
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    assert "standing by: node pve1 is not the HA manager's master (pve2): idle" in result.stderr
    assert decisions(tmp_path) == [] and migration_requests(fake) == []
    status = opendrs("status", "--config", str(config), "--format", "json")
    assert json.loads(status.stdout)["daemon"]["standby"] == (
        "node pve1 is not the HA manager's master (pve2): idle"
    )
    text = opendrs("status", "--config", str(config))
    assert "standing by: node pve1 is not the HA manager's master (pve2)" in text.stdout
    # The master's daemon acts.
    result = opendrs("run", "--config", str(leader_config(tmp_path, fake, "pve2")), "--once")
    assert result.returncode == 0, result.stderr
    assert "standing by" not in result.stderr
    assert migration_requests(fake)


def test_leader_only_without_a_current_master(tmp_path: Path, fake: FakeCluster) -> None:
    """The HA manager is idle (its status a day old): the first online node acts, alone."""
    for vmid in (100, 101, 102, 103):
        add_vm(fake, vmid, "pve1", 3)
    fake.pve.ha_master, fake.pve.ha_master_age = "pve3", 86400.0
    result = opendrs("run", "--config", str(leader_config(tmp_path, fake, "pve2")), "--once")
    assert result.returncode == 0, result.stderr
    assert "node pve2 is not the first online node (pve1)" in result.stderr
    assert migration_requests(fake) == []
    result = opendrs("run", "--config", str(leader_config(tmp_path, fake, "pve1")), "--once")
    assert result.returncode == 0, result.stderr
    assert "standing by" not in result.stderr and migration_requests(fake)


def test_leader_only_with_a_node_name_the_cluster_does_not_have(
    tmp_path: Path, fake: FakeCluster
) -> None:
    add_vm(fake, 100, "pve1", 3)
    result = opendrs("run", "--config", str(leader_config(tmp_path, fake, "pve9")), "--once")
    assert result.returncode == 0, result.stderr
    assert "node pve9 (this host) is not a node of the cluster" in result.stderr
    assert decisions(tmp_path) == []


def test_the_daemon_follows_the_master_and_drops_its_plan_when_it_moves(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """Idle while pve2 is the master (the dashboard says so), acting once pve1 is; when the
    master moves on mid-plan, the migration in flight ends and the rest is skipped."""
    for vmid in (100, 101, 102, 103, 104, 105):
        add_vm(fake, vmid, "pve1", 3)
    pve = fake.pve
    pve.ha_master = "pve2"
    config = leader_config(tmp_path, fake, "pve1", http=True)
    with Daemon(config) as daemon:
        address = served(daemon)
        daemon.wait_for(r"standing by: node pve1 is not the HA manager's master \(pve2\)")

        def says_standby() -> bool:
            # The line is logged during the cycle, the dashboard's snapshot published at its end.
            code, body = fetch(address, "/api/state")
            assert code == 200
            return "is not the HA manager's master (pve2)" in str(json.loads(body)["standby"])

        eventually(says_standby, 10, what="the dashboard saying it stands by", log=daemon.log)
        code, page = fetch(address, "/")
        assert code == 200 and "standing by" in page
        assert "\nopendrs_standby 1.0\n" in fetch(address, "/metrics")[1]
        time.sleep(1.5)
        assert decisions(tmp_path) == [] and migration_requests(fake) == []
        pve.ha_master = "pve1"
        mark = len(daemon.lines)
        daemon.wait_for("acting again: this instance may act on the cluster", after=mark)
        daemon.wait_for(r"started vm10\d \(10\d\) pve1 → ", after=mark)
        assert "\nopendrs_standby 0.0\n" in fetch(address, "/metrics")[1]
        pve.ha_master = "pve3"
        skipped = r"skipped vm10\d \(10\d\) .*not the HA manager's master \(pve3\)"
        daemon.wait_for(skipped, after=mark)
        daemon.wait_for(r"done vm10\d \(10\d\) pve1 → ", after=mark)
        requested = len(migration_requests(fake))
        time.sleep(2.0)
        assert len(migration_requests(fake)) == requested == 1
        code, body = fetch(address, "/api/state")
        assert "(pve3)" in str(json.loads(body)["standby"])
        assert daemon.stop() == 0
    assert [m[3] for m in migrations(tmp_path)] == ["done"]


# --------------------------------------------------------------------------------------------
# A snapshot of it all, read back


def test_a_snapshot_of_the_platform_facts_reads_back(tmp_path: Path, fake: FakeCluster) -> None:
    """What the platform adds to a snapshot — a guest's ``failback`` and ``limits``, the cluster's
    ``ha_auto_rebalance``, a negative node affinity, an ``ignore`` with its reason — is written by
    ``opendrs snapshot``, read back by ``validate``, ``show``, ``place`` and ``plan``, and the
    snapshot of that snapshot (through the file backend) is the same file."""
    pve = fake.pve
    add_vm(fake, 100, "pve1", 8)  # replicated to pve3
    for vmid in (101, 102, 103):
        add_vm(fake, vmid, "pve1", 4)
        pve.guest(vmid).ha_state = "started"
    add_vm(fake, 104, "pve2", 2, hostpci0="mapping=gpu")
    pve.replication_jobs = [
        {"id": "100-0", "type": "local", "guest": 100, "target": "pve3", "source": "pve1"}
    ]
    pve.pci_mappings = {
        "gpu": {
            "map": ["node=pve2,path=0000:01:00.0", "node=pve3,path=0000:01:00.0"],
            "live-migration-capable": 1,
        }
    }
    pve.crs = {"ha": "static", "ha-auto-rebalance": 1}
    pve.ha_failback[101] = False
    pve.ha_auto_rebalance[103] = False
    pve.ha_rules = [
        {
            "rule": "never-pve3",
            "type": "node-affinity",
            "resources": "vm:102",
            "nodes": "pve3",
            "strict": 1,
            "affinity": "negative",
        }
    ]
    config = write_config(tmp_path, fake, mode="shadow")
    snap = tmp_path / "live.yaml"
    written = opendrs("snapshot", "--config", str(config), "-o", str(snap))
    assert written.returncode == 0, written.stderr
    doc = yaml.safe_load(snap.read_text())
    assert doc["ha_auto_rebalance"] is True and doc["ha_scheduler"] == "static"
    guests = {str(g["id"]): g for g in doc["guests"]}
    assert guests["101"]["failback"] is False and "failback" not in guests["102"]
    assert [lim["nodes"] for lim in guests["100"]["limits"]] == [["pve1", "pve3"]]
    assert [lim["nodes"] for lim in guests["104"]["limits"]] == [["pve2", "pve3"]]
    (never,) = [r for r in doc["rules"] if r.get("name") == "never-pve3"]
    assert never["guests"] == [102] and sorted(never["nodes"]) == ["pve1", "pve2"], never
    assert {
        "type": "ignore",
        "guests": [103],
        "reason": "its HA resource has auto-rebalance 0",
    } in (doc["rules"])
    for command in ("validate", "show"):
        result = opendrs(command, str(snap))
        assert result.returncode == 0, (command, result.stdout, result.stderr)
    assert "Proxmox VE balances its HA guests itself" in opendrs("show", str(snap)).stdout
    placed = opendrs("place", str(snap), "--guest", "102")
    assert "cannot move: Proxmox VE balances HA guests itself (ha-auto-rebalance)" in (
        placed.stdout
    ), placed.stdout
    evacuated = opendrs("place", str(snap), "--evacuate", "pve1", "--format", "json")
    assert evacuated.returncode == 1, evacuated.stderr  # a guest is stuck
    result = json.loads(evacuated.stdout)
    targets = {m["guest"]: m["target"] for m in result["moves"]}
    assert targets["100"] == "pve3" and targets["102"] != "pve3", targets
    assert result["stuck"] == [
        {"guest": "103", "reason": "ignored: its HA resource has auto-rebalance 0"}
    ]
    plan = opendrs("plan", str(snap), "--format", "json")
    assert plan.returncode == 0, plan.stderr
    moves = [(str(m["guest"]), m["target"]) for m in json.loads(plan.stdout)["moves"]]
    assert moves, plan.stdout
    # HA guests are Proxmox's to balance; the others only where the platform can move them.
    for guest, target in moves:
        assert guest in ("100", "104"), moves
        assert target == "pve3", moves
    # The snapshot read back as a cluster (the file backend) is written out the same.
    again = tmp_path / "again.yaml"
    again.write_text(f"backend: {{type: file, path: '{snap}'}}\n")
    copy = opendrs("snapshot", "--config", str(again))
    assert copy.returncode == 0, copy.stderr
    assert copy.stdout == snap.read_text()


# --------------------------------------------------------------------------------------------
# The HA scheduler mode, kept in a snapshot


def test_a_snapshot_keeps_the_ha_scheduler_mode_auto_judges_by(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """With ``crs: ha=static``, the snapshot says ``ha_scheduler: static`` and ``headroom`` on it
    judges ``auto`` as Proxmox's static mode does: if pve1 fails, x goes to the node with the
    least memory in use (pve2, then pve3), whose configured cores are full, and stays down, where
    the best fit (pve4) has room."""
    fake.pve.add_node("pve4", cpu=8, memory=32 * GiB, base_memory=1 * GiB)
    add_vm(fake, 101, "pve1", 8, cores=2)
    fake.pve.guest(101).ha_state = "started"
    add_vm(fake, 201, "pve2", 4, cores=8)
    add_vm(fake, 301, "pve3", 4, cores=8)
    add_vm(fake, 401, "pve4", 20)
    fake.pve.crs = {"ha": "static"}
    config = write_config(
        tmp_path, fake, mode="shadow", extra="settings: {mode: static, cpu_overcommit: 1}\n"
    )
    snap = tmp_path / "live.yaml"
    written = opendrs("snapshot", "--config", str(config), "-o", str(snap))
    assert written.returncode == 0, written.stderr
    assert yaml.safe_load(snap.read_text())["ha_scheduler"] == "static"
    judged = opendrs("headroom", str(snap), "--format", "json")
    assert judged.returncode == 1, judged.stderr
    assert json.loads(judged.stdout)["recovery"] == "pve-static"
    text = opendrs("headroom", str(snap))
    assert "vm101 (101): no room to start on pve2 and pve3" in text.stdout, text.stdout
    live = opendrs("headroom", "--config", str(config), "--format", "json")
    assert json.loads(live.stdout) == json.loads(judged.stdout)
    assert opendrs("headroom", str(snap), "--recovery", "best-fit").returncode == 0
