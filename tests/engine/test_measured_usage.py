"""Smoothed usage as arrays: the view builds its models on them, and a decision on the
observation with the window's usage is the decision on the cluster written from it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import clusters
from opendrs.engine.constraints import Constraints
from opendrs.engine.policy import PastMigrations, PolicyConfig, PolicyState, UsageWindow, decide
from opendrs.engine.usage import CapacityModel, LoadModel, MeasuredUsage, with_usage
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.report.reasons import explain

NOW = 1_000_000.0
EAGER = PolicyConfig(hold=1, margin=0.0, cooldown=0, no_return=0, min_uptime=0, smoothing=3600)


def _scaled(cluster: Cluster, factor: float, base: float) -> Cluster:
    """``cluster`` with every measured value scaled by ``factor`` and each host loaded ``base``."""
    guests = tuple(
        replace(
            g,
            cpu_used=None if g.cpu_used is None else g.cpu_used * factor,
            memory_used=None if g.memory_used is None else int(g.memory_used * factor),
        )
        for g in cluster.guests
    )
    nodes = tuple(replace(n, base_cpu=base, base_memory=int(base * 2**30)) for n in cluster.nodes)
    return replace(cluster, nodes=nodes, guests=guests)


def _window(cluster: Cluster, factors: list[float]) -> UsageWindow:
    window = UsageWindow()
    for k, factor in enumerate(factors):
        window = window.add(NOW - 300 * (len(factors) - 1 - k), _scaled(cluster, factor, k / 4))
    return window


@settings(max_examples=60, deadline=None)
@given(
    clusters(max_nodes=5, max_guests=14),
    st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5]), min_size=1, max_size=4),
)
def test_models_on_arrays_equal_models_on_the_written_cluster(
    cluster: Cluster, factors: list[float]
) -> None:
    cluster = replace(cluster, settings=replace(cluster.settings, mode="dynamic"))
    window = _window(cluster, [*factors, 1.0])
    average, recent = window.usage(cluster, 600)
    for usage in (average, recent):
        written = with_usage(cluster, usage)
        on_arrays, on_cluster = LoadModel.build(cluster, usage=usage), LoadModel.build(written)
        assert np.array_equal(on_arrays.loads(), on_cluster.loads())
        caps = CapacityModel.build(cluster, usage), CapacityModel.build(written)
        assert np.array_equal(caps[0].committed(), caps[1].committed())
        assert np.array_equal(caps[0].demand, caps[1].demand)
        # The arrays of the written cluster are the arrays it was written from.
        own = MeasuredUsage.of(written)
        assert np.array_equal(own.cpu, usage.cpu) and np.array_equal(own.memory, usage.memory)


@settings(max_examples=40, deadline=None)
@given(
    clusters(max_nodes=5, max_guests=14),
    st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]), min_size=1, max_size=4),
)
def test_deciding_on_arrays_is_deciding_on_the_smoothed_cluster(
    cluster: Cluster, factors: list[float]
) -> None:
    window = _window(cluster, [*factors, 1.0])
    average, recent = window.usage(cluster, 600)
    on_arrays = decide(
        cluster,
        NOW,
        EAGER,
        PolicyState(),
        PastMigrations(),
        busy=False,
        average=average,
        recent=recent,
    )
    smoothed = window.smoothed(cluster)
    on_cluster = decide(
        smoothed, NOW, EAGER, PolicyState(), PastMigrations(), busy=False, recent=recent
    )
    assert (on_arrays.code, explain(on_arrays), on_arrays.metric) == (
        on_cluster.code,
        explain(on_cluster),
        on_cluster.metric,
    )
    assert on_arrays.plan == on_cluster.plan


def test_the_view_reads_usage_from_arrays_and_refuses_another_clusters() -> None:
    gib = 2**30
    cluster = Cluster(
        (Node("n1", 8, 32 * gib), Node("n2", 8, 32 * gib)),
        (
            Guest("a", "n1", cpu=4, memory=8 * gib, cpu_used=1.0, memory_used=4 * gib),
            Guest("b", "n2", cpu=4, memory=8 * gib, cpu_used=None, memory_used=2 * gib),
        ),
        settings=Settings(mode="dynamic"),
    )
    usage = MeasuredUsage.replacing(
        cluster,
        np.array([3.0, 5.0]),
        np.array([6.4 * gib, np.nan]),
        np.array([0.5, np.nan]),
        np.array([np.nan, gib]),
    )
    # b's cpu is not measured now: its configured 4 cores stand; memory is whole bytes.
    assert usage.cpu.tolist() == [3.0, 4.0]
    assert usage.memory.tolist() == [float(round(6.4 * gib)), 2.0 * gib]
    assert usage.base_cpu.tolist() == [0.5, 0.0] and usage.base_memory.tolist() == [0.0, gib]
    view = CycleView(cluster, usage)
    assert view.loads.loads().tolist() == [[3.5, round(6.4 * gib)], [4.0, 3.0 * gib]]
    assert view.constraints == view.constraints  # built once
    assert view.cluster.guest("a").cpu_used == 3.0 and view.cluster.guest("b").cpu_used is None
    assert view.observed.guest("a").cpu_used == 1.0
    other = replace(cluster, guests=cluster.guests[:1])
    with pytest.raises(ValueError, match="another cluster"):
        CycleView(other, usage)
    with pytest.raises(ValueError, match="another cluster"):
        with_usage(other, usage)
    assert isinstance(Constraints.build(cluster, usage=usage), Constraints)
