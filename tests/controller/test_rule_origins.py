"""A rule is never weakened by one of a later origin (issue 26, item 5): platform rules (Proxmox's
HA rules, Incus's placement rules) come before configured ones (a snapshot's), which come before
tags (ProxLB's ``plb_*``, opendrs's ``user.opendrs.*`` keys). A contradicting later rule is
ignored, with a warning in the daemon's log, ``opendrs status`` and ``opendrs validate``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon import opendrs, run_once

pytest.importorskip("aiohttp", reason="the fake APIs are aiohttp servers")

GiB = 1024**3
IGNORED = (
    "Ignore tag rule 'plb_pin 100', because guest '100' is in more than one node-affinity rule, "
    "and platform rule 'pve3-only' holds"
)


@pytest.fixture
def pve(tmp_path: Path) -> Iterator[Any]:
    """VM 100 on pve1, HA-managed, with a strict HA rule to pve3 and the tag plb_pin_pve2; four
    more VMs spread out."""
    pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
    pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")
    from backends.fakepve_fixture import three_nodes

    cluster = three_nodes(str(tmp_path))
    fake = cluster.pve
    for vmid, node in ((100, "pve1"), (101, "pve1"), (102, "pve2"), (103, "pve3")):
        config = {"cores": 2, "memory": 4096, "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G"}
        if vmid == 100:
            config["tags"] = "plb_pin_pve2"
        vm = fake.add_vm(vmid, f"vm{vmid}", node=node, status="running", config=config)
        vm.stats.update(cpu=0.2, mem=3 * GiB)
    fake.vm(100).ha_state = "started"
    fake.ha_rules = [
        {
            "rule": "pve3-only",
            "type": "node-affinity",
            "resources": "vm:100",
            "nodes": "pve3",
            "strict": 1,
            "digest": "0" * 40,
        }
    ]
    try:
        yield cluster
    finally:
        cluster.stop()


def _config(tmp_path: Path, cluster: Any) -> Path:
    from backends.fakepve_fixture import shadow_config

    return shadow_config(tmp_path, cluster)


def test_the_daemon_keeps_the_ha_rule_and_warns_about_the_tag(tmp_path: Path, pve: Any) -> None:
    done = run_once(_config(tmp_path, pve))
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if " WARNING rules: " in line]
    assert len(warnings) == 1 and warnings[0].endswith(IGNORED), done.stderr
    assert "would migrate vm100 (100) pve1 → pve3" in done.stderr, done.stderr
    assert "→ pve2" not in next(
        (line for line in done.stderr.splitlines() if "would migrate vm100 (100) " in line), ""
    )


def test_status_warns_about_the_ignored_tag(tmp_path: Path, pve: Any) -> None:
    config = _config(tmp_path, pve)
    done = opendrs("status", "--config", str(config), timeout=120)
    assert f"warning: rules: {IGNORED}" in done.stderr.splitlines(), done.stderr
    assert f"rules: {IGNORED}" in " ".join(done.stdout.split())
    data = json.loads(opendrs("status", "--config", str(config), "--format", "json").stdout)
    assert data["cluster"]["rules"] == [{"problem": IGNORED, "ignored": True}]


def test_a_snapshot_keeps_the_origins_and_validate_warns(tmp_path: Path, pve: Any) -> None:
    live = tmp_path / "live.yaml"
    done = opendrs("snapshot", "--config", str(_config(tmp_path, pve)), "-o", str(live))
    assert done.returncode == 0, done.stderr
    checked = opendrs("validate", str(live))
    assert checked.returncode == 0, checked.stderr
    assert checked.stderr.splitlines() == [f"{live}: rules: warning: {IGNORED}"]
    assert checked.stdout.strip().endswith("2 rules; 1 ignored)")
    plan = json.loads(opendrs("plan", str(live), "--format", "json").stdout)
    assert {(m["guest"], m["target"]) for m in plan["moves"]} >= {("100", "pve3")}


# -- every contradiction, by origin ------------------------------------------------------------

HEAD = """\
version: 1
nodes:
  n1: {cpu: 16, memory: 64GiB}
  n2: {cpu: 16, memory: 64GiB}
  n3: {cpu: 16, memory: 64GiB}
guests:
  - {id: 1, node: n1, memory: 4GiB}
  - {id: 2, node: n2, memory: 4GiB}
  - {id: 3, node: n3, memory: 4GiB}
rules:
"""

#: rules → (exit status of validate, its lines on standard error)
CASES: dict[str, tuple[str, int, list[str]]] = {
    "a pin tag against a platform pin": (
        "  - {type: pin, name: plat, guests: [1], nodes: [n3], origin: platform}\n"
        "  - {type: pin, name: tagged, guests: [1], nodes: [n2], origin: tag}\n",
        0,
        [
            "rules: warning: Ignore tag rule 'tagged', because guest '1' is in more than one "
            "node-affinity rule, and platform rule 'plat' holds"
        ],
    ),
    "a configured pin against a tag pin": (
        "  - {type: pin, name: mine, guests: [1], nodes: [n3]}\n"
        "  - {type: pin, name: tagged, guests: [1], nodes: [n2], origin: tag}\n",
        0,
        [
            "rules: warning: Ignore tag rule 'tagged', because guest '1' is in more than one "
            "node-affinity rule, and configured rule 'mine' holds"
        ],
    ),
    "a platform affinity against a tag anti-affinity": (
        "  - {type: affinity, name: together, guests: [1, 2], origin: platform}\n"
        "  - {type: anti-affinity, name: apart, guests: [1, 2], origin: tag}\n",
        0,
        [
            "rules: warning: Ignore tag rule 'apart', because guests '1', '2' are kept both "
            "together and apart, and platform rule 'together' holds"
        ],
    ),
    "tag pins that confine a platform anti-affinity": (
        "  - {type: anti-affinity, name: apart, guests: [1, 2], origin: platform}\n"
        "  - {type: pin, name: pin-1, guests: [1], nodes: [n1], origin: tag}\n"
        "  - {type: pin, name: pin-2, guests: [2], nodes: [n1], origin: tag}\n",
        0,
        [
            "rules: warning: Ignore tag rules 'pin-1', 'pin-2', because 2 guests are confined "
            "to 1 nodes by strict node affinity and kept apart, and platform rule 'apart' holds"
        ],
    ),
    "a tag affinity whose members platform pins keep apart": (
        "  - {type: affinity, name: together, guests: [1, 2], origin: tag}\n"
        "  - {type: pin, name: pin-1, guests: [1], nodes: [n1], origin: platform}\n"
        "  - {type: pin, name: pin-2, guests: [2], nodes: [n2], origin: platform}\n",
        0,
        [
            "rules: warning: Ignore tag rule 'together', because strict node affinity leaves "
            "their guests no common node, and platform rules 'pin-1', 'pin-2' hold"
        ],
    ),
    "two rules of one origin: both dropped, as before": (
        "  - {type: pin, name: a, guests: [1], nodes: [n3], origin: tag}\n"
        "  - {type: pin, name: b, guests: [1], nodes: [n2], origin: tag}\n",
        2,
        ["rules: Drop rules 'a', 'b', because guest '1' is in more than one node-affinity rule"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_ignores_the_later_origin(tmp_path: Path, case: str) -> None:
    rules, status, lines = CASES[case]
    path = tmp_path / "rules.yaml"
    path.write_text(HEAD + rules, encoding="utf-8")
    done = opendrs("validate", str(path))
    assert done.returncode == status, done.stderr
    assert done.stderr.splitlines() == [f"{path}: {line}" for line in lines]


# -- Incus ---------------------------------------------------------------------------------------


def test_the_daemon_keeps_an_incus_cluster_group_over_a_pin_key(tmp_path: Path) -> None:
    """An instance created for the cluster group ``fast`` (m1, m2) with ``user.opendrs.pin: m3``:
    the group holds, the key is ignored with a warning."""
    pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
    from backends.fakeincus import FakeIncus, Served, socket_path

    fake = FakeIncus("m1")
    for name, groups in (("m1", ["fast"]), ("m2", ["fast"]), ("m3", ["default"])):
        fake.add_member(name, threads=16, memory=64 * GiB, used_memory=GiB, groups=groups)
    fake.add_instance(
        "db",
        "m1",
        config={
            "limits.cpu": "2",
            "limits.memory": "4GiB",
            "migration.stateful": "true",
            "volatile.cluster.group": "fast",
            "user.opendrs.pin": "m3",
        },
        devices={"root": {"type": "disk", "pool": "ceph", "path": "/"}},
    )
    server = Served(fake, socket=socket_path(tmp_path))
    try:
        config = tmp_path / "opendrs.yaml"
        config.write_text(
            "version: 1\nmode: shadow\n"
            f"backend: {{type: incus, socket: {server.socket}, timeout: 5s}}\n"
            "history: history.sqlite\npolicy: {interval: 1s, hold: 1, smoothing: 0}\n"
        )
        done = run_once(config)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if " WARNING rules: " in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].endswith(
        "Ignore tag rule 'user.opendrs.pin db', because guest 'db' is in more than one "
        "node-affinity rule, and platform rule 'cluster group fast' holds"
    )
    assert "would migrate db" not in done.stderr
