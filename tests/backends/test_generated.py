"""Generated months (opendrs.backends.generated): deterministic, valid, and of different shapes."""

from __future__ import annotations

import pytest

from opendrs.backends.generated import (
    DEFAULT_GUESTS,
    DEFAULT_NODES,
    generated_scenario,
    shape_of,
)
from opendrs.backends.sim import Simulator
from opendrs.engine.usage import CapacityModel
from opendrs.model.snapshot import dumps

GiB = 1024**3


def test_the_same_seed_gives_the_same_month() -> None:
    first, second = generated_scenario(7), generated_scenario(7)
    assert dumps(first.cluster) == dumps(second.cluster)
    assert first.workloads == second.workloads
    assert first.faults == second.faults
    assert first.migration == second.migration
    sims = [Simulator(s, days=0.5) for s in (first, second)]
    for sim in sims:
        sim.sleep(43_200)
    assert sims[0].stats() == sims[1].stats()


def test_different_seeds_give_different_shapes() -> None:
    shapes = [shape_of(seed) for seed in range(40)]
    assert {s.nodes for s in shapes} == {"uniform", "two sizes", "mixed"}
    assert {s.packing for s in shapes} == {"balanced", "skewed", "packed", "one hot node"}
    assert {s.mix for s in shapes} == {
        "mixed",
        "office hours",
        "batch bursts",
        "trends",
        "random walks",
    }
    assert {s.node_failures for s in shapes} == {0, 1, 2}
    assert {s.maintenance for s in shapes} == {0, 1, 2}
    clusters = {dumps(generated_scenario(seed).cluster) for seed in range(4)}
    assert len(clusters) == 4


def test_the_size_changes_the_size_not_the_shape() -> None:
    small = generated_scenario(5, nodes=4, guests=40)
    assert len(small.cluster.nodes) == 4 and len(small.cluster.guests) == 40
    default = generated_scenario(5)
    assert len(default.cluster.nodes) == DEFAULT_NODES
    assert len(default.cluster.guests) == DEFAULT_GUESTS
    assert {g.tags for g in small.cluster.guests} <= {g.tags for g in default.cluster.guests}
    assert sorted(f.type for f in small.faults) == sorted(f.type for f in default.faults)


@pytest.mark.parametrize("seed", range(12))
def test_a_generated_month_starts_valid_and_fits_with_a_node_down(seed: int) -> None:
    scenario = generated_scenario(seed)
    cluster = scenario.cluster
    capacity = CapacityModel.build(cluster)
    assert not capacity.over(capacity.committed()).any()
    where = {g.id: g.node for g in cluster.guests}
    for rule in cluster.rules.guest_affinity:
        assert len({where[g] for g in rule.guests}) == len(rule.guests)
    # Every guest follows a workload; the faults name nodes of the cluster, within the month.
    assert all(scenario.workload_of(g) is not None for g in cluster.guests)
    names = {n.name for n in cluster.nodes}
    for fault in scenario.faults:
        assert fault.node is None or fault.node in names
        assert fault.at is not None and 0 < fault.at < scenario.duration
    # With the biggest node down, its guests' configured memory still fits the others.
    reserve = cluster.settings.reserve_memory
    memory = sorted(n.memory - reserve for n in cluster.nodes)
    configured = sum(g.memory for g in cluster.guests)
    assert configured < 0.9 * sum(memory[:-1])


@pytest.mark.parametrize(("nodes", "guests"), [(2, 100), (201, 100), (10, 9), (10, 10_001)])
def test_sizes_out_of_range_are_refused(nodes: int, guests: int) -> None:
    with pytest.raises(ValueError, match="must be from"):
        generated_scenario(1, nodes, guests)


def test_a_packed_start_is_unbalanced_and_a_balanced_one_is_not() -> None:
    def memory_spread(seed: int) -> float:
        cluster = generated_scenario(seed).cluster
        used = {n.name: 0 for n in cluster.nodes}
        for g in cluster.guests:
            used[g.node] += g.memory
        fill = [used[n.name] / n.memory for n in cluster.nodes]
        return max(fill) - min(fill)

    seeds = {shape_of(s).packing: s for s in range(40)}
    assert memory_spread(seeds["balanced"]) < 0.15
    for packing in ("skewed", "packed", "one hot node"):
        assert memory_spread(seeds[packing]) > 0.3
