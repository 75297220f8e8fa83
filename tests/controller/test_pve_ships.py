"""Proxmox VE as it ships today, through ``opendrs run`` (``--once`` and the daemon) against the
fake Proxmox API: negative node affinity, HA failback, and Proxmox's own balancer of HA guests
(``ha-auto-rebalance``) with the per-resource ``auto-rebalance`` flag.

The fake's HA manager runs its rounds (:meth:`FakeCluster.crm_rounds`): a guest that is not where
its rules want it is moved there, back to its highest-priority nodes when ``failback`` is on — so
a plan that fights the HA manager shows as moves undone and asked for again.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster, GiB, proxmox_config, three_nodes
from daemon import Daemon, eventually, fetch, served
from daemon import opendrs as run_opendrs

DEADLINE = 120.0


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    """Three nodes of 8 cores and 32 GiB, shared storage, no guests yet."""
    cluster = three_nodes(str(tmp_path))
    cluster.pve.migrate_secs = 50  # half a second of real time
    cluster.pve.ha_delay = 1
    try:
        yield cluster
    finally:
        cluster.stop()


def add_vm(
    fake: FakeCluster, vmid: int, *, gib: int = 3, ha: bool = False, tags: str | None = None
) -> None:
    config: dict[str, object] = {
        "cores": 1,
        "memory": gib * 1024,
        "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G",
    }
    if tags is not None:
        config["tags"] = tags
    vm = fake.pve.add_vm(vmid, f"vm{vmid}", node="pve1", status="running", config=config)
    vm.stats.update(cpu=0.3, mem=gib * GiB)
    if ha:
        vm.ha_state = "started"


def write_config(tmp_path: Path, fake: FakeCluster, *, mode: str, extra: str = "") -> Path:
    return proxmox_config(
        tmp_path,
        fake,
        mode=mode,
        executor="{max_parallel: 2, poll_interval: 1s}",
        extra=extra,
    )


def with_backend(config: Path, line: str) -> None:
    """Add ``line`` (``key: value``) to the configuration's ``backend:`` section."""
    text = config.read_text()
    config.write_text(text.replace("  retries: 1\n", f"  retries: 1\n  {line}\n"))


def opendrs(*args: str) -> subprocess.CompletedProcess[str]:
    return run_opendrs(*args, timeout=DEADLINE, columns=200)


def moves_asked(fake: FakeCluster, vmid: int) -> int:
    """How many times anyone asked the API to move guest ``vmid`` (HA or directly)."""
    return sum(
        1
        for method, path, _ in fake.pve.requests
        if method == "POST"
        and (path.endswith(f"/vm:{vmid}/migrate") or path.endswith(f"/qemu/{vmid}/migrate"))
    )


def migrations(tmp_path: Path) -> list[tuple[str, str, str, str | None]]:
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        return db.execute(
            "SELECT guest, source, target, outcome FROM migrations ORDER BY id"
        ).fetchall()


def observations(fake: FakeCluster) -> int:
    return sum(
        1 for m, p, _ in fake.pve.requests if m == "GET" and p.endswith("/cluster/resources")
    )


def daemon_beside_the_ha_manager(tmp_path: Path, fake: FakeCluster, first: str) -> str:
    """Run the daemon (active) while the fake's HA manager runs its rounds: from its first line
    matching ``first``, eight more observations; its log."""
    fake.crm_rounds()
    config = write_config(tmp_path, fake, mode="active")
    with Daemon(config) as daemon:
        daemon.wait_for(first)
        seen = observations(fake)
        eventually(
            lambda: observations(fake) >= seen + 8,
            DEADLINE,
            what="observed eight more times",
            log=daemon.log,
        )
        assert daemon.stop() == 0
        return daemon.log()


def node_of(fake: FakeCluster, vmid: int) -> str:
    guest = fake.pve.guest(vmid)
    assert guest is not None
    return str(guest.node)


# --------------------------------------------------------------------------------------------
# 1. Negative node affinity: "never on pve3" is not "only on pve3"


def never_on_pve3(fake: FakeCluster) -> None:
    """Six VMs on pve1; HA VM 100 must never run on pve3 (a strict negative rule)."""
    for vmid in range(100, 106):
        add_vm(fake, vmid, ha=vmid == 100)
    fake.pve.ha_rules = [
        {
            "rule": "never-pve3",
            "type": "node-affinity",
            "resources": "vm:100",
            "nodes": "pve3",
            "strict": 1,
            "affinity": "negative",
        }
    ]


def test_once_a_strict_negative_rule_keeps_the_guest_off_its_nodes(
    tmp_path: Path, fake: FakeCluster
) -> None:
    never_on_pve3(fake)
    fake.crm_rounds()
    result = opendrs("run", "--once", "--config", str(write_config(tmp_path, fake, mode="active")))
    assert result.returncode == 0, result.stderr
    moved = migrations(tmp_path)
    assert len(moved) >= 3, result.stderr  # the cluster was balanced
    assert not [m for m in moved if m[0] == "100" and m[2] == "pve3"], moved
    assert node_of(fake, 100) != "pve3"
    assert fake.pve.crm_moves == []  # nothing the HA manager had to undo


def test_the_daemon_never_puts_the_guest_on_a_node_it_avoids(
    tmp_path: Path, fake: FakeCluster
) -> None:
    never_on_pve3(fake)
    log = daemon_beside_the_ha_manager(tmp_path, fake, r"started (?:\S+ \()?\d+\)? pve1 → ")
    assert not [m for m in migrations(tmp_path) if m[0] == "100" and m[2] == "pve3"], log
    assert node_of(fake, 100) != "pve3" and fake.pve.crm_moves == [], log


def test_a_negative_rule_naming_every_node_is_dropped_with_a_warning(
    tmp_path: Path, fake: FakeCluster
) -> None:
    for vmid in range(100, 103):
        add_vm(fake, vmid, ha=True)
    fake.pve.ha_rules = [
        {
            "rule": "nowhere",
            "type": "node-affinity",
            "resources": "vm:100",
            "nodes": "pve1,pve2,pve3",
            "strict": 1,
            "affinity": "negative",
        },
        {
            "rule": "ranked",
            "type": "node-affinity",
            "resources": "vm:101",
            "nodes": "pve2:2",
            "affinity": "negative",
        },
    ]
    result = opendrs("run", "--once", "--config", str(write_config(tmp_path, fake, mode="shadow")))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert any(
        "HA rule 'nowhere' is not used, because negative node affinity rule must not specify "
        "all cluster nodes" in line
        for line in warnings
    ), result.stderr
    assert any(
        "HA rule 'ranked' is not used, because negative node affinity rule must not specify "
        "node priorities" in line
        for line in warnings
    ), result.stderr
    # The snapshot of the same cluster holds neither rule.
    snap = opendrs("snapshot", "--config", str(tmp_path / "opendrs.yaml"))
    assert snap.returncode == 0, snap.stderr
    assert "nowhere" not in snap.stdout and "ranked" not in snap.stdout


# --------------------------------------------------------------------------------------------
# 2. HA failback: the top tier is the only place for a failback guest


def prefers_pve1(fake: FakeCluster, *, failback: bool) -> None:
    """HA VM 100 (12 GiB) prefers pve1 (priority 2) to pve2 (priority 1), non-strict; VM 101
    (12 GiB) is pinned to pve1: balancing can only move VM 100."""
    add_vm(fake, 100, gib=12, ha=True)
    add_vm(fake, 101, gib=12, tags="plb_pin_pve1")
    fake.pve.ha_rules = [
        {
            "rule": "prefer-pve1",
            "type": "node-affinity",
            "resources": "vm:100",
            "nodes": "pve1:2,pve2:1",
            "strict": 0,
        }
    ]
    if not failback:
        fake.pve.ha_failback[100] = False


def test_the_daemon_does_not_fight_failback(tmp_path: Path, fake: FakeCluster) -> None:
    prefers_pve1(fake, failback=True)
    log = daemon_beside_the_ha_manager(tmp_path, fake, r"decision \(active\)")
    assert moves_asked(fake, 100) == 0, log
    assert fake.pve.crm_moves == [] and node_of(fake, 100) == "pve1", log


def test_once_why_not_names_failback(tmp_path: Path, fake: FakeCluster) -> None:
    prefers_pve1(fake, failback=True)
    config = write_config(tmp_path, fake, mode="active")
    result = opendrs("run", "--once", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert migrations(tmp_path) == [] and moves_asked(fake, 100) == 0
    assert "1 with HA failback on, kept to their top node-affinity tier" in result.stderr
    snap = tmp_path / "live.yaml"
    assert opendrs("snapshot", "--config", str(config), "-o", str(snap)).returncode == 0
    placed = opendrs("place", str(snap), "--guest", "100")
    assert placed.returncode == 0, placed.stderr
    assert re.search(
        r"pve2:\s+HA failback \(prefer-pve1\): priority 1, while the HA manager moves it back to "
        r"its priority 2 nodes \(pve1\)",
        placed.stdout,
    ), placed.stdout


def test_without_failback_the_preference_is_soft(tmp_path: Path, fake: FakeCluster) -> None:
    prefers_pve1(fake, failback=False)
    fake.crm_rounds()
    config = write_config(tmp_path, fake, mode="active")
    result = opendrs("run", "--once", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert [(g, s) for g, s, _, o in migrations(tmp_path) if o == "done"] == [("100", "pve1")]
    moved_to = node_of(fake, 100)
    assert moved_to != "pve1"
    # A few rounds of the HA manager later it is still there: nothing pulls it back.
    time.sleep(1.0)
    assert node_of(fake, 100) == moved_to and fake.pve.crm_moves == []
    snap = opendrs("snapshot", "--config", str(config))
    assert "failback: false" in snap.stdout, snap.stdout


# --------------------------------------------------------------------------------------------
# 3. Proxmox's own balancer of HA guests, and the per-resource auto-rebalance flag


def two_balancers(fake: FakeCluster) -> None:
    """Six VMs on pve1, three of them HA; Proxmox's ha-auto-rebalance on."""
    for vmid in range(100, 106):
        add_vm(fake, vmid, ha=vmid < 103)
    fake.pve.crs = {"ha": "static", "ha-auto-rebalance": 1}


def test_once_leaves_ha_guests_to_proxmox_s_balancer(tmp_path: Path, fake: FakeCluster) -> None:
    two_balancers(fake)
    config = write_config(tmp_path, fake, mode="active")
    result = opendrs("run", "--once", "--config", str(config))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "not balancing HA guests" in line]
    assert len(lines) == 1 and "WARNING" in lines[0], result.stderr
    assert "turn ha-auto-rebalance off" in lines[0]
    moved = {guest for guest, *_ in migrations(tmp_path)}
    assert moved and moved <= {"103", "104", "105"}, moved
    assert all(moves_asked(fake, vmid) == 0 for vmid in (100, 101, 102))
    # opendrs snapshot names it, in the file and on standard error; show says it.
    snap = tmp_path / "live.yaml"
    written = opendrs("snapshot", "--config", str(config), "-o", str(snap))
    assert written.returncode == 0, written.stderr
    assert "ha_auto_rebalance: true" in snap.read_text()
    assert "note: Proxmox VE balances its HA guests itself" in written.stderr
    shown = opendrs("show", str(snap))
    assert "Proxmox VE balances its HA guests itself" in shown.stdout, shown.stdout
    status = opendrs("status", "--config", str(config), "--format", "json")
    data = json.loads(status.stdout)
    assert "opendrs leaves its 3 HA guests to it" in data["cluster"]["platform_balancer"]


def test_the_daemon_shows_the_other_balancer(tmp_path: Path, fake: FakeCluster) -> None:
    two_balancers(fake)
    config = write_config(tmp_path, fake, mode="active", extra="http: {listen: '127.0.0.1:0'}\n")
    with Daemon(config) as daemon:
        address = served(daemon)
        daemon.wait_for("not balancing HA guests")

        def platform_balancer(value: str) -> Callable[[], bool]:
            line = re.compile(rf"^opendrs_platform_balancer {value}$", re.M)
            return lambda: bool(line.search(fetch(address, "/metrics")[1]))

        eventually(platform_balancer("1.0"), DEADLINE, what="the metric at 1", log=daemon.log)
        _, state = fetch(address, "/api/state")
        assert "Proxmox VE balances its HA guests itself" in (
            json.loads(state)["cluster"]["platform_balancer"] or ""
        )
        _, panel = fetch(address, "/api/panel")
        assert 'id="platform-balancer"' in panel
        # Proxmox's balancer turned off: opendrs says so and balances HA guests again.
        fake.pve.crs = {"ha": "static"}
        daemon.wait_for("opendrs balances them again")
        eventually(
            lambda: any(moves_asked(fake, vmid) for vmid in (100, 101, 102)),
            DEADLINE,
            what="an HA guest moved",
            log=daemon.log,
        )
        eventually(platform_balancer("0.0"), DEADLINE, what="the metric at 0", log=daemon.log)
        assert daemon.stop() == 0
    assert daemon.count("not balancing HA guests") == 1


def auto_rebalance_off(fake: FakeCluster) -> None:
    """HA VM 100 with auto-rebalance 0 and VM 101 pinned to pve1, both 12 GiB, on pve1."""
    add_vm(fake, 100, gib=12, ha=True)
    add_vm(fake, 101, gib=12, tags="plb_pin_pve1")
    fake.pve.ha_auto_rebalance[100] = False


def test_once_honours_auto_rebalance_0(tmp_path: Path, fake: FakeCluster) -> None:
    auto_rebalance_off(fake)
    config = write_config(tmp_path, fake, mode="active")
    result = opendrs("run", "--once", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert migrations(tmp_path) == [] and moves_asked(fake, 100) == 0
    assert "1 ignored: its HA resource has auto-rebalance 0" in result.stderr, result.stderr
    snap = tmp_path / "live.yaml"
    assert opendrs("snapshot", "--config", str(config), "-o", str(snap)).returncode == 0
    assert "reason: its HA resource has auto-rebalance 0" in snap.read_text()
    placed = opendrs("place", str(snap), "--guest", "100")
    assert "cannot move: ignored: its HA resource has auto-rebalance 0" in placed.stdout


def test_the_daemon_moves_it_when_told_not_to_honour_the_flag(
    tmp_path: Path, fake: FakeCluster
) -> None:
    auto_rebalance_off(fake)
    config = write_config(tmp_path, fake, mode="active")
    with_backend(config, "respect_auto_rebalance: false")
    with Daemon(config) as daemon:
        eventually(
            lambda: node_of(fake, 100) != "pve1", DEADLINE, what="VM 100 moved", log=daemon.log
        )
        assert daemon.stop() == 0
    assert moves_asked(fake, 100) == 1


# --------------------------------------------------------------------------------------------
# 4. The proxmox preset beside the HA manager's own moves and balancer


def proxmox_preset(tmp_path: Path, fake: FakeCluster) -> Path:
    """An active configuration with ``policy: {preset: proxmox}`` (its own interval and hold)."""
    config = write_config(tmp_path, fake, mode="active")
    text = config.read_text()
    config.write_text(
        text.replace("policy: {interval: 1s, hold: 1, smoothing: 0}", "policy: {preset: proxmox}")
    )
    return config


def decisions(tmp_path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        return db.execute("SELECT action, reason FROM decisions ORDER BY id").fetchall()


def test_once_the_proxmox_preset_waits_for_a_queued_ha_move(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """A move the HA manager has queued (its ``cmd``, not yet started) is a motion: the preset
    decides nothing while it waits, as Proxmox's balancer does, and balances once it is over."""
    for vmid in range(100, 106):
        add_vm(fake, vmid, ha=True)
    fake.pve.queue_ha_motion(105, "pve3")
    config = proxmox_preset(tmp_path, fake)
    result = opendrs("run", "--once", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert migrations(tmp_path) == [], result.stderr
    assert all(moves_asked(fake, vmid) == 0 for vmid in range(100, 106))
    [(action, reason)] = decisions(tmp_path)
    assert action == "none" and reason.startswith(
        "vm105 (105) is moving: no new decision until it ends (imbalance "
    ), reason
    # The HA manager carries the move out; once it is over, the preset makes its one move.
    fake.run(fake.pve.carry_out_ha_motions())
    eventually(
        lambda: node_of(fake, 105) == "pve3" and fake.pve.guest(105).ha_state == "started",
        DEADLINE,
        what="the HA manager's move over",
        log=lambda: result.stderr,
    )
    result = opendrs("run", "--once", "--config", str(config))
    assert result.returncode == 0, result.stderr
    moved = migrations(tmp_path)
    assert len(moved) == 1 and moved[0][1:] == ("pve1", "pve2", "done"), result.stderr


def test_once_the_proxmox_preset_leaves_ha_guests_to_proxmox_s_balancer(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """The preset moves only HA resources; while Proxmox VE balances them itself, it moves
    nothing, and its decision counts every guest under what keeps it (not 'may move' for the
    guests that are no HA resource)."""
    two_balancers(fake)
    result = opendrs("run", "--once", "--config", str(proxmox_preset(tmp_path, fake)))
    assert result.returncode == 0, result.stderr
    assert migrations(tmp_path) == [], result.stderr
    assert all(moves_asked(fake, vmid) == 0 for vmid in range(100, 106))
    [(action, reason)] = decisions(tmp_path)
    assert action == "none", reason
    assert reason.endswith(
        "6 candidates, all excluded: 3 HA guests Proxmox VE balances itself (ha-auto-rebalance), "
        "3 not started HA resources (pve-bruteforce moves only those)"
    ), reason
