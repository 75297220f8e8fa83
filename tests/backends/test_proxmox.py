"""The Proxmox VE backend against a real fake: fakepve served over TLS on 127.0.0.1.

Verification stays on: the client trusts the fake's certificate through ``ca_file``. Every
server listens on loopback only, with a port the system picks.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster, GiB, MiB
from fakes import FakeClock, stepped_time
from opendrs.backends.base import Backend, BackendError, Handle, Progress
from opendrs.backends.proxmox import (
    ENV_TOKEN,
    ProxmoxBackend,
    ProxmoxConfig,
    parse_proxmox,
)
from opendrs.backends.proxmox import migration as proxmox_migration
from opendrs.backends.proxmox.observe import crs_auto_rebalance, crs_ha_scheduler
from opendrs.engine.constraints import movability
from opendrs.model.cluster import Cluster, Move, Settings
from opendrs.model.document import DocumentError, Reader

SECRET = "9f1c2e7a-5b3d-4c1e-8a6f-0d2b4e6f8a1c"
TOKEN_ID = "opendrs@pve!drs"


# --------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    cluster = FakeCluster(str(tmp_path))
    cluster.pve.apitokens[TOKEN_ID] = SECRET
    try:
        yield cluster
    finally:
        cluster.pve.flaky_network(0.0, 0.0)
        cluster.stop()


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return str(path)


def config_for(fake: FakeCluster, token_file: str, **changes: object) -> ProxmoxConfig:
    base = ProxmoxConfig(
        hosts=(fake.address,),
        user="opendrs@pve",
        token_name="drs",
        token_file=token_file,
        ca_file=fake.cafile,
        timeout=2.0,
        retries=2,
        backoff=0.01,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def backend_for(
    fake: FakeCluster, token_file: str, settings: Settings | None = None, **changes: object
) -> ProxmoxBackend:
    return ProxmoxBackend(config_for(fake, token_file, **changes), settings or Settings())


def populate(fake: FakeCluster) -> None:
    """Three nodes, shared Ceph and local storage, VMs and containers, tags and HA."""
    pve = fake.pve
    pve.add_node("pve1", cpu=8, memory=32 * GiB, base_memory=2 * GiB)
    pve.add_node("pve2", cpu=8, memory=32 * GiB, base_memory=3 * GiB)
    pve.add_node("pve3", cpu=16, memory=64 * GiB, base_memory=4 * GiB, arch="aarch64")
    pve.add_ceph_storage("ceph")
    vm = pve.add_vm(
        100,
        "web1",
        node="pve1",
        status="running",
        config={
            "cores": 2,
            "sockets": 1,
            "memory": 4096,
            "scsi0": "ceph:vm-100-disk-0,size=32G",
            "ide2": "none,media=cdrom",
            "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
            "tags": "plb_affinity_web;prod",
        },
    )
    vm.stats.update(cpu=0.5, mem=2 * GiB)
    pve.guest_rrd[100] = [
        {"time": 1, "cpu": 0.2, "maxcpu": 2, "mem": 1 * GiB},
        {"time": 2, "cpu": 0.4, "maxcpu": 2, "mem": 2 * GiB},
        {"time": 3, "cpu": 0.6, "maxcpu": 2, "mem": 3 * GiB},
        {"time": 4},  # a point with no data (the RRD has gaps)
    ]
    vm = pve.add_vm(
        101,
        "web2",
        node="pve2",
        status="running",
        config={
            "cores": 2,
            "memory": "current=2048",
            "scsi0": "ceph:vm-101-disk-0,size=16G",
            "tags": "plb_affinity_web",
        },
    )
    vm.stats.update(cpu=0.25, mem=1 * GiB)
    pve.guest_rrd[101] = [{}]  # no RRD yet: the current values stand in
    pve.add_vm(
        102,
        "db1",
        node="pve1",
        status="running",
        config={
            "cores": 4,
            "sockets": 2,
            "memory": 16384,
            "scsi0": "local-lvm:vm-102-disk-0,size=100G",
            "scsi1": "ceph:vm-102-disk-1,size=1T",
            "tags": "plb_anti_affinity_db",
        },
    )
    pve.add_vm(
        103,
        "db2",
        node="pve2",
        status="running",
        config={
            "cores": 4,
            "vcpus": 3,
            "memory": 8192,
            "virtio0": "ceph:vm-103-disk-0,size=64G",
            "tags": "plb_anti_affinity_db;plb_pin_pve2;plb_pin_PVE3;plb_pin_nowhere",
        },
    )
    pve.add_vm(
        104,
        "gpu",
        node="pve3",
        status="running",
        config={
            "cores": 8,
            "memory": 32768,
            "hostpci0": "0000:01:00.0,pcie=1",
            "usb0": "spice",
            "usb1": "host=1234:5678",
            "scsi0": "ceph:vm-104-disk-0,size=64G",
        },
    )
    ha = pve.add_vm(
        105,
        "ha1",
        node="pve3",
        status="running",
        config={"cores": 2, "memory": 2048, "scsi0": "ceph:vm-105-disk-0,size=10G"},
    )
    ha.ha_state = "started"
    pve.add_vm(
        106,
        "old",
        node="pve2",
        status="stopped",
        config={"cores": 1, "memory": 1024, "tags": "plb_ignore_legacy"},
    )
    pve.add_vm(900, "tmpl", node="pve1", status="stopped", template=True, config={"memory": 512})
    ct = pve.add_ct(
        200,
        node="pve2",
        status="running",
        config={
            "hostname": "dns",
            "cores": 2,
            "memory": 1024,
            "rootfs": "local-lvm:vm-200-disk-0,size=8G",
            "tags": "infra",
        },
    )
    ct.stats.update(cpu=0.5, mem=512 * MiB)
    pve.add_ct(
        201,
        node="pve1",
        status="stopped",
        config={
            "hostname": "files",
            "cores": 1,
            "memory": 512,
            "rootfs": "ceph:vm-201-disk-0,size=4G",
            "mp0": "/srv/share,mp=/share",
        },
    )
    pve.ha_rules = [
        {
            "rule": "prefer-pve3",
            "type": "node-affinity",
            "resources": "vm:101",
            "nodes": "pve3:2,pve1:1",
            "strict": 0,
            "digest": "0" * 40,
        },
        {
            "rule": "apart",
            "type": "resource-affinity",
            "resources": "vm:104,vm:105",
            "affinity": "negative",
        },
        {
            "rule": "off",
            "type": "resource-affinity",
            "resources": "vm:101,vm:102",
            "affinity": "positive",
            "disable": 1,
        },
        {
            "rule": "too-few",
            "type": "resource-affinity",
            "resources": "vm:105",
            "affinity": "positive",
        },
    ]


MOVE = Move("100", "pve1", "pve2")


def wait_done(backend: Backend, handle: Handle, seconds: float = 10.0) -> Progress:
    deadline = time.monotonic() + seconds
    while True:
        progress = backend.poll(handle)
        if progress.finished or time.monotonic() > deadline:
            return progress
        time.sleep(0.02)


def requests_to(fake: FakeCluster, method: str, suffix: str) -> int:
    return sum(1 for m, p, _ in fake.pve.requests if m == method and p.endswith(suffix))


def closed_port() -> int:
    """A loopback port nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------------------------
# Observing


def test_backend_protocol(fake: FakeCluster, token_file: str) -> None:
    backend = backend_for(fake, token_file)
    assert isinstance(backend, Backend)
    assert backend.name == "proxmox"
    assert backend.read_only is False
    assert SECRET not in repr(backend)
    backend.close()


def test_observe_nodes(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    cluster = backend_for(fake, token_file).observe()
    assert cluster.name == "fakecluster"
    assert [n.name for n in cluster.nodes] == ["pve1", "pve2", "pve3"]
    pve1, _, pve3 = cluster.nodes
    assert (pve1.cpu, pve1.memory, pve1.arch, pve1.online) == (8.0, 32 * GiB, "x86_64", True)
    assert (pve3.cpu, pve3.memory, pve3.arch) == (16.0, 64 * GiB, "aarch64")
    # Local (not shared) pools that hold guest disks: Ceph is shared, "local" holds only ISO
    # images, templates and backups.
    assert dict(pve1.storage) == {"local-lvm": 100 * GiB}
    # The host's own memory: the node's use less what its running guests use (RRD averages).
    assert pve1.base_memory == pytest.approx(2 * GiB, abs=1)
    assert not any(n.maintenance for n in cluster.nodes)


def test_observe_ksm_sharing(fake: FakeCluster, token_file: str) -> None:
    # /nodes/{node}/status answers ksm: {shared: BYTES}, as Proxmox VE does.
    populate(fake)
    fake.pve.capacity["pve1"]["ksm_shared"] = 5 * GiB + 4096
    fake.pve.capacity["pve2"]["ksm_shared"] = None  # no ksm in the answer: none shared
    backend = backend_for(fake, token_file)
    cluster = backend.observe()
    assert [n.ksm_shared for n in cluster.nodes] == [5 * GiB + 4096, 0, 0]
    # Nonsense is not a size: it counts as none shared, and the node is still observed.
    for odd in (-5, "lots", {"x": 1}, float("inf"), True):
        fake.pve.capacity["pve3"]["ksm_shared"] = odd
        assert backend.observe().node("pve3").ksm_shared == 0, odd
    fake.pve.capacity["pve3"]["ksm_shared"] = "123"  # a number as text, as Perl may write it
    assert backend.observe().node("pve3").ksm_shared == 123
    # An offline node is not asked: nothing is known to be shared there.
    fake.pve.set_node_offline("pve1")
    assert backend.observe().node("pve1").ksm_shared == 0


def test_running_guests_have_been_up_a_day_unless_the_test_says_otherwise(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.add_vm(110, "fresh", node="pve1", status="running", config={"memory": 512}, uptime=120)
    fake.pve.add_ct(210, node="pve2", status="running", config={"memory": 256}, uptime=600)
    cluster = backend_for(fake, token_file).observe()
    up = {g.id: g.uptime for g in cluster.guests}
    # Seconds pass between adding and observing: at least the uptime, and not an hour more.
    for gid in ("100", "101", "102", "200"):
        assert 86400 <= up[gid] < 86400 + 3600, (gid, up[gid])
    assert 120 <= up["110"] < 120 + 3600
    assert 600 <= up["210"] < 600 + 3600
    assert up["106"] == 0 and up["201"] == 0  # stopped


def test_observe_guests(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    cluster = backend_for(fake, token_file).observe()
    guests = {g.id: g for g in cluster.guests}
    assert sorted(guests, key=int) == [
        "100",
        "101",
        "102",
        "103",
        "104",
        "105",
        "106",
        "200",
        "201",
    ]
    web1 = guests["100"]
    assert (web1.kind, web1.name, web1.node, web1.state) == ("vm", "web1", "pve1", "running")
    assert (web1.cpu, web1.memory) == (2.0, 4 * GiB)
    # RRD averages over the points that have data: cpu (0.2+0.4+0.6)/3 × 2 vCPUs, memory 2 GiB.
    assert web1.cpu_used == pytest.approx(0.8)
    assert web1.memory_used == 2 * GiB
    assert web1.tags == ("plb_affinity_web", "prod")
    assert [(d.pool, d.size, d.local) for d in web1.disks] == [("ceph", 32 * GiB, False)]
    assert web1.devices == () and web1.lock is None and not web1.ha
    # No RRD data: the current values of /cluster/resources (a quarter of 2 vCPUs, 1 GiB).
    web2 = guests["101"]
    assert web2.memory == 2 * GiB
    assert (web2.cpu_used, web2.memory_used) == (pytest.approx(0.5), GiB)
    db1 = guests["102"]
    assert db1.cpu == 8.0
    assert [(d.pool, d.size, d.local) for d in db1.disks] == [
        ("local-lvm", 100 * GiB, True),
        ("ceph", 1024 * GiB, False),
    ]
    assert db1.local_disk_bytes == 100 * GiB
    assert guests["103"].cpu == 3.0  # vcpus wins over cores × sockets
    assert guests["104"].devices == ("hostpci0", "usb1")  # spice USB is not a local device
    ha1 = guests["105"]
    assert ha1.ha and ha1.ha_state == "started"
    old = guests["106"]
    assert (old.state, old.cpu_used, old.memory_used) == ("stopped", 0.0, 0)
    dns = guests["200"]
    assert (dns.kind, dns.name, dns.cpu, dns.memory) == ("ct", "dns", 2.0, GiB)
    assert (dns.cpu_used, dns.memory_used) == (pytest.approx(1.0), 512 * MiB)
    assert [(d.pool, d.local) for d in dns.disks] == [("local-lvm", True)]
    assert guests["201"].devices == ("mp0 (bind mount)",)
    # Templates are not guests to balance.
    assert "900" not in guests


def test_observe_rules_from_ha_and_tags(
    fake: FakeCluster, token_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    populate(fake)
    with caplog.at_level(logging.WARNING, logger="opendrs.backends.proxmox"):
        rules = backend_for(fake, token_file).observe().rules
    assert "HA rule 'too-few' is not used, because rule is ineffective" in caplog.text
    assert "tag plb_pin_nowhere names no node of the cluster" in caplog.text
    node_rules = {r.name: r for r in rules.node_affinity}
    assert set(node_rules) == {"prefer-pve3", "plb_pin 103"}
    prefer = node_rules["prefer-pve3"]
    assert (prefer.guests, dict(prefer.nodes), prefer.strict) == (
        ("101",),
        {"pve3": 2, "pve1": 1},
        False,
    )
    pin = node_rules["plb_pin 103"]
    # plb_pin_PVE3 matches pve3; plb_pin_nowhere names no node and is skipped.
    assert (pin.guests, dict(pin.nodes), pin.strict) == (("103",), {"pve2": 0, "pve3": 0}, True)
    guest_rules = {r.name: r for r in rules.guest_affinity}
    # "off" is disabled, "too-few" has one resource: Proxmox drops it, and so does opendrs.
    assert set(guest_rules) == {"apart", "plb_affinity_web", "plb_anti_affinity_db"}
    assert (guest_rules["apart"].guests, guest_rules["apart"].positive) == (("104", "105"), False)
    assert guest_rules["apart"].hard
    assert (guest_rules["plb_affinity_web"].guests, guest_rules["plb_affinity_web"].positive) == (
        ("100", "101"),
        True,
    )
    assert guest_rules["plb_anti_affinity_db"].guests == ("102", "103")
    assert not guest_rules["plb_anti_affinity_db"].positive
    assert rules.ignored == frozenset({"106"})


def test_rules_can_be_turned_off(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend = backend_for(fake, token_file, tags=False, ha_rules=False)
    rules = backend.observe().rules
    assert rules.node_affinity == () and rules.guest_affinity == () and rules.ignored == frozenset()
    assert requests_to(fake, "GET", "/cluster/ha/rules") == 0


def test_legacy_ha_groups_before_pve9(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    fake.pve.rules_api = False
    fake.pve.ha_group[105] = "fast"
    fake.pve.ha_groups = [
        {"group": "fast", "type": "group", "nodes": "pve3:2,pve2", "restricted": 1, "nofailback": 0}
    ]
    rules = backend_for(fake, token_file).observe().rules
    (group,) = [r for r in rules.node_affinity if r.name == "ha-group-fast"]
    assert (group.guests, dict(group.nodes), group.strict) == (
        ("105",),
        {"pve3": 2, "pve2": 0},
        True,
    )


def test_usage_window_day(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend_for(fake, token_file, usage_window="day").observe()
    windows = {(timeframe, cf) for _, timeframe, cf in fake.pve.rrd_requests}
    assert windows == {("day", "AVERAGE")}
    # Stopped guests have no RRD to read.
    assert not any(what.endswith("/106") for what, _, _ in fake.pve.rrd_requests)


def test_offline_node(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend = backend_for(fake, token_file)
    backend.observe()
    fake.pve.set_node_offline("pve3")
    fake.pve.requests.clear()
    cluster = backend.observe()
    pve3 = cluster.node("pve3")
    assert not pve3.online and not pve3.usable
    # Its capacity is remembered from the last time it was seen.
    assert (pve3.cpu, pve3.memory) == (16.0, 64 * GiB)
    assert cluster.guest("104").state == "stopped"
    # Nothing was asked of the offline node (its requests would only time out or fail).
    assert not any("/nodes/pve3/" in path for _, path, _ in fake.pve.requests)


def test_reads_that_fail_midway(
    fake: FakeCluster, token_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A node gone between two reads, a guest moved meanwhile, an RRD that cannot be read."""
    populate(fake)
    pve = fake.pve
    pve.fail("GET", "/nodes/pve3/status", 595, "No route to host")
    pve.fail(
        "GET",
        "/nodes/pve1/qemu/102/config",
        500,
        "Configuration file 'nodes/pve1/qemu-server/102.conf' does not exist",
    )
    pve.fail(
        "GET",
        "/nodes/pve1/qemu/100/rrddata",
        500,
        "RRD error: opening '/var/lib/rrdcached/db/pve2-vm/100': No such file or directory",
    )
    with caplog.at_level(logging.WARNING, logger="opendrs.backends.proxmox"):
        cluster = backend_for(fake, token_file).observe()
    assert not cluster.node("pve3").online
    assert "node pve3 is unreachable: No route to host" in caplog.text
    # Not moved on what may be stale knowledge.
    assert cluster.guest("102").lock == "config-unreadable"
    # The current values stand in for the RRD averages (half of 2 vCPUs, 2 GiB).
    web1 = cluster.guest("100")
    assert (web1.cpu_used, web1.memory_used) == (pytest.approx(1.0), 2 * GiB)
    assert requests_to(fake, "GET", "/qemu/100/rrddata") == 1  # an RRD error is not passing


def test_ha_maintenance(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    fake.pve.ha_maintenance.add("pve2")
    backend = backend_for(fake, token_file)
    cluster = backend.observe()
    assert [n.name for n in cluster.nodes if n.maintenance] == ["pve2"]
    with pytest.raises(BackendError, match="not supported") as raised:
        backend.set_maintenance("pve2", False)
    assert not raised.value.transient


def test_guest_already_migrating(tmp_path: Path, token_file: str) -> None:
    fake = FakeCluster(str(tmp_path), time_scale=0.003)
    try:
        fake.pve.apitokens[TOKEN_ID] = SECRET
        populate(fake)
        upid = fake.run(fake.pve.migrate(100, "pve2", secs=200))  # 0.6 s of real time
        cluster = backend_for(fake, token_file).observe()
        web1 = cluster.guest("100")
        assert (web1.node, web1.lock, web1.migrating_to) == ("pve1", "migrate", "pve2")
        deadline = time.monotonic() + 5
        while fake.pve.tasks[upid]["status"] == "running" and time.monotonic() < deadline:
            time.sleep(0.02)
        web1 = backend_for(fake, token_file).observe().guest("100")
        assert (web1.node, web1.lock, web1.migrating_to) == ("pve2", None, None)
    finally:
        fake.stop()


def test_locked_guest_is_not_moved(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    fake.pve.snapshot_lock(100, "backup")
    backend = backend_for(fake, token_file)
    assert backend.observe().guest("100").lock == "backup"
    with pytest.raises(BackendError, match=r"guest 100 is locked \(backup\)") as raised:
        backend.start_migration(Move("100", "pve1", "pve2"))
    assert raised.value.transient
    assert requests_to(fake, "POST", "/qemu/100/migrate") == 0


# --------------------------------------------------------------------------------------------
# Migrating


def test_live_migration_end_to_end(tmp_path: Path, token_file: str) -> None:
    fake = FakeCluster(str(tmp_path), time_scale=0.003)
    try:
        fake.pve.apitokens[TOKEN_ID] = SECRET
        fake.pve.migrate_secs = 100  # 0.3 s of real time
        populate(fake)
        backend = backend_for(fake, token_file)
        before = backend.observe()
        assert before.guest("100").node == "pve1"
        handle = backend.start_migration(Move("100", "pve1", "pve2"))
        assert handle.id.startswith("UPID:pve1:") and ":qmigrate:100:" in handle.id
        assert handle.move == Move("100", "pve1", "pve2")
        assert backend.poll(handle).state == "running"
        assert wait_done(backend, handle) == Progress("done")
        path, params = fake.pve.migrations[-1]
        assert path == "/nodes/pve1/qemu/100/migrate"
        assert (params["target"], str(params["online"])) == ("pve2", "1")
        assert "with-local-disks" not in params
        after = backend.observe()
        assert after.guest("100").node == "pve2"
        assert after.guest("100").migrating_to is None
    finally:
        fake.stop()


def test_local_disks_need_the_setting(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    refusing = backend_for(fake, token_file)
    refusing.observe()
    with pytest.raises(BackendError, match="local storage") as raised:
        refusing.start_migration(Move("102", "pve1", "pve2"))
    assert not raised.value.transient
    allowing = backend_for(fake, token_file, Settings(allow_local_disks=True))
    handle = allowing.start_migration(Move("102", "pve1", "pve2"))
    assert wait_done(allowing, handle).state == "done"
    _, params = fake.pve.migrations[-1]
    assert str(params["with-local-disks"]) == "1" and str(params["online"]) == "1"
    assert allowing.observe().guest("102").node == "pve2"


def test_devices_cannot_move(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend = backend_for(fake, token_file)
    with pytest.raises(BackendError, match=r"local devices \(hostpci0, usb1\)") as raised:
        backend.start_migration(Move("104", "pve3", "pve1"))
    assert not raised.value.transient


def test_a_replicated_vm_live_migrates_only_to_a_replication_target(
    fake: FakeCluster, token_file: str
) -> None:
    """Proxmox refuses the live migration elsewhere (qemu-server's API); the observation limits
    the VM to its node and the targets of its jobs, with the reason."""
    populate(fake)
    fake.pve.replication_jobs = [
        {"id": "100-0", "type": "local", "guest": 100, "target": "pve3", "source": "pve1"},
        {"id": "100-1", "type": "local", "guest": 100, "target": "pve2", "remove_job": "full"},
    ]
    backend = backend_for(fake, token_file)
    ((limit),) = backend.observe().guest("100").limits
    assert limit.nodes == {"pve1", "pve3"}
    assert limit.reason.startswith("not a replication target of the VM (jobs 100-0, 100-1")
    assert backend.observe().guest("101").limits == ()
    fake.pve.replication_jobs.pop()
    with pytest.raises(BackendError, match="not a replication target"):
        backend.start_migration(Move("100", "pve1", "pve2"))


def test_mapped_pci_devices(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    fake.pve.pci_mappings = {
        "gpu": {"map": ["node=pve1,path=0000:01:00.0", "node=pve2,path=0000:01:00.0"]},
        "live": {"map": ["node=pve1,path=0000:02:00.0"], "live-migration-capable": 1},
    }
    vm = fake.pve.guest(100)
    vm.config.update(hostpci0="mapping=gpu,pcie=1")
    backend = backend_for(fake, token_file)
    guest = backend.observe().guest("100")
    # Running, and the mapping is not live-capable: a local device.
    assert guest.devices == ("hostpci0 (mapping gpu, not live-migration capable)",)
    with pytest.raises(BackendError, match=r"local devices \(hostpci0 \(mapping gpu"):
        backend.start_migration(Move("100", "pve1", "pve2"))
    fake.pve.pci_mappings["gpu"]["live-migration-capable"] = 1
    guest = backend.observe().guest("100")
    assert guest.devices == ()
    ((limit),) = guest.limits
    assert limit.nodes == {"pve1", "pve2"}
    assert limit.reason == "the PCI mapping gpu of hostpci0 has no device on that node"
    # The precondition refuses a node without the mapping, before anything moves.
    with pytest.raises(BackendError, match="hostpci0 has no mapping there"):
        backend.start_migration(Move("100", "pve1", "pve3"))
    handle = backend.start_migration(Move("100", "pve1", "pve2"))
    assert wait_done(backend, handle).state == "done"
    # Other local resources as qemu-server counts them.
    vm.config.update({"virtiofs0": "dirid=share", "amd-sev": "type=std", "ivshmem": "size=32"})
    assert set(backend.observe().guest("100").devices) == {"virtiofs0", "amd-sev", "ivshmem"}


def test_a_container_move_asks_the_containers_precondition(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.guest(200).ha_state = "started"
    fake.pve.ha_rules = [
        {
            "rule": "pin",
            "type": "node-affinity",
            "resources": "ct:200",
            "nodes": "pve2,pve3",
            "strict": 1,
        },
    ]
    settings = Settings(allow_restart_migration=True, allow_local_disks=True)
    backend = backend_for(fake, token_file, settings)
    backend.observe()
    with pytest.raises(BackendError, match=r"HA resources ct:200 \(node-affinity\) block it"):
        backend.start_migration(Move("200", "pve2", "pve1"))
    assert requests_to(fake, "GET", "/lxc/200/migrate") == 1
    assert requests_to(fake, "POST", "/cluster/ha/resources/ct:200/relocate") == 0


def test_the_ha_managers_motions_and_master(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    fake.pve.queue_ha_motion(105, "pve1")
    backend = backend_for(fake, token_file, leader_only=True, node="pve2")
    cluster = backend.observe()
    assert cluster.guest("105").migrating_to == "pve1"
    assert backend.platform_motions() == {"105": "vm:105 (migrate from pve3 to pve1, queued)"}
    assert backend.standby() == "node pve2 is not the HA manager's master (pve1): idle"
    fake.pve.ha_master = "pve2"
    backend.observe()
    assert backend.standby() is None
    fake.pve.ha_master_age = 31.0
    backend.observe()
    assert backend.standby() == (
        "node pve2 is not the first online node (pve1), which acts while the HA manager has no "
        "current master: idle"
    )
    assert backend_for(fake, token_file).standby() is None


def test_containers_move_by_restart_only_when_allowed(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    refusing = backend_for(fake, token_file, Settings(allow_local_disks=True))
    with pytest.raises(BackendError, match="restart migration") as raised:
        refusing.start_migration(Move("200", "pve2", "pve1"))
    assert not raised.value.transient
    allowing = backend_for(
        fake, token_file, Settings(allow_restart_migration=True, allow_local_disks=True)
    )
    handle = allowing.start_migration(Move("200", "pve2", "pve1"))
    assert ":vzmigrate:200:" in handle.id
    assert wait_done(allowing, handle).state == "done"
    migrate_posts = [
        body for m, p, body in fake.pve.requests if m == "POST" and p.endswith("/lxc/200/migrate")
    ]
    assert len(migrate_posts) == 1 and b"restart=1" in migrate_posts[0]
    assert b"online" not in migrate_posts[0]
    assert allowing.observe().guest("200").node == "pve1"


def test_ha_managed_guest_moves_through_the_ha_stack(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend = backend_for(fake, token_file)
    backend.observe()
    handle = backend.start_migration(Move("105", "pve3", "pve1"))
    assert handle.id.startswith("ha:vm:105:pve3:pve1:")
    assert requests_to(fake, "POST", "/cluster/ha/resources/vm:105/migrate") == 1
    assert requests_to(fake, "POST", "/qemu/105/migrate") == 0
    fake.settle()
    assert wait_done(backend, handle) == Progress("done")
    # The task the HA manager started was found and followed.
    assert any(":qmigrate:105:root@pam:" in p for _, p, _ in fake.pve.requests)
    cluster = backend.observe()
    assert cluster.guest("105").node == "pve1"
    assert cluster.guest("105").ha_state == "started"


def test_an_ha_resource_set_to_ignored_is_left_alone(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    fake.pve.ha_request[105] = "ignored"
    cluster = backend_for(fake, token_file).observe()
    assert "105" in cluster.rules.ignored and not cluster.guest("105").ha
    assert str(movability(cluster.guest("105"), cluster)) == "ignored by a rule"


def test_ha_manager_refusal(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    fake.pve.ha_blocking = [{"sid": "vm:100", "cause": "resource-affinity"}]
    backend = backend_for(fake, token_file)
    backend.observe()
    with pytest.raises(BackendError, match=r"blocked by vm:100 \(resource-affinity\)") as raised:
        backend.start_migration(Move("105", "pve3", "pve1"))
    assert not raised.value.transient


def test_guest_put_under_ha_since_the_last_observation(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend = backend_for(fake, token_file)
    backend.observe()
    fake.pve.vm(100).ha_state = "started"
    # The fresh status before the request says the guest is HA-managed now.
    handle = backend.start_migration(Move("100", "pve1", "pve2"))
    assert handle.id.startswith("ha:vm:100:pve1:pve2:")
    fake.settle()
    assert wait_done(backend, handle) == Progress("done")
    assert backend.observe().guest("100").node == "pve2"


def test_hamigrate_task_is_followed_to_the_real_migration(
    fake: FakeCluster, token_file: str
) -> None:
    """A plain request for an HA-managed VM: Proxmox answers with a short 'hamigrate' task and
    the HA manager migrates later; polling that handle follows the real 'qmigrate' task."""
    import requests

    populate(fake)
    backend = backend_for(fake, token_file)
    backend.observe()
    answer = requests.post(
        f"https://{fake.address}/api2/json/nodes/pve3/qemu/105/migrate",
        data={"target": "pve2", "online": 1},
        headers={"Authorization": f"PVEAPIToken={TOKEN_ID}={SECRET}"},
        verify=fake.cafile,
        timeout=5,
    )
    upid = answer.json()["data"]
    assert ":hamigrate:105:" in upid
    handle = Handle(upid, Move("105", "pve3", "pve2"), time.time())
    fake.settle()
    assert wait_done(backend, handle) == Progress("done")
    assert any(":qmigrate:105:root@pam:" in p for _, p, _ in fake.pve.requests)
    assert backend.observe().guest("105").node == "pve2"


def test_migration_task_fails(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    fake.pve.fail("POST", "/nodes/pve1/qemu/100/migrate", error="migration_aborted")
    backend = backend_for(fake, token_file)
    handle = backend.start_migration(Move("100", "pve1", "pve2"))
    progress = wait_done(backend, handle)
    assert progress.state == "failed"
    assert progress.reason is not None and "migration aborted" in progress.reason
    assert "\n" not in progress.reason
    assert backend.observe().guest("100").node == "pve1"


def test_migration_to_an_offline_node_fails_with_the_log_line(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.set_node_offline("pve3")
    backend = backend_for(fake, token_file)
    handle = backend.start_migration(Move("100", "pve1", "pve3"))
    progress = wait_done(backend, handle)
    assert progress.state == "failed"
    assert progress.reason == (
        "qmigrate task on pve1 failed: migration aborted (duration 00:00:03): Can't connect to "
        "destination address using public key"
    )


def test_refusals_of_the_api_are_one_line(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend = backend_for(fake, token_file)
    with pytest.raises(BackendError) as raised:
        backend.start_migration(Move("100", "pve1", "nowhere"))
    assert str(raised.value) == (
        "POST /nodes/pve1/qemu/100/migrate on "
        f"{fake.address}: HTTP 500: no such cluster node 'nowhere'"
    )
    assert not raised.value.transient
    with pytest.raises(BackendError, match="not on pve2") as raised:
        backend.start_migration(Move("100", "pve2", "pve3"))
    assert not raised.value.transient
    with pytest.raises(BackendError, match="does not exist"):
        backend.start_migration(Move("999", "pve1", "pve2"))


# --------------------------------------------------------------------------------------------
# Stopping a migration that is given up on


def test_cancel_stops_the_migration_task(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    fake.pve.time_scale = 1.0  # the migration takes 20 s: it is still running when stopped
    backend = backend_for(fake, token_file)
    backend.observe()
    handle = backend.start_migration(Move("100", "pve1", "pve2"))
    assert backend.poll(handle) == Progress("running")
    assert backend.cancel(handle) is True
    assert fake.pve.stopped_tasks == [handle.id]
    assert requests_to(fake, "DELETE", f"/nodes/pve1/tasks/{handle.id}") == 1
    progress = wait_done(backend, handle)
    assert progress == Progress("failed", "qmigrate task on pve1 failed: received interrupt")
    cluster = backend.observe()
    assert cluster.guest("100").node == "pve1" and cluster.guest("100").lock is None
    # A task that has ended: asking again does no harm.
    assert backend.cancel(handle) is True


def test_a_migration_whose_answer_was_lost_is_found_by_its_task(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.time_scale = 1.0  # the migration takes 20 s: still running when looked for
    since = time.time()
    started = backend_for(fake, token_file).start_migration(Move("100", "pve1", "pve2"))
    # Another backend (the daemon after a restart, or whose answer was lost) finds that task.
    backend = backend_for(fake, token_file)
    # A task names no target: the guest's migration from its source since then is the one.
    assert backend.find_migration(Move("100", "pve1", "pve3"), since) is not None
    backend = backend_for(fake, token_file)
    found = backend.find_migration(Move("100", "pve1", "pve2"), since)
    assert found is not None and found.id == started.id
    assert abs(found.started - since) < 5
    assert backend.poll(found) == Progress("running")
    assert backend.cancel(found) is True and fake.pve.stopped_tasks == [started.id]
    # Followed now: a second request of the same guest would not be taken for it.
    assert backend.find_migration(Move("100", "pve1", "pve2"), since) is None
    assert backend.find_migration(Move("101", "pve1", "pve2"), since) is None
    assert backend.find_migration(Move("100", "pve1", "pve2"), since + 600) is None


def test_cancel_of_an_unknown_task(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend = backend_for(fake, token_file)
    gone = Handle("UPID:pve1:00001234:00008888:65000000:qmigrate:100:opendrs@pve!drs:", MOVE, 0)
    assert backend.cancel(gone) is False
    with pytest.raises(BackendError, match="not a Proxmox task id") as raised:
        backend.cancel(Handle("nonsense", MOVE, 0))
    assert not raised.value.transient


def wait_for_ha_task(fake: FakeCluster, backend: ProxmoxBackend, handle: Handle) -> None:
    """Poll until the HA manager's migration task of guest 105 exists."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        backend.poll(handle)
        if any(t["type"] == "qmigrate" and t["id"] == "105" for t in fake.pve.tasklog):
            return
        time.sleep(0.05)
    raise AssertionError("the HA manager started no task")


def test_cancel_of_a_request_to_the_ha_stack_before_its_task(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.time_scale = 1.0
    fake.pve.ha_delay = 600  # the HA manager does not act during the test
    backend = backend_for(fake, token_file)
    backend.observe()
    handle = backend.start_migration(Move("105", "pve3", "pve1"))
    assert handle.id.startswith("ha:vm:105:")
    # No task yet: the HA stack cannot take a request back.
    assert backend.cancel(handle) is False
    assert requests_to(fake, "DELETE", "/tasks/") == 0 and fake.pve.stopped_tasks == []


def test_the_ha_managers_grace_is_measured_on_the_monotonic_clock(
    fake: FakeCluster, token_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request to the HA stack that the HA manager has not acted on yet: a wall clock stepped
    two hours forward does not fail it; 300 s on the monotonic clock do."""
    populate(fake)
    fake.pve.time_scale = 1.0
    fake.pve.ha_delay = 600  # the HA manager does not act during the test
    clock = FakeClock()
    backend = ProxmoxBackend(config_for(fake, token_file), Settings(), monotonic=clock.monotonic)
    backend.observe()
    handle = backend.start_migration(Move("105", "pve3", "pve1"))
    monkeypatch.setattr(proxmox_migration, "time", stepped_time(7200))
    assert backend.poll(handle) == Progress("running")
    clock.sleep(301)
    progress = backend.poll(handle)
    assert progress.state == "failed"
    assert "did not start moving vm:105 to pve1 within 300s" in str(progress.reason)


def test_a_request_to_the_ha_stack_taken_over_after_a_restart_gets_its_grace_from_then(
    fake: FakeCluster, token_file: str
) -> None:
    """A request made an hour ago by another process (its handle's wall-clock time says so):
    the HA manager's 300 s count from this process's first poll of it."""
    populate(fake)
    fake.pve.time_scale = 1.0
    fake.pve.ha_delay = 600
    clock = FakeClock()
    backend = ProxmoxBackend(config_for(fake, token_file), Settings(), monotonic=clock.monotonic)
    backend.observe()
    asked = int(time.time()) - 3600
    handle = Handle(f"ha:vm:105:pve3:pve1:{asked}", Move("105", "pve3", "pve1"), asked)
    assert backend.poll(handle) == Progress("running")
    clock.sleep(299)
    assert backend.poll(handle) == Progress("running")
    clock.sleep(2)
    assert backend.poll(handle).state == "failed"


def test_cancel_of_a_request_to_the_ha_stack_stops_its_task(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.time_scale = 1.0
    fake.pve.ha_delay = 0.1
    backend = backend_for(fake, token_file)
    backend.observe()
    handle = backend.start_migration(Move("105", "pve3", "pve1"))
    wait_for_ha_task(fake, backend, handle)
    # The HA manager's task (root@pam's: stopping it takes Sys.Modify, which the fake's
    # token has until the first grant).
    assert backend.cancel(handle) is True
    assert len(fake.pve.stopped_tasks) == 1
    assert ":qmigrate:105:root@pam:" in fake.pve.stopped_tasks[0]
    progress = wait_done(backend, handle)
    assert progress.state == "failed" and "received interrupt" in str(progress.reason)
    assert backend.observe().guest("105").node == "pve3"


def test_cancel_of_the_ha_managers_task_needs_sys_modify(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    pve = fake.pve
    pve.time_scale = 1.0
    pve.ha_delay = 0.1
    for path, privs in (
        ("/", ("Sys.Audit", "Sys.Console")),
        ("/vms", ("VM.Audit", "VM.Migrate")),
        ("/storage", ("Datastore.Audit",)),
    ):
        pve.grant("opendrs@pve", path, *privs)
    backend = backend_for(fake, token_file)
    backend.observe()
    handle = backend.start_migration(Move("105", "pve3", "pve1"))
    wait_for_ha_task(fake, backend, handle)
    with pytest.raises(BackendError) as raised:
        backend.cancel(handle)
    assert not raised.value.transient
    assert str(raised.value).endswith(
        f"permission denied for {TOKEN_ID}: Permission check failed (/nodes/pve3, Sys.Modify)"
    )
    assert pve.stopped_tasks == []


# --------------------------------------------------------------------------------------------
# Failures of the API


def test_server_errors_are_retried_a_bounded_number_of_times(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    backend = backend_for(fake, token_file, retries=2)
    fake.pve.fail("GET", "/cluster/resources", 500, "boom", times=2)
    assert len(backend.observe().guests) == 9  # the third try answered
    fake.pve.requests.clear()
    fake.pve.fail("GET", "/cluster/resources", 500, "boom")
    with pytest.raises(BackendError) as raised:
        backend.observe()
    assert raised.value.transient
    assert str(raised.value) == (
        f"GET /cluster/resources on {fake.address}: HTTP 500: boom (after 3 tries)"
    )
    assert requests_to(fake, "GET", "/cluster/resources") == 3


def test_timeouts_are_transient(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend = backend_for(fake, token_file, timeout=1.0, retries=1)
    fake.pve.flaky_network(hang_rate=1.0, hang_secs=3)
    started = time.monotonic()
    with pytest.raises(BackendError) as raised:
        backend.observe()
    assert time.monotonic() - started < 10  # two tries of 1 s (the fake would hang 3 s each)
    assert raised.value.transient
    assert "no answer within 1s" in str(raised.value) and "(after 2 tries)" in str(raised.value)
    # The connections given up on are gone: the next calls work at once.
    fake.pve.flaky_network(0.0, 0.0)
    assert len(backend.observe().nodes) == 3


def test_a_migration_request_is_not_sent_twice(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    backend = backend_for(fake, token_file, retries=3)
    fake.pve.fail("POST", "/nodes/pve1/qemu/100/migrate", 503, "busy")
    with pytest.raises(BackendError, match="HTTP 503: busy") as raised:
        backend.start_migration(Move("100", "pve1", "pve2"))
    assert raised.value.transient
    assert requests_to(fake, "POST", "/qemu/100/migrate") == 1


def test_connection_refused_is_transient(fake: FakeCluster, token_file: str) -> None:
    port = closed_port()
    backend = backend_for(fake, token_file, hosts=(f"127.0.0.1:{port}",), retries=1)
    with pytest.raises(BackendError) as raised:
        backend.observe()
    assert raised.value.transient
    assert str(raised.value) == (
        f"GET /cluster/resources on 127.0.0.1:{port}: cannot connect: connection refused "
        "(after 2 tries)"
    )


def test_second_api_host_when_the_first_is_down(
    fake: FakeCluster, token_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    populate(fake)
    down = f"127.0.0.1:{closed_port()}"
    backend = backend_for(fake, token_file, hosts=(down, fake.address))
    with caplog.at_level(logging.INFO, logger="opendrs.backends.proxmox"):
        cluster = backend.observe()
    assert len(cluster.nodes) == 3
    assert any("trying the next API host" in r.getMessage() for r in caplog.records)
    assert any(f"using the Proxmox API on {fake.address}" in r.getMessage() for r in caplog.records)
    # Once a host answers, it is asked first.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="opendrs.backends.proxmox"):
        backend.observe()
    assert not caplog.records


def test_bad_token_is_one_clear_line_without_the_secret(
    fake: FakeCluster,
    token_file: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wrong = "0badc0de-dead-beef-0000-feedfacecafe"
    fake.pve.apitokens[TOKEN_ID] = wrong  # the server expects another secret than ours
    caplog.set_level(logging.DEBUG)
    backend = backend_for(fake, token_file)
    with pytest.raises(BackendError) as raised:
        backend.observe()
    error = raised.value
    assert not error.transient
    assert str(error) == (
        f"authentication failed at {fake.address} for {TOKEN_ID}: check the API token "
        "(401 authentication failure)"
    )
    with pytest.raises(BackendError) as raised_again:
        backend.start_migration(Move("100", "pve1", "pve2"))
    assert not raised_again.value.transient
    captured = capsys.readouterr()
    for text in (
        str(error),
        repr(error),
        str(raised_again.value),
        repr(backend),
        captured.out,
        captured.err,
        caplog.text,
        *(r.getMessage() for r in caplog.records),
    ):
        assert SECRET not in text
        assert wrong not in text
    # Nor in the exceptions chained to it (a traceback would print them).
    chained: BaseException | None = error
    while chained is not None:
        assert SECRET not in str(chained) and SECRET not in repr(chained.args)
        chained = chained.__cause__ or chained.__context__


def test_bad_password_is_one_clear_line(
    fake: FakeCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    password = tmp_path / "password"
    password.write_text("not-the-password")
    password.chmod(0o600)
    caplog.set_level(logging.DEBUG)
    config = ProxmoxConfig(
        hosts=(fake.address,),
        user="root@pam",
        password_file=str(password),
        ca_file=fake.cafile,
        timeout=2.0,
        backoff=0.01,
    )
    with pytest.raises(BackendError) as raised:
        ProxmoxBackend(config, Settings()).observe()
    assert str(raised.value) == (
        f"authentication failed at {fake.address} for root@pam: check the password"
    )
    assert not raised.value.transient
    assert "not-the-password" not in caplog.text


def test_login_that_does_not_get_through_is_transient(fake: FakeCluster, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("secret")
    password.chmod(0o600)
    fake.pve.fail("POST", "/access/ticket", 502, "Bad Gateway")
    config = ProxmoxConfig(
        hosts=(fake.address,),
        user="root@pam",
        password_file=str(password),
        ca_file=fake.cafile,
        retries=1,
        backoff=0.01,
    )
    with pytest.raises(BackendError) as raised:
        ProxmoxBackend(config, Settings()).observe()
    assert raised.value.transient
    assert str(raised.value) == (
        f"GET /cluster/resources on {fake.address}: login failed: HTTP 502 (after 2 tries)"
    )


def test_password_login_works(fake: FakeCluster, tmp_path: Path) -> None:
    populate(fake)
    password = tmp_path / "password"
    password.write_text("secret\n")
    password.chmod(0o600)
    config = ProxmoxConfig(
        hosts=(fake.address,), user="root@pam", password_file=str(password), ca_file=fake.cafile
    )
    backend = ProxmoxBackend(config, Settings())
    handle = backend.start_migration(Move("101", "pve2", "pve1"))
    assert wait_done(backend, handle).state == "done"


def test_tls_is_verified_by_default(fake: FakeCluster, token_file: str) -> None:
    """Without ca_file the fake's self-signed certificate is refused."""
    backend = backend_for(fake, token_file, ca_file=None)
    with pytest.raises(BackendError, match="TLS verification failed") as raised:
        backend.observe()
    assert not raised.value.transient
    assert requests_to(fake, "GET", "/cluster/resources") == 0


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_verify_tls_false_warns(
    fake: FakeCluster, token_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    populate(fake)
    with caplog.at_level(logging.WARNING, logger="opendrs.backends.proxmox"):
        backend = backend_for(fake, token_file, ca_file=None, verify_tls=False)
    assert "TLS verification of the Proxmox API is off" in caplog.text
    assert len(backend.observe().nodes) == 3


def test_secret_from_the_environment(fake: FakeCluster) -> None:
    populate(fake)
    config = ProxmoxConfig(
        hosts=(fake.address,), user="opendrs@pve", token_name="drs", ca_file=fake.cafile
    )
    backend = ProxmoxBackend(config, Settings(), environ={ENV_TOKEN: SECRET})
    assert len(backend.observe().guests) == 9
    with pytest.raises(BackendError, match=f"set backend.token_file or .*{ENV_TOKEN}") as raised:
        ProxmoxBackend(config, Settings(), environ={})
    assert not raised.value.transient


def test_least_privilege_token(fake: FakeCluster, token_file: str) -> None:
    """The privileges docs/proxmox.md asks for are enough, and a missing one is one clear line."""
    populate(fake)
    pve = fake.pve
    pve.grant("opendrs@pve", "/", "Sys.Audit")
    pve.grant("opendrs@pve", "/vms", "VM.Audit")
    pve.grant("opendrs@pve", "/storage", "Datastore.Audit")
    backend = backend_for(fake, token_file)
    assert len(backend.observe().guests) == 9
    with pytest.raises(BackendError) as raised:
        backend.start_migration(Move("100", "pve1", "pve2"))
    assert str(raised.value) == (
        f"GET /nodes/pve1/qemu/100/migrate on {fake.address}: permission denied for {TOKEN_ID}: "
        "Permission check failed (/vms/100, VM.Migrate)"
    )
    assert not raised.value.transient
    pve.grant("opendrs@pve", "/vms", "VM.Migrate")
    handle = backend.start_migration(Move("100", "pve1", "pve2"))
    assert wait_done(backend, handle).state == "done"
    with pytest.raises(BackendError, match=r"\(/, Sys.Console\)"):
        backend.start_migration(Move("105", "pve3", "pve1"))
    pve.grant("opendrs@pve", "/", "Sys.Console")
    handle = backend.start_migration(Move("105", "pve3", "pve1"))
    fake.settle()
    assert wait_done(backend, handle).state == "done"
    assert backend.observe().guest("105").node == "pve1"


def test_storages_the_token_cannot_see_count_as_local(
    fake: FakeCluster, token_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    populate(fake)
    fake.pve.grant("opendrs@pve", "/", "Sys.Audit")
    fake.pve.grant("opendrs@pve", "/vms", "VM.Audit")
    with caplog.at_level(logging.WARNING, logger="opendrs.backends.proxmox"):
        cluster = backend_for(fake, token_file).observe()
    assert cluster.guest("100").disks[0].local  # on ceph, but nothing says ceph is shared
    assert "storages ceph, local-lvm are not listed for opendrs@pve!drs" in caplog.text
    assert "Datastore.Audit on /storage missing?" in caplog.text


# --------------------------------------------------------------------------------------------
# Configuration


def parse(value: object, filename: str = "opendrs.yaml") -> ProxmoxConfig:
    return parse_proxmox(Reader(filename), value, ("backend",))


def test_parse_proxmox(tmp_path: Path, token_file: str) -> None:
    config = parse(
        {
            "type": "proxmox",
            "hosts": ["pve1.example.com", "10.0.0.2:8443", "[fd00::3]"],
            "user": "opendrs@pve",
            "token_name": "drs",
            "token_file": token_file,
            "timeout": "30s",
            "retries": 5,
            "usage_window": "day",
            "tags": False,
            "ha_rules": False,
        }
    )
    assert config.hosts == ("pve1.example.com:8006", "10.0.0.2:8443", "[fd00::3]:8006")
    assert (config.user, config.token_name, config.token_file) == ("opendrs@pve", "drs", token_file)
    assert (config.timeout, config.retries, config.usage_window) == (30.0, 5, "day")
    assert (config.tags, config.ha_rules, config.verify_tls, config.ca_file) == (
        False,
        False,
        True,
        None,
    )
    leader = parse(
        {"type": "proxmox", "hosts": "localhost", "user": "a@pve", "leader_only": True, "node": 2}
    )
    assert (leader.leader_only, leader.node) == (True, "2")
    defaults = parse({"type": "proxmox", "hosts": "pve1", "user": "opendrs@pve!drs"})
    assert defaults == ProxmoxConfig(hosts=("pve1:8006",), user="opendrs@pve", token_name="drs")
    assert (defaults.timeout, defaults.retries, defaults.usage_window) == (10.0, 3, "hour")


def test_parse_relative_paths_follow_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(SECRET)
    (tmp_path / "token").chmod(0o600)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    config_file = tmp_path / "opendrs.yaml"
    config_file.write_text("")
    config = parse(
        {
            "type": "proxmox",
            "hosts": ["pve1"],
            "user": "opendrs@pve",
            "token_name": "drs",
            "token_file": "token",
            "ca_file": "ca.pem",
        },
        str(config_file),
    )
    assert config.token_file == str(tmp_path / "token")
    assert config.ca_file == str(tmp_path / "ca.pem")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"type": "proxmx"}, "backend.type: unknown value 'proxmx' (did you mean 'proxmox'?)"),
        ({"hosts": []}, "backend.hosts: must name at least one API host"),
        (
            {"hosts": ["pve1:99999"]},
            "backend.hosts[0]: expected host or host:port, got 'pve1:99999'",
        ),
        ({"hosts": ["pve1", "pve1:8006"]}, "backend.hosts[1]: pve1:8006 is listed twice"),
        (
            {"user": "opendrs"},
            "backend.user: expected user@realm (e.g. opendrs@pve), got 'opendrs'",
        ),
        ({"token_name": None}, "backend.token_name: expected a string, got null (quote it)"),
        ({"verify_tls": "no"}, "backend.verify_tls: expected true or false, got 'no'"),
        (
            {"verify_tls": False, "ca_file": "x"},
            "backend.ca_file: has no use with verify_tls: false",
        ),
        ({"timeout": 0}, "backend.timeout: must be between 1s and 1h, got 0"),
        ({"timeout": "100000000d"}, "backend.timeout: must be "),  # said here or by the Reader
        ({"timeout": "1000d"}, "backend.timeout: must be between 1s and 1h, got '1000d'"),
        ({"timeout": "61m"}, "backend.timeout: must be between 1s and 1h, got '61m'"),
        ({"retries": 11}, "backend.retries: must be between 0 and 10, got 11"),
        ({"usage_window": "week"}, "backend.usage_window: expected one of hour, day, got 'week'"),
        ({"tls": True}, "backend.tls: unknown key (expected one of type, hosts, user,"),
        ({"password_file": "pw"}, "with token_name, the secret is the token's: token_file"),
        ({"leader_only": "yes"}, "backend.leader_only: expected true or false, got 'yes'"),
        ({"node": "pve 1"}, "backend.node: not a Proxmox node name: 'pve 1'"),
    ],
)
def test_parse_errors(changes: dict[str, object], message: str) -> None:
    value: dict[str, object] = {
        "type": "proxmox",
        "hosts": ["pve1"],
        "user": "opendrs@pve",
        "token_name": "drs",
    }
    value.update(changes)
    with pytest.raises(DocumentError) as raised:
        parse(value)
    text = str(raised.value)
    assert text.startswith("opendrs.yaml: ") and message in text
    assert "\n" not in text


def test_secret_file_problems_name_the_file_not_the_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = {"type": "proxmox", "hosts": ["pve1"], "user": "opendrs@pve", "token_name": "drs"}
    missing = tmp_path / "missing"
    with pytest.raises(DocumentError) as raised:
        parse({**base, "token_file": str(missing)})
    assert str(raised.value) == (
        f"opendrs.yaml: backend.token_file: cannot read the secret file '{missing}': "
        "No such file or directory"
    )
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    empty.chmod(0o600)
    with pytest.raises(DocumentError, match="is empty"):
        parse({**base, "token_file": str(empty)})
    two_lines = tmp_path / "two"
    two_lines.write_text(f"{SECRET}\n{SECRET}\n")
    two_lines.chmod(0o600)
    with pytest.raises(DocumentError) as raised:
        parse({**base, "token_file": str(two_lines)})
    assert "must hold only the secret" in str(raised.value) and SECRET not in str(raised.value)
    if os.geteuid() != 0:  # root reads any file
        unreadable = tmp_path / "unreadable"
        unreadable.write_text(SECRET)
        unreadable.chmod(0)
        with pytest.raises(DocumentError, match="Permission denied"):
            parse({**base, "token_file": str(unreadable)})
    with pytest.raises(DocumentError, match="needs token_name"):
        parse({**{k: v for k, v in base.items() if k != "token_name"}, "token_file": str(empty)})
    world = tmp_path / "world"
    world.write_text(SECRET)
    world.chmod(0o644)
    assert world.stat().st_mode & stat.S_IROTH
    with caplog.at_level(logging.WARNING, logger="opendrs.backends.proxmox"):
        config = parse({**base, "token_file": str(world)})
    assert config.token_file == str(world)
    assert "readable by every user" in caplog.text and SECRET not in caplog.text


def test_secret_files_others_could_change_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {"type": "proxmox", "hosts": ["pve1"], "user": "opendrs@pve", "token_name": "drs"}
    for mode, who in ((0o620, "its group"), (0o602, "every user"), (0o666, "every user")):
        path = tmp_path / f"token-{mode:o}"
        path.write_text(SECRET)
        path.chmod(mode)
        with pytest.raises(DocumentError) as raised:
            parse({**base, "token_file": str(path)})
        assert str(raised.value) == (
            f"opendrs.yaml: backend.token_file: the secret file '{path}' is writable by {who} "
            f"(mode 0{mode:o}): chmod 600 (or 640) it"
        )
    # The same rules when the backend reads the file again (it may have changed since).
    path = tmp_path / "token"
    path.write_text(SECRET)
    path.chmod(0o600)
    config = parse({**base, "token_file": str(path)})
    path.chmod(0o660)
    with pytest.raises(BackendError, match="is writable by its group") as error:
        ProxmoxBackend(config, Settings())
    assert not error.value.transient and SECRET not in str(error.value)
    path.chmod(0o640)  # read by the group (opendrs), written by the owner only: fine
    assert parse({**base, "token_file": str(path)}).token_file == str(path)

    # A file of another user (not root): refused, as someone else could change the secret.
    other = tmp_path / "other"
    other.write_text(SECRET)
    other.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(other, 54321, -1)
    else:
        monkeypatch.setattr(os, "geteuid", lambda: 54321)  # the file is ours: not the euid's
    owner = other.stat().st_uid
    with pytest.raises(DocumentError) as raised:
        parse({**base, "token_file": str(other)})
    text = str(raised.value)
    assert "belongs to" in text and "not to the user running opendrs" in text and "or root" in text
    assert f"uid {owner}" in text and SECRET not in text and "\n" not in text
    monkeypatch.undo()
    # Root's files are fine for any user (e.g. /run/credentials, or root:opendrs 0640).
    if os.geteuid() == 0:
        os.chown(other, 0, -1)
        assert parse({**base, "token_file": str(other)}).token_file == str(other)


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("where", ["examples/proxmox.yaml", "docs/proxmox.md"])
def test_shipped_backend_sections_parse(where: str, tmp_path: Path, token_file: str) -> None:
    """The example file and the documentation's example keep to the keys parse_proxmox reads."""
    text = (ROOT / where).read_text()
    if where.endswith(".md"):
        blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "backend:" in b]
        assert blocks
        text = blocks[0]
    backend = yaml.safe_load(text)["backend"]
    # The secret and the CA live on the opendrs host, not here: point them at test files.
    assert backend["token_file"] == "/etc/opendrs/proxmox.token"
    backend["token_file"] = token_file
    backend["ca_file"] = token_file
    config = parse(backend)
    assert config.user == "opendrs@pve" and config.token_name == "drs"
    assert config.verify_tls and len(config.hosts) >= 2


def test_secret_file_gone_when_connecting(tmp_path: Path) -> None:
    token = tmp_path / "token"
    config = ProxmoxConfig(
        hosts=("127.0.0.1:8006",), user="opendrs@pve", token_name="drs", token_file=str(token)
    )
    with pytest.raises(BackendError, match="cannot read the secret file") as raised:
        ProxmoxBackend(config, Settings())
    assert not raised.value.transient


def test_observe_returns_a_cluster_the_engine_can_use(fake: FakeCluster, token_file: str) -> None:
    populate(fake)
    cluster = backend_for(fake, token_file, settings=None).observe()
    assert isinstance(cluster, Cluster)
    assert cluster.settings == Settings()
    assert {g.node for g in cluster.guests} <= {n.name for n in cluster.nodes}


def test_failback_auto_rebalance_and_the_crs_option_are_read(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.ha_failback[105] = False
    fake.pve.ha_auto_rebalance[105] = False
    backend = backend_for(fake, token_file)
    cluster = backend.observe()
    assert not cluster.ha_auto_rebalance and cluster.ha_scheduler == "basic"
    assert not cluster.guest("105").failback
    assert str(movability(cluster.guest("105"), cluster)) == (
        "ignored: its HA resource has auto-rebalance 0"
    )
    fake.pve.crs = {"ha": "static", "ha-auto-rebalance": 1}
    static = backend.observe()
    assert static.ha_auto_rebalance and static.ha_scheduler == "static"
    kept = backend_for(fake, token_file, respect_auto_rebalance=False).observe()
    assert "105" not in kept.rules.ignored


@pytest.mark.parametrize(
    ("crs", "on"),
    [
        ({"ha": "static", "ha-auto-rebalance": 1}, True),
        ({"ha": "static", "ha-auto-rebalance": 0}, False),
        ("ha=dynamic,ha-auto-rebalance=1", True),
        ("ha=basic", False),
        (None, False),
    ],
)
def test_crs_auto_rebalance(crs: object, on: bool) -> None:
    assert crs_auto_rebalance(crs) is on


@pytest.mark.parametrize(
    ("crs", "mode"),
    [
        ({"ha": "static"}, "static"),
        ("ha=static,ha-auto-rebalance=1", "static"),
        ({"ha": "basic"}, "basic"),
        ({"ha-auto-rebalance": 1}, "basic"),
        (None, None),
    ],
)
def test_crs_ha_scheduler(crs: object, mode: str | None) -> None:
    assert crs_ha_scheduler(crs) == mode
