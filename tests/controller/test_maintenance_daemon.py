"""A node in maintenance is never left without a word (issue 26, items 3, 4 and 14): ``opendrs
run`` as a subprocess against the fake Proxmox API (and the fake Incus API), ``opendrs status``
beside it.

pve2 is in HA maintenance and keeps guests that may not move — a VM with a local disk, one with a
PCI device, a running container (restart migration not allowed), a VM locked by a backup, an HA
VM in state error, a VM ProxLB's tag ignores — and one VM up for two minutes, under both
``min_uptime`` (the cluster's, 10 minutes, and the policy's, 10 minutes by default). The daemon
moves the young VM, warns of each other one at every decision, and reports them in its status,
its dashboard and its metrics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster, GiB, proxmox_config, three_nodes
from daemon import Daemon, eventually, fetch, opendrs, run_once, served
from repairs import left_on

#: Why each guest stays on pve2, as the daemon says it.
STAYS = {
    "201": "local disks (8.0 GiB)",
    "202": "local device hostpci0",
    "203": "container: restart migration not allowed",
    "204": "locked (backup)",
    "205": "HA state error",
    "206": "ignored by a rule",
}


#: The fake Proxmox's names: the VMs' vmNNN, the container's hostname.
SAID = left_on("pve2", STAYS, {g: ("ct" if g == "203" else "vm") + g for g in STAYS})


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    cluster = three_nodes(str(tmp_path))
    pve = cluster.pve
    pve.ha_maintenance.add("pve2")

    def vm(vmid: int, node: str = "pve2", uptime: float = 86400, **config: str) -> None:
        disk = {"scsi0": f"ceph:vm-{vmid}-disk-0,size=8G"}
        guest = pve.add_vm(
            vmid,
            f"vm{vmid}",
            node=node,
            status="running",
            uptime=uptime,
            config={"cores": 1, "memory": 2048, **disk, **config},
        )
        guest.stats.update(cpu=0.2, mem=2 * GiB)

    vm(201, scsi0="local-lvm:vm-201-disk-0,size=8G")
    vm(202, hostpci0="0000:01:00.0,pcie=1")
    ct = pve.add_ct(
        203,
        node="pve2",
        status="running",
        config={"hostname": "ct203", "cores": 1, "memory": 1024, "rootfs": "ceph:vm-203,size=4G"},
    )
    ct.stats.update(cpu=0.1, mem=512 * 1024**2)
    vm(204, lock="backup")
    vm(205)
    pve.vm(205).ha_state = "error"
    vm(206, tags="plb_ignore_legacy")
    vm(207, uptime=120)  # up for two minutes
    vm(101, node="pve1")
    vm(301, node="pve3")
    try:
        yield cluster
    finally:
        cluster.stop()


def write_config(tmp_path: Path, fake: FakeCluster, *, mode: str, extra: str = "") -> Path:
    return proxmox_config(
        tmp_path,
        fake,
        mode=mode,
        extra="history: history.sqlite\nsettings: {min_uptime: 10m}\n" + extra,
    )


def warned(log: str) -> list[str]:
    return re.findall(r"WARNING repair stuck: (.*)", log)


def test_run_once_moves_the_young_vm_and_warns_of_each_guest_left(
    tmp_path: Path, fake: FakeCluster
) -> None:
    done = run_once(write_config(tmp_path, fake, mode="active"))
    assert done.returncode == 0, done.stderr
    assert warned(done.stderr) == [SAID[g] for g in STAYS]
    (reason,) = re.findall(r"decision \(active\): (.*)", done.stderr)
    assert reason.startswith("repair: vm207 (207) is on pve2, in maintenance; 1 migration")
    assert fake.pve.vm(207).node != "pve2"
    assert {g: fake.pve.guest(int(g)).node for g in STAYS} == dict.fromkeys(STAYS, "pve2")


def test_status_dashboard_and_metrics_name_the_guests_left(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(tmp_path, fake, mode="shadow", extra="http: {listen: '127.0.0.1:0'}\n")
    with Daemon(config) as daemon:
        address = served(daemon)
        daemon.wait_for(r"decision \(shadow\)")
        eventually(lambda: json.loads(fetch(address, "/api/state")[1])["stuck"] != [])
        state = json.loads(fetch(address, "/api/state")[1])
        assert [(s["guest"], s["node"], s["maintenance"], s["reason"]) for s in state["stuck"]] == [
            (g, "pve2", True, SAID[g]) for g in STAYS
        ]
        # The young VM's move (shadow: what it would do) says why it moves.
        assert [(m["guest"], m["reason"]) for m in state["would"]["moves"]] == [
            ("207", "repair: maintenance")
        ]
        page = fetch(address, "/")[1]
        assert "6 guests left breaking a hard constraint (6 on a node in maintenance)" in page
        metrics = fetch(address, "/metrics")[1]
        assert "opendrs_stuck_guests 6.0" in metrics
        assert "opendrs_maintenance_stuck_guests 6.0" in metrics
        status = opendrs("status", "--config", str(config), "--format", "json", timeout=120)
        assert status.returncode == 0, status.stderr
        rows = json.loads(status.stdout)["cluster"]["stuck"]
        assert [(r["guest"], r["reason"]) for r in rows] == [(g, SAID[g]) for g in STAYS]
        text = opendrs("status", "--config", str(config), timeout=120, columns=200)
        assert "Stuck: 6 left breaking a hard constraint" in text.stdout
        assert all(SAID[g] in text.stdout for g in STAYS)
        assert daemon.stop() == 0
    assert set(warned(daemon.log())) == {SAID[g] for g in STAYS}
