"""The hot spots of generated months (opendrs.backends.generated_hotspots): jobs pinned to a node
whose CPU surges — for hours (lasting) or in turns with another job (alternating) —, and what the
default policy does with them, simulated as ``opendrs simulate`` runs it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opendrs.backends.generated import generated_scenario, shape_of
from opendrs.backends.scenario import Fault, Scenario
from opendrs.backends.sim import Simulator
from opendrs.backends.workload import Surge
from opendrs.cli.simulate import StabilityReport, run_policy
from opendrs.engine.policy import PRESETS
from opendrs.model.cluster import Cluster

HOUR = 3600.0

#: Seeds whose hot spot comes early at 8 nodes and 120 guests, so that a short run reaches it:
#: a lasting one on node01 from day 1.22 to 1.51 (no node failure), and an alternating pair of
#: jobs on node01 and node06 from day 1.22 to 1.56.
LASTING = (10, 1.55)
ALTERNATING = (38, 1.6)


def _jobs(scenario: Scenario) -> dict[str, list[str]]:
    """Each job's guests, by the job's name (read from the ignore reasons)."""
    rules = scenario.cluster.rules
    jobs: dict[str, list[str]] = {}
    for guest in sorted(rules.ignored, key=int):
        reason = rules.ignore_reason(guest) or ""
        jobs.setdefault(reason.split("(")[-1].rstrip(")"), []).append(guest)
    return jobs


def _node_of(cluster: Cluster, guests: list[str]) -> set[str]:
    return {cluster.guests[cluster.guest_index[g]].node for g in guests}


@pytest.mark.parametrize("seed", range(6))
def test_each_month_has_its_lasting_and_alternating_jobs_pinned_to_one_node(seed: int) -> None:
    scenario = generated_scenario(seed)
    shape, cluster = shape_of(seed), scenario.cluster
    jobs = _jobs(scenario)
    lasting = [name for name in jobs if name.startswith("job-lasting-")]
    alternating = [name for name in jobs if name.startswith("job-alternating-")]
    assert len(lasting) == shape.lasting_hot_spots
    assert len(alternating) == 2 * shape.alternating_hot_spots
    for name, guests in jobs.items():
        assert len(_node_of(cluster, guests)) == 1, name
        surges = [scenario.workload_of(cluster.guests[cluster.guest_index[g]]) for g in guests]
        timings = {tuple((s.at, s.last, s.rise) for s in w.cpu.surges) for w in surges if w.cpu}
        assert len(timings) == 1, f"{name}: its guests surge together"
        (times,) = timings
        if name in lasting:
            ((at, last, rise),) = times
            assert 24 * HOUR <= at <= 28 * 24 * HOUR
            assert 2 * HOUR <= last <= 8 * HOUR and rise in (1800.0, 3600.0, 5400.0)
        else:
            assert all(last + 2 * rise == HOUR for _at, last, rise in times)
    for k in range(1, shape.alternating_hot_spots + 1):
        a, b = jobs[f"job-alternating-{k}a"], jobs[f"job-alternating-{k}b"]
        assert _node_of(cluster, a) != _node_of(cluster, b)
        first = [s.at for s in _surges(scenario, a[0])]
        second = [s.at for s in _surges(scenario, b[0])]
        # They take turns: b's turns start an hour after a's.
        assert [t - HOUR for t in second] == first[: len(second)]


def test_a_jobs_guests_are_ha_resources_set_to_ignored_which_the_ha_manager_leaves_down() -> None:
    # As Proxmox's HA manager treats a resource set to `ignored`: it is not HA-managed — when its
    # node fails it is not restarted elsewhere, and starts again when the node comes back —,
    # while the node's other HA guests are restarted on other nodes.
    scenario = generated_scenario(1, 8, 120)
    jobs = _jobs(scenario)
    guests = jobs["job-lasting-2"]
    cluster = scenario.cluster
    (node,) = _node_of(cluster, guests)
    assert not any(cluster.guests[cluster.guest_index[g]].ha for g in guests)
    others = [g.id for g in cluster.guests if g.node == node and g.ha]
    assert others, "the job's node holds HA guests of its own"
    failure = Fault("node-failure", at=HOUR, node=node, duration=HOUR)
    sim = Simulator(replace(scenario, faults=(failure,)), days=1)
    try:
        sim.sleep(HOUR + 600)
        down = sim.peek()
        for g in guests:
            guest = down.guests[down.guest_index[g]]
            assert (guest.node, guest.state) == (node, "stopped"), g
        assert all(down.guests[down.guest_index[g]].node != node for g in others)
        sim.sleep(HOUR)
        back = sim.peek()
        for g in guests:
            guest = back.guests[back.guest_index[g]]
            assert (guest.node, guest.state) == (node, "running"), g
    finally:
        sim.close()


def _surges(scenario: Scenario, guest: str) -> tuple[Surge, ...]:
    workload = scenario.workload_of(scenario.cluster.guests[scenario.cluster.guest_index[guest]])
    assert workload is not None and workload.cpu is not None
    return workload.cpu.surges


def _run(seed: int, days: float, hot: float | None) -> StabilityReport:
    policy = PRESETS["opendrs"] if hot == 0.85 else replace(PRESETS["opendrs"], hot=hot)
    return run_policy(generated_scenario(seed, 8, 120), policy, days=days)


def test_the_default_policy_relieves_a_lasting_hot_spot() -> None:
    seed, days = LASTING
    assert PRESETS["opendrs"].hot == 0.85
    relieved, left = _run(seed, days, 0.85), _run(seed, days, None)
    # Without a hot level node01 runs hot while the job is near its top (212 minutes when this
    # was written; 23 since balancing consolidates its moves and leaves node01 lighter);
    # relieved at the first observation above 85 %, a tenth as long at most: the observations
    # are 5 minutes apart, so a few minutes may stay hot before a relief (7 of 212 then, 0 of
    # 23 now).
    assert left.max_hot_minutes_per_node >= 20
    assert relieved.hot_node_minutes <= 0.1 * left.hot_node_minutes
    assert relieved.repair_migrations > 0
    assert relieved.ping_pongs == 0 and relieved.capacity_violations == 0


def test_the_default_policy_does_not_chase_an_alternating_hot_spot() -> None:
    seed, days = ALTERNATING
    report, without = _run(seed, days, 0.85), _run(seed, days, None)
    # The two jobs heat node01 and node06 in turns. Each is relieved in its turn, never onto a
    # node seen running hot, and no plan refills a relieved one: no guest goes back to a node
    # it left (the turns are not chased), fewer hot minutes and no more migrations than without
    # a hot level (0 against 76 minutes, 31 against 50 migrations when this was written).
    assert without.hot_node_minutes > 0
    assert report.hot_node_minutes < without.hot_node_minutes
    assert report.max_hot_minutes_per_node <= without.max_hot_minutes_per_node
    assert report.migrations <= without.migrations
    assert report.ping_pongs == 0 and without.ping_pongs == 0
