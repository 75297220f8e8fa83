"""Proxmox resource pools as rules (``backend.pools``): the fake API's ``/pools`` read by the
daemon, ``opendrs snapshot``, ``show`` and ``plan``; the rule's origin is ``pool``; no plan breaks a
pool's anti-affinity."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon import opendrs, run_once
from opendrs.cli.planning import make_plan
from opendrs.engine.breaks import rule_breaks
from opendrs.engine.strategies import get_strategy
from opendrs.model.cluster import Cluster, Guest, Node
from opendrs.model.rules import GuestAffinity, Rules

GiB = 1024**3
WEB = ("100", "101", "102")


@pytest.fixture
def pve(tmp_path: Path) -> Iterator[Any]:
    """VMs 100-102 of the pool ``web`` all on pve1, 103 (pool ``db``) on pve2, 104 in no pool."""
    pytest.importorskip("aiohttp", reason="the fake API is an aiohttp server")
    pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
    pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")
    from backends.fakepve_fixture import three_nodes

    cluster = three_nodes(str(tmp_path))
    placed = [(100, "web", "pve1"), (101, "web", "pve1"), (102, "web", "pve1")]
    placed += [(103, "db", "pve2"), (104, None, "pve3")]
    for vmid, pool, node in placed:
        config = {"cores": 2, "memory": 4096, "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G"}
        vm = cluster.pve.add_vm(
            vmid, f"vm{vmid}", node=node, status="running", config=config, pool=pool
        )
        vm.stats.update(cpu=0.2, mem=3 * GiB)
    try:
        yield cluster
    finally:
        cluster.stop()


def _config(tmp_path: Path, cluster: Any, pools: str) -> Path:
    from backends.fakepve_fixture import shadow_config

    config = shadow_config(tmp_path, cluster)
    text = config.read_text()
    config.write_text(text.replace("  retries: 1\n", f"  retries: 1\n  pools: {pools}\n", 1))
    return config


def test_the_daemon_splits_a_pool_kept_apart(tmp_path: Path, pve: Any) -> None:
    done = run_once(_config(tmp_path, pve, "{web: anti-affinity, db: affinity}"))
    assert done.returncode == 0, done.stderr
    would = [line for line in done.stderr.splitlines() if "would migrate" in line]
    # each guest as "name (id)" in the log
    moved = {re.search(r"would migrate \S+ \((\d+)\)", line)[1] for line in would}
    assert len(moved & set(WEB)) == 2, done.stderr  # two of the three leave pve1
    assert " WARNING " not in done.stderr, done.stderr


def test_a_pool_the_api_does_not_list_is_warned_about(tmp_path: Path, pve: Any) -> None:
    done = run_once(_config(tmp_path, pve, "{web: anti-affinity, cache: affinity}"))
    assert done.returncode == 0, done.stderr
    assert "pools: pool 'cache' is not listed by /pools" in done.stderr, done.stderr


def test_snapshot_show_and_plan_carry_the_pool_rule(tmp_path: Path, pve: Any) -> None:
    live = tmp_path / "live.yaml"
    config = _config(tmp_path, pve, "{'*': {type: anti-affinity, strict: false}}")
    done = opendrs("snapshot", "--config", str(config), "-o", str(live), "--format", "json")
    assert done.returncode == 0, done.stderr
    rules = json.loads(live.read_text())["rules"]
    assert rules == [
        {
            "type": "anti-affinity",
            "name": "pool web",
            "guests": [100, 101, 102],
            "hard": False,
            "origin": "pool",
        }
    ]
    shown = opendrs("show", str(live))
    assert (
        "  pool web: vm100 (100), vm101 (101), vm102 (102) kept apart (soft), origin pool"
        in shown.stdout.splitlines()
    )
    text = " ".join(opendrs("plan", str(live)).stdout.split())  # its lines as wrapped, joined
    assert (
        "pool web (soft anti-affinity): vm100 (100), vm101 (101), vm102 (102) share pve1; "
        "origin pool" in text
    )
    plan = json.loads(opendrs("plan", str(live), "--format", "json").stdout)
    assert plan["rules"]["guest_affinity"] == [
        {
            "name": "pool web",
            "guests": list(WEB),
            "together": False,
            "hard": False,
            "origin": "pool",
        }
    ]
    targets = {m["guest"]: m["target"] for m in plan["moves"]}
    ends = {g: targets.get(g, "pve1") for g in WEB}
    assert len(set(ends.values())) >= 2, plan["moves"]  # a soft rule: a penalty to lessen


def test_an_ha_rule_holds_over_a_pool_rule(tmp_path: Path, pve: Any) -> None:
    """An HA resource-affinity keeping 100 and 101 together (a platform rule) holds; the pool's
    anti-affinity, of a later origin, is ignored with a warning naming both."""
    pve.pve.ha_rules = [
        {
            "rule": "web-pair",
            "type": "resource-affinity",
            "resources": "vm:100,vm:101",
            "affinity": "positive",
            "digest": "0" * 40,
        }
    ]
    done = run_once(_config(tmp_path, pve, "{web: anti-affinity}"))
    assert done.returncode == 0, done.stderr
    ignored = (
        "Ignore pool rule 'pool web', because guests '100', '101' are kept both together and "
        "apart, and platform rule 'web-pair' holds"
    )
    assert any(line.endswith(ignored) for line in done.stderr.splitlines()), done.stderr


@pytest.mark.parametrize(
    ("pools", "error"),
    [
        ("{web: sideways}", "backend.pools.web: expected one of affinity, anti-affinity"),
        (
            "{web: {type: affinity, pin: [pve1]}}",
            "backend.pools.web.pin: unknown key (expected one of type, strict)",
        ),
        ("{'we b': affinity}", "backend.pools[\"we b\"]: not a Proxmox pool id: 'we b'"),
    ],
)
def test_a_wrong_pools_setting_is_one_line(tmp_path: Path, pools: str, error: str) -> None:
    from daemon import write_proxmox_config

    ca = tmp_path / "ca.pem"
    ca.write_text("not read: the pools setting is refused first\n")
    config = write_proxmox_config(
        tmp_path, "127.0.0.1:8006", str(ca), user="u@pve!t", token="s", mode="shadow"
    )
    text = config.read_text()
    config.write_text(text.replace("  retries: 1\n", f"  retries: 1\n  pools: {pools}\n", 1))
    done = opendrs("validate", "--config", str(config))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert error in line, line


# -- no plan breaks a pool's anti-affinity --------------------------------------------------


def _pool_cluster(nodes: int, on: list[int], loads: list[float]) -> Cluster:
    """``nodes`` nodes; a pool kept apart (hard, origin pool) whose guests sit on the nodes
    ``on``, beside a guest of load ``loads[i]`` per node."""
    names = [f"n{i}" for i in range(nodes)]
    members = [
        Guest(f"p{k}", names[n % nodes], cpu=2, memory=2 * GiB, cpu_used=1.0)
        for k, n in enumerate(on)
    ]
    others = [
        Guest(f"o{i}", names[i], cpu=4, memory=4 * GiB, cpu_used=4 * load)
        for i, load in enumerate(loads[:nodes])
    ]
    rule = GuestAffinity("pool web", tuple(g.id for g in members), False, True, origin="pool")
    return Cluster(
        nodes=tuple(Node(n, cpu=16, memory=64 * GiB) for n in names),
        guests=(*members, *others),
        rules=Rules(guest_affinity=(rule,)),
        name="pools",
    )


@settings(max_examples=25, deadline=None)
@given(
    nodes=st.integers(3, 5),
    on=st.lists(st.integers(0, 4), min_size=2, max_size=3),
    loads=st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5),
    strategy=st.sampled_from(["balance", "static-greedy", "proxlb-greedy"]),
)
def test_no_plan_breaks_a_pool_kept_apart(
    nodes: int, on: list[int], loads: list[float], strategy: str
) -> None:
    cluster = _pool_cluster(nodes, on, loads)
    chosen = get_strategy(strategy)
    result = make_plan(
        cluster,
        chosen,
        chosen.options.parse(strategy, {}),
        max_parallel=None,
        max_node_inflow=None,
    )
    assert not [b for b in rule_breaks(result.placed) if b.rule == "pool web"], result.plan.moves


class _BeforeEightOne:
    """A client of a Proxmox VE before 8.1: ``GET /pools`` takes no ``poolid`` (400), and
    ``GET /pools/{poolid}`` answers the pool's members."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def get(self, path: str, **params: Any) -> Any:
        from opendrs.backends.base import HttpError

        self.paths.append(path + "".join(f"?{k}={v}" for k, v in params.items()))
        if path == "pools" and params:
            raise HttpError("400 parameter verification failed", 400, "poolid", transient=False)
        if path == "pools":
            return [{"poolid": "web"}, {"poolid": "other"}]
        members = [{"vmid": 100, "type": "qemu"}, {"vmid": 101}, {"id": "storage/pve1/local"}]
        return {"members": members}


def test_the_members_are_read_from_the_older_path_before_proxmox_8_1() -> None:
    from opendrs.backends.proxmox.pools import PoolRule, pool_rules

    client = _BeforeEightOne()
    warnings: list[str] = []
    setting = {"web": PoolRule(positive=False)}
    rules = pool_rules(client, setting, {"100", "101", "102"}, warnings.append)  # type: ignore[arg-type]
    assert rules == [GuestAffinity("pool web", ("100", "101"), False, True, origin="pool")]
    assert client.paths == ["pools", "pools?poolid=web", "pools/web"]
    assert warnings == []
