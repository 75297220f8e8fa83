"""End to end through the command line, as an operator runs opendrs on a new Proxmox cluster.

``opendrs snapshot --config``, ``opendrs run --config --once`` (shadow, then active) and a few
cycles of ``opendrs run`` run as subprocesses against the fake Proxmox API, served over TLS on
127.0.0.1. Three nodes; nine running VMs, all on pve1, up for a day (the fake's default). Each
test stops every process and server it starts; no assertion depends on how long anything takes
(the deadlines below only keep a broken run from hanging the suite).

The API token's secret is checked for in everything opendrs writes: standard output and error
(the log, at debug level), the history database's bytes and every other file it leaves.
"""

from __future__ import annotations

import json
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import (
    DEFAULT_UPTIME,
    TOKEN_SECRET,
    FakeCluster,
    GiB,
    proxmox_config,
    running_on_pve1,
    three_nodes,
)
from daemon import Daemon, eventually
from daemon import opendrs as run_opendrs
from opendrs.model import snapshot
from opendrs.model.cluster import Cluster

NODES = ("pve1", "pve2", "pve3")
VMS = tuple(range(100, 109))
#: A run that has not ended after this long is broken: it is killed and the test fails.
DEADLINE = 120.0


# --------------------------------------------------------------------------------------------
# The cluster, the configuration, the commands


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    """Three nodes of 8 cores and 32 GiB; nine running VMs of 3 GiB, all on pve1."""
    cluster = three_nodes(str(tmp_path))
    pve = cluster.pve
    pve.capacity["pve3"]["ksm_shared"] = 2 * GiB
    running_on_pve1(pve, VMS)
    try:
        yield cluster
    finally:
        cluster.stop()


def write_config(
    tmp_path: Path, fake: FakeCluster, *, mode: str, token: str = TOKEN_SECRET, extra: str = ""
) -> Path:
    return proxmox_config(
        tmp_path,
        fake,
        token=token,
        mode=mode,
        executor="{max_parallel: 2, poll_interval: 1s}",
        extra="log: {level: debug}\n" + extra,
    )


def opendrs(*args: str) -> subprocess.CompletedProcess[str]:
    """``opendrs ARGS`` in a subprocess, its tables 160 columns wide."""
    return run_opendrs(*args, timeout=DEADLINE, columns=160)


def placement(fake: FakeCluster) -> dict[int, str]:
    return {vm.vmid: vm.node for vm in fake.pve.vms}


def memory_fractions(fake: FakeCluster) -> dict[str, float]:
    """Each node's memory in use (its own and its running guests') as a share of its memory."""
    pve = fake.pve
    return {name: pve.node_usage(name)[1] / pve.capacity[name]["memory"] for name in NODES}


def timeless(cluster: Cluster) -> Cluster:
    return replace(cluster, guests=tuple(replace(g, uptime=0) for g in cluster.guests))


def posts(fake: FakeCluster) -> list[str]:
    """The paths of every POST the fake received (a token needs none to read)."""
    return [path for method, path, _ in fake.pve.requests if method == "POST"]


def decisions(tmp_path: Path) -> list[tuple[str, str, int, str]]:
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        rows = db.execute("SELECT mode, action, moves, plan FROM decisions ORDER BY id").fetchall()
    return [(mode, action, moves, plan) for mode, action, moves, plan in rows]


def migrations(tmp_path: Path) -> list[tuple[str, str, str, str | None]]:
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        return db.execute(
            "SELECT guest, source, target, outcome FROM migrations ORDER BY id"
        ).fetchall()


def assert_no_secret(tmp_path: Path, *outputs: str) -> None:
    """The secret is in no output and in no file but its own (the history's bytes included)."""
    for text in outputs:
        assert TOKEN_SECRET not in text
    written = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and not p.is_symlink() and p.name != "token" and p.parent.name != "tls"
    ]
    for path in written:
        assert TOKEN_SECRET.encode() not in path.read_bytes(), path


# --------------------------------------------------------------------------------------------
# opendrs snapshot: the first thing to run on a new cluster


def test_snapshot_of_the_live_cluster_works_with_every_command(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(
        tmp_path,
        fake,
        mode="active",
        extra="cluster: prod\nsettings: {reserve: {memory: 2GiB}, min_uptime: 5m}\n",
    )
    result = opendrs("snapshot", "--config", str(config))
    assert result.returncode == 0, result.stderr
    live = snapshot.loads(result.stdout, filename="live.yaml")
    # The configuration's name and settings apply, as in the daemon.
    assert live.name == "prod"
    assert (live.settings.reserve_memory, live.settings.min_uptime) == (2 * GiB, 300)
    assert [(n.name, n.cpu, n.memory, n.online) for n in live.nodes] == [
        (name, 8.0, 32 * GiB, True) for name in NODES
    ]
    assert [n.ksm_shared for n in live.nodes] == [0, 0, 2 * GiB]
    assert [g.id for g in live.guests] == [str(v) for v in VMS]
    assert {g.node for g in live.guests} == {"pve1"}
    assert all(g.uptime >= DEFAULT_UPTIME and g.memory == 3 * GiB for g in live.guests)
    assert all(g.memory_used == 3 * GiB for g in live.guests)
    # Observing asks nothing to change.
    assert posts(fake) == [] and fake.pve.migrations == []
    # The snapshot works with every command.
    path = tmp_path / "live.yaml"
    path.write_text(result.stdout)
    assert result.stdout == snapshot.dumps(snapshot.load(path))  # canonical: a fixed point
    validate = opendrs("validate", str(path))
    assert validate.returncode == 0, validate.stderr
    assert "valid (3 nodes, 9 guests" in validate.stdout
    show = opendrs("show", str(path), "--format", "json")
    assert show.returncode == 0, show.stderr
    assert [n["guests"] for n in json.loads(show.stdout)["nodes"]][1:] == [[], []]
    plan = opendrs("plan", str(path), "--format", "json")
    assert plan.returncode == 0, plan.stderr
    moves = json.loads(plan.stdout)["moves"]
    assert len(moves) >= 4 and {m["source"] for m in moves} == {"pve1"}
    place = opendrs("place", str(path), "--new", "cpu=1,memory=1GiB", "--format", "json")
    assert place.returncode == 0, place.stderr
    scenario = tmp_path / "week.yaml"
    scenario.write_text("version: 1\ncluster: live.yaml\nduration: 2h\n")
    simulate = opendrs(
        "simulate", str(scenario), "--policy", "opendrs", "--format", "json", "--no-progress"
    )
    assert simulate.returncode == 0, simulate.stderr
    (report,) = json.loads(simulate.stdout)
    assert report["migrations"] >= 4 and report["capacity_violations"] == 0
    assert_no_secret(tmp_path, result.stdout, result.stderr)


def test_snapshot_to_a_file_is_atomic_and_follows_the_format(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(tmp_path, fake, mode="shadow")
    # -o: the format follows the file's name; an existing file is replaced whole, its mode kept.
    target = tmp_path / "live.json"
    target.write_text("old\n")
    target.chmod(0o640)
    result = opendrs("snapshot", "--config", str(config), "-o", str(target))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    text = target.read_text()
    assert text.startswith("{")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert snapshot.dumps(snapshot.load(target), "json") == text
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    # --format says which, on standard output too.
    as_json = opendrs("snapshot", "--config", str(config), "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["nodes"]["pve3"]["ksm"] == "2GiB"
    yaml_file = tmp_path / "live.yaml"
    as_yaml = opendrs("snapshot", "--config", str(config), "-o", str(yaml_file), "--format", "yaml")
    assert as_yaml.returncode == 0, as_yaml.stderr
    # The same cluster (but for the uptimes: time passed between the two).
    assert timeless(snapshot.load(yaml_file)) == timeless(snapshot.load(target))
    assert_no_secret(tmp_path, result.stdout, result.stderr, as_json.stdout, as_yaml.stderr)


def test_snapshot_never_writes_through_a_symbolic_link(tmp_path: Path, fake: FakeCluster) -> None:
    config = write_config(tmp_path, fake, mode="shadow")
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    link = tmp_path / "live.yaml"
    link.symlink_to(precious)
    result = opendrs("snapshot", "--config", str(config), "-o", str(link))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: -o {link}: a symbolic link: refused (remove it, or name the file it points to)"
    ]
    assert precious.read_text() == "keep me\n" and link.is_symlink()
    assert fake.pve.requests == []  # refused before anything is asked


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-o", "{tmp}/x.json", "--format", "yaml"), "x.json"),
        (("-o", "{tmp}/no/such/dir/x.yaml"), "no/such/dir"),
        (("-o", "{tmp}"), "not a regular file"),
        (("--format", "xml"), "invalid choice: 'xml'"),
    ],
)
def test_snapshot_bad_options_are_one_line_and_exit_2(
    tmp_path: Path, fake: FakeCluster, args: tuple[str, ...], message: str
) -> None:
    config = write_config(tmp_path, fake, mode="shadow")
    result = opendrs("snapshot", "--config", str(config), *(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line, line
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_snapshot_of_a_bad_configuration_exits_2(tmp_path: Path, fake: FakeCluster) -> None:
    config = write_config(tmp_path, fake, mode="shadow", extra="polcy: {}\n")
    result = opendrs("snapshot", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: {config}: polcy: unknown key (did you mean 'policy'?)"
    ]
    missing = opendrs("snapshot", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1
    assert "Traceback" not in missing.stderr
    assert fake.pve.requests == []


def test_snapshot_exits_1_when_the_cluster_cannot_be_observed(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(tmp_path, fake, mode="shadow", token="00000000-0000-0000-0000-00000000")
    result = opendrs("snapshot", "--config", str(config), "-o", str(tmp_path / "live.yaml"))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "authentication failed" in errors[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "live.yaml").exists()
    # A reserve from the configuration that leaves a node nothing: refused as the daemon does.
    config = write_config(tmp_path, fake, mode="shadow", extra="settings: {reserve: {cpu: 8}}\n")
    result = opendrs("snapshot", "--config", str(config))
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1].startswith(
        "error: cannot observe the cluster: the cpu reserve (8 cores) leaves node pve1 no cpu"
    )
    assert_no_secret(tmp_path, result.stdout, result.stderr)


def test_snapshot_with_a_node_down(tmp_path: Path, fake: FakeCluster) -> None:
    fake.pve.set_node_offline("pve3")
    config = write_config(tmp_path, fake, mode="shadow")
    # Proxmox shows an offline node's size while it has RRD data of it: the snapshot says so.
    fake.pve.offline_sizes = True
    result = opendrs("snapshot", "--config", str(config))
    assert result.returncode == 0, result.stderr
    pve3 = snapshot.loads(result.stdout).node("pve3")
    assert (pve3.online, pve3.cpu, pve3.memory, pve3.ksm_shared) == (False, 8.0, 32 * GiB, 0)
    # Without its size, a node cannot be written: one line says why.
    fake.pve.offline_sizes = False
    result = opendrs("snapshot", "--config", str(config))
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "error: cannot write the cluster as a snapshot: node pve3 is offline and the API reports "
        "no size for it: take the snapshot while it is online"
    )
    assert result.stdout == ""


# --------------------------------------------------------------------------------------------
# opendrs run: shadow first, then active


def test_shadow_once_records_decisions_and_migrates_nothing(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(tmp_path, fake, mode="shadow")
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    assert "nothing will be migrated" in result.stderr
    would = [line for line in result.stderr.splitlines() if "shadow: would migrate" in line]
    # pve1 holds every VM at about 90 % of its memory: with the default hot level (85 %) the
    # first decision relieves it at once, before balancing waits for its hold.
    assert "repair: pve1 runs hot (memory_used above 85 %)" in result.stderr
    assert len(would) >= 2 and all(" pve1 → " in line for line in would), result.stderr
    # The decision is in the history, with its plan; no migration is.
    ((mode, action, moves, plan),) = decisions(tmp_path)
    assert (mode, action) == ("shadow", "repair") and moves == len(would)
    assert {m["guest"] for m in json.loads(plan)} <= {str(v) for v in VMS}
    assert migrations(tmp_path) == []
    # Not one request to change anything reached the API: no migration, nothing else.
    assert fake.pve.migrations == [] and posts(fake) == []
    assert set(placement(fake).values()) == {"pve1"}
    assert_no_secret(tmp_path, result.stdout, result.stderr)


def test_active_once_balances_a_cluster_packed_on_one_node(
    tmp_path: Path, fake: FakeCluster
) -> None:
    before = memory_fractions(fake)
    assert max(before.values()) - min(before.values()) > 0.8  # 28 GiB on pve1, 1 on the others
    # Balancing alone: with the default hot level the first decision would be pve1's relief
    # (test_shadow_once_records_decisions_and_migrates_nothing).
    config = write_config(tmp_path, fake, mode="active")
    config.write_text(config.read_text().replace("smoothing: 0}", "smoothing: 0, hot: null}"))
    assert "hot: null" in config.read_text()
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    # Every migration was asked for, ran and was recorded; each VM moved at most once.
    moved = migrations(tmp_path)
    assert len(moved) == len(fake.pve.migrations) >= 4
    assert {outcome for *_, outcome in moved} == {"done"}
    assert len({guest for guest, *_ in moved}) == len(moved)
    final = placement(fake)
    assert all(final[int(guest)] == target for guest, _, target, _ in moved)
    assert not any(vm.lock for vm in fake.pve.vms)
    # Balanced: three VMs per node, memory per node within 10 percentage points.
    assert sorted(list(final.values()).count(n) for n in NODES) == [3, 3, 3]
    after = memory_fractions(fake)
    assert max(after.values()) - min(after.values()) <= 0.10, after
    assert_no_secret(tmp_path, result.stdout, result.stderr)


def test_the_daemon_balances_over_a_few_cycles_then_holds_still(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(tmp_path, fake, mode="active")

    def observations() -> int:
        return sum(
            1 for m, p, _ in fake.pve.requests if m == "GET" and p.endswith("/cluster/resources")
        )

    with Daemon(config) as daemon:
        daemon.wait_for(r"started (?:\S+ \()?\d+\)? pve1 → ")
        eventually(
            lambda: (
                sorted(list(placement(fake).values()).count(n) for n in NODES) == [3, 3, 3]
                and not any(vm.lock for vm in fake.pve.vms)
            ),
            DEADLINE,
            what="balanced",
            log=daemon.log,
        )
        requested = len(fake.pve.migrations)
        # Three more observations of the balanced cluster: nothing more is asked for.
        seen = observations()
        eventually(
            lambda: observations() >= seen + 3,
            DEADLINE,
            what="observed three more times",
            log=daemon.log,
        )
        assert len(fake.pve.migrations) == requested
        assert daemon.stop() == 0
        log = daemon.log()
    moved = migrations(tmp_path)
    assert len(moved) == requested and {outcome for *_, outcome in moved} == {"done"}
    assert daemon.count(r"done (?:\S+ \()?\d+\)? pve1 → ") == requested
    after = memory_fractions(fake)
    assert max(after.values()) - min(after.values()) <= 0.10, after
    assert_no_secret(tmp_path, log)
