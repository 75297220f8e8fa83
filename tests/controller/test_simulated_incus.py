"""The controller against the simulator as an Incus cluster (examples/scenarios/incus-week.yaml):
opendrs's policy and the emulated Incus balancer both keep to what Incus allows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from opendrs.backends.sim import Simulator, load_scenario
from opendrs.cli.simulate import report_from, simulated_config
from opendrs.controller.config import BackendConfig
from opendrs.controller.history import History
from opendrs.controller.loop import Controller
from opendrs.engine.policy import PRESETS

EXAMPLE = Path(__file__).parents[2] / "examples" / "scenarios" / "incus-week.yaml"


def _run(name: str, *, allow_restart: bool = True) -> tuple[Simulator, Controller, History]:
    scenario = load_scenario(EXAMPLE)
    settings = replace(scenario.cluster.settings, allow_restart_migration=allow_restart)
    scenario = replace(scenario, cluster=replace(scenario.cluster, settings=settings))
    policy = PRESETS[name]
    sim = Simulator(scenario, days=1, threshold=policy.threshold)
    history = History(":memory:")
    controller = Controller(
        simulated_config(policy, "<test>", BackendConfig("sim")), sim, sim, history
    )
    controller.run(until=sim.end)
    return sim, controller, history


@pytest.mark.parametrize("name", ["opendrs", "incus"])
def test_every_move_keeps_its_architecture_and_containers_only_restart(name: str) -> None:
    sim, _, history = _run(name)
    cluster = sim.scenario.cluster
    kind = {g.id: g.kind for g in cluster.guests}
    arch = {n.name: n.arch for n in cluster.nodes}
    ours = [r for r in sim.migrations if r.cause == "controller"]
    assert ours
    for record in ours:
        assert arch[record.source] == arch[record.target], record
        assert record.restart == (kind[record.guest] == "ct"), record
    report = report_from(sim, PRESETS[name], 0.15, history, 0.0)
    assert report.restart_migrations == sum(r.restart for r in ours)
    downtime = sum((r.ended or sim.now()) - r.started for r in ours if r.restart)
    assert report.restart_downtime_minutes == pytest.approx(downtime / 60)
    history.close()


def test_the_incus_balancer_moves_vms_only_and_takes_the_clusters_keys() -> None:
    sim, controller, history = _run("incus")
    kind = {g.id: g.kind for g in sim.scenario.cluster.guests}
    decisions = {d.id: d.action for d in history.decisions()}
    balancing = {m.handle for m in history.migrations() if decisions.get(m.decision) != "repair"}
    moved = [r for r in sim.migrations if r.cause == "controller" and r.handle in balancing]
    assert moved and all(kind[r.guest] == "vm" for r in moved)
    # cluster.rebalance.threshold 25, cooldown 3H, batch 2: as the Incus backend takes them.
    policy = controller.config.policy
    assert (policy.options, policy.cooldown, policy.batch) == ({"threshold": 25.0}, 10800, 2)
    history.close()


def test_opendrs_moves_containers_by_restart_only_when_allowed() -> None:
    sim, _, history = _run("opendrs")
    kind = {g.id: g.kind for g in sim.scenario.cluster.guests}
    assert any(kind[r.guest] == "ct" for r in sim.migrations if r.cause == "controller")
    history.close()
    sim, _, history = _run("opendrs", allow_restart=False)
    ours = [r for r in sim.migrations if r.cause == "controller"]
    assert ours and all(kind[r.guest] == "vm" for r in ours)
    assert sim.stats().restart_migrations == 0
    history.close()


def test_a_policy_files_own_keys_win_over_the_clusters(tmp_path: Path) -> None:
    from opendrs.cli.simulate_command import _policies

    path = tmp_path / "mine.yaml"
    path.write_text("policy:\n  preset: incus\n  cooldown: 1h\n", encoding="utf-8")
    ((policy, keys),) = _policies([str(path)])
    assert keys == {"preset", "cooldown"}
    sim = Simulator(load_scenario(EXAMPLE), days=0.1)
    history = History(":memory:")
    config = simulated_config(policy, "<test>", BackendConfig("sim"), keys)
    controller = Controller(config, sim, sim, history)
    controller.cycle()
    # The file's cooldown stays; the cluster's batch and threshold are taken.
    taken = controller.config.policy
    assert (taken.cooldown, taken.batch, taken.options) == (3600, 2, {"threshold": 25.0})
    assert controller.config.executor.cooldown == 3600
    history.close()
