"""``policy.keep_failover``'s repair in ``mode: manual``, ``opendrs run`` in a subprocess against
the fake Proxmox API on loopback: it is balancing-kind (as migration windows treat it), so it
waits for an operator unless ``automatic`` lists ``balance``, and an approved one starts although
it raises the imbalance."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from tests.controller.test_manual_daemon import migrations, proposals

from backends.fakepve_fixture import FakeCluster, GiB, proxmox_config, three_nodes
from daemon import Daemon, opendrs

PROPOSED = r"proposal ([0-9a-f]{8}) \((\w+)\) waits for approval: scratch \(103\) pve3 → pve1"
# Balancing stays out of the way: the threshold is far above the spread.
POLICY = (
    "policy: {interval: 1s, hold: 1, smoothing: 0, threshold: 0.9, hot: null, keep_failover: 1}"
)


def short_of_failover(directory: str) -> FakeCluster:
    """pve1 and pve2 each run an HA guest of 20 GiB, pve3 a 10 GiB guest and a small HA one:
    if pve1 fails, db (101) fits on no node (pve2 has 11 GiB free, pve3 17 GiB); with scratch
    (103) on pve1, every node's failure restarts every HA guest."""
    cluster = three_nodes(directory)
    for vmid, name, node, gib, ha in (
        (101, "db", "pve1", 20, True),
        (102, "db2", "pve2", 20, True),
        (103, "scratch", "pve3", 10, False),
        (104, "web", "pve3", 4, True),
    ):
        vm = cluster.pve.add_vm(
            vmid,
            name,
            node=node,
            status="running",
            config={"cores": 1, "memory": gib * 1024, "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G"},
        )
        vm.stats.update(cpu=0.1, mem=gib * GiB)
        if ha:
            vm.ha_state = "started"
    return cluster


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    """:func:`short_of_failover`."""
    with short_of_failover(str(tmp_path)) as cluster:
        yield cluster


def _config(tmp_path: Path, fake: FakeCluster, extra: str = "") -> Path:
    config = proxmox_config(tmp_path, fake, mode="manual", extra=extra)
    text = config.read_text()
    config.write_text(text.replace("policy: {interval: 1s, hold: 1, smoothing: 0}", POLICY))
    assert POLICY in config.read_text()
    return config


def test_the_failover_repair_waits_for_approval_then_starts(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = _config(tmp_path, fake)
    with Daemon(config) as daemon:
        daemon.wait_for(r"manual mode.*\(maintenance, return, repair act on their own")
        match = re.search(PROPOSED, daemon.wait_for(PROPOSED, timeout=60))
        assert match is not None
        pid, kind = match.groups()
        assert kind == "balance"
        daemon.wait_for(r"decision \(manual\)", after=daemon.mark)
        daemon.wait_for(r"decision \(manual\)", after=daemon.mark)
        assert fake.pve.migrations == [] and migrations(tmp_path) == []
        listed = proposals(config)
        assert [(p["id"], p["kind"]) for p in listed] == [(pid, "balance")]
        assert "failover headroom" in listed[0]["reason"]
        done = opendrs("approve", pid, "--config", str(config))
        assert done.returncode == 0, done.stderr
        # Checked again: it moves away from balance, but gives the failover headroom back.
        daemon.wait_for(rf"proposal {pid} approved by \S+: checked again, starting", timeout=60)
        daemon.wait_for(r"done .*scratch \(103\) pve3 → pve1", timeout=60)
        assert daemon.stop() == 0
    assert migrations(tmp_path) == [("103", "pve3", "pve1")]
    status = opendrs("status", "--config", str(config))
    assert "failover headroom: yes, for any 1 node failing (3 HA guests)" in status.stdout


def test_automatic_balance_lets_the_failover_repair_act_alone(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = _config(tmp_path, fake, extra="automatic: [balance]\n")
    with Daemon(config) as daemon:
        daemon.wait_for(r"done .*scratch \(103\) pve3 → pve1", timeout=60)
        assert daemon.count(r"waits for approval") == 0
        assert daemon.stop() == 0
    assert migrations(tmp_path) == [("103", "pve3", "pve1")]
