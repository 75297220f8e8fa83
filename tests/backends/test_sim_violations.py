"""Whose a capacity violation is (opendrs.backends.sim.violations): the controller's moves, the
platform's HA, the placement, or the guests' own load."""

from __future__ import annotations

from opendrs.backends.scenario import Fault, Scenario
from opendrs.backends.sim import Simulator
from opendrs.backends.sim.simulator import MOVE_ACCOUNTED
from opendrs.backends.sim.violations import ViolationCauses
from opendrs.backends.workload import Pattern, Ramp, Selector, Workload
from opendrs.model.cluster import Cluster, Guest, Move, Node, Settings

GiB = 1024**3
HOUR = 3600.0
STEP = 60.0


def sim_of(guests: tuple[Guest, ...], overcommit: float = 2.0, **scenario: object) -> Simulator:
    """Two nodes of 16 cores and 64 GiB, ``guests`` on them, dynamic mode, 60 s steps; memory
    overcommitted ``overcommit`` times."""
    nodes = (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB))
    settings = Settings(mode="dynamic", memory_overcommit=overcommit)
    cluster = Cluster(nodes, guests, settings=settings)
    values: dict[str, object] = {"duration": 4 * HOUR, "step": STEP}
    values.update(scenario)
    return Simulator(Scenario(cluster, **values), window=0)  # type: ignore[arg-type]


def vm(gid: str, on: str, used: int, memory: int = 40 * GiB, **fields: object) -> Guest:
    values: dict[str, object] = {"cpu": 2.0, "cpu_used": 1.0}
    values.update(fields)
    return Guest(gid, on, memory=memory, memory_used=used, **values)  # type: ignore[arg-type]


def test_a_move_onto_a_node_it_fills_is_the_moves_for_half_an_hour() -> None:
    # b uses 36 GiB of its 64; guest 1 brings 36 more: over from the step it lands on. For the
    # move's 30 minutes that is the move's, then the guests' own load (nothing else moved).
    sim = sim_of((vm("1", "a", 36 * GiB), vm("2", "b", 36 * GiB)))
    sim.sleep(HOUR)
    sim.start_migration(Move("1", "a", "b"))
    sim.sleep(2 * HOUR)
    stats = sim.stats()
    by = stats.capacity_violations_by
    assert stats.capacity_violations == 2 * HOUR / STEP  # every step after 1 h
    assert by == ViolationCauses(
        moves=MOVE_ACCOUNTED / STEP, load=(2 * HOUR - MOVE_ACCOUNTED) / STEP
    )


def test_a_move_past_a_configured_limit_stays_the_moves() -> None:
    # Without memory overcommit, 80 GiB configured on 64 GiB: the move's while it stays.
    sim = sim_of((vm("1", "a", 8 * GiB), vm("2", "b", 8 * GiB)), overcommit=1.0)
    sim.start_migration(Move("1", "a", "b"))
    sim.sleep(2 * HOUR)
    stats = sim.stats()
    assert stats.capacity_violations == 2 * HOUR / STEP
    assert stats.capacity_violations_by == ViolationCauses(moves=stats.capacity_violations)


def test_load_growth_with_no_move_is_the_load() -> None:
    # Guest 1 grows from 24 to 60 GiB of use next to guest 2's 20 GiB on a 64 GiB node; nothing
    # moves.
    grow = Workload(Selector(guests=("1",)), memory=Pattern(ramp=Ramp(to=1.0, over=HOUR)))
    guests = (vm("1", "a", 24 * GiB, memory=60 * GiB), vm("2", "a", 20 * GiB))
    sim = sim_of(guests, workloads=(grow,))
    sim.sleep(2 * HOUR)
    stats = sim.stats()
    assert stats.capacity_violations > HOUR / STEP / 2
    assert stats.capacity_violations_by == ViolationCauses(load=stats.capacity_violations)


def test_a_placement_over_its_limits_from_the_start_is_the_placements() -> None:
    sim = sim_of((vm("1", "a", 8 * GiB), vm("2", "a", 8 * GiB)), overcommit=1.0)
    sim.sleep(HOUR)
    stats = sim.stats()
    assert stats.capacity_violations_by == ViolationCauses(placement=stats.capacity_violations)
    assert stats.capacity_violations == HOUR / STEP + 1


def test_load_on_a_node_ha_recovery_filled_is_the_platforms() -> None:
    # a fails at 30 min; HA restarts guest 1 (20 GiB used) on b beside guest 2 (40 GiB), where
    # it fits; from 1 h guest 1 grows to 30 GiB: b is over, and would not be without the guest
    # the platform put there (it stays on b: nothing moves it back).
    grow = Workload(
        Selector(guests=("1",)), memory=Pattern(ramp=Ramp(to=0.75, over=HOUR / 2, begin=HOUR))
    )
    guests = (vm("1", "a", 20 * GiB, ha=True), vm("2", "b", 40 * GiB))
    failure = Fault("node-failure", at=HOUR / 2, node="a", duration=HOUR)
    sim = sim_of(guests, faults=(failure,), recovery_delay=60.0, workloads=(grow,))
    sim.sleep(3 * HOUR)
    stats = sim.stats()
    assert stats.recoveries == 1 and [m.target for m in sim.migrations] == ["b"]
    assert stats.capacity_violations > HOUR / STEP
    assert stats.capacity_violations_by == ViolationCauses(platform=stats.capacity_violations)
