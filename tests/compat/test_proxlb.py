"""proxlb-solver scenarios: the loader, the expectation semantics, JUnit output, every scenario."""

from __future__ import annotations

import textwrap
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from opendrs.compat.proxlb import (
    LOADER_WEIGHTS,
    Check,
    Expect,
    check_paths,
    check_scenario,
    evaluate_expect,
    is_proxlb_scenario,
    junit_xml,
    load_gap,
    load_scenario,
    loads_scenario,
    scenario_files,
)
from opendrs.model.snapshot import SnapshotError

GiB = 1024**3
SCENARIOS = Path(__file__).resolve().parents[2].parent / "shared" / "compat" / "proxlb-scenarios"
FILES = sorted(SCENARIOS.glob("*/*.yaml")) if SCENARIOS.is_dir() else []


def scenario(text: str, filename: str = "test.yaml"):
    return loads_scenario(textwrap.dedent(text), filename=filename)


BASE = """
nodes:
  node-A: {cpu_total: 16, memory_total_gb: 64}
  node-B: {cpu_total: 16, memory_total_gb: 64}
  node-C: {cpu_total: 16, memory_total_gb: 64}
"""


# --------------------------------------------------------------------------------------------
# Every shared scenario passes


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(SCENARIOS)) for p in FILES] or None)
def test_shared_scenario(path: Path) -> None:
    result = check_scenario(load_scenario(path), time_limit=5.0)
    assert result.passed, [c for c in result.checks if not c.passed]
    assert result.checks[0].name == "feasible"


def test_shared_scenarios_present_or_skipped() -> None:
    if not SCENARIOS.is_dir():
        pytest.skip(f"{SCENARIOS} not present")
    assert FILES, "the scenario folder is empty"
    assert scenario_files([SCENARIOS]) == FILES


# --------------------------------------------------------------------------------------------
# Loader


def test_defaults_units_and_cluster() -> None:
    s = scenario(
        BASE
        + """
vms:
  vm-1: {node: node-A, cpu: 2, memory_gb: 0.5}
  ct-1: {node: node-B, cpu: 1, memory_gb: 4, cpu_usage: 0.25, type: ct, priority: 3}
"""
    )
    assert s.name == "test"
    b = s.balancing
    assert (b.method, b.mode, b.balanciness, b.cpu_overcommit) == ("memory", "used", 3, 2.0)
    assert dict(b.weights) == dict(LOADER_WEIGHTS)
    vm = s.vms[0]
    assert (vm.memory, vm.cpu_usage, vm.priority, vm.type) == (GiB // 2, 2.0, 2, "vm")
    c = s.cluster
    assert c.settings.mode == "static"
    assert c.settings.cpu_overcommit == 2.0
    assert c.settings.allow_restart_migration and c.settings.allow_local_disks
    assert c.settings.max_parallel == 2  # unlimited: as many as there are guests
    assert c.settings.max_node_inflow == 1
    ct = c.guest("ct-1")
    assert (ct.kind, ct.cpu, ct.cpu_used, ct.memory, ct.priority) == ("ct", 1, 0.25, 4 * GiB, 3)
    assert c.node("node-A").memory == 64 * GiB
    assert s.options["method"] == "memory" and s.options["strict"] is True
    assert s.options["w_global_cpu"] == 10


def test_tags_become_rules() -> None:
    s = scenario(
        BASE
        + """
vms:
  a: {node: node-A, cpu: 1, memory_gb: 1, tags: [plb_affinity_web, plb_anti_affinity_db]}
  b:
    node: node-A
    cpu: 1
    memory_gb: 1
    tags: [plb_affinity_web, plb_pin_node-B, plb_pin_node-C, plb_pin_nope]
  c: {node: node-B, cpu: 1, memory_gb: 1, tags: [plb_anti_affinity_db, plb_affinity_alone]}
"""
    )
    rules = {r.name: r for r in s.cluster.rules.guest_affinity}
    assert set(rules) == {"plb_affinity_web", "plb_anti_affinity_db"}  # "alone" has one guest
    assert rules["plb_affinity_web"].positive and rules["plb_affinity_web"].hard
    assert rules["plb_anti_affinity_db"].guests == ("a", "c")
    assert not rules["plb_anti_affinity_db"].positive
    (pin,) = s.cluster.rules.node_affinity
    assert pin.guests == ("b",) and pin.strict and set(pin.nodes) == {"node-B", "node-C"}
    assert s.pins == (("b", ("node-B", "node-C")),)
    assert any("plb_pin_nope" in n for n in s.notes)


def test_constraints_pins_intersect_and_ignore() -> None:
    s = scenario(
        BASE
        + """
vms:
  a: {node: node-A, cpu: 1, memory_gb: 1, tags: [plb_pin_node-A, plb_pin_node-B]}
  b: {node: node-A, cpu: 1, memory_gb: 1}
  c: {node: node-A, cpu: 1, memory_gb: 1}
constraints:
  pin:
    - {vm: a, nodes: [node-B, node-C], strict: true}
    - {vm: b, nodes: [node-X]}
  affinity:
    - {name: together, vms: [a, b, ghost], hard: false, origin: pve}
  anti_affinity:
    - {vms: [b, c]}
  ignore: [c, {vm: b}]
"""
    )
    pins = {r.guests[0]: set(r.nodes) for r in s.cluster.rules.node_affinity}
    assert pins == {"a": {"node-B"}, "b": set()}  # an unknown node allows nothing
    rules = {r.name: r for r in s.cluster.rules.guest_affinity}
    assert rules["together"].guests == ("a", "b") and not rules["together"].hard
    assert rules["anti_affinity[0]"].hard
    assert s.affinity[0].origin == "pve"
    assert s.cluster.rules.ignored == frozenset({"b", "c"})
    assert s.ignore == ("c", "b")


def test_reserve_storage_and_evacuate() -> None:
    s = scenario(
        """
evacuate_node: node-B
balancing: {method: disk, cpu_overcommit: 1.5, max_parallel_migrations: 1, max_node_inflow: 2}
nodes:
  node-A:
    cpu_total: 16
    memory_total_gb: 64
    storage_free: {local: 50}
    reserve: {cpu: 2, memory_gb: 8, storage_gb: {local: 10}}
  node-B: {cpu_total: 8, memory_total_gb: 32, maintenance: false}
vms:
  a: {node: node-A, cpu: 1, memory_gb: 1, disks: {local: 40}}
  b: {node: node-A, cpu: 1, memory_gb: 1, disks: {local: 40}}
  c: {node: node-B, cpu: 1, memory_gb: 1, disks: {other: 5}}
"""
    )
    a, b = s.cluster.node("node-A"), s.cluster.node("node-B")
    assert (a.reserve_cpu, a.reserve_memory) == (2, 8 * GiB)
    # Capacity = free + what its own guests use − reserve (not the free space alone).
    assert dict(a.storage) == {"local": (50 + 80 - 10) * GiB}
    assert dict(b.storage) == {"other": 5 * GiB}
    assert b.maintenance and not s.nodes[1].maintenance  # proxlb's own view keeps it
    assert s.evacuate_node == "node-B"
    settings = s.cluster.settings
    assert (settings.cpu_overcommit, settings.max_parallel, settings.max_node_inflow) == (1.5, 1, 2)
    assert s.cluster.guest("a").disks[0].local


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("nodes: {n: {memory_total_gb: 4}}\nvms: {}", "nodes.n.cpu_total: required key is missing"),
        (
            "nodes: {n: {cpu_total: 4, memory_total_gb: 4}}\n"
            "vms: {v: {node: m, cpu: 1, memory_gb: 1}}",
            "vms.v.node: unknown node 'm'",
        ),
        (
            "balancing: {balanciness: 7}\n" + BASE,
            "balancing.balanciness: expected a whole number 1 to 5",
        ),
        ("balancing: {method: fastest}\n" + BASE, "balancing.method: unknown method 'fastest'"),
        ("evacuate_node: node-Z\n" + BASE, "evacuate_node: unknown node 'node-Z'"),
        (
            "nodes: {n: {cpu_total: -1, memory_total_gb: 4}}",
            "nodes.n.cpu_total: expected a number ≥ 0",
        ),
        (
            "nodes: {n: {cpu_total: 4, memory_total_gb: four}}",
            "nodes.n.memory_total_gb: expected a number",
        ),
        (
            BASE + "vms: {v: {node: node-A, cpu: 1, memory_gb: 1, tags: plb_pin_x}}",
            "vms.v.tags: expected a list",
        ),
        (
            BASE + "vms: {v: {node: node-A, cpu: 1, memory_gb: 1, type: kvm}}",
            "vms.v.type: expected 'vm' or 'ct'",
        ),
        (
            BASE + "expect: {max_migrations: -1}",
            "expect.max_migrations: expected a whole number ≥ 0",
        ),
        (
            BASE + "constraints: {pin: [{vm: a}]}",
            "constraints.pin[0].nodes: required key is missing",
        ),
        ("[1, 2]", "expected a mapping, got a list"),
        ("nodes: {a: 1\n", "line 2, column 1"),
    ],
)
def test_bad_scenarios_raise_one_line(text: str, where: str) -> None:
    with pytest.raises(SnapshotError) as info:
        loads_scenario(text, filename="bad.yaml")
    message = str(info.value)
    assert message.startswith("bad.yaml: ")
    assert where in message
    assert "\n" not in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="cannot read the file"):
        load_scenario(tmp_path / "none.yaml")


def test_unknown_keys_are_noted_not_fatal() -> None:
    s = scenario(
        "colour: blue\n" + BASE + "vms: {v: {node: node-A, cpu: 1, memory_gb: 1, pets: 2}}"
    )
    assert "unknown key colour ignored" in s.notes
    assert "unknown key vms.v.pets ignored" in s.notes


def test_detection() -> None:
    assert is_proxlb_scenario({"nodes": {"a": {"cpu_total": 1, "memory_total_gb": 1}}, "vms": {}})
    assert not is_proxlb_scenario({"version": 1, "nodes": {"a": {"cpu": 1}}, "guests": []})
    assert not is_proxlb_scenario({"nodes": {"a": {"cpu_total": 1}}})  # no vms
    assert not is_proxlb_scenario(["vms"])


# --------------------------------------------------------------------------------------------
# Expectation semantics (proxlb-solver's reporter), on hand-made results

RULES = (
    BASE
    + """
vms:
  a: {node: node-A, cpu: 1, memory_gb: 16}
  b: {node: node-A, cpu: 1, memory_gb: 16}
  c: {node: node-B, cpu: 1, memory_gb: 8}
  d: {node: node-C, cpu: 1, memory_gb: 8}
constraints:
  anti_affinity: [{name: ab-apart, vms: [a, b]}, {name: soft, vms: [c, d], hard: false}]
  affinity: [{name: cd-together, vms: [c, d]}]
  pin: [{vm: d, nodes: [node-B, node-C]}]
  ignore: [a]
"""
)


def names(checks: list[Check]) -> list[tuple[str, bool]]:
    return [(c.name, c.passed) for c in checks]


def test_feasible_default_and_early_stop() -> None:
    s = scenario(RULES + "expect: {max_migrations: 0, node_empty: node-A}")
    checks = evaluate_expect(s, feasible=False, status="INFEASIBLE", placements={})
    assert checks == [Check("feasible", "True", False, "INFEASIBLE")]
    s = scenario(RULES + "expect: {feasible: false, max_migrations: 0}")
    assert names(evaluate_expect(s, feasible=False, status="INFEASIBLE", placements={})) == [
        ("feasible", True)
    ]
    # Expected infeasible but feasible: that fails, and the other checks still run.
    got = evaluate_expect(s, feasible=True, status="OPTIMAL", placements=s.initial_placements)
    assert names(got) == [("feasible", False), ("constraints", False), ("max_migrations", True)]


def test_constraints_satisfied() -> None:
    s = scenario(RULES)
    good = {"a": "node-A", "b": "node-B", "c": "node-C", "d": "node-C"}
    assert names(evaluate_expect(s, feasible=True, status="OK", placements=good)) == [
        ("feasible", True),
        ("constraints", True),
    ]
    bad = {"a": "node-B", "b": "node-B", "c": "node-B", "d": "node-A"}
    (_, check) = evaluate_expect(s, feasible=True, status="OK", placements=bad)
    assert not check.passed
    for part in (
        "anti-affinity 'ab-apart'",
        "affinity 'cd-together'",
        "pin d on node-A",
        "ignored VM a",
    ):
        assert part in check.detail
    assert "soft" not in check.detail
    maint = scenario(
        RULES.replace(
            "node-C: {cpu_total: 16, memory_total_gb: 64}",
            "node-C: {cpu_total: 16, memory_total_gb: 64, maintenance: true}",
        )
    )
    (_, check) = evaluate_expect(maint, feasible=True, status="OK", placements=good)
    assert "VMs on maintenance node-C: ['c', 'd']" in check.detail
    off = scenario(RULES + "expect: {constraints_satisfied: false}")
    assert names(evaluate_expect(off, feasible=True, status="OK", placements=bad)) == [
        ("feasible", True)
    ]


def test_spread_improved_uses_proxlbs_gap() -> None:
    s = scenario(
        RULES
        + "balancing: {method: disk}\nexpect: {spread_improved: true, constraints_satisfied: false}"
    )
    # "disk" falls back to memory: A 32·2/64 = 1.0, B 0.25, C 0.25 -> 0.75.
    assert load_gap(s, s.initial_placements) == pytest.approx(0.75)
    moved = {"a": "node-A", "b": "node-B", "c": "node-B", "d": "node-C"}  # 0.5, 0.75, 0.25
    assert load_gap(s, moved) == pytest.approx(0.5)
    (_, check) = evaluate_expect(s, feasible=True, status="OK", placements=moved)
    assert check == Check("spread_improved", "True", True, "75.0% → 50.0%")
    (_, check) = evaluate_expect(s, feasible=True, status="OK", placements=s.initial_placements)
    assert not check.passed
    worse = replace(s, expect=Expect(constraints_satisfied=False, spread_improved=False))
    (_, check) = evaluate_expect(worse, feasible=True, status="OK", placements=s.initial_placements)
    assert check.passed  # not improved, as expected


def test_spread_of_an_empty_cluster_counts_as_improved() -> None:
    s = scenario(BASE + "vms: {}\nexpect: {spread_improved: true}")
    assert names(evaluate_expect(s, feasible=True, status="OK", placements={}))[-1] == (
        "spread_improved",
        True,
    )


def test_smart_and_global_spread() -> None:
    s = scenario(
        """
balancing: {method: global_smart, w_global_mem: 1, w_global_cpu: 2, w_global_io: 0}
nodes:
  a: {cpu_total: 10, memory_total_gb: 10}
  b: {cpu_total: 10, memory_total_gb: 10}
vms:
  v: {node: a, cpu: 1, memory_gb: 5, cpu_usage: 2.5, cpu_pressure: 10, priority: 1}
"""
    )
    # memory: (1·0.5 + 1·0)/2 = 0.25; cpu: (1·0.25 + 1·0.10)/2 = 0.175 -> (0.25 + 2·0.175)/3.
    assert load_gap(s, {"v": "a"}) == pytest.approx((0.25 + 2 * 0.175) / 3)


def test_max_migrations_node_empty_and_placements() -> None:
    s = scenario(
        RULES
        + """
expect:
  constraints_satisfied: false
  max_migrations: 1
  node_empty: node-C
  placements: {c: node-B, d: "== c", ghost: "== phantom", a: "== d"}
"""
    )
    final = {"a": "node-A", "b": "node-A", "c": "node-B", "d": "node-B"}
    checks = evaluate_expect(s, feasible=True, status="OK", placements=final)
    assert names(checks) == [
        ("feasible", True),
        ("max_migrations", True),
        ("node_empty", True),
        ("placement:c", True),
        ("placement:d", True),
        ("placement:ghost", True),  # two missing placements count as equal
        ("placement:a", False),
    ]
    assert checks[1] == Check("max_migrations", "≤1", True, "got 1")
    final["b"] = "node-C"
    checks = evaluate_expect(s, feasible=True, status="OK", placements=final)
    assert checks[1].detail == "got 2" and not checks[1].passed
    assert checks[2] == Check("node_empty", "node-C", False, "still has ['b']")


def test_path_feasible() -> None:
    s = scenario(RULES + "expect: {constraints_satisfied: false, path_feasible: true}")
    p = s.initial_placements
    assert names(evaluate_expect(s, feasible=True, status="OK", placements=p, path_feasible=True))[
        -1
    ] == ("path_feasible", True)
    last = evaluate_expect(
        s, feasible=True, status="OK", placements=p, path_feasible=False, unreachable="a → node-B"
    )[-1]
    assert last == Check("path_feasible", "True", False, "unreachable: a → node-B")
    assert names(evaluate_expect(s, feasible=True, status="OK", placements=p))[-1] == (
        "feasible",
        True,
    )
    quiet = scenario(RULES + "expect: {constraints_satisfied: false}")
    assert (
        len(evaluate_expect(quiet, feasible=True, status="OK", placements=p, path_feasible=True))
        == 1
    )
    last = evaluate_expect(quiet, feasible=True, status="OK", placements=p, path_feasible=False)[-1]
    assert (last.name, last.expected, last.passed) == ("path_feasible", "reachable", False)


# --------------------------------------------------------------------------------------------
# Running, paths and JUnit


SMALL = """
name: Small
balancing: {method: memory, balanciness: 5}
nodes:
  node-A: {cpu_total: 16, memory_total_gb: 64}
  node-B: {cpu_total: 16, memory_total_gb: 64}
vms:
  vm-1: {node: node-A, cpu: 2, memory_gb: 16}
  vm-2: {node: node-A, cpu: 2, memory_gb: 16}
expect:
  spread_improved: true
  max_migrations: 1
"""


def test_check_scenario_end_to_end() -> None:
    result = check_scenario(scenario(SMALL), time_limit=2.0)
    assert result.passed
    assert result.migrations == 1
    assert result.solver["status"] == "OPTIMAL" and result.solver["plan_feasible"]
    assert result.plan is not None and result.plan.steps == 1
    wrong = check_scenario(
        scenario(SMALL.replace("max_migrations: 1", "max_migrations: 0")), time_limit=2.0
    )
    assert not wrong.passed
    assert [c.name for c in wrong.failures] == ["max_migrations"]


def test_other_strategies_run_too() -> None:
    result = check_scenario(scenario(SMALL), strategy="pve-bruteforce")
    assert result.checks[0] == Check("feasible", "True", True, "OK")


def test_check_paths_and_junit(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "ok.yaml").write_text(SMALL)
    (tmp_path / "a.yaml").write_text(SMALL.replace("max_migrations: 1", "max_migrations: 0"))
    (tmp_path / "b" / "off.yaml.disabled").write_text(SMALL)
    (tmp_path / "b" / "broken.yaml").write_text("nodes: [\n")
    results = check_paths([tmp_path], time_limit=2.0)
    assert [Path(r.path).name for r in results] == ["a.yaml", "broken.yaml", "ok.yaml"]
    assert [r.passed for r in results] == [False, False, True]
    assert results[1].checks[0].name == "load" and "broken.yaml" in results[1].checks[0].detail

    xml = junit_xml(results)
    root = ET.fromstring(xml)
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("3", "2")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["Small", "broken", "Small"]
    assert cases[1].get("classname") == "proxlb-scenarios.b"
    failure = cases[0].find("failure")
    assert failure is not None and "max_migrations: expected ≤0, got 1" in failure.get(
        "message", ""
    )
    assert cases[2].find("failure") is None
    assert "OPTIMAL" in (cases[2].findtext("system-out") or "")
