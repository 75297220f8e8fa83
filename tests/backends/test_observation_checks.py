"""An observation is held to the snapshot format's rules (issue 26, item 12): the daemon never
plans on a value a snapshot would refuse — negative memory, −1 vCPUs, infinite usage, a guest or
a node listed twice — and says, in one line, which node or guest and which API field."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon import run_once

pytest.importorskip("aiohttp", reason="the fake APIs are aiohttp servers")

GiB = 1024**3


# -- Proxmox -----------------------------------------------------------------------------------


@pytest.fixture
def pve(tmp_path: Path) -> Iterator[Any]:
    """Three nodes; four VMs on pve1, enough for a plan to move some."""
    pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
    pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")
    from backends.fakepve_fixture import three_nodes

    cluster = three_nodes(str(tmp_path))
    for i in range(4):
        vm = cluster.pve.add_vm(
            101 + i,
            f"vm{i}",
            node="pve1",
            status="running",
            config={"cores": 2, "memory": 6144, "scsi0": f"ceph:vm-{101 + i}-disk-0,size=8G"},
        )
        vm.stats.update(cpu=0.4, mem=5 * GiB)
    try:
        yield cluster
    finally:
        cluster.stop()


def _pve_config(tmp_path: Path, cluster: Any) -> Path:
    from backends.fakepve_fixture import shadow_config

    return shadow_config(tmp_path, cluster)


#: fault name → (how to make it, the line the daemon must write)
PVE_FAULTS: dict[str, tuple[Any, str]] = {
    "negative memory": (
        lambda fake: fake.vm(102).config.update(memory=-1024),
        "guest 102: memory, from the config's memory (maxmem of /cluster/resources): "
        "size must not be negative",
    ),
    "-1 vCPUs": (
        lambda fake: fake.vm(103).config.update(vcpus=-1),
        "guest 103: cpu, from the config's vcpus or cores × sockets (maxcpu of "
        "/cluster/resources): must be greater than 0, got -1",
    ),
    "infinite usage": (
        # A CPU fraction of 1e308 on 2 vCPUs: infinite cores.
        lambda fake: fake.guest_rrd.update({101: [{"cpu": 1e308, "maxcpu": 2, "mem": GiB}]}),
        "guest 101: usage.cpu, from cpu of the guest's rrddata (of /cluster/resources without "
        "one): expected a finite number, got inf",
    ),
    "guest listed twice": (
        lambda fake: fake.listed_twice.append(("qemu", 104)),
        "guest 104: id, from vmid of /cluster/resources: the guest is listed twice",
    ),
    "node listed twice": (
        lambda fake: fake.listed_twice.append(("node", "pve2")),
        "node pve2: listed twice by /cluster/resources",
    ),
}


@pytest.mark.parametrize("fault", sorted(PVE_FAULTS))
def test_the_daemon_refuses_a_proxmox_observation_the_snapshot_format_refuses(
    tmp_path: Path, pve: Any, fault: str
) -> None:
    make, said = PVE_FAULTS[fault]
    make(pve.pve)
    _refused(run_once(_pve_config(tmp_path, pve)), said)


def _refused(done: subprocess.CompletedProcess[str], said: str) -> None:
    """``run --once`` exited 1 with the refusal ``said`` at WARNING and as its error, and made
    no decision."""
    assert done.returncode == 1, done.stderr
    warning, error = [x for x in done.stderr.splitlines() if "the observation is refused" in x]
    assert " WARNING cannot observe the cluster: the observation is refused: " in warning
    assert said in warning and error.startswith("error: ") and said in error, done.stderr
    assert "decision" not in done.stderr and "would migrate" not in done.stderr
    assert "Traceback" not in done.stderr


def test_a_sound_proxmox_observation_is_planned_on(tmp_path: Path, pve: Any) -> None:
    done = run_once(_pve_config(tmp_path, pve))
    assert done.returncode == 0, done.stderr
    assert "would migrate" in done.stderr and "refused" not in done.stderr


# -- Incus ---------------------------------------------------------------------------------------


@pytest.fixture
def incus(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
    from backends.fakeincus import FakeIncus, Served, socket_path

    fake = FakeIncus("m1")
    for name in ("m1", "m2", "m3"):
        fake.add_member(name, threads=16, memory=64 * GiB, load1=0.0, used_memory=GiB)
    for i in range(4):
        fake.add_instance(
            f"vm{i}",
            "m1",
            config={"limits.cpu": "2", "limits.memory": "8GiB", "migration.stateful": "true"},
            devices={"root": {"type": "disk", "pool": "ceph", "path": "/"}},
            memory_usage=7 * GiB,
            cpu_rate=0.0,
        )
    fake.members["m1"].used_memory = GiB + 4 * 7 * GiB
    server = Served(fake, socket=socket_path(tmp_path))
    try:
        yield server
    finally:
        server.close()


def _incus_config(tmp_path: Path, server: Any) -> Path:
    path = tmp_path / "opendrs.yaml"
    path.write_text(
        "version: 1\nmode: shadow\n"
        f"backend: {{type: incus, socket: {server.socket}, timeout: 5s}}\n"
        "history: history.sqlite\npolicy: {interval: 1s, hold: 1, smoothing: 0}\n"
    )
    return path


INCUS_FAULTS: dict[str, tuple[Any, str]] = {
    "negative memory in use": (
        lambda fake: setattr(fake.instance("vm1"), "memory_usage", -5 * GiB),
        "guest vm1: usage.memory, from state.memory.usage of /1.0/instances: "
        "size must not be negative",
    ),
    "instance listed twice": (
        lambda fake: fake.listed_twice.add("vm2"),
        "guest vm2: id, from project and name of /1.0/instances: the guest is listed twice",
    ),
    "member listed twice": (
        lambda fake: fake.listed_twice.add("m2"),
        "node m2: name, from server_name of /1.0/cluster/members: the node is listed twice",
    ),
}


@pytest.mark.parametrize("fault", sorted(INCUS_FAULTS))
def test_the_daemon_refuses_an_incus_observation_the_snapshot_format_refuses(
    tmp_path: Path, incus: Any, fault: str
) -> None:
    make, said = INCUS_FAULTS[fault]
    make(incus.fake)
    _refused(run_once(_incus_config(tmp_path, incus)), said)


def test_a_sound_incus_observation_is_planned_on(tmp_path: Path, incus: Any) -> None:
    done = run_once(_incus_config(tmp_path, incus))
    assert done.returncode == 0, done.stderr
    assert "would migrate" in done.stderr and "refused" not in done.stderr


# -- one set of rules ----------------------------------------------------------------------------


def test_the_observation_check_is_the_snapshot_readers_own() -> None:
    """What :func:`refused` refuses is what loading the same cluster as a snapshot refuses."""
    from dataclasses import replace

    from opendrs.model.snapshot import SnapshotError, from_dict, load, refused, to_dict

    cluster = load("examples/small.yaml")
    bad = replace(cluster, guests=(replace(cluster.guests[0], memory_used=-1), *cluster.guests[1:]))
    found = refused(bad)
    assert found is not None
    with pytest.raises(SnapshotError) as caught:
        from_dict(to_dict(bad))
    assert caught.value.reason == found.reason
    assert caught.value.path == f"guests[0].{found.key}"
