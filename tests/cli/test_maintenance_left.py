"""Nothing is left on a node in maintenance without a word (issue 26, items 3, 4, 7 and 14).

``opendrs plan``, ``opendrs show`` and ``opendrs run --once`` run as subprocesses on hand-made
snapshots (the file backend):

* a node in maintenance keeps guests that may not move — local disks, a PCI device, a running
  container without restart migration, a backup lock, HA state error, an ignored guest: each is
  named, ``plan`` exits 1, the daemon warns and its reason says so, ``show`` lists them;
* a guest up for less than ``settings.min_uptime`` (or the policy's ``min_uptime``) leaves a node
  in maintenance all the same;
* ``plan --strategy NAME`` makes the repair the daemon with that strategy makes;
* a hard-affinity group that fits nowhere says which room it lacks; a move off a node in
  maintenance says ``maintenance``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from daemon import opendrs, run_once
from repairs import left_on, run_config

#: pve2 in maintenance keeps six guests that may not move and one that may, up for two minutes.
LEFT = """\
version: 1
name: left
settings: {min_uptime: 10m}
nodes:
  pve1: {cpu: 16, memory: 64GiB, storage: {local-lvm: 1TiB}}
  pve2: {cpu: 16, memory: 64GiB, storage: {local-lvm: 1TiB}, maintenance: true}
  pve3: {cpu: 16, memory: 64GiB, storage: {local-lvm: 1TiB}}
storage:
  ceph: {shared: true}
guests:
  - {id: 101, node: pve2, cpu: 2, memory: 4GiB, disks: [{pool: local-lvm, size: 32GiB}], uptime: 1d}
  - {id: 102, node: pve2, cpu: 2, memory: 4GiB, devices: [hostpci0], uptime: 1d}
  - {id: 103, node: pve2, kind: ct, cpu: 1, memory: 1GiB, uptime: 1d}
  - {id: 104, node: pve2, cpu: 2, memory: 4GiB, lock: backup, uptime: 1d}
  - {id: 105, node: pve2, cpu: 2, memory: 4GiB, ha: true, ha_state: error, uptime: 1d}
  - {id: 106, node: pve2, cpu: 2, memory: 4GiB, uptime: 1d}
  - {id: 107, node: pve2, cpu: 2, memory: 4GiB, uptime: 2m}
  - {id: 201, node: pve1, cpu: 2, memory: 4GiB, uptime: 1d}
  - {id: 301, node: pve3, cpu: 2, memory: 4GiB, uptime: 1d}
rules:
  - {type: ignore, guests: [106]}
"""

#: Why each guest stays on pve2.
STAYS = {
    "101": "local disks (32.0 GiB)",
    "102": "local device hostpci0",
    "103": "container: restart migration not allowed",
    "104": "locked (backup)",
    "105": "HA state error",
    "106": "ignored by a rule",
}


SAID = left_on("pve2", STAYS)


def write(folder: Path, name: str, text: str, policy: str = "") -> tuple[Path, Path]:
    """The snapshot, and a configuration of ``opendrs run`` on it (file backend, shadow)."""
    snapshot = folder / f"{name}.yaml"
    snapshot.write_text(text, encoding="utf-8")
    return snapshot, run_config(snapshot, policy)


def pve2_in_maintenance(
    name: str, *, memory: tuple[int, int, int], guests: list[tuple[int, str, int]], rules: str = ""
) -> str:
    """A snapshot (static mode): pve1, pve2 (in maintenance), pve3 of 16 cores and ``memory``
    GiB each; ``guests`` as (id, node, GiB) of 2 cores, up a day; ``rules`` its ``rules:`` items
    (YAML lines), if any."""
    nodes = "".join(
        f"  pve{i}: {{cpu: 16, memory: {gib}GiB{', maintenance: true' if i == 2 else ''}}}\n"
        for i, gib in enumerate(memory, 1)
    )
    rows = "".join(
        f"  - {{id: {g}, node: {node}, cpu: 2, memory: {gib}GiB, uptime: 1d}}\n"
        for g, node, gib in guests
    )
    text = f"version: 1\nname: {name}\nsettings: {{mode: static}}\nnodes:\n{nodes}guests:\n{rows}"
    return text + (f"rules:\n{rules}" if rules else "")


def plan_json(snapshot: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    done = opendrs("plan", str(snapshot), "--format", "json", *args, timeout=120)
    return done.returncode, json.loads(done.stdout), done.stderr


def warnings(stderr: str) -> list[str]:
    return [line.split("WARNING ", 1)[1] for line in stderr.splitlines() if " WARNING " in line]


def would_migrate(stderr: str) -> list[str]:
    return re.findall(r"shadow: would migrate (.*)", stderr)


def decision(stderr: str) -> str:
    (line,) = re.findall(r"decision \(shadow\): (.*)", stderr)
    return line


# --------------------------------------------------------------------------------------------
# Items 3 and 4: every guest left is named; min_uptime does not hold a guest in maintenance


def test_plan_names_every_guest_left_in_maintenance_and_exits_1(tmp_path: Path) -> None:
    snapshot, _ = write(tmp_path, "left", LEFT)
    code, data, stderr = plan_json(snapshot)
    assert code == 1
    assert data["stuck"] == [{"guest": g, "reason": SAID[g]} for g in STAYS]
    assert stderr.splitlines() == [f"repair stuck: {SAID[g]}" for g in STAYS]
    # 107, up for 2 minutes (min_uptime 10m), leaves all the same, its move saying why.
    assert [(m["guest"], m["source"]) for m in data["moves"]] == [("107", "pve2")]
    assert [m["reason"] for m in data["proposed"]] == ["repair: maintenance"]


def test_plan_text_names_them_too(tmp_path: Path) -> None:
    snapshot, _ = write(tmp_path, "left", LEFT)
    done = opendrs("plan", str(snapshot), timeout=120, columns=200)
    assert done.returncode == 1
    for guest in STAYS:
        assert f"Repair stuck: {SAID[guest]}" in done.stdout


def test_the_daemon_warns_of_each_and_moves_the_young_guest(tmp_path: Path) -> None:
    _, config = write(tmp_path, "left", LEFT)
    done = run_once(config)
    assert done.returncode == 0, done.stderr
    assert warnings(done.stderr) == [f"repair stuck: {SAID[g]}" for g in STAYS]
    assert [m.split(" → ")[0] for m in would_migrate(done.stderr)] == ["107 pve2"]
    # The policy's min_uptime (10m by default) gave way too, and the decision says so.
    assert decision(done.stderr).startswith("repair: 107 is on pve2, in maintenance; 1 migration")
    assert "minimum uptime" in decision(done.stderr)


def test_the_daemon_says_so_when_nothing_may_leave(tmp_path: Path) -> None:
    only_held = "\n".join(line for line in LEFT.splitlines() if "id: 107" not in line) + "\n"
    _, config = write(tmp_path, "held", only_held)
    done = run_once(config)
    assert done.returncode == 0, done.stderr
    assert warnings(done.stderr) == [f"repair stuck: {SAID[g]}" for g in STAYS]
    assert decision(done.stderr).endswith(
        "nothing to do; 6 guests may not leave pve2, in maintenance"
    )
    assert would_migrate(done.stderr) == []


def test_show_lists_the_guests_left(tmp_path: Path) -> None:
    snapshot, _ = write(tmp_path, "left", LEFT)
    done = opendrs("show", str(snapshot), "--format", "json", timeout=120)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["stuck"]
    assert [(r["guest"], r["node"], r["maintenance"], r["reason"]) for r in rows] == [
        (g, "pve2", True, SAID[g]) for g in STAYS
    ]
    text = opendrs("show", str(snapshot), "--no-guests", timeout=120, columns=200)
    assert "Stuck: 6 left breaking a hard constraint" in text.stdout
    for guest in STAYS:
        assert SAID[guest] in text.stdout


# --------------------------------------------------------------------------------------------
# Item 7: plan --strategy NAME previews the daemon with that strategy

#: pve2 in maintenance with two guests that may move; pve1 and pve3 have room for both.
EVACUATE = pve2_in_maintenance(
    "evacuate",
    memory=(64, 64, 64),
    guests=[(101, "pve2", 4), (102, "pve2", 4), (201, "pve1", 4), (301, "pve3", 4)],
)


@pytest.mark.parametrize("strategy", ["pve-bruteforce", "pve-topsis", "incus", "drs-pressure"])
def test_plan_with_a_peer_strategy_makes_the_daemons_repair(tmp_path: Path, strategy: str) -> None:
    snapshot, config = write(tmp_path, "evacuate", EVACUATE, f"{{strategy: {strategy}}}")
    code, data, _ = plan_json(snapshot, "--strategy", strategy)
    done = run_once(config)
    assert done.returncode == 0, done.stderr
    daemon = would_migrate(done.stderr)
    assert len(daemon) == 2 and decision(done.stderr).startswith("repair: ")
    planned = [
        f"{m['guest']} {m['source']} → {m['target']} (step {m['step']})" for m in data["moves"]
    ]
    assert code == 0 and data["stuck"] == [] and planned == daemon
    assert data["strategy"] == "repair" and strategy in data["stopped"]
    assert {m["reason"] for m in data["proposed"]} == {"repair: maintenance"}


# --------------------------------------------------------------------------------------------
# Item 14: a group that fits nowhere names the room it lacks

#: A hard-affinity group of three 16 GiB guests on pve2, in maintenance: 48 GiB together, and
#: no other node has as much even empty (32 GiB each).
GROUP = pve2_in_maintenance(
    "group",
    memory=(32, 64, 32),
    guests=[
        (101, "pve2", 16),
        (102, "pve2", 16),
        (103, "pve2", 16),
        (201, "pve1", 4),
        (301, "pve3", 2),
    ],
    rules="  - {type: affinity, name: app, guests: [101, 102, 103]}\n",
)


def test_a_group_that_fits_nowhere_names_the_room_it_lacks(tmp_path: Path) -> None:
    snapshot, config = write(tmp_path, "group", GROUP)
    code, data, _ = plan_json(snapshot)
    assert code == 1 and data["moves"] == []
    reasons = {s["guest"]: s["reason"] for s in data["stuck"]}
    assert reasons["101"] == (
        "101 is on pve2, in maintenance; elsewhere, with its hard-affinity partners 102, 103: "
        "pve1, pve3: capacity, even empty: memory needs 48.0 GiB, has 32.0 GiB on pve1, the "
        "closest"
    )
    assert not any("partners run elsewhere" in r for r in reasons.values())
    done = run_once(config)
    assert f"WARNING repair stuck: {reasons['101']}" in done.stderr
