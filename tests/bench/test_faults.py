"""bench.faults: the fault campaign keeps its promises on a few seeds, and its checker can fail."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from bench.faults import (
    INVARIANTS,
    Ledger,
    Mix,
    Run,
    breaches,
    main,
    make_mix,
    run_seed,
)

from opendrs.backends.base import Handle, StartGate
from opendrs.backends.scenario import Fault, MigrationModel, Scenario, builtin_scenario
from opendrs.backends.sim import Simulator
from opendrs.controller.executor import Executor
from opendrs.controller.history import History
from opendrs.controller.loop import Controller, Cycle
from opendrs.engine.policy import PolicyConfig
from opendrs.model.cluster import Cluster, Disk, Guest, Move, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.records import Outcome

GiB = 1024**3
HOUR = 3600.0

# --------------------------------------------------------------------------------------------
# The campaign on a few seeds


@pytest.mark.parametrize("seed", [0, 27])
def test_a_few_seeds_keep_every_promise(seed: int) -> None:
    result = run_seed(seed, days=0.1)
    assert result.violation_count == 0, [str(v) for v in result.violations]
    assert all(result.checks[name] > 0 for name in INVARIANTS), result.checks
    assert sum(result.faults.values()) > 0
    assert result.facts["migrations started"] > 0


def test_a_seed_is_the_same_run_every_time() -> None:
    first, second = run_seed(7, days=0.03), run_seed(7, days=0.03)
    assert asdict(first) == asdict(second)


def test_mixes_vary_by_seed_and_stay_in_their_cluster() -> None:
    cluster = builtin_scenario("demo").cluster
    mixes = [make_mix(seed, cluster) for seed in range(30)]
    assert make_mix(3, cluster) == mixes[3]
    assert len({m.describe() for m in mixes}) == 30
    assert {len(m.nodes) for m in mixes} >= {3, 8}
    for mix in mixes:
        assert all(at + length <= mix.span for at, _, length in mix.maintenance)
        assert all(g in mix.guests for group in mix.anti_affinity for g in group)
        names = {g.id: g.node for g in cluster.guests}
        for group in mix.anti_affinity:  # apart at the start
            assert len({names[g] for g in group}) == len(group)
        for gid, nodes in mix.pins:
            assert names[gid] in nodes and set(nodes) <= set(mix.nodes)


def test_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "faults.json"
    argv = ["--seeds", "1", "--start", "7", "--days", "0.02", "--jobs", "1", "--json"]
    assert main([*argv, str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "seeds: 1 (7–7)" in out and "violations: 0" in out and "wall time" in out
    data = json.loads(out_file.read_text())
    result = run_seed(7, days=0.02)
    assert data["checks"] == result.checks and data["faults"] == result.faults
    assert data["seeds"] == 1 and data["violation_count"] == 0
    for bad in (["--seeds", "0"], ["--days", "nan"], ["--jobs", "0"]):
        with pytest.raises(SystemExit) as info:
            main(bad)
        assert info.value.code == 2


# --------------------------------------------------------------------------------------------
# The independent checks


def test_the_ledger_counts_a_migrating_guest_on_both_nodes() -> None:
    nodes = (
        Node("a", cpu=4, memory=16 * GiB, base_memory=GiB),
        Node("b", cpu=4, memory=16 * GiB, storage={"local": 100 * GiB}),
    )
    guests = (
        Guest("1", "a", cpu=8, memory=10 * GiB, cpu_used=1.0, memory_used=8 * GiB),
        Guest("2", "b", cpu=8, memory=8 * GiB, cpu_used=3.5, memory_used=7 * GiB),
        Guest("3", "b", cpu=64, memory=64 * GiB, state="stopped"),  # loads nothing
    )
    cluster = Cluster(nodes, guests)
    assert breaches(cluster) == []
    moving = replace(cluster, guests=(replace(guests[0], migrating_to="b"), *guests[1:]))
    assert breaches(moving, ["a"]) == []
    assert breaches(moving, ["b"]) == [
        f"b: configured memory {18 * GiB:.6g} > {16 * GiB:.6g}",
        "b: cpu use 4.5 > 4",
    ]
    assert breaches(moving, ["b"], measured=False) == [
        f"b: configured memory {18 * GiB:.6g} > {16 * GiB:.6g}"
    ]
    # Reserves and overcommit, as CapacityModel reads them; local disks, whatever the state.
    tight = Cluster(
        nodes,
        (
            replace(guests[1], cpu=17),
            replace(guests[2], disks=(Disk("local", 120 * GiB),)),
        ),
        settings=Settings(reserve_cpu=0.5, mode="static"),
    )
    assert Ledger(tight).over("b") == [
        "b: configured vCPUs 17 > 14",
        f"b: local disks in local {120 * GiB:.6g} > {100 * GiB:.6g}",
    ]


def test_the_ledger_sees_broken_hard_rules() -> None:
    nodes = (Node("a", 8, 32 * GiB), Node("b", 8, 32 * GiB))
    guests = tuple(Guest(str(i), "a" if i < 2 else "b", cpu=1, memory=GiB) for i in range(4))
    rules = Rules(
        node_affinity=(NodeAffinity("pin", ("3",), {"b": 1}, strict=True),),
        guest_affinity=(
            GuestAffinity("apart", ("0", "2"), positive=False),
            GuestAffinity("soft", ("0", "1"), positive=False, hard=False),
        ),
    )
    cluster = Cluster(nodes, guests, rules)
    assert breaches(cluster) == []
    moved = cluster.with_placement({"2": "a"})
    assert breaches(moved) == [
        "a: hard anti-affinity apart: ['0', '2'] (the rule keeps 2 guests apart; 2 of 2 nodes "
        "usable)"
    ]
    assert breaches(moved, guests=[guests[1]]) == []  # not a rule of guest 1
    flying = replace(cluster, guests=(*guests[:3], replace(guests[3], migrating_to="a")))
    assert breaches(flying) == ["a: strict node affinity pin: 3 is there"]


# --------------------------------------------------------------------------------------------
# A checker that cannot fail proves nothing: broken controllers, caught


def tiny(*, failure_rate: float = 0.0) -> Scenario:
    """Two roomy nodes and a full one; a guest that fits only where it is."""
    nodes = (
        Node("a", cpu=16, memory=64 * GiB),
        Node("b", cpu=16, memory=64 * GiB),
        Node("c", cpu=16, memory=8 * GiB),
    )
    small = tuple(
        Guest(str(100 + i), "a", cpu=2, memory=4 * GiB, cpu_used=1.0, memory_used=3 * GiB)
        for i in range(6)
    )
    big = Guest("200", "b", cpu=2, memory=32 * GiB, cpu_used=1.0, memory_used=30 * GiB)
    guests = (*small, big)
    cluster = Cluster(nodes, guests, settings=Settings(max_parallel=2))
    return Scenario(cluster, name="tiny", migration=MigrationModel(failure_rate=failure_rate))


def calm(scenario: Scenario, **changes: object) -> Mix:
    """A mix without faults over the whole of ``scenario``'s cluster, eager to balance."""
    cluster = scenario.cluster
    mix = make_mix(0, cluster, days=0.1)
    policy = PolicyConfig(
        interval=300,
        hold=1,
        threshold=0.05,
        target=0.02,
        margin=0.0,
        smoothing=0,
        min_uptime=0,
        cooldown=0,
        no_return=0,
    )
    fields: dict[str, object] = {
        "nodes": tuple(n.name for n in cluster.nodes),
        "guests": tuple(g.id for g in cluster.guests),
        "node_failures": (),
        "maintenance": (),
        "outages": (),
        "api_probability": 0.0,
        "failure_rate": scenario.migration.failure_rate,
        "scheduled_failures": (),
        "hang_probability": 0.0,
        "scheduled_hangs": (),
        "lost_probability": 0.0,
        "scheduled_lost": (),
        "restarts": (),
        "crash_probability": 0.0,
        "reloads": (),
        "signal_probability": 0.0,
        "anti_affinity": (),
        "pins": (),
        "policy": policy,
        "executor": replace(mix.executor, max_parallel=None, max_node_inflow=None),
    }
    fields.update(changes)
    return replace(mix, **fields)  # type: ignore[arg-type]


def invariants_broken(run: Run) -> set[str]:
    result = run.execute()
    return {v.invariant for v in result.violations}


def test_a_calm_run_of_the_tiny_cluster_breaks_nothing() -> None:
    run = Run(calm(tiny()), base=tiny())
    result = run.execute()
    assert result.violation_count == 0, [str(v) for v in result.violations]
    assert result.facts["migrations done"] > 0


def test_a_migration_started_in_shadow_mode_is_caught() -> None:
    class Reckless(Controller):
        def cycle(self, *, policy: PolicyConfig | None = None) -> Cycle:
            if not self.config.active and self.clock.now() < 2 * HOUR:
                guest = self.backend.observe().guest("101")
                if guest.migrating_to is None:
                    target = "b" if guest.node == "a" else "a"
                    self.backend.start_migration(Move("101", guest.node, target))
            return super().cycle(policy=policy)

    run = Run(calm(tiny(), reloads=(600.0,)), base=tiny(), controller_class=Reckless)
    # Behind the history's back, too: the simulator's migrations have no row.
    assert invariants_broken(run) == {"active mode", "history"}


def test_a_migration_that_overloads_a_node_is_caught() -> None:
    class Reckless(Controller):
        def cycle(self, *, policy: PolicyConfig | None = None) -> Cycle:
            if self.clock.now() == 0:
                self.backend.start_migration(Move("200", "b", "c"))  # 32 GiB onto 8 GiB
            return super().cycle(policy=policy)

    run = Run(calm(tiny()), base=tiny(), controller_class=Reckless)
    assert invariants_broken(run) == {"capacity and rules", "history"}


def test_a_migration_that_breaks_anti_affinity_is_caught() -> None:
    class Reckless(Controller):
        def cycle(self, *, policy: PolicyConfig | None = None) -> Cycle:
            if self.clock.now() == 0:
                self.backend.start_migration(Move("101", "a", "b"))
            return super().cycle(policy=policy)

    mix = calm(tiny(), anti_affinity=(("101", "200"),))
    mix = replace(mix, policy=replace(mix.policy, threshold=0.99))  # it would not balance
    run = Run(mix, base=tiny(), controller_class=Reckless)
    assert invariants_broken(run) == {"capacity and rules", "history"}


def test_a_queue_that_holds_the_policy_back_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # An executor that never starts its queue and never gives up on it.
    monkeypatch.setattr(Executor, "_start_ready", lambda self, cluster: None)
    monkeypatch.setattr(Executor, "_stalled", lambda self: False)
    run = Run(calm(tiny()), base=tiny())
    assert invariants_broken(run) == {"decides again"}


def test_a_history_that_lies_is_caught() -> None:
    class Rosy(History):
        def migration_finished(  # type: ignore[override]
            self, migration_id: int, *, at: float, outcome: Outcome, error: str | None = None
        ) -> object:
            return super().migration_finished(migration_id, at=at, outcome="done")

    scenario = tiny(failure_rate=1.0)
    run = Run(calm(scenario), base=scenario, history=Rosy(":memory:"))
    assert invariants_broken(run) == {"history"}


def test_reloads_and_stops_before_requests_keep_every_promise() -> None:
    base = builtin_scenario("demo")
    mix = replace(make_mix(27, base.cluster, days=0.1), signal_probability=0.3)
    result = Run(mix, base=base).execute()
    assert result.violation_count == 0, [str(v) for v in result.violations]
    assert result.faults["reloads before a request"] > 0
    assert result.faults["stops before a request"] > 0
    assert result.facts["migrations done"] > 0


def test_a_request_sent_after_a_reload_or_a_stop_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A backend that reads, then sends its request without asking the gate again.
    start = Simulator.start_migration

    def ungated(self: Simulator, move: Move, gate: StartGate | None = None) -> Handle:
        return start(self, move)

    monkeypatch.setattr(Simulator, "start_migration", ungated)
    run = Run(calm(tiny(), signal_probability=1.0), base=tiny())
    assert invariants_broken(run) == {"active mode"}


def test_a_start_given_up_before_its_request_that_leaves_a_row_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An executor that records a start it gave up on as a failed migration.
    def recorded(self: History, migration_id: int) -> None:
        self.migration_finished(migration_id, at=0.0, outcome="failed", error="given up")

    monkeypatch.setattr(History, "migration_withdrawn", recorded)
    run = Run(calm(tiny(), signal_probability=1.0), base=tiny())
    assert invariants_broken(run) == {"history"}


def test_a_daemon_that_dies_is_caught_and_started_again() -> None:
    class Fragile(Controller):
        def cycle(self, *, policy: PolicyConfig | None = None) -> Cycle:
            if 1800 <= self.clock.now() < 1900:
                raise RuntimeError("boom")
            return super().cycle(policy=policy)

    run = Run(calm(tiny()), base=tiny(), controller_class=Fragile)
    result = run.execute()
    assert {v.invariant for v in result.violations} == {"no exception"}
    assert "RuntimeError: boom" in result.violations[0].what
    assert result.simulated > 0.1 * 86400  # it went on


# --------------------------------------------------------------------------------------------
# Found by the campaign (seeds 113; 689 and 998), reported: see docs/performance.md


def test_maintenance_on_a_small_cluster_keeps_hard_anti_affinity() -> None:
    nodes = tuple(Node(n, cpu=16, memory=64 * GiB) for n in ("a", "b", "c"))
    guests = tuple(
        Guest(gid, node, cpu=2, memory=4 * GiB, cpu_used=0.5, memory_used=2 * GiB, uptime=86400)
        for gid, node in (("1", "a"), ("2", "b"), ("3", "c"))
    )
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("1", "2", "3"), positive=False),))
    scenario = Scenario(
        Cluster(nodes, guests, rules),
        name="apart",
        faults=(Fault("maintenance", at=600.0, node="c", duration=2 * HOUR),),
    )
    run = Run(calm(scenario), base=scenario)
    assert invariants_broken(run) == set()


def test_a_failed_migration_is_not_recorded_done_when_ha_restarts_its_guest_there() -> None:
    nodes = (Node("a", cpu=16, memory=64 * GiB), Node("b", cpu=16, memory=64 * GiB))
    guests = tuple(
        Guest(gid, "a", cpu=2, memory=8 * GiB, cpu_used=2.0, memory_used=6 * GiB, ha=True)
        for gid in ("1", "2")
    )
    scenario = Scenario(
        Cluster(nodes, guests),
        name="recovered",
        faults=(
            # The first migration loses its answer and hangs; its source fails while the
            # executor follows it in the background, and HA restarts its guest on the target.
            Fault("api-lost-answer", at=0.0),
            Fault("migration-hang", at=0.0),
            Fault("node-failure", at=400.0, node="a", duration=HOUR),
        ),
    )
    mix = calm(scenario)
    mix = replace(mix, executor=replace(mix.executor, timeout=300, poll_interval=10))
    run = Run(mix, base=scenario)
    assert invariants_broken(run) == set()
