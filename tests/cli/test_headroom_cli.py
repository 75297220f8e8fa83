"""``opendrs headroom``: the failover headroom through the command, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Three nodes of 32 GiB; db and web are HA, scratch is not. If a fails, db (20 GiB) fits only on
# c (b holds its anti-affinity partner db2); if c fails, db2 must go to b, which has room.
SNAPSHOT = """\
version: 1
name: lab
nodes:
  a: {cpu: 16, memory: 32GiB}
  b: {cpu: 16, memory: 32GiB}
  c: {cpu: 16, memory: 32GiB}
guests:
  - {id: 101, name: db, node: a, memory: 20GiB, cpu: 4, ha: true}
  - {id: 102, name: db2, node: b, memory: 20GiB, cpu: 4, ha: true}
  - {id: 103, name: web, node: c, memory: 4GiB, cpu: 2, ha: true}
  - {id: 104, name: scratch, node: c, memory: 8GiB, cpu: 2}
rules:
  - {type: anti-affinity, guests: [101, 102]}
"""


def run(*argv: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``opendrs headroom ARGV``; ``config``: the default configuration ($OPENDRS_CONFIG)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    if config is not None:
        env["OPENDRS_CONFIG"] = str(config)
    return subprocess.run(
        [sys.executable, "-m", "opendrs.cli.main", "headroom", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "lab.yaml"
    path.write_text(SNAPSHOT)
    return path


def test_one_failure_is_covered(snapshot: Path) -> None:
    done = run(str(snapshot))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "lab: failover headroom: yes, for any 1 node failing (3 HA guests)"
    assert "  if a fails: the HA guest restarts (worst survivor c at 100 % memory)" in lines
    assert "  if c fails: the HA guest restarts (worst survivor a at 75 % memory)" in lines


def test_two_failures_strand_guests_named_with_why(snapshot: Path) -> None:
    done = run(str(snapshot), "--failures", "2")
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("lab: failover headroom: no, 1 HA guest cannot restart when")
    assert "  if a and b fail: 1 HA guest of 2 cannot restart: db2 (102)" in done.stdout
    assert "    db2 (102): no node can take it (c: hard anti-affinity with db (101))" in done.stdout


def test_json_names_each_case(snapshot: Path) -> None:
    done = run(str(snapshot), "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is True and data["unrestartable"] == 0 and data["ha_guests"] == 3
    assert data["exhaustive"] is True and data["assumed_ha"] is False
    by_failed = {tuple(c["failed"]): c for c in data["cases"]}
    assert by_failed[("a",)]["restarts"] == [{"guest": "101", "from": "a", "to": "c"}]
    # The non-HA guest of c is not restarted.
    assert by_failed[("c",)]["restarts"] == [{"guest": "103", "from": "c", "to": "a"}]


def test_without_ha_guests_every_running_guest_counts(tmp_path: Path) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text(SNAPSHOT.replace(", ha: true", ""))
    done = run(str(path), "--format", "json")
    data = json.loads(done.stdout)
    assert data["assumed_ha"] is True and data["ha_guests"] == 4
    text = run(str(path)).stdout
    assert "note: no guest is HA-managed: every running guest is counted as one" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("demo", "--config", "opendrs.yaml"), "give a SNAPSHOT or --config FILE"),
        (("--failures", "3"), "--failures 3: the cluster has 3 online nodes: at most 2"),
        (("--failures", "0"), "must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    snapshot: Path, argv: tuple[str, ...], message: str
) -> None:
    args = argv if not argv or argv[0] != "--failures" else (str(snapshot), *argv)
    done = run(*args)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.splitlines()) == 1


def test_alone_it_observes_the_default_configurations_cluster(
    snapshot: Path, tmp_path: Path
) -> None:
    config = tmp_path / "opendrs.yaml"
    config.write_text(f"backend: {{type: file, path: {snapshot}}}\nhistory: history.sqlite\n")
    done = run(config=config)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("lab: failover headroom: yes, for any 1 node failing")
    missing = run(config=tmp_path / "none.yaml")
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1
    assert f"no configuration file at {tmp_path / 'none.yaml'}" in missing.stderr


def test_demo_lacks_it_and_exits_1() -> None:
    done = run("demo")
    assert done.returncode == 1
    assert "cannot restart: db-replica (101)" in done.stdout


# x (HA) on a: the best node with room is d; Proxmox's basic mode picks b or c (one guest each
# against d's six), lacks room there and on the other, and leaves x down.
FEWEST_GUESTS = (
    "version: 1\nname: few\nsettings: {mode: static}\nnodes:\n"
    + "".join(f"  {name}: {{cpu: 16, memory: 32GiB}}\n" for name in "abcd")
    + "guests:\n  - {id: 101, name: x, node: a, memory: 8GiB, cpu: 2, ha: true}\n"
    + "".join(f"  - {{id: {n}01, node: {n}, memory: 28GiB, cpu: 2}}\n" for n in "bc")
    + "".join(f"  - {{id: 40{i}, node: d, memory: 1GiB, cpu: 1}}\n" for i in range(6))
)


def test_recovery_judges_by_proxmoxs_own_placement(tmp_path: Path) -> None:
    path = tmp_path / "few.yaml"
    path.write_text(FEWEST_GUESTS)
    # A snapshot without ha_scheduler knows no Proxmox scheduler mode: auto is best-fit.
    auto = run(str(path), "--format", "json")
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["recovery"] == "best-fit"
    basic = run(str(path), "--recovery", "pve-basic")
    assert basic.returncode == 1, basic.stderr
    assert basic.stdout.startswith("few: failover headroom: no, 1 HA guest cannot restart when a")
    assert "x (101): no room to start on b and c" in basic.stdout
    assert run(str(path), "--recovery", "pve-static").returncode == 0
    bad = run(str(path), "--recovery", "pve-dynamic")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1


def test_auto_judges_by_the_snapshots_ha_scheduler(tmp_path: Path) -> None:
    path = tmp_path / "few.yaml"
    path.write_text(FEWEST_GUESTS + "ha_scheduler: basic\n")
    auto = run(str(path))
    assert auto.returncode == 1, auto.stderr
    assert "x (101): no room to start on b and c" in auto.stdout
    assert run(str(path), "--recovery", "best-fit").returncode == 0
    path.write_text(FEWEST_GUESTS + "ha_scheduler: dynamic\n")
    bad = run(str(path))
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        f"error: {path}: ha_scheduler: expected one of basic, static, got 'dynamic'"
    ]
