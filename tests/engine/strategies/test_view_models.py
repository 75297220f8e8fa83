"""The strategies that read the view's models: static-greedy, incus, drs-pressure and
proxlb-greedy read measured usage only through their view (its loads, its constraints, its
balancing usage), so a view that smooths the observation's usage decides as a view of the
cluster with that usage written in; and :func:`~opendrs.engine.strategies.base.start`, the
preamble they share, starts where the view is."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import clusters
from opendrs.engine.placement import PlacementState
from opendrs.engine.strategies import get_strategy
from opendrs.engine.strategies.base import Request, cluster_imbalance, start, usable_nodes
from opendrs.engine.usage import MeasuredUsage, with_usage
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Node, Settings

GiB = 1024**3
ON_VIEW_MODELS = ("static-greedy", "incus", "drs-pressure", "proxlb-greedy")
#: Options that make each strategy move more than its defaults would on small clusters.
EAGER: dict[str, dict[str, object]] = {
    "static-greedy": {"passes": 2, "keep": 0.001},
    "incus": {"threshold": 5.0, "max_moves": 4},
    "drs-pressure": {"min_uptime": 0, "cpu_pressure": 0.05, "memory_threshold": 0.5},
    "proxlb-greedy": {"balanciness": 2.0},
}


def _smoothed(cluster: Cluster, factors: list[float]) -> MeasuredUsage:
    """A usage with each guest's measured values and each host's own load scaled."""
    own = MeasuredUsage.of(cluster)
    scale = np.resize(np.array(factors), len(own.cpu)) if len(own.cpu) else np.zeros(0)
    base = np.resize(np.array(factors), len(own.base_cpu))
    return MeasuredUsage.replacing(cluster, own.cpu * scale, own.memory * scale, base, base * GiB)


@pytest.mark.parametrize("name", ON_VIEW_MODELS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clusters(max_nodes=5, max_guests=14),
    st.lists(st.sampled_from([0.25, 0.5, 1.5, 3.0]), min_size=1, max_size=4),
    st.sampled_from(["dynamic", "static"]),
)
def test_a_smoothing_view_decides_as_the_written_cluster(
    name: str, cluster: Cluster, factors: list[float], mode: str
) -> None:
    cluster = replace(cluster, settings=replace(cluster.settings, mode=mode))
    average = _smoothed(cluster, factors)
    info = get_strategy(name)
    options = EAGER[name]
    smoothed = info.propose(CycleView(cluster, average), Request(), options)
    written = info.propose(CycleView(with_usage(cluster, average)), Request(), options)
    assert smoothed.as_dict() == written.as_dict()


def test_the_balancing_usage_is_the_average_or_the_observation_own() -> None:
    cluster = Cluster(
        (Node("n1", 8, 32 * GiB), Node("n2", 8, 32 * GiB)),
        (Guest("a", "n1", cpu=4, memory=8 * GiB, cpu_used=1.0, memory_used=4 * GiB),),
        settings=Settings(mode="dynamic"),
    )
    average = _smoothed(cluster, [2.0])
    assert CycleView(cluster, average).balancing_usage is average
    own = CycleView(cluster).balancing_usage
    assert own.cpu.tolist() == [1.0] and own.memory.tolist() == [4.0 * GiB]
    # Built from the observation and the average alone: kept when the view is guarded.
    view = CycleView(cluster, average)
    assert view.guarding(None, frozenset()).balancing_usage is view.balancing_usage


def test_start_is_the_view_with_the_request_forbidden_placements_refused() -> None:
    cluster = Cluster(
        (Node("n1", 8, 32 * GiB), Node("n2", 8, 32 * GiB), Node("n3", 8, 32 * GiB)),
        tuple(Guest(f"g{j}", "n1", cpu=2, memory=4 * GiB, cpu_used=1.5) for j in range(4)),
        settings=Settings(mode="dynamic"),
    )
    view = CycleView(cluster)
    begun = start(view, {("g0", "n2")})
    assert begun.cluster is view.observed and begun.state.loads is view.loads
    assert not begun.state.allowed(np.array([0]))[1] and begun.state.allowed(np.array([1]))[1]
    # The view's own constraints forbid nothing: the next request may place g0 on n2.
    assert PlacementState.build(cluster, view.constraints).allowed(np.array([0]))[1]
    assert begun.before == cluster_imbalance(cluster, loads=view.loads)
    assert begun.usable.tolist() == usable_nodes(begun.state).tolist() == [True, True, True]
    begun.state.commit(np.array([0]), 2)
    assert begun.imbalance() == cluster_imbalance(cluster, begun.state.assign, view.loads)
    assert begun.imbalance() != begun.before
    # Other loads (drs-pressure's usage loads) are the state's, and the imbalance's.
    other = start(view, (), view.usage_loads)
    assert isinstance(other.state, PlacementState) and other.state.loads is view.usage_loads
