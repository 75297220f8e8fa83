"""Incus's own placement rules, honoured by ``opendrs run --once`` (a subprocess) against the fake
Incus API: ``scheduler.instance``, ``cluster.evacuate`` and the boot state of a stateful VM, the
placement scriptlet (Incus's documented example and hostile ones), ``limits.cpu`` topologies,
members being evacuated or restored, projects that block choosing a member."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
pytest.importorskip("aiohttp", reason="the fake Incus API is an aiohttp server")
pytest.importorskip("starlark", reason="the placement scriptlet runs in starlark-pyo3")

from backends.fakeincus import GiB, Served
from backends.incus_fixture import CROWDED_VMS, history, opendrs, serve_crowded, write_config
from opendrs.model import snapshot

VMS = list(CROWDED_VMS)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Served]:
    yield from serve_crowded(tmp_path)


STATEFUL = {"limits.cpu": "2", "limits.memory": "8GiB", "migration.stateful": "true"}
ROOT = {"root": {"type": "disk", "pool": "ceph", "path": "/", "size": "10GiB"}}
#: Incus's example placement scriptlet (doc/explanation/clustering.md), as an operator pastes it.
DOC_EXAMPLE = """
def instance_placement(request, candidate_members):
    # Example of logging info, this will appear in Incus' log.
    log_info("instance placement started: ", request)

    # Example of applying logic based on the instance request.
    if request.name == "foo":
        # Example of logging an error, this will appear in Incus' log.
        log_error("Invalid name supplied: ", request.name)

        fail("Invalid name") # Exit with an error to reject instance placement.

    # Place the instance on the first candidate server provided.
    set_target(candidate_members[0].server_name)

    return # Return empty to allow instance placement to proceed.
"""


def run_once(
    tmp_path: Path, server: Served, *, mode: str = "shadow", backend: str = "", extra: str = ""
) -> str:
    """``opendrs run --once``: its log (the run must succeed)."""
    path = write_config(tmp_path, server, mode=mode, backend=backend, extra=extra, level="info")
    result = opendrs("run", "--config", str(path), "--once")
    assert result.returncode == 0, result.stderr
    return result.stderr


def would_move(log: str) -> dict[str, str]:
    """The shadow moves a run logged: guest → target (an instance of another project is logged
    as ``name (project/name)``: its id)."""
    moves = {}
    for label, target in re.findall(r"shadow: would migrate (.+?) \S+ → (\S+)", log):
        named = re.fullmatch(r".+ \((\S+)\)", label)
        moves[named[1] if named else label] = target
    return moves


def last_reason(tmp_path: Path) -> str:
    (row,) = history(tmp_path, "SELECT reason FROM decisions ORDER BY id DESC LIMIT 1")
    return str(row[0])


def moves_posted(server: Served) -> list[tuple[str, str, bool]]:
    """The moves sent: (instance, target, live)."""
    return [
        (r[1].rsplit("/", 1)[-1], r[2]["target"], bool(r[3]["live"]))
        for r in server.fake.requests
        if r[0] == "POST" and r[1].startswith("/1.0/instances/")
    ]


# -- scheduler.instance ---------------------------------------------------------------------------


def test_manual_and_group_members_are_no_balancing_targets(tmp_path: Path, fake: Served) -> None:
    fake.fake.members["m2"].config["scheduler.instance"] = "manual"
    fake.fake.members["m3"].config["scheduler.instance"] = "group"
    log = run_once(tmp_path, fake)
    assert would_move(log) == {}
    assert last_reason(tmp_path).endswith(
        "6 candidates, all excluded: 6 with no node their rules allow "
        "(scheduler.instance: m2 manual, m3 group)"
    )


def test_a_group_member_takes_the_instances_that_target_its_group(
    tmp_path: Path, fake: Served
) -> None:
    fake.fake.members["m2"].config["scheduler.instance"] = "manual"
    fake.fake.members["m3"].config["scheduler.instance"] = "group"
    fake.fake.members["m3"].groups = ["default", "fast"]
    for name in ("vm5", "vm6"):  # created with --target @default
        fake.fake.instance(name).config["volatile.cluster.group"] = "default"
    log = run_once(tmp_path, fake)
    assert would_move(log) == {"vm5": "m3", "vm6": "m3"}


# -- cluster.evacuate, migration.stateful and the boot state --------------------------------------


def test_stop_and_migrate_instances_never_move_live(tmp_path: Path, fake: Served) -> None:
    for index, name in enumerate(VMS):
        fake.fake.instance(name).config["cluster.evacuate"] = ("stop", "migrate")[index % 2]
    log = run_once(tmp_path, fake, mode="active")
    assert moves_posted(fake) == []
    assert would_move(log) == {}
    reason = last_reason(tmp_path)
    assert "3 locked (cluster.evacuate=stop: Incus never moves it live)" in reason
    assert "3 locked (cluster.evacuate=migrate: Incus never moves it live)" in reason

    # With restart moves allowed, they move stopped: stop, a cold move, start.
    run_once(tmp_path, fake, mode="active", extra="settings: {allow_restart_migration: true}\n")
    posted = moves_posted(fake)
    assert posted and all(not live for _, _, live in posted)
    rows = history(tmp_path, "SELECT guest, target, outcome FROM migrations")
    assert rows and all(outcome == "done" for _, _, outcome in rows)
    for guest, target, _ in rows:
        instance = fake.fake.instance(str(guest))
        assert (instance.location, instance.status) == (target, "Running")
    stops = [r for r in fake.fake.requests if r[0] == "PUT" and r[3].get("action") == "stop"]
    assert len(stops) == len(posted)


def test_auto_and_live_migrate_follow_migration_stateful(tmp_path: Path, fake: Served) -> None:
    fake.fake.instance("vm1").config["cluster.evacuate"] = "live-migrate"
    fake.fake.instance("vm2").config["cluster.evacuate"] = "auto"
    for name in VMS[2:]:
        fake.fake.instance(name).config["migration.stateful"] = "false"
    run_once(tmp_path, fake, mode="active")
    posted = moves_posted(fake)
    assert {name for name, _, _ in posted} == {"vm1", "vm2"}
    assert all(live for _, _, live in posted)


def test_a_vm_made_stateful_after_it_booted_moves_live_only_after_a_restart(
    tmp_path: Path, fake: Served
) -> None:
    fake.fake.version = "7.0"  # Incus 7 records the boot state, and checks it
    log = run_once(tmp_path, fake, mode="active")
    assert moves_posted(fake) == [] and would_move(log) == {}
    assert last_reason(tmp_path).endswith(
        "6 candidates, all excluded: 6 locked (migration.stateful was set after it started: "
        "Incus moves it live after a restart)"
    )

    # A restart move starts it again, with its boot state recorded: it may move live next time.
    run_once(tmp_path, fake, mode="active", extra="settings: {allow_restart_migration: true}\n")
    restarted = [name for name, _, live in moves_posted(fake) if not live]
    assert restarted and len(restarted) == len(moves_posted(fake))
    for name in restarted:
        assert "volatile.vm.boot_state" in fake.fake.instance(name).config
    assert history(tmp_path, "SELECT * FROM migrations WHERE outcome != 'done'") == []

    # Booted stateful, they may move live.
    booted = json.dumps({"version": 1, "machine_type": "pc-q35-9.2"})
    for name in VMS:
        fake.fake.instance(name).config["volatile.vm.boot_state"] = booted
        fake.fake.instance(name).config.pop("volatile.rebalance.last_move", None)
        fake.fake.instance(name).location = "m1"
    fake.fake.requests.clear()
    (tmp_path / "again").mkdir()
    run_once(tmp_path / "again", fake, mode="active")
    posted = moves_posted(fake)
    assert posted and all(live for _, _, live in posted)


def test_lts_servers_do_not_check_the_boot_state(tmp_path: Path, fake: Served) -> None:
    assert fake.fake.version.startswith("6.0")
    log = run_once(tmp_path, fake)
    assert len(would_move(log)) >= 2


# -- the placement scriptlet ----------------------------------------------------------------------


def test_the_documented_example_scriptlet_chooses_the_targets(tmp_path: Path, fake: Served) -> None:
    fake.fake.members["m3"].load1 = 8.0  # m2 is the least loaded candidate: listed first
    fake.fake.add_instance(
        "foo", "m1", config=dict(STATEFUL), devices=ROOT, memory_usage=7 * GiB, cpu_rate=0.0
    )
    fake.fake.members["m1"].used_memory += 7 * GiB
    fake.fake.config["instances.placement.scriptlet"] = DOC_EXAMPLE
    log = run_once(tmp_path, fake)
    moves = would_move(log)
    assert moves and set(moves.values()) == {"m2"} and "foo" not in moves
    assert "placement scriptlet (vm1): instance placement started: {" in log
    assert "'reason': 'rebalance'" in log and "'project': 'default'" in log
    assert "placement scriptlet (foo): Invalid name supplied: foo" in log
    assert (
        "WARNING instance foo: instances.placement.scriptlet failed: fail: Invalid name "
        "(scriptlet:11:9): it stays on m1" in log
    )


def test_a_scriptlet_reads_members_and_the_instance(tmp_path: Path, fake: Served) -> None:
    # Incus's functions: the members' resources and state, the instance's resources, the
    # instances, the members of a group, the project.
    fake.fake.members["m2"].used_memory = 40 * GiB
    fake.fake.config["instances.placement.scriptlet"] = """
def instance_placement(request, candidate_members):
    need = get_instance_resources().memory_size
    best = None
    for member in candidate_members:
        name = member.server_name
        memory = get_cluster_member_resources(name).memory
        busy = get_cluster_member_state(name).sysinfo.load_averages[0]
        free = memory.total - memory.used
        if free >= need and busy < 4 and (best == None or free > best[1]):
            best = (name, free)
    if get_project(request.project).name != "default":
        fail("wrong project")
    if len(get_instances(location = "m1")) != get_instances_count(location = "m1"):
        fail("counts differ")
    if [m.server_name for m in get_cluster_members()] != ["m1", "m2", "m3"]:
        fail("members")
    if best != None:
        log_warn("most free memory on ", best[0])
        set_target(best[0])
"""
    log = run_once(tmp_path, fake)
    moves = would_move(log)
    assert moves and set(moves.values()) == {"m3"}
    assert "placement scriptlet (vm1): most free memory on m3" in log


def test_a_scriptlet_that_picks_a_member_without_room_keeps_the_guests(
    tmp_path: Path, fake: Served
) -> None:
    fake.fake.members["m3"].used_memory = 60 * GiB
    fake.fake.config["instances.placement.scriptlet"] = """
def instance_placement(request, candidate_members):
    set_target("m3")
"""
    log = run_once(tmp_path, fake)
    assert would_move(log) == {}
    assert "(instances.placement.scriptlet chose m3)" in last_reason(tmp_path)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (
            'def instance_placement(request, candidate_members):\n    open("/etc/passwd")\n',
            "Variable `open` not found",
        ),
        (
            'load("secrets.star", "key")\ndef instance_placement(request, candidate_members):\n'
            "    pass\n",
            "`load` is not allowed",
        ),
        (
            'def instance_placement(request, candidate_members):\n    set_target("elsewhere")\n',
            "Invalid member name: elsewhere",
        ),
        (
            "def instance_placement(request, candidate_members):\n    return 1\n",
            "it returned 1 instead of nothing",
        ),
        (
            "def place(request, candidate_members):\n    pass\n",
            "Variable `instance_placement` not found",
        ),
        (
            "def instance_placement(request, candidate_members):\n"
            "    instance_placement(request, candidate_members)\n",
            "Starlark call stack overflow",
        ),
    ],
    ids=["file", "load", "unknown-member", "return-value", "no-function", "recursion"],
)
def test_a_hostile_or_broken_scriptlet_keeps_every_guest_where_it_is(
    tmp_path: Path, fake: Served, source: str, reason: str
) -> None:
    fake.fake.config["instances.placement.scriptlet"] = source
    log = run_once(tmp_path, fake, mode="active")
    assert moves_posted(fake) == []
    assert would_move(log) == {}
    assert reason in last_reason(tmp_path)
    assert "instances.placement.scriptlet" in last_reason(tmp_path)


def test_an_endless_scriptlet_is_cut_off_by_its_time_limit(tmp_path: Path, fake: Served) -> None:
    fake.fake.config["instances.placement.scriptlet"] = """
def instance_placement(request, candidate_members):
    for i in range(2000000000):
        for j in range(2000000000):
            pass
"""
    started = time.monotonic()
    log = run_once(tmp_path, fake, mode="active", backend=", scriptlet_timeout: 1s")
    assert time.monotonic() - started < 30
    assert moves_posted(fake) == []
    reason = last_reason(tmp_path)
    assert "1 locked (instances.placement.scriptlet failed: it ran longer than" in reason
    assert "scriptlet_timeout (1 s))" in reason
    assert "5 locked (instances.placement.scriptlet was not run: a run on vm1 ran longer" in reason
    assert log.count("WARNING instance") == 1  # the others are not run


def test_placement_scriptlet_false_leaves_it_unused(tmp_path: Path, fake: Served) -> None:
    fake.fake.config["instances.placement.scriptlet"] = (
        "def instance_placement(r, c):\n  fail('x')\n"
    )
    log = run_once(tmp_path, fake, backend=", placement_scriptlet: false")
    assert len(would_move(log)) >= 2


# -- limits.cpu topology, members in transition, projects that block targets ---------------------


def test_a_cpu_topology_counts_its_vcpus(tmp_path: Path, fake: Served) -> None:
    fake.fake.instance("vm1").config["limits.cpu"] = "sockets=2,cores=4,threads=2"
    fake.fake.instance("vm2").config["limits.cpu"] = "cores=3"
    path = tmp_path / "opendrs.yaml"
    path.write_text(f"version: 1\nbackend: {{type: incus, socket: {fake.socket}}}\n")
    out = tmp_path / "live.yaml"
    result = opendrs("snapshot", "--config", str(path), "-o", str(out))
    assert result.returncode == 0, result.stderr
    cluster = snapshot.load(out)
    assert (cluster.guest("vm1").cpu, cluster.guest("vm2").cpu) == (16.0, 3.0)


def test_members_being_evacuated_or_restored_are_online_and_no_targets(
    tmp_path: Path, fake: Served
) -> None:
    fake.fake.members["m2"].status = "Evacuating"
    fake.fake.members["m3"].status = "Restoring"
    fake.fake.add_instance("back", "m3", config=dict(STATEFUL), devices=ROOT, cpu_rate=0.0)
    log = run_once(tmp_path, fake, mode="active")
    assert moves_posted(fake) == []
    assert "member m2 is offline" not in log and "m3 is offline" not in log
    path = tmp_path / "snap.yaml"
    path.write_text(f"version: 1\nbackend: {{type: incus, socket: {fake.socket}}}\n")
    out = tmp_path / "live.yaml"
    assert opendrs("snapshot", "--config", str(path), "-o", str(out)).returncode == 0
    cluster = snapshot.load(out)
    for name in ("m2", "m3"):
        assert cluster.node(name).online and cluster.node(name).maintenance
    assert cluster.guest("back").lock == "its member m3 is Restoring: Incus is moving its instances"


@pytest.mark.parametrize(("target", "moves"), [(None, False), ("block", False), ("allow", True)])
def test_a_project_that_blocks_targets_keeps_its_instances(
    tmp_path: Path, fake: Served, target: str | None, moves: bool
) -> None:
    fake.fake.projects["web"] = {"restricted": "true"}
    if target is not None:
        fake.fake.projects["web"]["restricted.cluster.target"] = target
    for name in VMS:
        fake.fake.instances[("web", name)] = fake.fake.instances.pop(("default", name))
        fake.fake.instance(name, "web").project = "web"
    log = run_once(tmp_path, fake, backend=", project: web")
    assert bool(would_move(log)) is moves
    if not moves:
        assert (
            "6 locked (project web has restricted.cluster.target=block: Incus keeps it where it "
            "is)" in last_reason(tmp_path)
        )
