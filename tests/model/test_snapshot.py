"""The snapshot file format: opendrs.model.snapshot."""

from __future__ import annotations

import copy
import json
import pickle
import re
import tempfile
from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opendrs.model import document, snapshot
from opendrs.model.cluster import (
    HA_STATES,
    Cluster,
    Disk,
    Guest,
    Node,
    Pressure,
    Settings,
)
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.model.snapshot import (
    SnapshotError,
    dumps,
    from_dict,
    load,
    load_demo,
    loads,
    to_dict,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs" / "snapshot-format.md"
#: Snapshots among the examples (examples/proxmox.yaml and incus.yaml are configuration files, see
#: tests/backends/test_proxmox.py and test_incus_client.py).
EXAMPLE_FILES = sorted(
    p
    for p in EXAMPLES.iterdir()
    if p.suffix in (".yaml", ".yml", ".json") and p.name not in ("proxmox.yaml", "incus.yaml")
)
GIB = 1024**3
MIB = 1024**2

MINIMAL = """\
version: 1
nodes:
  pve1: {cpu: 8, memory: 32GiB}
  pve2: {cpu: 8, memory: 32GiB}
guests:
  - {id: 101, node: pve1, memory: 4GiB}
  - {id: 102, node: pve2, memory: 4GiB}
  - {id: 103, node: pve2, memory: 4GiB}
"""


def _all_clusters() -> list[tuple[str, Cluster]]:
    return [(p.name, load(p)) for p in EXAMPLE_FILES] + [("demo", load_demo())]


def _error(text: str | bytes, filename: str = "t.yaml", **kwargs: Any) -> SnapshotError:
    with pytest.raises(SnapshotError) as info:
        loads(text, filename=filename, **kwargs)
    return info.value


def _assert_one_line(error: SnapshotError) -> None:
    message = str(error)
    assert message.splitlines() == [message], message
    assert message.isprintable(), message
    assert "internal error" not in message, message


def _document(extra: str = "") -> str:
    return MINIMAL + extra


# --------------------------------------------------------------------------------------------
# Shipped files


def test_examples_exist_and_do_not_duplicate_the_demo() -> None:
    names = {p.name for p in EXAMPLE_FILES}
    assert {"small.yaml", "small.json", "rules.yaml"} <= names
    assert "demo.yaml" not in names


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_every_example_loads(path: Path) -> None:
    cluster = load(path)
    assert cluster.nodes
    assert cluster.guests
    assert cluster.name == path.stem


def test_small_json_is_the_same_cluster_as_small_yaml() -> None:
    assert load(EXAMPLES / "small.json") == load(EXAMPLES / "small.yaml")


def test_small_example_contents() -> None:
    cluster = load(EXAMPLES / "small.yaml")
    assert [n.name for n in cluster.nodes] == ["pve1", "pve2", "pve3"]
    assert [g.id for g in cluster.guests] == [
        "100",
        "101",
        "102",
        "103",
        "104",
        "200",
        "201",
        "105",
    ]
    assert cluster.settings == Settings(reserve_memory=2 * GIB, min_uptime=300)
    pve1, _, pve3 = cluster.nodes
    assert pve1.base_cpu == 0.3 and pve1.base_memory == 2 * GIB
    assert dict(pve1.storage) == {"local-lvm": 1024**4}
    assert (pve3.reserve_cpu, pve3.reserve_memory) == (1.0, 4 * GIB)
    assert cluster.reserve_memory(pve1) == 2 * GIB
    assert cluster.reserve_memory(pve3) == 4 * GIB
    db = cluster.guest("100")
    assert db.disks == (Disk("ceph", 100 * GIB, shared=True),)
    assert (db.cpu_used, db.memory_used) == (2.5, 14 * GIB)
    assert (db.ha, db.ha_state, db.priority, db.uptime) == (True, "started", 3, 12 * 86400)
    assert cluster.guest("103").disks == (Disk("local-lvm", 200 * GIB, shared=False),)
    assert cluster.guest("103").local_disk_bytes == 200 * GIB
    assert cluster.guest("104").devices == ("hostpci0",)
    assert cluster.guest("200").kind == "ct"
    assert cluster.guest("200").cpu == 1.0
    assert cluster.guest("105").state == "stopped"
    assert cluster.guest("105").cpu_used is None
    assert cluster.rules == Rules(
        guest_affinity=(
            GuestAffinity("dns-apart", ("200", "201"), positive=False, hard=True),
            GuestAffinity("web-together", ("101", "102"), positive=True, hard=False),
        )
    )


def test_rules_example_shows_every_rule_type() -> None:
    text = (EXAMPLES / "rules.yaml").read_text()
    types = set(re.findall(r"^\s*- type: ([a-z-]+)", text, re.MULTILINE))
    assert types == set(snapshot.RULE_TYPES)
    rules = load(EXAMPLES / "rules.yaml").rules
    assert rules.node_affinity == (
        NodeAffinity("db-on-fast", ("100", "101"), {"pve1": 2, "pve2": 2, "pve3": 1}, True),
        NodeAffinity("node-affinity-2", ("102", "103"), {"pve1": 0, "pve3": 0}, False),
        NodeAffinity("pin-105", ("105",), {"pve3": 0}, True),
    )
    assert rules.guest_affinity == (
        GuestAffinity("app-cache", ("103", "104"), positive=True, hard=True),
        GuestAffinity("dns-apart", ("106", "107"), positive=False, hard=False),
    )
    assert rules.ignored == frozenset({"108", "109"})


def test_docs_examples_load() -> None:
    text = DOCS.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    documents = [b for b in blocks if re.search(r"^version: 1$", b, re.MULTILINE)]
    assert documents, "the docs should hold a complete example"
    for block in documents:
        assert loads(block, filename="small.yaml") == load(EXAMPLES / "small.yaml")


def test_demo_is_package_data_and_named() -> None:
    resource = resources.files("opendrs") / "data" / "demo.yaml"
    assert resource.is_file()
    assert load_demo().name == "demo"


def test_demo_is_realistic() -> None:
    demo = load_demo()
    assert len(demo.nodes) == 5
    assert 35 <= len(demo.guests) <= 45
    assert {(n.cpu, n.memory // GIB) for n in demo.nodes} == {(32, 256), (24, 128), (16, 64)}
    assert not any(n.maintenance or not n.online for n in demo.nodes)
    assert demo.settings.mode == "dynamic"
    assert demo.settings.reserve_memory == 4 * GIB
    kinds = [g.kind for g in demo.guests]
    assert kinds.count("vm") > kinds.count("ct") >= 3
    assert sum(g.state == "stopped" for g in demo.guests) >= 2
    running = [g for g in demo.guests if g.state == "running"]
    assert all(g.cpu_used is not None and g.memory_used is not None for g in running)
    assert any(g.local_disk_bytes for g in demo.guests)
    assert any(d.startswith("hostpci") for g in demo.guests for d in g.devices)
    assert sum(g.ha for g in demo.guests) >= 3
    rules = demo.rules
    assert any(r.strict and len(set(r.nodes.values())) == 1 for r in rules.node_affinity)
    assert any(r.hard and not r.positive and len(r.guests) == 2 for r in rules.guest_affinity)
    assert any(not r.hard and r.positive for r in rules.guest_affinity)
    assert rules.ignored


def test_demo_is_valid_now() -> None:
    """No node over capacity and every hard rule satisfied by the current placement."""
    demo = load_demo()
    for node in demo.nodes:
        guests = demo.guests_on(node.name)
        assert sum(g.cpu for g in guests) <= node.cpu * demo.settings.cpu_overcommit
        assert sum(g.memory for g in guests) <= node.memory - demo.reserve_memory(node)
        for pool, capacity in node.storage.items():
            used = sum(d.size for g in guests for d in g.disks if d.pool == pool and d.local)
            assert used <= capacity, (node.name, pool)
    usable = frozenset(n.name for n in demo.nodes if n.usable)
    for rule in demo.rules.node_affinity:
        if rule.strict:
            for guest in rule.guests:
                assert demo.guest(guest).node in rule.top_nodes(usable), rule.name
    for group in demo.rules.guest_affinity:
        if group.hard:
            nodes = [demo.guest(g).node for g in group.guests]
            if group.positive:
                assert len(set(nodes)) == 1, group.name
            else:
                assert len(set(nodes)) == len(nodes), group.name


def test_demo_is_unbalanced() -> None:
    demo = load_demo()

    def cpu_share(node: Node) -> float:
        running = [g for g in demo.guests_on(node.name) if g.state == "running"]
        return (node.base_cpu + sum(g.cpu_load for g in running)) / node.cpu

    shares = sorted(cpu_share(n) for n in demo.nodes)
    assert shares[-1] > 0.75
    assert shares[0] < 0.15
    busiest = max(demo.nodes, key=cpu_share)
    assert len(demo.guests_on(busiest.name)) >= len(demo.guests) / 4


# --------------------------------------------------------------------------------------------
# Reading details


def test_minimal_document_and_defaults() -> None:
    cluster = loads(MINIMAL, filename="lab/minimal.yaml")
    assert cluster.name == "minimal"
    assert cluster.settings == Settings()
    assert cluster.rules == Rules()
    assert cluster.nodes[0] == Node("pve1", 8.0, 32 * GIB)
    assert cluster.guests[0] == Guest(id="101", node="pve1", memory=4 * GIB)


@pytest.mark.parametrize(
    ("filename", "expected"),
    [("<string>", "cluster"), ("x/y/prod.json", "prod"), ("a.b.yaml", "a.b"), ("noext", "noext")],
)
def test_default_name_is_the_file_stem(filename: str, expected: str) -> None:
    text = json.dumps(to_dict(loads(MINIMAL)) | {"name": None})
    assert loads(text, filename=filename, fmt="json").name == expected


def test_name_key_wins_and_ids_become_strings() -> None:
    cluster = loads(_document("name: 42\n"), filename="file.yaml")
    assert cluster.name == "42"
    assert [g.id for g in cluster.guests] == ["101", "102", "103"]
    quoted = loads(MINIMAL.replace("id: 101", "id: '0101'"))
    assert quoted.guests[0].id == "0101"


def test_everything_is_read() -> None:
    text = """
version: 1
name: full
settings:
  mode: static
  cpu_overcommit: 2.5
  memory_overcommit: 1.2
  reserve: {cpu: 1, memory: 4GiB}
  allow_restart_migration: true
  min_uptime: 1d 6h
  weights: {cpu: 2, memory: 0}
storage:
  ceph: {shared: true}
  nfs:
  local-zfs: {shared: false}
nodes:
  b:
    cpu: 12.5
    memory: 2GiB
    arch: aarch64
    online: false
    maintenance: true
    tags: [x, 7]
    storage: {zz: 1TB, local-zfs: 2GiB}
    reserve: {memory: 1GiB}
    usage: {cpu: 0.5}
    pressure: {cpu: 1.5, memory: 2, io: 3, memory_full: 4, io_full: 5}
  a: {cpu: 2, memory: 8GiB}
guests:
  - id: x1
    name: 5
    kind: ct
    node: b
    state: paused
    cpu: 0.5
    memory: 100MiB
    disks: [{pool: ceph, size: 1GiB}, {pool: nfs, size: 3}, {pool: local-zfs, size: 2KiB}]
    usage: {memory: 50MiB}
    pressure: {io: 9.5}
    devices: [hostpci0, usb1]
    uptime: 90
    lock: backup
    ha: true
    ha_state: migrate
    tags: [t]
    priority: 1
    migrating_to: a
    arch: aarch64
"""
    cluster = loads(text)
    assert cluster.name == "full"
    assert cluster.settings == Settings(
        mode="static",
        cpu_overcommit=2.5,
        memory_overcommit=1.2,
        reserve_cpu=1.0,
        reserve_memory=4 * GIB,
        allow_restart_migration=True,
        min_uptime=86400 + 6 * 3600,
        weight_cpu=2.0,
        weight_memory=0.0,
    )
    assert cluster.nodes == (
        Node(
            "b",
            12.5,
            2 * GIB,
            storage={"zz": 10**12, "local-zfs": 2 * GIB},
            arch="aarch64",
            online=False,
            maintenance=True,
            tags=("x", "7"),
            reserve_cpu=None,
            reserve_memory=GIB,
            base_cpu=0.5,
            base_memory=0,
            pressure=Pressure(1.5, 2.0, 3.0, 4.0, 5.0),
        ),
        Node("a", 2.0, 8 * GIB),
    )
    assert list(cluster.nodes[0].storage) == ["zz", "local-zfs"]
    assert cluster.guests == (
        Guest(
            id="x1",
            node="b",
            kind="ct",
            name="5",
            state="paused",
            cpu=0.5,
            memory=100 * MIB,
            disks=(Disk("ceph", GIB, True), Disk("nfs", 3, False), Disk("local-zfs", 2048, False)),
            cpu_used=None,
            memory_used=50 * MIB,
            pressure=Pressure(io=9.5),
            devices=("hostpci0", "usb1"),
            uptime=90,
            lock="backup",
            ha=True,
            ha_state="migrate",
            tags=("t",),
            priority=1,
            migrating_to="a",
            arch="aarch64",
        ),
    )
    assert from_dict(to_dict(cluster)) == cluster
    assert loads(dumps(cluster)) == cluster


def test_rules_are_read_with_defaults_and_order() -> None:
    rules = loads(
        _document(
            """
rules:
  - {type: ignore, guests: [101]}
  - {type: node-affinity, guests: [101, 102], nodes: {pve2: 1, pve1: 3}}
  - {type: anti-affinity, guests: [102, 103]}
  - {type: pin, guests: [102, 103], nodes: [pve2]}
  - {type: node-affinity, guests: [103], nodes: [pve1], strict: true}
  - {type: affinity, name: ab, guests: [101, 103], hard: false}
  - {type: ignore, guests: [103, 101]}
  - {type: anti-affinity, guests: [101, 102], hard: true}
"""
        )
    ).rules
    assert rules.node_affinity == (
        NodeAffinity("node-affinity-1", ("101", "102"), {"pve2": 1, "pve1": 3}, strict=False),
        NodeAffinity("pin-102-103", ("102", "103"), {"pve2": 0}, strict=True),
        NodeAffinity("node-affinity-2", ("103",), {"pve1": 0}, strict=True),
    )
    assert rules.guest_affinity == (
        GuestAffinity("anti-affinity-1", ("102", "103"), positive=False, hard=True),
        GuestAffinity("ab", ("101", "103"), positive=True, hard=False),
        GuestAffinity("anti-affinity-2", ("101", "102"), positive=False, hard=True),
    )
    assert rules.ignored == frozenset({"101", "103"})
    assert rules.node_affinity[0].top_nodes({"pve1", "pve2"}) == {"pve1"}


def test_bom_and_bytes_are_accepted() -> None:
    assert loads(b"\xef\xbb\xbf" + MINIMAL.encode()) == loads(MINIMAL)
    assert loads(bytearray(MINIMAL.encode())) == loads(MINIMAL)


def test_yaml_anchors_and_merge_keys_work() -> None:
    text = """
version: 1
nodes:
  pve1: &big {cpu: 8, memory: 32GiB}
  pve2: {<<: *big, cpu: 4}
"""
    cluster = loads(text)
    assert [(n.cpu, n.memory) for n in cluster.nodes] == [(8, 32 * GIB), (4, 32 * GIB)]


def test_load_and_dump_files(tmp_path: Path) -> None:
    cluster = load(EXAMPLES / "small.yaml")
    for name in ("out.yaml", "out.json", "out.yml"):
        snapshot.dump(cluster, tmp_path / name)
        assert load(tmp_path / name) == cluster
    assert (tmp_path / "out.json").read_text().startswith("{")
    assert load(str(tmp_path / "out.yaml")) == cluster


# --------------------------------------------------------------------------------------------
# Writing


@pytest.mark.parametrize(("label", "cluster"), _all_clusters(), ids=lambda v: str(v)[:20])
def test_round_trips(label: str, cluster: Cluster) -> None:
    assert from_dict(to_dict(cluster)) == cluster
    for fmt in ("yaml", "json"):
        text = dumps(cluster, fmt)
        again = loads(text, fmt=fmt)
        assert again == cluster, label
        assert dumps(again, fmt) == text
    assert json.loads(dumps(cluster, "json")) == to_dict(cluster)


def test_to_dict_is_short_but_complete() -> None:
    document = to_dict(loads(MINIMAL, filename="m.yaml"))
    assert document == {
        "version": 1,
        "name": "m",
        "nodes": {"pve1": {"cpu": 8, "memory": "32GiB"}, "pve2": {"cpu": 8, "memory": "32GiB"}},
        "guests": [
            {"id": 101, "node": "pve1", "memory": "4GiB"},
            {"id": 102, "node": "pve2", "memory": "4GiB"},
            {"id": 103, "node": "pve2", "memory": "4GiB"},
        ],
    }
    empty = Cluster((Node("n", 1, 1),), ())
    assert to_dict(empty) == {
        "version": 1,
        "name": "cluster",
        "nodes": {"n": {"cpu": 1, "memory": "1B"}},
        "guests": [],
    }


def test_dump_text_is_readable() -> None:
    text = dumps(loads(MINIMAL, filename="m.yaml"))
    assert text == (
        "version: 1\nname: m\nnodes:\n  pve1: {cpu: 8, memory: 32GiB}\n"
        "  pve2: {cpu: 8, memory: 32GiB}\nguests:\n"
        "  - {id: 101, node: pve1, memory: 4GiB}\n"
        "  - {id: 102, node: pve2, memory: 4GiB}\n"
        "  - {id: 103, node: pve2, memory: 4GiB}\n"
    )


def test_sizes_and_durations_are_written_compactly() -> None:
    node = Node("n", 2.0, 3 * GIB + 1, storage={"b": 5 * 1024**4, "a": 1536 * MIB})
    guest = Guest(id="7", node="n", memory=1536 * MIB, uptime=86400 + 61, cpu_used=0.25)
    document = to_dict(Cluster((node,), (guest,), settings=Settings(min_uptime=600)))
    assert document["nodes"]["n"] == {
        "cpu": 2,
        "memory": 3 * GIB + 1,
        "storage": {"a": "1536MiB", "b": "5TiB"},
    }
    assert document["guests"][0] == {
        "id": 7,
        "node": "n",
        "memory": "1536MiB",
        "usage": {"cpu": 0.25},
        "uptime": "1d 1m 1s",
    }
    assert document["settings"] == {"min_uptime": "10m"}


def test_pins_and_generated_names_survive_a_dump() -> None:
    rules = Rules(
        node_affinity=(
            NodeAffinity("node-affinity-1", ("101",), {"pve1": 1, "pve2": 2}),
            NodeAffinity("pin-102", ("102",), {"pve2": 0}, strict=True),
            NodeAffinity("custom-pin", ("103",), {"pve1": 0, "pve2": 0}, strict=True),
            NodeAffinity("node-affinity-9", ("103",), {"pve1": 0}),
            NodeAffinity("p", ("101",), {"pve1": 1, "pve2": 1}, strict=True),
        ),
        guest_affinity=(
            GuestAffinity("affinity-1", ("101", "102"), positive=True),
            GuestAffinity("anti-affinity-1", ("101", "102"), positive=False, hard=False),
            GuestAffinity("anti-affinity-1x", ("101", "103"), positive=False),
        ),
        ignored=frozenset({"103", "101"}),
    )
    cluster = replace(loads(MINIMAL), rules=rules)
    written = to_dict(cluster)["rules"]
    assert written == [
        {"type": "node-affinity", "guests": [101], "nodes": {"pve1": 1, "pve2": 2}},
        {"type": "pin", "guests": [102], "nodes": ["pve2"]},
        {"type": "pin", "name": "custom-pin", "guests": [103], "nodes": ["pve1", "pve2"]},
        {"type": "node-affinity", "name": "node-affinity-9", "guests": [103], "nodes": ["pve1"]},
        {
            "type": "node-affinity",
            "name": "p",
            "guests": [101],
            "nodes": {"pve1": 1, "pve2": 1},
            "strict": True,
        },
        {"type": "affinity", "guests": [101, 102]},
        {"type": "anti-affinity", "guests": [101, 102], "hard": False},
        {"type": "anti-affinity", "name": "anti-affinity-1x", "guests": [101, 103]},
        {"type": "ignore", "guests": [101, 103]},
    ]
    assert from_dict(to_dict(cluster)) == cluster


def test_to_dict_refuses_a_pool_both_shared_and_local() -> None:
    base = loads(MINIMAL)
    guests = (
        replace(base.guests[0], disks=(Disk("p", 1, shared=True),)),
        replace(base.guests[1], disks=(Disk("p", 1, shared=False),)),
    )
    with pytest.raises(ValueError, match="'p' is used both as a shared and as a local pool"):
        to_dict(replace(base, guests=guests))
    with pytest.raises(ValueError, match="unknown format"):
        dumps(base, "toml")


def test_dumps_does_not_depend_on_set_order() -> None:
    ids = [str(i) for i in range(200, 260)]
    nodes = (Node("n", 64, 512 * GIB),)
    guests = tuple(Guest(id=i, node="n", memory=GIB) for i in ids)
    first = Cluster(nodes, guests, Rules(ignored=frozenset(ids)))
    second = Cluster(nodes, guests, Rules(ignored=frozenset(reversed(ids))))
    assert dumps(first) == dumps(second)
    assert to_dict(first)["rules"] == [{"type": "ignore", "guests": [int(i) for i in ids]}]


# --------------------------------------------------------------------------------------------
# Errors


def test_error_shape() -> None:
    error = SnapshotError("a.yaml", "guests[3].memory", "required key is missing")
    assert str(error) == "a.yaml: guests[3].memory: required key is missing"
    assert isinstance(error, ValueError)
    assert (error.file, error.path, error.reason) == (
        "a.yaml",
        "guests[3].memory",
        "required key is missing",
    )
    whole = SnapshotError("a.yaml", "", "line 1, column 2: bad\nthing")
    assert str(whole) == "a.yaml: line 1, column 2: bad\\nthing"
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error)
    assert again.path == error.path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "t.yaml: the snapshot is empty (it needs at least `version: 1` and `nodes`)"),
        ("# only a comment\n", "t.yaml: the snapshot is empty"),
        (
            "version: 1\nname: a\n  b: c\n",
            "t.yaml: line 3, column 4: mapping values are not allowed here",
        ),
        (
            "version: 1\nnodes: {a: [1, 2}\n",
            "t.yaml: line 2, column 17: expected ',' or ']', but got '}'",
        ),
        (
            "a: 1\n---\nb: 2\n",
            "t.yaml: line 2, column 1: expected a single document in the stream, but found another",
        ),
        (
            'a: "x\0y"\n',
            "t.yaml: line 1, column 6: unacceptable character #x0000: special characters are not",
        ),
        (
            "a: !!python/object:os.system {}\n",
            "t.yaml: line 1, column 4: could not determine a constructor",
        ),
        (
            "version: 1\nnodes:\n  pve1: {cpu: 1, memory: 1}\n  pve1: {cpu: 2, memory: 2}\n",
            "t.yaml: line 4, column 3: duplicate key 'pve1'",
        ),
        ("a: {b: 1, b: 2}\n", "t.yaml: line 1, column 11: duplicate key 'b'"),
        ("[" * 1000, "t.yaml: the document is nested too deeply"),
        ("- 1\n- 2\n", "t.yaml: expected a mapping at the top level, got a list"),
        ("just text\n", "t.yaml: expected a mapping at the top level, got 'just text'"),
        (
            "version: 1\nnodes: {a: {cpu: 1, memory: 1}}\nguests:\n  - id: 1\n\tnode: a\n",
            "t.yaml: line 5, column 1: found character '\\t' that cannot start any token",
        ),
    ],
)
def test_whole_file_errors(text: str, message: str) -> None:
    error = _error(text)
    assert error.path == ""
    assert str(error).startswith(message)
    _assert_one_line(error)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "t.json: line 1, column 1: Expecting value"),
        (
            '{"version": 1,\n "nodes": {,}}',
            "t.json: line 2, column 12: Expecting property name enclosed in double quotes",
        ),
        ('{"version": 1', "t.json: line 1, column 14: Expecting ',' delimiter"),
        ("[" * 100_000, "t.json: the document is nested too deeply"),
        (
            '{"v": ' + "9" * 5000 + "}",
            "t.json: cannot read a value: a number of 5000 digits (at most 4300)",
        ),
        ("[]", "t.json: expected a mapping at the top level, got a list"),
        ("null", "t.json: the snapshot is empty"),
    ],
)
def test_whole_file_errors_json(text: str, message: str) -> None:
    error = _error(text, filename="t.json")
    assert str(error).startswith(message)
    _assert_one_line(error)


def test_json_duplicate_keys_have_a_path() -> None:
    document = to_dict(loads(MINIMAL))
    text = json.dumps(document).replace('"cpu": 8,', '"cpu": 8, "cpu": 9,', 1)
    error = _error(text, filename="t.json")
    assert str(error) == "t.json: nodes.pve1.cpu: duplicate key"


def test_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    assert (
        str(_load_error(missing)) == f"{missing}: cannot read the file: No such file or directory"
    )
    assert str(_load_error(tmp_path)) == f"{tmp_path}: cannot read the file: Is a directory"
    binary = tmp_path / "garbage.yaml"
    binary.write_bytes(b"version: 1\nname: \xff\xfe\x00garbage")
    assert str(_load_error(binary)) == f"{binary}: line 2, column 7: not UTF-8 text (byte 0xff)"
    nul_path = str(tmp_path / "a\0b.yaml")
    assert "cannot read the file" in str(_load_error(nul_path))
    assert str(_load_error(None)) == "None: not a file path"  # type: ignore[arg-type]


def test_large_files_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(MINIMAL)
    monkeypatch.setattr(document, "MAX_FILE_BYTES", 100)
    assert str(_load_error(path)) == f"{path}: the file is larger than 100 bytes"
    monkeypatch.setattr(document, "MAX_FILE_BYTES", 10 * MIB)
    assert load(path).name == "big"


def _load_error(path: Any) -> SnapshotError:
    with pytest.raises(SnapshotError) as info:
        load(path)
    _assert_one_line(info.value)
    return info.value


def test_bad_arguments_are_snapshot_errors() -> None:
    assert (
        str(_error(MINIMAL, fmt="toml")) == "t.yaml: unknown format 'toml' (use 'yaml' or 'json')"
    )
    assert str(_error(42)) == "t.yaml: expected text or bytes, got 42"  # type: ignore[arg-type]
    with pytest.raises(SnapshotError, match=r"^<dict>: expected a mapping at the top level"):
        from_dict([1, 2])


def _set(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    document = copy.deepcopy(document)
    target: Any = document
    for part in path[:-1]:
        target = target[part]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


class _Deleted:
    """The value of a case that removes its key; named alike in every process, so that the cases'
    test ids are the same in each of pytest-xdist's workers."""

    def __repr__(self) -> str:
        return "<deleted>"


_DELETE = _Deleted()
_BASE = {
    "version": 1,
    "nodes": {"pve1": {"cpu": 8, "memory": "32GiB"}, "pve2": {"cpu": 8, "memory": "32GiB"}},
    "guests": [
        {"id": 101, "node": "pve1", "memory": "4GiB"},
        {"id": 102, "node": "pve2", "memory": "4GiB"},
        {"id": 103, "node": "pve2", "memory": "4GiB"},
    ],
}

# (change to _BASE, expected path, reason fragment)
FIELD_ERRORS: list[tuple[tuple[Any, ...], Any, str, str]] = [
    # version
    (("version",), _DELETE, "version", "required key is missing"),
    (("version",), 2, "version", "unsupported version 2 (this opendrs reads version 1)"),
    (("version",), "1", "version", "expected the number 1, got '1'"),
    (("version",), True, "version", "expected the number 1, got true"),
    # unknown keys
    (("verison",), 1, "verison", "unknown key (did you mean 'version'?)"),
    (("vms",), {}, "vms", "proxlb-solver scenario"),
    (("zzz",), 1, "zzz", "unknown key (expected one of version, name, settings"),
    (("nodes", "pve1", "memroy"), 1, "nodes.pve1.memroy", "did you mean 'memory'?"),
    (("guests", 1, "nmae"), "x", "guests[1].nmae", "did you mean 'name'?"),
    (("settings",), {"reserve": {"mem": 1}}, "settings.reserve.mem", "did you mean 'memory'?"),
    # name and top-level types
    (("name",), "", "name", "must not be empty"),
    (("name",), "a\nb", "name", "must contain only printable characters"),
    (("name",), [1], "name", "expected a name or a number, got a list"),
    (("settings",), [], "settings", "expected a mapping, got a list"),
    (("nodes",), _DELETE, "nodes", "required key is missing"),
    (("nodes",), {}, "nodes", "a snapshot needs at least one node"),
    (("nodes",), [{"cpu": 1}], "nodes", "expected a mapping of node name to node"),
    (("guests",), {"101": {}}, "guests", "expected a list of guests"),
    (("rules",), {}, "rules", "expected a list, got a mapping"),
    # settings
    (("settings",), {"mode": "fast"}, "settings.mode", "expected one of basic, static, dynamic"),
    (("settings",), {"mode": "dynamc"}, "settings.mode", "did you mean 'dynamic'?"),
    (("settings",), {"cpu_overcommit": 0}, "settings.cpu_overcommit", "must be greater than 0"),
    (("settings",), {"memory_overcommit": -1}, "settings.memory_overcommit", "greater than 0"),
    (("settings",), {"reserve": {"memory": "-1GiB"}}, "settings.reserve.memory", "cannot read"),
    (
        ("settings",),
        {"allow_restart_migration": "yes"},
        "settings.allow_restart_migration",
        "expected true or false",
    ),
    (("settings",), {"min_uptime": "5 minutes"}, "settings.min_uptime", "as a duration"),
    (("settings",), {"weights": {"cpu": 0, "memory": 0}}, "settings.weights", "must not both be 0"),
    (("settings",), {"weights": {"cpu": -1}}, "settings.weights.cpu", "must not be less than 0"),
    # storage
    (("storage",), {"ceph": {"shared": "yes"}}, "storage.ceph.shared", "expected true or false"),
    (("storage",), {"ceph": {"sharde": True}}, "storage.ceph.sharde", "did you mean 'shared'?"),
    (("storage",), {"ceph": True}, "storage.ceph", "expected a mapping, got true"),
    # nodes
    (("nodes", "pve1", "cpu"), _DELETE, "nodes.pve1.cpu", "required key is missing"),
    (("nodes", "pve1", "cpu"), 0, "nodes.pve1.cpu", "must be greater than 0, got 0"),
    (("nodes", "pve1", "cpu"), "8", "nodes.pve1.cpu", "expected a number, got '8'"),
    (("nodes", "pve1", "cpu"), float("nan"), "nodes.pve1.cpu", "expected a finite number"),
    (("nodes", "pve1", "cpu"), 10**20, "nodes.pve1.cpu", "number too large"),
    (("nodes", "pve1", "memory"), _DELETE, "nodes.pve1.memory", "required key is missing"),
    (("nodes", "pve1", "memory"), -5, "nodes.pve1.memory", "size must not be negative, got -5"),
    (("nodes", "pve1", "memory"), 0, "nodes.pve1.memory", "must be greater than 0"),
    (("nodes", "pve1", "memory"), "8 GiBs", "nodes.pve1.memory", "unknown size unit 'GiBs'"),
    (("nodes", "pve1", "memory"), "lots", "nodes.pve1.memory", "cannot read 'lots' as a size"),
    (("nodes", "pve1", "memory"), "9000PiB", "nodes.pve1.memory", "size too large (at most 8 PiB)"),
    (("nodes", "pve1", "memory"), "9" * 400 + "GiB", "nodes.pve1.memory", "size too large"),
    (("nodes", "pve1", "memory"), True, "nodes.pve1.memory", "got a boolean"),
    (("nodes", "pve1", "online"), 1, "nodes.pve1.online", "expected true or false, got 1"),
    (("nodes", "pve1", "tags"), "ssd", "nodes.pve1.tags", "expected a list, got 'ssd'"),
    (("nodes", "pve1", "tags"), ["a", None], "nodes.pve1.tags[1]", "got null (quote it)"),
    (("nodes", "pve1", "storage"), {"lvm": "2XB"}, "nodes.pve1.storage.lvm", "unknown size unit"),
    (
        ("nodes", "pve1", "reserve"),
        {"cpu": -1},
        "nodes.pve1.reserve.cpu",
        "must not be less than 0",
    ),
    (("nodes", "pve1", "usage"), {"memory": []}, "nodes.pve1.usage.memory", "got list"),
    (
        ("nodes", "pve1", "pressure"),
        {"cpu": 101},
        "nodes.pve1.pressure.cpu",
        "must not be more than 100",
    ),
    (("nodes", "pve1", "pressure"), {"psi": 1}, "nodes.pve1.pressure.psi", "unknown key"),
    (("nodes", "pve1", "arch"), "", "nodes.pve1.arch", "must not be empty"),
    (("nodes", "pve1.lab"), {"cpu": 0, "memory": 1}, 'nodes["pve1.lab"].cpu', "greater than 0"),
    # guests
    (("guests", 0), "101", "guests[0]", "expected a mapping, got '101'"),
    (("guests", 2, "id"), _DELETE, "guests[2].id", "required key is missing"),
    (("guests", 2, "id"), 101, "guests[2].id", "duplicate guest id '101' (also guests[0])"),
    (("guests", 2, "id"), "101", "guests[2].id", "duplicate guest id '101' (also guests[0])"),
    (("guests", 2, "id"), 1.5, "guests[2].id", "expected a name or a number, got 1.5 (quote it)"),
    (("guests", 2, "id"), -3, "guests[2].id", "expected a name or a number from 0"),
    (("guests", 2, "id"), "   ", "guests[2].id", "must not be empty"),
    (("guests", 1, "node"), _DELETE, "guests[1].node", "required key is missing"),
    (("guests", 1, "node"), "pve9", "guests[1].node", "unknown node 'pve9' (did you mean 'pve"),
    (("guests", 1, "node"), "zzz", "guests[1].node", "unknown node 'zzz'"),
    (("guests", 1, "memory"), _DELETE, "guests[1].memory", "required key is missing"),
    (("guests", 1, "memory"), "-4GiB", "guests[1].memory", "cannot read '-4GiB' as a size"),
    (("guests", 1, "memory"), 0, "guests[1].memory", "must be greater than 0, got 0"),
    (("guests", 1, "cpu"), -2, "guests[1].cpu", "must be greater than 0, got -2"),
    (("guests", 1, "kind"), "lxc", "guests[1].kind", "expected one of vm, ct, got 'lxc'"),
    (
        ("guests", 1, "state"),
        "halted",
        "guests[1].state",
        "expected one of running, stopped, paused",
    ),
    (("guests", 1, "disks"), [{"pool": "a"}], "guests[1].disks[0].size", "required key is missing"),
    (
        ("guests", 1, "disks"),
        [{"pool": "a", "size": "x"}],
        "guests[1].disks[0].size",
        "cannot read 'x'",
    ),
    (("guests", 1, "disks"), {"pool": "a"}, "guests[1].disks", "expected a list, got a mapping"),
    (("guests", 1, "usage"), {"cpu": "1"}, "guests[1].usage.cpu", "expected a number"),
    (("guests", 1, "uptime"), "soon", "guests[1].uptime", "cannot read 'soon' as a duration"),
    (("guests", 1, "uptime"), -1, "guests[1].uptime", "non-negative"),
    (("guests", 1, "uptime"), "9" * 400 + "d", "guests[1].uptime", "duration too long"),
    (("guests", 1, "lock"), 5, "guests[1].lock", "expected a string, got 5"),
    (("guests", 1, "ha"), "true", "guests[1].ha", "expected true or false, got 'true'"),
    (("guests", 1, "ha_state"), "started", "guests[1].ha_state", "set ha: true"),
    (("guests", 1, "priority"), 4, "guests[1].priority", "must be between 1 and 3, got 4"),
    (("guests", 1, "priority"), 0, "guests[1].priority", "must be between 1 and 3, got 0"),
    (("guests", 1, "priority"), 2.0, "guests[1].priority", "expected a whole number, got 2.0"),
    (("guests", 1, "migrating_to"), "pve2", "guests[1].migrating_to", "already on 'pve2'"),
    (("guests", 1, "migrating_to"), "pve7", "guests[1].migrating_to", "unknown node 'pve7'"),
    (("guests", 1, "devices"), [["x"]], "guests[1].devices[0]", "got a list"),
]

RULE_ERRORS: list[tuple[Any, str, str]] = [
    ([{"guests": [101]}], "rules[0].type", "required key is missing"),
    (
        [{"type": "anti_affinity", "guests": [101, 102]}],
        "rules[0].type",
        "did you mean 'anti-affinity'?",
    ),
    (
        [{"type": "spread", "guests": [101, 102]}],
        "rules[0].type",
        "expected one of node-affinity, pin",
    ),
    ([1], "rules[0]", "expected a mapping, got 1"),
    (
        [{"type": "pin", "guests": [101], "nodes": ["pve1"], "strict": True}],
        "rules[0].strict",
        "unknown key (expected one of type, name, guests, nodes, origin)",
    ),
    ([{"type": "ignore", "name": "x", "guests": [101]}], "rules[0].name", "unknown key"),
    (
        [{"type": "affinity", "guests": [101]}],
        "rules[0].guests",
        "needs at least two guests, got 1",
    ),
    (
        [{"type": "anti-affinity", "guests": []}],
        "rules[0].guests",
        "needs at least two guests, got 0",
    ),
    ([{"type": "ignore", "guests": []}], "rules[0].guests", "needs at least one guest, got 0"),
    ([{"type": "pin", "nodes": ["pve1"]}], "rules[0].guests", "required key is missing"),
    ([{"type": "affinity", "guests": [101, 999]}], "rules[0].guests[1]", "unknown guest '999'"),
    (
        [{"type": "affinity", "guests": [101, "101"]}],
        "rules[0].guests[1]",
        "guest '101' is listed twice",
    ),
    ([{"type": "affinity", "guests": "101"}], "rules[0].guests", "expected a list, got '101'"),
    ([{"type": "pin", "guests": [101]}], "rules[0].nodes", "required key is missing"),
    ([{"type": "pin", "guests": [101], "nodes": []}], "rules[0].nodes", "needs at least one node"),
    (
        [{"type": "pin", "guests": [101], "nodes": ["pve3"]}],
        "rules[0].nodes[0]",
        "unknown node 'pve3' (did you mean",
    ),
    (
        [{"type": "pin", "guests": [101], "nodes": ["pve1", "pve1"]}],
        "rules[0].nodes[1]",
        "listed twice",
    ),
    (
        [{"type": "pin", "guests": [101], "nodes": {"pve1": 1}}],
        "rules[0].nodes",
        "a pin has no priorities",
    ),
    (
        [{"type": "node-affinity", "guests": [101], "nodes": {"pve9": 1}}],
        "rules[0].nodes.pve9",
        "unknown node 'pve9'",
    ),
    (
        [{"type": "node-affinity", "guests": [101], "nodes": {"pve1": -1}}],
        "rules[0].nodes.pve1",
        "must be between 0 and",
    ),
    (
        [{"type": "node-affinity", "guests": [101], "nodes": {"pve1": "high"}}],
        "rules[0].nodes.pve1",
        "expected a whole number",
    ),
    (
        [{"type": "node-affinity", "guests": [101], "nodes": {}}],
        "rules[0].nodes",
        "needs at least one node",
    ),
    (
        [{"type": "node-affinity", "guests": [101], "nodes": ["pve1"], "strict": "no"}],
        "rules[0].strict",
        "expected true or false",
    ),
    (
        [{"type": "affinity", "guests": [101, 102], "hard": 0}],
        "rules[0].hard",
        "expected true or false, got 0",
    ),
    (
        [{"type": "affinity", "name": "", "guests": [101, 102]}],
        "rules[0].name",
        "must not be empty",
    ),
    (
        [
            {"type": "affinity", "name": "x", "guests": [101, 102]},
            {"type": "anti-affinity", "name": "x", "guests": [101, 102]},
        ],
        "rules[1].name",
        "duplicate rule name: 'x' is also the name of rules[0]",
    ),
    (
        [
            {"type": "affinity", "name": "affinity-2", "guests": [101, 102]},
            {"type": "affinity", "guests": [101, 102]},
        ],
        "rules[1]",
        "generated 'affinity-2' is also the name of rules[0]; give this rule a name",
    ),
    (
        [
            {"type": "pin", "guests": [101], "nodes": ["pve1"]},
            {"type": "pin", "guests": [101], "nodes": ["pve2"]},
        ],
        "rules[1]",
        "generated 'pin-101'",
    ),
]


@pytest.mark.parametrize(
    ("change", "value", "path", "reason"), FIELD_ERRORS, ids=lambda v: str(v)[:30]
)
def test_field_errors(change: tuple[Any, ...], value: Any, path: str, reason: str) -> None:
    document = _set(_BASE, change, value)
    for fmt in ("yaml", "json"):
        if fmt == "yaml":
            text = yaml.safe_dump(document)
        else:
            try:
                text = json.dumps(document)
            except ValueError:
                continue
        with pytest.raises(SnapshotError) as info:
            loads(text, filename=f"s.{fmt}", fmt=fmt)
        error = info.value
        assert error.path == path, str(error)
        assert reason in error.reason, str(error)
        assert str(error) == f"s.{fmt}: {path}: {error.reason}"
        _assert_one_line(error)
    with pytest.raises(SnapshotError) as direct:
        from_dict(document, filename="d.yaml")
    assert direct.value.path == path


@pytest.mark.parametrize(("rules", "path", "reason"), RULE_ERRORS, ids=lambda v: str(v)[:40])
def test_rule_errors(rules: Any, path: str, reason: str) -> None:
    with pytest.raises(SnapshotError) as info:
        from_dict(_BASE | {"rules": rules}, filename="r.yaml")
    assert info.value.path == path, str(info.value)
    assert reason in info.value.reason, str(info.value)
    _assert_one_line(info.value)


def test_shared_pool_in_node_storage_is_refused() -> None:
    document = _BASE | {"storage": {"ceph": {"shared": True}}}
    document = _set(document, ("nodes", "pve1", "storage"), {"ceph": "1TiB"})
    with pytest.raises(SnapshotError) as info:
        from_dict(document, filename="s.yaml")
    assert (
        str(info.value)
        == "s.yaml: nodes.pve1.storage.ceph: pool 'ceph' is shared; list only local pools here"
    )


def test_node_names_are_checked_for_type_and_duplicates() -> None:
    error = _error("version: 1\nnodes: {on: {cpu: 1, memory: 1}}\n")
    assert str(error) == "t.yaml: nodes.true: expected a name or a number, got true (quote it)"
    error = _error("version: 1\nnodes: {1: {cpu: 1, memory: 1}, '1': {cpu: 1, memory: 1}}\n")
    assert str(error) == "t.yaml: nodes.1: duplicate node name '1'"


def test_first_problem_wins() -> None:
    document = _set(_BASE, ("guests", 0, "memory"), "x")
    document = _set(document, ("guests", 1, "memory"), "y")
    document["zzz"] = 1
    with pytest.raises(SnapshotError) as info:
        from_dict(document)
    assert info.value.path == "zzz"
    del document["zzz"]
    with pytest.raises(SnapshotError) as info:
        from_dict(document)
    assert info.value.path == "guests[0].memory"


def test_unexpected_internal_errors_are_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Any, value: object, path: Any) -> Any:
        raise KeyError("boom")

    monkeypatch.setattr(snapshot.SnapshotReader, "storage", broken)
    document = _set(_BASE, ("storage",), {})
    with pytest.raises(
        SnapshotError, match=r"internal error while reading the snapshot \(KeyError"
    ):
        from_dict(document)


# --------------------------------------------------------------------------------------------
# Properties

SMALL_YAML = (EXAMPLES / "small.yaml").read_text()
SMALL_JSON = (EXAMPLES / "small.json").read_text()
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _outcome(call: Callable[[], Cluster]) -> Cluster | str:
    """The cluster, or the one-line message of the SnapshotError (nothing else may escape)."""
    try:
        return call()
    except SnapshotError as error:
        _assert_one_line(error)
        return str(error)


@FAST
@given(st.binary(max_size=300), st.sampled_from(["b.yaml", "b.json"]))
def test_random_bytes(data: bytes, filename: str) -> None:
    _outcome(lambda: loads(data, filename=filename))


@FAST
@given(st.text(max_size=300), st.sampled_from(["yaml", "json"]))
def test_random_text(text: str, fmt: str) -> None:
    _outcome(lambda: loads(text, fmt=fmt))


YAML_ALPHABET = st.sampled_from([*"{}[]:,-&*!|>'\"%@`#?\n\t \\0aA1.~", "version: 1\n", "nodes:\n"])


@FAST
@given(st.lists(YAML_ALPHABET, max_size=80).map("".join))
def test_random_yaml_like_text(text: str) -> None:
    _outcome(lambda: loads(text))


@FAST
@given(st.binary(max_size=200))
def test_random_files(data: bytes) -> None:
    with tempfile.NamedTemporaryFile(suffix=".yaml") as handle:
        handle.write(data)
        handle.flush()
        _outcome(lambda: load(handle.name))


def test_every_prefix_of_the_json_example() -> None:
    valid = 0
    for cut in range(len(SMALL_JSON) + 1):
        result = _outcome(lambda cut=cut: loads(SMALL_JSON[:cut], fmt="json"))
        valid += isinstance(result, Cluster)
    assert valid >= 1  # the whole file (and its prefixes ending in the closing brace)


def test_line_prefixes_of_the_yaml_example() -> None:
    lines = SMALL_YAML.splitlines(keepends=True)
    for count in [*range(0, len(lines), 2), len(lines)]:
        _outcome(lambda count=count: loads("".join(lines[:count])))


#: A second YAML source, with multi-byte characters for the byte-level cuts to split.
UNICODE_YAML = dumps(replace(load(EXAMPLES / "rules.yaml"), name="règles — ünïcode ✓"))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_truncated_yaml(data: st.DataObject) -> None:
    text = data.draw(st.sampled_from([SMALL_YAML, UNICODE_YAML]))
    cut = data.draw(st.integers(min_value=0, max_value=len(text)))
    _outcome(lambda: loads(text[:cut]))
    _outcome(lambda: loads(text.encode()[:cut]))


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["8GiB", "pve1", "pve2", "101", "vm", "ct", "pin", "5m", "started"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(value, dict):
        for key, item in value.items():
            out.append((*prefix, key))
            out.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out.append((*prefix, index))
            out.extend(_paths(item, (*prefix, index)))
    return out


RICH = to_dict(load(EXAMPLES / "rules.yaml")) | {
    "settings": {"mode": "static", "reserve": {"cpu": 1, "memory": "1GiB"}, "weights": {"cpu": 2}},
    "storage": {"ceph": {"shared": True}},
}
RICH["guests"][0] |= {
    "disks": [{"pool": "ceph", "size": "1GiB"}],
    "usage": {"cpu": 1, "memory": "1GiB"},
    "pressure": {"cpu": 3},
    "ha": True,
    "ha_state": "started",
    "migrating_to": "pve3",
}
RICH_PATHS = _paths(RICH)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_mutations(data: st.DataObject) -> None:
    assert from_dict(RICH)  # the base document is valid
    document = copy.deepcopy(RICH)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(document)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        action = data.draw(st.sampled_from(["delete", "set", "add"]))
        parent: Any = document
        for part in path[:-1]:
            parent = parent[part]
        if action == "delete":
            del parent[path[-1]]
        elif action == "set":
            parent[path[-1]] = data.draw(JSON_VALUES)
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=8))] = data.draw(JSON_VALUES)
        else:
            parent.append(data.draw(JSON_VALUES))
    first = _outcome(lambda: from_dict(document, filename="m.yaml"))
    second = _outcome(lambda: from_dict(copy.deepcopy(document), filename="m.yaml"))
    assert first == second
    if isinstance(first, Cluster):
        assert from_dict(to_dict(first)) == first
        for fmt in ("yaml", "json"):
            text = dumps(first, fmt)
            assert loads(text, fmt=fmt) == first
            assert dumps(loads(text, fmt=fmt), fmt) == text
    try:
        text = json.dumps(document, allow_nan=True)
    except (TypeError, ValueError):
        return
    assert _outcome(lambda: loads(text, filename="m.json")) == _outcome(
        lambda: loads(text, filename="m.json")
    )


@FAST
@given(
    st.text(max_size=200) | st.sampled_from([SMALL_YAML, SMALL_JSON, MINIMAL]),
    st.sampled_from(["yaml", "json"]),
)
def test_loads_is_deterministic(text: str, fmt: str) -> None:
    first = _outcome(lambda: loads(text, fmt=fmt))
    second = _outcome(lambda: loads(text, fmt=fmt))
    assert first == second
    if isinstance(first, Cluster):
        assert dumps(first, fmt) == dumps(second, fmt)  # type: ignore[arg-type]


# Random valid clusters round-trip through every form.

TEXTS = st.text(
    st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"]), min_size=1, max_size=8
).filter(lambda s: s.strip() != "" and s.isprintable())
#: Names the history keeps (cluster, nodes, guests, pools): no blanks around them.
NAMES = TEXTS.filter(lambda s: s == s.strip())
IDS = NAMES | st.integers(min_value=0, max_value=10**6).map(str)
LABELS = TEXTS | st.integers(min_value=0, max_value=10**6).map(str)
SIZES = st.integers(min_value=1, max_value=2**53) | st.integers(min_value=1, max_value=4096).map(
    lambda n: n * GIB
)
AMOUNTS = st.floats(min_value=0, max_value=1e5, allow_nan=False, allow_infinity=False)
CORES = AMOUNTS.filter(lambda x: x > 0)
NODE_CORES = st.floats(min_value=0.01, max_value=1e5)
RATIOS = st.floats(min_value=0.01, max_value=1000)


def _below(draw: st.DrawFn, limit: float, whole: bool = False) -> float | int:
    """A reserve that leaves some capacity: from 0 to just under ``limit``."""
    if whole:
        return draw(st.integers(0, int(limit) - 1))
    return draw(st.floats(0, limit, exclude_max=True, allow_nan=False))


PERCENT = st.floats(min_value=0, max_value=100, allow_nan=False)
PRESSURES = st.builds(Pressure, PERCENT, PERCENT, PERCENT, PERCENT, PERCENT)


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    node_names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    pools = draw(st.lists(NAMES, max_size=3, unique=True))
    shared = set(draw(st.lists(st.sampled_from(pools), unique=True))) if pools else set()
    local = [p for p in pools if p not in shared]
    nodes_drawn = []
    for name in node_names:
        cpu, memory = draw(NODE_CORES), draw(SIZES)
        nodes_drawn.append(
            Node(
                name,
                cpu,
                memory,
                storage=draw(st.dictionaries(st.sampled_from(local), SIZES)) if local else {},
                arch=draw(st.sampled_from(["x86_64", "aarch64"])),
                online=draw(st.booleans()),
                maintenance=draw(st.booleans()),
                tags=tuple(draw(st.lists(LABELS, max_size=2))),
                reserve_cpu=_below(draw, cpu) if draw(st.booleans()) else None,
                reserve_memory=int(_below(draw, memory, True)) if draw(st.booleans()) else None,
                base_cpu=draw(AMOUNTS),
                base_memory=draw(st.integers(0, 2**40)),
                pressure=draw(PRESSURES),
            )
        )
    nodes = tuple(nodes_drawn)
    # The cluster's default reserve leaves some capacity on every node that takes it.
    cpu_room = min((n.cpu for n in nodes if n.reserve_cpu is None), default=1e5)
    memory_room = min((n.memory for n in nodes if n.reserve_memory is None), default=2**40)
    guest_ids = draw(st.lists(IDS, max_size=4, unique=True))
    guests = []
    for guest_id in guest_ids:
        node = draw(st.sampled_from(node_names))
        others = [n for n in node_names if n != node]
        ha = draw(st.booleans())
        guests.append(
            Guest(
                id=guest_id,
                node=node,
                kind=draw(st.sampled_from(["vm", "ct"])),
                name=draw(st.just("") | TEXTS),
                state=draw(st.sampled_from(["running", "stopped", "paused"])),
                cpu=draw(CORES),
                memory=draw(SIZES),
                disks=tuple(
                    Disk(pool, draw(st.integers(0, 2**53)), pool in shared)
                    for pool in (
                        draw(st.lists(st.sampled_from(pools), max_size=3)) if pools else []
                    )
                ),
                cpu_used=draw(st.none() | AMOUNTS),
                memory_used=draw(st.none() | st.integers(0, 2**53)),
                pressure=draw(PRESSURES),
                devices=tuple(draw(st.lists(TEXTS, max_size=2))),
                uptime=draw(st.integers(0, 10**9)),
                lock=draw(st.none() | TEXTS),
                ha=ha,
                ha_state=draw(st.none() | st.sampled_from(HA_STATES)) if ha else None,
                tags=tuple(draw(st.lists(LABELS, max_size=2))),
                priority=draw(st.integers(1, 3)),
                migrating_to=draw(st.none() | st.sampled_from(others)) if others else None,
                arch=draw(st.none() | st.sampled_from(["x86_64", "riscv64"])),
            )
        )
    rule_names = iter(draw(st.lists(TEXTS, min_size=12, max_size=12, unique=True)))
    node_rules = []
    guest_rules = []
    ignored: frozenset[str] = frozenset()
    if guest_ids:
        for _ in range(draw(st.integers(0, 3))):
            members = tuple(draw(st.lists(st.sampled_from(guest_ids), min_size=1, unique=True)))
            targets = draw(st.lists(st.sampled_from(node_names), min_size=1, unique=True))
            priorities = {n: draw(st.integers(0, 3)) for n in targets}
            node_rules.append(
                NodeAffinity(next(rule_names), members, priorities, draw(st.booleans()))
            )
        ignored = frozenset(draw(st.lists(st.sampled_from(guest_ids), unique=True)))
    if len(guest_ids) >= 2:
        for _ in range(draw(st.integers(0, 3))):
            members = tuple(draw(st.lists(st.sampled_from(guest_ids), min_size=2, unique=True)))
            guest_rules.append(
                GuestAffinity(next(rule_names), members, draw(st.booleans()), draw(st.booleans()))
            )
    cluster_settings = Settings(
        mode=draw(st.sampled_from(["basic", "static", "dynamic"])),
        cpu_overcommit=draw(RATIOS),
        memory_overcommit=draw(RATIOS),
        reserve_cpu=_below(draw, cpu_room),
        reserve_memory=int(_below(draw, min(memory_room, 2**40), True)),
        allow_restart_migration=draw(st.booleans()),
        min_uptime=draw(st.integers(0, 10**7)),
        weight_cpu=draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])),
        weight_memory=draw(st.sampled_from([0.25, 1.0, 2.0])),
    )
    return Cluster(
        nodes,
        tuple(guests),
        Rules(tuple(node_rules), tuple(guest_rules), ignored),
        cluster_settings,
        draw(NAMES),
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_random_clusters_round_trip(cluster: Cluster) -> None:
    assert from_dict(to_dict(cluster)) == cluster
    for fmt in ("yaml", "json"):
        text = dumps(cluster, fmt)
        again = loads(text, fmt=fmt)
        assert again == cluster
        assert dumps(again, fmt) == text


def test_docs_error_examples_are_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every example error line in docs/snapshot-format.md comes from a real input."""
    documented = re.search(r"Examples:\n\n```\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert documented is not None
    two_nodes = (
        "version: 1\nnodes:\n  pve1: {cpu: 8, memory: 32GiB}\n  pve2: {cpu: 8, memory: 32GiB}\n"
    )

    def guests(count: int, extra: str = "") -> str:
        items = "".join(f"  - {{id: {100 + i}, node: pve1, memory: 1GiB}}\n" for i in range(count))
        return f"{two_nodes}guests:\n{items}{extra}"

    pin = "  - {type: pin, guests: [100], nodes: [pve1]}\n"
    pin2 = "  - {type: pin, guests: [101], nodes: [pve1]}\n"
    inputs: list[tuple[str | bytes, str]] = [
        ("version: 1\nname: a\n  b: c\n", "small.yaml"),
        ('{"version": 1,\n "nodes": {,}}', "small.json"),
        (
            "version: 1\nnodes:\n  pve1: {cpu: 1, memory: 1}\n  pve1: {cpu: 2, memory: 2}\n",
            "small.yaml",
        ),
        (b"\xff", "small.yaml"),
        ("", "missing.yaml"),
        ("- 1\n", "small.yaml"),
        ("version: 2\n", "small.yaml"),
        ("version: 1\nnodes:\n  pve1: {cpu: 8, memroy: 1}\n", "small.yaml"),
        ("version: 1\nnodes:\n  pve1: {cpu: 0, memory: 1}\n", "small.yaml"),
        (guests(3, "  - {id: 104, node: pve1}\n"), "small.yaml"),
        (guests(3, "  - {id: 104, node: pve1, memory: 8 GiBs}\n"), "small.yaml"),
        (
            "version: 1\nnodes: {pve1: {cpu: 1, memory: 1GiB}, db: {cpu: 1, memory: 1GiB}}\n"
            "guests:\n  - {id: 1, node: pve1, memory: 1GiB}\n  - {id: 2, node: pve9}\n",
            "small.yaml",
        ),
        (guests(5, "  - {id: 101, node: pve1, memory: 1GiB}\n"), "small.yaml"),
        (two_nodes + "guests:\n  - {id: 1, node: pve1, memory: 1GiB, priority: 5}\n", "small.yaml"),
        (guests(6, "rules:\n  - {type: anti_affinity, guests: [100, 101]}\n"), "small.yaml"),
        (guests(6, f"rules:\n{pin}  - {{type: affinity, guests: [100]}}\n"), "small.yaml"),
        (
            guests(
                6,
                f"rules:\n{pin}{pin2}  - {{type: affinity, guests: [100, 999]}}\n",
            ),
            "small.yaml",
        ),
    ]
    monkeypatch.chdir(tmp_path)
    produced = []
    for text, filename in inputs:
        with pytest.raises(SnapshotError) as info:
            if filename == "missing.yaml":
                load(filename)
            else:
                loads(text, filename=filename)
        produced.append(str(info.value))
    assert produced == documented.group(1).splitlines()


def test_migration_settings_round_trip() -> None:
    text = (
        "version: 1\n"
        "settings:\n"
        "  allow_local_disks: true\n"
        "  migration: {max_parallel: 8, max_node_inflow: 2, cost_unit: 1GiB, cost_disk_factor: 2}\n"
        "nodes: {a: {cpu: 4, memory: 8GiB}}\n"
        "guests: []\n"
    )
    cluster = loads(text, filename="m.yaml")
    settings = cluster.settings
    assert settings.allow_local_disks is True
    assert (settings.max_parallel, settings.max_node_inflow) == (8, 2)
    assert (settings.cost_unit, settings.cost_disk_factor) == (1024**3, 2.0)
    assert loads(dumps(cluster), filename="m.yaml") == cluster
    with pytest.raises(SnapshotError) as info:
        loads(text.replace("max_parallel: 8", "max_paralel: 8"), filename="m.yaml")
    assert str(info.value).startswith("m.yaml: settings.migration.max_paralel: unknown key")
    with pytest.raises(SnapshotError) as info:
        loads(text.replace("max_node_inflow: 2", "max_node_inflow: 0"), filename="m.yaml")
    assert info.value.path == "settings.migration.max_node_inflow"


# --------------------------------------------------------------------------------------------
# Physically sensible ranges: a number a strategy would choke on is refused when read.

RANGE_ERRORS: list[tuple[tuple[Any, ...], Any, str, str]] = [
    (("nodes", "pve1", "cpu"), 100_001, "nodes.pve1.cpu", "must not be more than 100000"),
    (("nodes", "pve1", "cpu"), 1e15, "nodes.pve1.cpu", "must not be more than 100000"),
    (("nodes", "pve1", "cpu"), 1e-300, "nodes.pve1.cpu", "must be at least 0.01 cores"),
    (("nodes", "pve1", "cpu"), 10**400, "nodes.pve1.cpu", "number too large"),
    (("nodes", "pve1", "usage"), {"cpu": 1e9}, "nodes.pve1.usage.cpu", "more than 100000"),
    (("nodes", "pve1", "reserve"), {"cpu": 8}, "nodes.pve1.reserve.cpu", "must be less than"),
    (
        ("nodes", "pve1", "reserve"),
        {"memory": "32GiB"},
        "nodes.pve1.reserve.memory",
        "must be less than the node's memory (node 'pve1' has 32GiB), got 32GiB",
    ),
    (("guests", 1, "cpu"), 1e15, "guests[1].cpu", "must not be more than 100000"),
    (("guests", 1, "usage"), {"cpu": 1e15}, "guests[1].usage.cpu", "more than 100000"),
    (("guests", 1, "usage"), {"cpu": -1e15}, "guests[1].usage.cpu", "less than 0"),
    (("guests", 1, "usage"), {"cpu": -(10**400)}, "guests[1].usage.cpu", "less than 0"),
    (("guests", 1, "uptime"), 1e12, "guests[1].uptime", "at most 36500d (100 years)"),
    (("guests", 1, "uptime"), "200000w", "guests[1].uptime", "at most 36500d (100 years)"),
    (("settings",), {"reserve": {"cpu": 8}}, "settings.reserve.cpu", "node 'pve1' has 8 cores"),
    (("settings",), {"reserve": {"memory": "1PiB"}}, "settings.reserve.memory", "less than"),
    (("settings",), {"cpu_overcommit": 1e6}, "settings.cpu_overcommit", "more than 1000"),
    (("settings",), {"weights": {"memory": 1e15}}, "settings.weights.memory", "more than 1000"),
    (("settings",), {"min_uptime": "400d"}, "settings.min_uptime", "must be at most 365d"),
    (
        ("settings",),
        {"migration": {"cost_unit": 1}},
        "settings.migration.cost_unit",
        "must be at least 1MiB",
    ),
    (
        ("settings",),
        {"migration": {"cost_disk_factor": 1e9}},
        "settings.migration.cost_disk_factor",
        "more than 1000",
    ),
    # Names the history keeps: no blanks around them, not too long.
    (("name",), "prod ", "name", "must not have surrounding blanks, got 'prod '"),
    (("name",), "x" * 256, "name", "must be at most 255 characters, got 256"),
    (("guests", 2, "id"), " 103", "guests[2].id", "must not have surrounding blanks"),
    (("nodes", "pve3 "), {"cpu": 1, "memory": 1}, 'nodes["pve3 "]', "surrounding blanks"),
]


@pytest.mark.parametrize(
    ("change", "value", "path", "reason"), RANGE_ERRORS, ids=lambda v: str(v)[:30]
)
def test_out_of_range_values_are_refused(
    change: tuple[Any, ...], value: Any, path: str, reason: str
) -> None:
    with pytest.raises(SnapshotError) as info:
        from_dict(_set(_BASE, change, value), filename="r.yaml")
    assert info.value.path == path, str(info.value)
    assert reason in info.value.reason, str(info.value)
    _assert_one_line(info.value)


def test_the_largest_values_in_range_are_read() -> None:
    document = _set(_BASE, ("nodes", "pve1"), {"cpu": 100_000, "memory": "8PiB"})
    document = _set(document, ("guests", 0, "cpu"), 100_000)
    document = _set(document, ("guests", 0, "usage"), {"cpu": 100_000, "memory": "8PiB"})
    document = _set(document, ("guests", 0, "uptime"), "36500d")
    document["settings"] = {
        "cpu_overcommit": 1000,
        "weights": {"cpu": 1000},
        "min_uptime": "365d",
        "reserve": {"cpu": 7.99},
        "migration": {"cost_unit": "1MiB", "cost_disk_factor": 1000},
    }
    cluster = from_dict(document)
    assert cluster.guests[0].uptime == 36500 * 86400
    assert from_dict(to_dict(cluster)) == cluster


_EXTREME_NUMBERS = (
    st.sampled_from([0, -1, 1e-300, 5e-324, 100_000, 1e15, 1e300, 2**53, 2**63, 10**400])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(2**80), max_value=2**80)
)
_NUMERIC_FIELDS = [
    ("nodes", "pve1", "cpu"),
    ("nodes", "pve2", "memory"),
    ("guests", 0, "cpu"),
    ("guests", 1, "memory"),
    ("guests", 2, "uptime"),
    ("settings", "cpu_overcommit"),
    ("settings", "memory_overcommit"),
    ("settings", "min_uptime"),
    ("settings", "reserve", "cpu"),
    ("nodes", "pve2", "reserve", "cpu"),
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_NUMERIC_FIELDS), _EXTREME_NUMBERS), max_size=4))
def test_extreme_numbers_give_an_error_or_finite_loads(
    changes: list[tuple[tuple[Any, ...], Any]],
) -> None:
    from opendrs.engine.strategies.base import cluster_imbalance
    from opendrs.engine.usage import LoadModel

    document = copy.deepcopy(_BASE) | {"settings": {"mode": "static", "reserve": {"cpu": 0}}}
    document["nodes"]["pve2"]["reserve"] = {"cpu": 1}
    for where, value in changes:
        document = _set(document, where, value)
    outcome = _outcome(lambda: from_dict(document, filename="x.yaml"))
    if isinstance(outcome, str):
        return
    fractions = LoadModel.build(outcome).fractions()
    assert np.isfinite(fractions).all()
    json.dumps(cluster_imbalance(outcome).as_dict(), allow_nan=False)


# --------------------------------------------------------------------------------------------
# A node's KSM-shared memory (``ksm``): optional, 0 by default, a size like the others.


def test_node_ksm_is_read_and_written() -> None:
    text = MINIMAL.replace(
        "pve1: {cpu: 8, memory: 32GiB}", "pve1: {cpu: 8, memory: 32GiB, ksm: 6GiB}"
    )
    cluster = loads(text, filename="k.yaml")
    assert cluster.node("pve1").ksm_shared == 6 * GIB
    assert cluster.node("pve2").ksm_shared == 0  # left out: none shared
    document = to_dict(cluster)
    assert document["nodes"]["pve1"] == {"cpu": 8, "memory": "32GiB", "ksm": "6GiB"}
    assert document["nodes"]["pve2"] == {"cpu": 8, "memory": "32GiB"}  # 0 is not written
    for fmt in ("yaml", "json"):
        assert loads(dumps(cluster, fmt), fmt=fmt, filename="k.yaml") == cluster
    assert Node("n", 1, 1).ksm_shared == 0
    # Plain bytes, and the largest size of the format.
    assert from_dict(_set(_BASE, ("nodes", "pve1", "ksm"), 12345)).node("pve1").ksm_shared == 12345
    largest = from_dict(_set(_BASE, ("nodes", "pve1", "ksm"), "8PiB"))
    assert largest.node("pve1").ksm_shared == 8 * 1024**5
    assert from_dict(to_dict(largest)) == largest


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (-1, "size must not be negative, got -1"),
        ("lots", "cannot read 'lots' as a size"),
        ("2XB", "unknown size unit"),
        (True, "got a boolean"),
        ([], "got list"),
        ("9PiB", "size too large (at most 8 PiB)"),
        (1e30, "size too large"),
    ],
)
def test_node_ksm_errors(value: Any, reason: str) -> None:
    with pytest.raises(SnapshotError) as info:
        from_dict(_set(_BASE, ("nodes", "pve1", "ksm"), value), filename="k.yaml")
    assert info.value.path == "nodes.pve1.ksm", str(info.value)
    assert reason in info.value.reason, str(info.value)
    _assert_one_line(info.value)


def test_node_ksm_null_is_a_wrong_type_and_typos_are_named() -> None:
    with pytest.raises(SnapshotError) as info:
        from_dict(_set(_BASE, ("nodes", "pve1", "ksm"), None), filename="k.yaml")
    assert info.value.path == "nodes.pve1.ksm"
    with pytest.raises(SnapshotError) as info:
        from_dict(_set(_BASE, ("nodes", "pve1", "kms"), "1GiB"), filename="k.yaml")
    assert "did you mean 'ksm'?" in info.value.reason


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(st.integers(0, 8 * 1024**5), min_size=3, max_size=3))
def test_random_clusters_with_ksm_round_trip(cluster: Cluster, shared: list[int]) -> None:
    nodes = tuple(
        replace(node, ksm_shared=value) for node, value in zip(cluster.nodes, shared, strict=False)
    )
    cluster = replace(cluster, nodes=nodes)
    assert from_dict(to_dict(cluster)) == cluster
    for fmt in ("yaml", "json"):
        assert loads(dumps(cluster, fmt), fmt=fmt) == cluster


# --------------------------------------------------------------------------------------------
# Proxmox VE 9.2: negative node affinity, failback, ha-auto-rebalance, ignores with a reason

THREE_NODES = """version: 1
nodes:
  pve1: {cpu: 8, memory: 32GiB}
  pve2: {cpu: 8, memory: 32GiB}
  pve3: {cpu: 8, memory: 32GiB}
guests:
  - {id: 101, node: pve1, memory: 4GiB, ha: true, failback: false}
  - {id: 102, node: pve2, memory: 4GiB}
"""


def test_a_negative_node_affinity_is_the_positive_rule_on_the_other_nodes() -> None:
    cluster = loads(
        THREE_NODES
        + "rules:\n  - {type: node-affinity, name: never3, guests: [101], nodes: [pve3],"
        " strict: true, affinity: negative}\n"
    )
    assert cluster.rules.node_affinity == (
        NodeAffinity("never3", ("101",), {"pve1": 0, "pve2": 0}, strict=True),
    )
    # The dump writes what it means on these nodes, which loads back the same.
    assert loads(dumps(cluster)).rules == cluster.rules


def test_a_negative_node_affinity_naming_every_node_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = loads(
        THREE_NODES + "rules:\n  - {type: node-affinity, name: nowhere, guests: [101],"
        " nodes: [pve1, pve2, pve3], affinity: negative}\n",
        filename="t.yaml",
    )
    assert cluster.rules.node_affinity == ()
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "t.yaml: rules[0] (nowhere): a negative node affinity naming every node" in caplog.text


def test_a_negative_node_affinity_refuses_priorities() -> None:
    error = _error(
        THREE_NODES
        + "rules:\n  - {type: node-affinity, guests: [101], nodes: {pve3: 1}, affinity: negative}\n"
    )
    _assert_one_line(error)
    assert str(error) == (
        "t.yaml: rules[0].nodes: expected a list of node names "
        "(a negative node affinity has no priorities)"
    )


def test_failback_ha_auto_rebalance_and_ignore_reasons_round_trip() -> None:
    cluster = loads(
        THREE_NODES + "ha_auto_rebalance: true\nrules:\n"
        "  - {type: ignore, guests: [102], reason: its HA resource has auto-rebalance 0}\n"
        "  - {type: ignore, guests: [101]}\n"
    )
    assert cluster.ha_auto_rebalance and not cluster.guest("101").failback
    assert cluster.guest("102").failback  # the default
    assert cluster.rules.ignore_reason("102") == "its HA resource has auto-rebalance 0"
    assert cluster.rules.ignore_reason("101") is None
    again = loads(dumps(cluster))
    assert again == cluster and dumps(again) == dumps(cluster)
    assert "failback" not in dumps(
        replace(cluster, guests=(replace(cluster.guests[0], failback=True), *cluster.guests[1:]))
    )


def test_the_ha_scheduler_mode_round_trips_and_is_checked() -> None:
    assert loads(THREE_NODES).ha_scheduler is None
    assert "ha_scheduler" not in dumps(loads(THREE_NODES))
    for mode in ("basic", "static"):
        cluster = loads(THREE_NODES + f"ha_scheduler: {mode}\n")
        assert cluster.ha_scheduler == mode
        assert f"\nha_scheduler: {mode}\n" in dumps(cluster)
        assert loads(dumps(cluster)) == cluster
    for bad, reason in (
        ("statik", "unknown value 'statik' (did you mean 'static'?)"),
        ("dynamic", "expected one of basic, static, got 'dynamic'"),
        ("true", "expected one of basic, static, got true"),
    ):
        error = _error(THREE_NODES + f"ha_scheduler: {bad}\n")
        _assert_one_line(error)
        assert str(error) == f"t.yaml: ha_scheduler: {reason}"


def test_failback_needs_ha() -> None:
    error = _error(
        THREE_NODES.replace("{id: 102, node: pve2,", "{id: 102, failback: false, node: pve2,")
    )
    assert str(error) == (
        "t.yaml: guests[1].failback: only HA-managed guests have failback (set ha: true)"
    )
