"""``Settings.balance_source = "pressure"``: what is balanced is pressure, not usage.

Each guest's balance load is its cpu and memory pressure (PSI ``some``, percent) times its
``priority / 2``; each node's capacity is 100 and the host adds nothing. The hard capacity checks
(:class:`CapacityModel`) do not change; the exact model counts pressure in thousandths of a
percent (not MiB); the lower bounds count no moved memory.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from opendrs.engine.bounds import lower_bounds
from opendrs.engine.strategies import get_strategy
from opendrs.engine.usage import CapacityModel, LoadModel
from opendrs.model.cluster import Cluster, Guest, Node, Pressure, Settings

GiB = 1024**3


def _cluster(source: str = "pressure", mode: str = "dynamic", **settings: object) -> Cluster:
    nodes = (
        Node("a", 8, 32 * GiB, base_cpu=0.5, base_memory=GiB, pressure=Pressure(cpu=30.0)),
        Node("b", 16, 64 * GiB, reserve_cpu=2, reserve_memory=4 * GiB),
    )
    guests = (
        Guest("1", "a", cpu=2, memory=4 * GiB, cpu_used=1.5, pressure=Pressure(12.0, 3.0, 7.0)),
        Guest("2", "a", cpu=4, memory=8 * GiB, pressure=Pressure(4.0, 1.0), priority=3),
        Guest("3", "b", cpu=1, memory=2 * GiB, pressure=Pressure(2.0, 8.0), priority=1),
        Guest("4", "b", cpu=2, memory=2 * GiB, state="stopped", pressure=Pressure(50.0, 50.0)),
    )
    return Cluster(
        nodes,
        guests,
        settings=Settings(mode=mode, balance_source=source, **settings),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("mode", ["basic", "static", "dynamic"])
def test_pressure_is_the_load_whatever_the_mode(mode: str) -> None:
    loads = LoadModel.build(_cluster(mode=mode))
    assert loads.source == "pressure" and loads.mode == mode
    # pressure × priority / 2: priority 2 counts as it is, 3 half as much again, 1 half.
    np.testing.assert_allclose(loads.demand, [[12.0, 3.0], [6.0, 1.5], [1.0, 4.0], [50.0, 50.0]])
    # Every node holds 100 (percent), with no reserve and no load of its own (nor its own PSI).
    np.testing.assert_allclose(loads.capacity, np.full((2, 2), 100.0))
    np.testing.assert_allclose(loads.base, 0.0)
    # The stopped guest puts no load anywhere.
    np.testing.assert_allclose(loads.loads(), [[18.0, 4.5], [1.0, 4.0]])
    np.testing.assert_allclose(loads.fractions(), [[0.18, 0.045], [0.01, 0.04]])
    assert not loads.memory_is_bytes


def test_usage_stays_the_default_and_can_be_asked_for() -> None:
    usage = LoadModel.build(_cluster(source="usage"))
    assert Settings().balance_source == "usage" and usage.source == "usage"
    assert usage.memory_is_bytes
    np.testing.assert_allclose(usage.capacity[0], [8.0, 32.0 * GiB])
    # A pressure cluster's usage is still there when asked for.
    asked = LoadModel.build(_cluster(), source="usage")
    np.testing.assert_allclose(asked.loads(), usage.loads())
    assert not LoadModel.build(_cluster(source="usage", mode="basic")).memory_is_bytes


def test_the_hard_capacity_checks_do_not_change() -> None:
    pressure, usage = CapacityModel.build(_cluster()), CapacityModel.build(_cluster("usage"))
    assert pressure.dimensions == usage.dimensions
    assert tuple(map(str, usage.dimensions)) == ("vcpus", "memory", "cpu_used", "memory_used")
    np.testing.assert_array_equal(pressure.limit, usage.limit)
    np.testing.assert_array_equal(pressure.demand, usage.demand)
    np.testing.assert_array_equal(pressure.committed(), usage.committed())


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="balance_source: expected one of usage, pressure"):
        Settings(balance_source="psi")  # type: ignore[arg-type]


def _stalling() -> Cluster:
    """Memory pressure on node a: guest m1 (2 GiB) stalls 10 %, m2 (16 GiB) 2 %, m3 (8 GiB) 8 %.
    Configured memory would move m2, or m1 with m3; pressure wants m1 alone to b (10 % each)."""
    nodes = (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB))
    guests = (
        Guest("m1", "a", cpu=1, memory=2 * GiB, pressure=Pressure(memory=10.0)),
        Guest("m2", "a", cpu=1, memory=16 * GiB, pressure=Pressure(memory=2.0)),
        Guest("m3", "a", cpu=1, memory=8 * GiB, pressure=Pressure(memory=8.0)),
    )
    settings = Settings(mode="static", balance_source="pressure", weight_cpu=0.0, weight_memory=1.0)
    return Cluster(nodes, guests, settings=settings)


@pytest.mark.parametrize("strategy", ["optimal", "balance"])
def test_memory_pressure_is_balanced_not_memory(strategy: str) -> None:
    """The exact model counts pressure in thousandths of a percent: rounded to MiB as bytes,
    every guest's memory pressure read 0 and nothing moved."""
    proposal = get_strategy(strategy).propose(_stalling())
    assert [(m.guest, m.target) for m in proposal.net_moves()] == [("m1", "b")]
    assert proposal.after.resources["memory"].spread == pytest.approx(0.0)
    # Configured memory is balanced otherwise (m2 alone, or m1 with m3).
    usage = replace(_stalling().settings, balance_source="usage")
    by_memory = get_strategy(strategy).propose(replace(_stalling(), settings=usage))
    assert {m.guest for m in by_memory.net_moves()} in ({"m2"}, {"m1", "m3"})


def test_the_bounds_hold_pressure_and_move_no_bytes() -> None:
    bounds = lower_bounds(_stalling(), {"memory": 0.0})
    assert bounds.resources == ("memory",)
    assert bounds.migrations == 1
    # 10 % of pressure is not 10 bytes of memory to move.
    assert bounds.moved_bytes == 0
    usage = replace(_stalling().settings, balance_source="usage")
    assert lower_bounds(replace(_stalling(), settings=usage), {"memory": 0.0}).moved_bytes > 0


def test_a_measured_overload_still_needs_a_repair() -> None:
    """Dynamic mode checks measured use as a hard limit whatever is balanced: 6 cores busy on a
    4-core node is a repair, and the policy's cheap screen reads usage for it."""
    from opendrs.engine.policy import may_need_repair

    nodes = (Node("a", 4, 32 * GiB), Node("b", 4, 32 * GiB))
    guests = (
        Guest("1", "a", cpu=4, memory=GiB, cpu_used=3.0),
        Guest("2", "a", cpu=4, memory=GiB, cpu_used=3.0),
    )
    usage = Cluster(nodes, guests, settings=Settings(mode="dynamic"))
    assert may_need_repair(usage)
    pressure = replace(usage, settings=replace(usage.settings, balance_source="pressure"))
    assert may_need_repair(pressure)


def test_drs_pressure_reads_its_own_signals_whatever_is_balanced() -> None:
    """drs-pressure's memory thresholds are on memory use: a pressure source must not turn
    them into thresholds on percentages of pressure."""
    nodes = (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB))
    guests = tuple(
        Guest(str(i), "a", cpu=1, memory=8 * GiB, memory_used=7 * GiB, uptime=86400)
        for i in range(8)
    )
    usage = Cluster(nodes, guests, settings=Settings(mode="dynamic"))
    pressure = replace(usage, settings=replace(usage.settings, balance_source="pressure"))
    on_usage = get_strategy("drs-pressure").propose(usage)
    on_pressure = get_strategy("drs-pressure").propose(pressure)
    assert on_usage.moves and on_pressure.moves == on_usage.moves  # 56 GiB used > 85 % of 64
    assert any("balance_source pressure does not change" in n for n in on_pressure.notes)
