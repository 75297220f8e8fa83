"""``opendrs run`` restarted after relieving a node that ran hot: the restarted daemon still keeps
every guest off that node (``policy.hot``: no plan refills a node seen running hot for a day)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster, GiB, proxmox_config, three_nodes
from daemon import Daemon


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    """pve1 running hot (eight busy VMs of one core on its eight), pve2 and pve3 with two quiet
    VMs each."""
    with three_nodes(str(tmp_path)) as cluster:
        cluster.pve.migrate_secs = 100
        for vmid, node, busy in [(100 + i, "pve1", 1.0) for i in range(8)] + [
            (110, "pve2", 0.3),
            (111, "pve2", 0.3),
            (120, "pve3", 0.3),
            (121, "pve3", 0.3),
        ]:
            vm = cluster.pve.add_vm(
                vmid,
                f"vm{vmid}",
                node=node,
                status="running",
                config={"cores": 1, "memory": 2048, "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G"},
            )
            vm.stats.update(cpu=busy, mem=2 * GiB)
        yield cluster


def _targets(fake: FakeCluster, since: int) -> list[tuple[int, str]]:
    """(vmid, target) of the migrations asked for from the ``since``-th on."""
    return [(int(v["vmid"]), v["target"]) for _, v in fake.pve.migrations[since:]]


def _run_once(config: Path) -> str:
    with Daemon(config, "--once") as daemon:
        status = daemon.wait(120)
        assert status == 0, daemon.log()
        return daemon.log()


def test_a_node_seen_running_hot_takes_no_guest_after_a_restart(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = proxmox_config(tmp_path, fake, mode="active")
    _run_once(config)
    relieved = _targets(fake, 0)
    assert relieved and all(vmid < 110 and target != "pve1" for vmid, target in relieved)
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        (kept,) = db.execute("SELECT value FROM state WHERE key = 'hot_seen'").fetchone()
    assert list(json.loads(kept)) == ["pve1"]
    # pve1 is now the coolest node by far and pve2 the busiest: a balancer would fill pve1 with
    # pve2's own VMs (those never left pve1, so no return guard keeps them off it).
    for vm in fake.pve.vms:
        vm.stats.update(cpu=0.02 if vm.node == "pve1" else 1.0 if vm.vmid in (110, 111) else 0.3)
    done = len(fake.pve.migrations)
    log = _run_once(config)
    moved = _targets(fake, done)
    assert moved, log
    assert all(target != "pve1" for _, target in moved), (moved, log)
