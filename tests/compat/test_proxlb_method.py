"""A proxlb-solver scenario's ``balancing.method`` is what every strategy balances.

The method becomes the imported cluster's :class:`~opendrs.model.cluster.Settings` (usage mode,
balance source and resource weights, :func:`~opendrs.compat.proxlb.balance_metric`); every strategy
reads those, and the lower bounds hold only the balanced resources to a target.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from opendrs.cli.main import main
from opendrs.compat.proxlb import Balancing, balance_metric, check_scenario, loads_scenario
from opendrs.engine.bounds import lower_bounds, migration_lower_bound
from opendrs.engine.strategies import DEFAULT_STRATEGY, get_strategy
from opendrs.engine.strategies.base import cluster_imbalance
from opendrs.model.cluster import Move


def scenario(text: str):
    return loads_scenario(textwrap.dedent(text), filename="method.yaml")


#: Memory is balanced (24 GiB on each node), configured vCPUs are not (24 against 3).
MEMORY_EVEN = """
balancing: {method: METHOD, balanciness: 5}
nodes:
  node-A: {cpu_total: 16, memory_total_gb: 64}
  node-B: {cpu_total: 16, memory_total_gb: 64}
vms:
  vm-a1: {node: node-A, cpu: 8, memory_gb: 8}
  vm-a2: {node: node-A, cpu: 8, memory_gb: 8}
  vm-a3: {node: node-A, cpu: 8, memory_gb: 8}
  vm-b1: {node: node-B, cpu: 1, memory_gb: 8}
  vm-b2: {node: node-B, cpu: 1, memory_gb: 8}
  vm-b3: {node: node-B, cpu: 1, memory_gb: 8}
expect:
  max_migrations: 0
"""

#: Every strategy but the exact one runs with the scenario's cluster settings alone.
STRATEGIES = (
    "balance",
    "static-greedy",
    "pve-bruteforce",
    "pve-topsis",
    "incus",
    "proxlb-greedy",
    "drs-pressure",
    "optimal",
)


# --------------------------------------------------------------------------------------------
# The mapping


@pytest.mark.parametrize(
    ("method", "mode", "expected", "approximate"),
    [
        ("memory", "used", ("static", 0.0, 1.0, "usage"), False),
        ("memory", "assigned", ("static", 0.0, 1.0, "usage"), False),
        ("cpu", "used", ("dynamic", 1.0, 0.0, "usage"), False),
        ("cpu", "assigned", ("static", 1.0, 0.0, "usage"), False),
        ("cpu_psi", "used", ("static", 1.0, 0.0, "pressure"), False),
        ("cpu_psi", "assigned", ("static", 1.0, 0.0, "pressure"), False),
        ("cpu", "psi", ("static", 1.0, 0.0, "pressure"), False),
        ("memory_psi", "used", ("static", 0.0, 1.0, "pressure"), False),
        ("memory", "psi", ("static", 0.0, 1.0, "pressure"), False),
        # The loader's smart weights are 1 / 1: pressure on the tie, noted.
        ("cpu_smart", "assigned", ("static", 1.0, 0.0, "pressure"), True),
        ("memory_smart", "used", ("static", 0.0, 1.0, "pressure"), True),
        ("global_smart", "used", ("static", 20.0, 20.0, "pressure"), True),
        ("disk", "used", ("static", 1.0, 1.0, "usage"), True),
        ("disk", "psi", ("static", 1.0, 1.0, "usage"), True),
        ("io_psi", "used", ("static", 1.0, 1.0, "usage"), True),
        ("io_smart", "used", ("static", 1.0, 1.0, "usage"), True),
    ],
)
def test_each_method_becomes_the_clusters_balance(
    method: str, mode: str, expected: tuple[str, float, float, str], approximate: bool
) -> None:
    metric = balance_metric(Balancing(method=method, mode=mode))
    assert (metric.mode, metric.weight_cpu, metric.weight_memory, metric.source) == expected
    assert (metric.note is not None) == approximate


def test_smart_weights_without_pressure_are_exact() -> None:
    weights = {**Balancing().weights, "w_cpu_psi": 0, "w_mem_psi": 0, "w_global_io": 0}
    metric = balance_metric(Balancing(method="cpu_smart", weights=weights))
    assert (metric.mode, metric.weight_cpu, metric.weight_memory, metric.note) == (
        "dynamic",
        1.0,
        0.0,
        None,
    )
    assert metric.source == "usage"
    weights["w_global_cpu"] = 5
    metric = balance_metric(Balancing(method="global_smart", weights=weights))
    assert (metric.weight_cpu, metric.weight_memory, metric.note) == (5.0, 10.0, None)
    assert metric.source == "usage"


@pytest.mark.parametrize(
    ("method", "weights", "has_pressure", "expected", "approximate"),
    [
        # One part constant: the other alone, exactly.
        ("cpu_smart", {"w_cpu_usage": 0}, None, ("static", 1.0, 0.0, "pressure"), False),
        ("cpu_smart", {}, {"cpu": False}, ("dynamic", 1.0, 0.0, "usage"), False),
        ("memory_smart", {}, {"memory": False}, ("static", 0.0, 1.0, "usage"), False),
        ("memory_smart", {"w_mem_usage": 0}, None, ("static", 0.0, 1.0, "pressure"), False),
        # Both parts: the heavier one, noted.
        ("cpu_smart", {"w_cpu_usage": 2}, None, ("dynamic", 1.0, 0.0, "usage"), True),
        ("memory_smart", {"w_mem_psi": 2}, None, ("static", 0.0, 1.0, "pressure"), True),
        # global_smart: usage parts 10·1 + 10·1 against pressure parts 10·1 (cpu) + 0 (memory).
        ("global_smart", {}, {"memory": False}, ("dynamic", 20.0, 10.0, "usage"), True),
        (
            "global_smart",
            {"w_cpu_usage": 0, "w_mem_usage": 0, "w_global_io": 0},
            None,
            ("static", 10.0, 10.0, "pressure"),
            False,
        ),
    ],
)
def test_smart_methods_balance_one_source(
    method: str,
    weights: dict[str, float],
    has_pressure: dict[str, bool] | None,
    expected: tuple[str, float, float, str],
    approximate: bool,
) -> None:
    balancing = Balancing(method=method, weights={**Balancing().weights, **weights})
    metric = balance_metric(balancing, has_pressure)
    assert (metric.mode, metric.weight_cpu, metric.weight_memory, metric.source) == expected
    assert (metric.note is not None) == approximate


def test_the_imported_cluster_carries_the_method_and_notes_approximations() -> None:
    memory = scenario(MEMORY_EVEN.replace("METHOD", "memory"))
    settings = memory.cluster.settings
    assert (settings.mode, settings.weight_cpu, settings.weight_memory) == ("static", 0.0, 1.0)
    assert settings.balance_source == "usage"
    assert not any("balancing.method" in n for n in memory.notes)
    psi = scenario(MEMORY_EVEN.replace("METHOD", "cpu_psi"))
    settings = psi.cluster.settings
    assert (settings.mode, settings.weight_cpu, settings.weight_memory) == ("static", 1.0, 0.0)
    assert settings.balance_source == "pressure"
    assert not any("balancing.method" in n for n in psi.notes)
    # optimal still gets the method itself, exactly.
    assert psi.options["method"] == "cpu_psi"
    # cpu_smart with no guest's CPU pressure: its pressure part is constant, usage is exact.
    smart = scenario(MEMORY_EVEN.replace("METHOD", "cpu_smart"))
    assert smart.cluster.settings.balance_source == "usage"
    assert not any("balancing.method" in n for n in smart.notes)
    stalling = scenario(
        MEMORY_EVEN.replace("METHOD", "cpu_smart").replace(
            "memory_gb: 8}", "memory_gb: 8, cpu_pressure: 3}", 1
        )
    )
    assert stalling.cluster.settings.balance_source == "pressure"
    assert any(
        n.startswith("balancing.method cpu_smart:") and "only optimal balances both" in n
        for n in stalling.notes
    )


# --------------------------------------------------------------------------------------------
# Every strategy balances the method


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_memory_method_leaves_balanced_memory_alone(strategy: str) -> None:
    """Memory is even: no strategy moves a guest to even out vCPUs (each did before, but
    proxlb-greedy, drs-pressure and optimal)."""
    result = check_scenario(scenario(MEMORY_EVEN.replace("METHOD", "memory")), strategy=strategy)
    assert result.passed, result.failures
    assert result.migrations == 0


def test_the_default_strategy_balances_memory_not_vcpus() -> None:
    """Memory is uneven and vCPUs pull the other way: the default strategy evens memory with one
    move and leaves vCPUs as they fall (before, it spent moves on them too)."""
    s = scenario(
        """
        balancing: {method: memory, balanciness: 5}
        nodes:
          node-A: {cpu_total: 16, memory_total_gb: 64}
          node-B: {cpu_total: 16, memory_total_gb: 64}
        vms:
          vm-1: {node: node-A, cpu: 1, memory_gb: 16}
          vm-2: {node: node-A, cpu: 1, memory_gb: 16}
          vm-3: {node: node-A, cpu: 1, memory_gb: 16}
          vm-4: {node: node-B, cpu: 12, memory_gb: 16}
        """
    )
    proposal = get_strategy(DEFAULT_STRATEGY).propose(s.cluster)
    moves = proposal.net_moves()
    assert [(m.guest, m.target) for m in moves] in ([(f"vm-{i}", "node-B")] for i in (1, 2, 3))
    after = cluster_imbalance(s.cluster.apply([Move(m.guest, m.source, m.target) for m in moves]))
    assert after.resources["memory"].spread == 0.0


def test_cpu_method_balances_measured_use() -> None:
    """``method: cpu`` (used mode) balances ``cpu_usage``: vCPUs and memory are even, use is not."""
    text = """
        balancing: {method: cpu, balanciness: 5}
        nodes:
          node-A: {cpu_total: 16, memory_total_gb: 64}
          node-B: {cpu_total: 16, memory_total_gb: 64}
        vms:
          vm-a1: {node: node-A, cpu: 4, memory_gb: 8, cpu_usage: 4.0}
          vm-a2: {node: node-A, cpu: 4, memory_gb: 8, cpu_usage: 4.0}
          vm-b1: {node: node-B, cpu: 4, memory_gb: 8, cpu_usage: 0.5}
          vm-b2: {node: node-B, cpu: 4, memory_gb: 8, cpu_usage: 0.5}
        """
    s = scenario(text)
    for strategy in ("balance", "pve-bruteforce", "proxlb-greedy"):
        # a scenario has no HA resources: Proxmox's rebalancer is asked about every guest
        extra = {"scope": "all"} if strategy == "pve-bruteforce" else {}
        proposal = get_strategy(strategy).propose(s.cluster, options={"max_moves": 10, **extra})
        before = cluster_imbalance(s.cluster).resources["cpu"].spread
        assert proposal.net_moves(), strategy
        assert proposal.after.resources["cpu"].spread < before, strategy
        assert proposal.options.get("method", "cpu") == "cpu", strategy
    # In assigned mode (vCPUs) the same cluster is balanced.
    assigned = scenario(text.replace("balanciness: 5", "balanciness: 5, mode: assigned"))
    assert not get_strategy("balance").propose(assigned.cluster).net_moves()


def test_drs_pressure_scores_targets_on_the_method() -> None:
    """drs-pressure sends a stalling guest where Proxmox's start scoring of the method is best:
    with cpu alone, the node with the least cpu — not the one with the least memory."""
    s = scenario(
        """
        balancing: {method: cpu, mode: assigned, balanciness: 5}
        nodes:
          node-A: {cpu_total: 16, memory_total_gb: 64}
          node-B: {cpu_total: 16, memory_total_gb: 64}
          node-C: {cpu_total: 16, memory_total_gb: 64}
        vms:
          vm-hot: {node: node-A, cpu: 4, memory_gb: 4, cpu_pressure: 90.0}
          vm-a: {node: node-A, cpu: 10, memory_gb: 4}
          vm-b: {node: node-B, cpu: 9, memory_gb: 4}
          vm-c: {node: node-C, cpu: 2, memory_gb: 40}
        """
    )
    proposal = get_strategy("drs-pressure").propose(
        s.cluster, options={"min_uptime": 0, "max_moves": 1}
    )
    assert [(m.guest, m.target) for m in proposal.net_moves()] == [("vm-hot", "node-C")]


def test_plan_on_a_memory_scenario_balances_memory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``opendrs plan scenario.yaml`` with the default strategy: no move, and the bound it
    reports holds memory alone."""
    path = tmp_path / "even.yaml"
    path.write_text(MEMORY_EVEN.replace("METHOD", "memory"))
    code = main(["plan", str(path), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["moves"] == [] and data["migrations"] == 0
    assert data["bounds"]["resources"] == ["memory"]


# --------------------------------------------------------------------------------------------
# The memory-only lower bound


def test_the_bound_holds_only_the_balanced_resources() -> None:
    s = scenario(MEMORY_EVEN.replace("METHOD", "memory"))
    cluster = s.cluster
    memory_only = migration_lower_bound(cluster, 0.0)
    assert memory_only.resources == ("memory",) and memory_only.migrations == 0
    both = migration_lower_bound(cluster, 0.0, resources=("cpu", "memory"))
    assert both.resources == ("cpu", "memory") and both.migrations > 0
    assert lower_bounds(cluster, {"memory": 0.0}, resources=["memory"]).migrations == 0
    with pytest.raises(ValueError, match="resources"):
        migration_lower_bound(cluster, 0.0, resources=("disk",))
