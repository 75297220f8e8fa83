"""The exact-search yardstick (bench/yardstick.py) on clusters whose optimum is known by hand."""

from __future__ import annotations

import re

import pytest
from bench.generate import bench_guest
from bench.metrics import Evaluator
from bench.realistic_report import measure, section
from bench.report import Case, Row
from bench.yardstick import fewest_moves, free_guests, memory_spread, spreads, warm_start, within

from opendrs.model.cluster import Cluster, Disk, Node, Settings
from opendrs.model.rules import NodeAffinity, Rules

GiB = 1024**3


def _cluster(rules: Rules | None = None, disk_on: int | None = None) -> Cluster:
    """Two nodes of 16 GiB with four 2-GiB guests each (50 %) and a new, empty one (0 %).

    8 guests on 3 nodes cannot be even: the best is 3, 3, 2 (37.5, 37.5, 25 %), a spread of
    12.5 pp, reached with one move from each full node; one move leaves 50 % somewhere.
    """
    nodes = tuple(Node(name, 8, 16 * GiB, storage={"local": 64 * GiB}) for name in "abc")
    guests = tuple(
        bench_guest(
            j,
            "a" if j < 4 else "b",
            1,
            2.0,
            0.5,
            (Disk("local", 8 * GiB),) if j == disk_on else (),
        )
        for j in range(8)
    )
    settings = Settings(mode="static", cpu_overcommit=4.0, allow_local_disks=True)
    return Cluster(nodes, guests, rules or Rules(), settings)


def test_two_moves_reach_the_best_spread_and_are_proven_the_fewest() -> None:
    cluster = _cluster()
    found = fewest_moves(cluster, 0.125, 10.0)
    assert (found.moves, found.optimal, found.bound, found.status) == (2, True, 2, "OPTIMAL")
    assert sorted(found.placement.values()) == ["c", "c"]
    moved_from = sorted(cluster.guest(g).node for g in found.placement)
    assert moved_from == ["a", "b"]
    evaluation = Evaluator(cluster).evaluate(found.placement)
    assert evaluation.after.memory_spread <= 0.125 + 1e-12
    assert evaluation.violations == ()


def test_a_spread_no_placement_reaches_is_proven_infeasible() -> None:
    found = fewest_moves(_cluster(), 0.10, 10.0)
    assert (found.moves, found.optimal, found.status, found.summary) == (
        None,
        True,
        "INFEASIBLE",
        "infeasible",
    )


def test_rule_bound_guests_stay_so_only_the_other_node_gives() -> None:
    # Every guest on a pinned to a: b's guests alone may move, b 2 and c 2 is the best (25 pp).
    pins = tuple(NodeAffinity(f"pin-{j}", (str(100 + j),), {"a": 0}, strict=True) for j in range(4))
    cluster = _cluster(Rules(node_affinity=pins))
    assert free_guests(cluster).tolist() == [False] * 4 + [True] * 4
    assert fewest_moves(cluster, 0.125, 10.0).status == "INFEASIBLE"
    found = fewest_moves(cluster, 0.25, 10.0)
    assert (found.moves, found.optimal) == (2, True)
    assert {cluster.guest(g).node for g in found.placement} == {"b"}


def test_a_guest_with_a_local_disk_stays() -> None:
    cluster = _cluster(disk_on=0)
    assert free_guests(cluster).tolist() == [False] + [True] * 7
    found = fewest_moves(cluster, 0.125, 10.0)
    assert found.moves == 2
    assert "100" not in found.placement


def test_a_hint_is_a_start_not_an_answer() -> None:
    # Starting from a placement with more moves than needed still ends at the fewest.
    cluster = _cluster()
    hint = {"100": "c", "101": "c", "104": "c"}
    found = fewest_moves(cluster, 0.125, 10.0, hint=hint)
    assert (found.moves, found.optimal) == (2, True)
    start = warm_start(cluster, 0.125)
    assert memory_spread(cluster, start) <= 0.125 + 1e-12
    assert memory_spread(cluster, start) == Evaluator(cluster).evaluate(start).after.memory_spread


def _cpu_cluster() -> Cluster:
    """Two nodes of 8 cores and 16 GiB; on a, 4 GiB with 1 vCPU, 2 GiB with 2, 1 GiB with 1 and
    1 GiB with 2 (8 GiB, 6 vCPUs); b is empty.

    Memory alone within 12.5 pp: moving the 4-GiB guest evens memory (one move, 0 pp) but leaves
    5 vCPUs against 1 (50 pp). With vCPUs even too (0 pp) no single move is within 12.5 pp of
    memory (the others leave 25 pp or more), and two are: 2 + 1 GiB with 2 + 1 vCPUs (12.5 pp,
    0 pp) or 4 + 1 GiB with 1 + 2. Memory and vCPUs both even need 4 GiB with 3 vCPUs on b: no
    set of a's guests is that.
    """
    nodes = tuple(Node(name, 8, 16 * GiB) for name in "ab")
    sizes = ((1, 4.0), (2, 2.0), (1, 1.0), (2, 1.0))
    guests = tuple(bench_guest(j, "a", cpu, mem, 0.5) for j, (cpu, mem) in enumerate(sizes))
    return Cluster(nodes, guests, Rules(), Settings(mode="static", cpu_overcommit=4.0))


def test_holding_vcpus_too_costs_a_second_move_proven_the_fewest() -> None:
    cluster = _cpu_cluster()
    memory_alone = fewest_moves(cluster, 0.125, 10.0)
    assert (memory_alone.moves, memory_alone.optimal) == (1, True)
    assert memory_alone.placement == {"100": "b"}
    assert spreads(cluster, memory_alone.placement) == (0.0, 0.5)
    both = fewest_moves(cluster, 0.125, 10.0, cpu_spread=0.0)
    assert (both.moves, both.optimal, both.bound, both.status) == (2, True, 2, "OPTIMAL")
    assert both.cpu_spread == 0.0
    assert spreads(cluster, both.placement) == (0.125, 0.0)
    assert Evaluator(cluster).evaluate(both.placement).violations == ()


def test_memory_and_vcpus_both_even_are_proven_infeasible() -> None:
    cluster = _cpu_cluster()
    assert fewest_moves(cluster, 0.0, 10.0).moves == 1
    found = fewest_moves(cluster, 0.0, 10.0, cpu_spread=0.0)
    assert (found.moves, found.optimal, found.status) == (None, True, "INFEASIBLE")


def test_the_warm_start_holds_vcpus_when_asked() -> None:
    cluster = _cpu_cluster()
    start = warm_start(cluster, 0.125, cpu_spread=0.25)
    assert within(cluster, start, 0.125, 0.25)
    found = fewest_moves(cluster, 0.125, 10.0, hint=start, cpu_spread=0.25)
    assert (found.moves, found.optimal, found.hinted) == (2, True, True)


def test_the_realistic_table_puts_the_search_beside_the_default_strategy() -> None:
    cluster = _cluster()
    evaluator = Evaluator(cluster)
    # Three moves (two from a, one from b) reach 12.5 pp; the search needs two.
    evaluation = evaluator.evaluate({"100": "c", "101": "c", "104": "c"})
    placement = {"100": "c", "101": "c", "104": "c"}
    row = Row("balance", "strategy", 0.5, 64 * 1024**2, evaluation=evaluation, placement=placement)
    case = Case("S", 3, 8, False, evaluator.before, None, True, [row], generator="new-node")
    measured = measure(case, cluster, 1, "balance", 5.0)
    assert measured.yardstick is not None and measured.yardstick.moves == 2
    assert measured.memory_bound["balance"] <= 2
    assert measured.search_evaluation is not None
    assert measured.search_evaluation.violations == ()
    table = section([measured])
    line = next(ln for ln in table.splitlines() if "| balance" in ln)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:5] == ["new-node", "S", "1", "without", "balance"]
    header = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    by_name = dict(zip(header, cells, strict=True))
    assert by_name["mem spread before pp"] == "50.00"
    assert by_name["mem spread pp"] == "12.50"
    assert (by_name["moved"], by_name["best found"], by_name["moved/best"]) == (
        "3",
        "2 (optimal)",
        "1.5×",
    )
    assert by_name["cost GiB"] == "6"
    # One vCPU per 2 GiB on like nodes: the vCPU spread is the memory's, and so is the search.
    assert by_name["vCPU spread pp"] == "12.50"
    assert (by_name["best found, memory and vCPUs"], by_name["moved/best (both)"]) == (
        "2 (optimal)",
        "1.5×",
    )
    assert measured.both_evaluation is not None and measured.both_evaluation.violations == ()
    assert by_name["disk moves with a twin"] == "0 / 0"
    assert "its placement 12.50 pp with 0 violations" in table
    assert "≤ 12.50 pp vCPUs (balance's spreads), from the warm start: OPTIMAL" in table


def test_only_configured_sizes_are_measured() -> None:
    cluster = _cluster()
    dynamic = Cluster(cluster.nodes, cluster.guests, cluster.rules, Settings(mode="dynamic"))
    with pytest.raises(ValueError, match="static"):
        fewest_moves(dynamic, 0.125, 1.0)


def test_the_table_counts_the_disk_moves_a_cheaper_twin_could_have_made() -> None:
    # Guest 100 has a local disk and moves; 101-103, alike without one, stay on its node.
    cluster = _cluster(disk_on=0)
    evaluator = Evaluator(cluster)
    placement = {"100": "c", "104": "c"}
    evaluation = evaluator.evaluate(placement)
    row = Row("balance", "strategy", 0.5, 1, evaluation=evaluation, placement=placement)
    case = Case("S", 3, 8, False, evaluator.before, None, True, [row], generator="new-node")
    measured = measure(case, cluster, 1, "balance", 5.0, search=False)
    assert (measured.twins["balance"].with_twin, measured.twins["balance"].local_disk_moves) == (
        1,
        1,
    )
    assert "| 1 / 1 |" in re.sub(" +", " ", section([measured]))
    assert measured.yardstick is None and "--no-yardstick" in measured.skipped
