"""The controller loop on the scripted backend: shadow, active, once, reload, outages."""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fakes import GIB, FakeBackend, FakeClock, cluster, guest, node
from opendrs.controller.config import BackendConfig, Config
from opendrs.controller.history import History
from opendrs.controller.loop import Controller
from opendrs.engine.imbalance import balance_spread
from opendrs.engine.policy import PolicyConfig
from opendrs.engine.strategies.exact_repair import SKIPPED, solve_repair
from opendrs.engine.usage import Dimension, DimensionKind, LoadModel


def _unbalanced():
    guests = [guest(f"g{i}", "a", memory_gib=2, used=0.5) for i in range(6)]
    return cluster([node("a"), node("b"), node("c")], guests, max_parallel=2)


def _config(mode: str = "active", **policy: object) -> Config:
    base = PolicyConfig(interval=60, hold=1, smoothing=0, min_uptime=0)
    return Config(
        file="<test>",
        backend=BackendConfig("file", path="x"),
        history=":memory:",
        lock="",
        mode=mode,  # type: ignore[arg-type]
        policy=replace(base, **policy),  # type: ignore[arg-type]
    )


def _spread(c) -> float:
    usable = [n.usable for n in c.nodes]
    f = LoadModel.build(c).fractions()[usable]
    return balance_spread(f, [c.settings.weight_cpu, c.settings.weight_memory])


def test_shadow_mode_records_the_decision_and_never_migrates() -> None:
    clock = FakeClock()
    fake = FakeBackend(_unbalanced(), clock)
    history = History(":memory:")
    controller = Controller(_config("shadow"), fake, clock, history)
    controller.run(until=600)
    assert fake.starts == []
    decisions = history.decisions()
    assert decisions and all(d.mode == "shadow" for d in decisions)
    assert any(d.action != "none" and d.plan for d in decisions)
    # Each recorded decision keeps its code beside the sentence.
    codes = [d.summary["code"] for d in decisions]  # type: ignore[index]
    assert "plan" in codes and set(codes) <= {"plan", "holding", "busy", "balanced"}
    assert history.migrations() == []


def test_active_once_balances_and_follows_its_plan_to_the_end() -> None:
    clock = FakeClock()
    fake = FakeBackend(_unbalanced(), clock)
    history = History(":memory:")
    before = _spread(fake.cluster)
    controller = Controller(_config(hold=5), fake, clock, history)
    controller.run(once=True)
    assert not controller.executor.busy
    assert fake.starts, "an unbalanced cluster must be balanced"
    assert all(r.outcome == "done" for r in history.migrations())
    assert _spread(fake.cluster) < before
    assert fake.violations == []


def test_hold_waits_for_several_observations_above_threshold() -> None:
    clock = FakeClock()
    fake = FakeBackend(_unbalanced(), clock)
    history = History(":memory:")
    controller = Controller(_config(hold=3), fake, clock, history)
    controller.run(until=125)  # observations at 0, 60, 120: the third may act
    starts = [r.started for r in history.migrations()]
    assert starts and min(starts) >= 120


def test_a_failed_observation_skips_the_cycle_and_the_loop_goes_on() -> None:
    clock = FakeClock()
    fake = FakeBackend(_unbalanced(), clock, observe_errors=2)
    history = History(":memory:")
    controller = Controller(_config(), fake, clock, history)
    controller.run(until=1800)
    assert [c.error for c in controller.cycles[:2]] == ["fake API error"] * 2
    assert fake.starts


def test_once_converges_and_a_second_run_does_nothing_more() -> None:
    clock = FakeClock()
    fake = FakeBackend(_unbalanced(), clock)
    history = History(":memory:")
    Controller(_config(), fake, clock, history).run(once=True)
    moved = len(fake.starts)
    clock.sleep(60)
    Controller(_config(), fake, clock, history).run(once=True)
    assert len(fake.starts) == moved  # balanced: no flapping


def test_reload_takes_the_new_policy() -> None:
    clock = FakeClock()
    fake = FakeBackend(_unbalanced(), clock)
    history = History(":memory:")
    controller = Controller(_config("shadow"), fake, clock, history)
    fresh = [_config("shadow", threshold=0.9)]
    controller.run(until=60, take_reload=lambda: fresh.pop() if fresh else None)
    assert controller.policy.threshold == 0.9


@pytest.mark.parametrize(("interval", "times"), [(300, [0, 300, 600]), (20, [0, 60, 80, 100])])
def test_a_reloaded_interval_counts_from_the_last_decision(interval: int, times: list[int]) -> None:
    """Reloaded a minute after the decision at 0 (the interval 60): a longer interval puts the
    next decision that long after the last one, not when the old interval ends; a shorter one
    too (already past: at once)."""
    clock = FakeClock()
    history = History(":memory:")
    controller = Controller(_config("shadow"), FakeBackend(_unbalanced(), clock), clock, history)
    fresh = [_config("shadow", interval=interval)]

    def take_reload() -> Config | None:
        return fresh.pop() if fresh and controller.cycles else None

    controller.run(until=times[-1] + 10, take_reload=take_reload)
    assert [round(c.at) for c in controller.cycles] == times


def test_maintenance_return_survives_a_restart() -> None:
    # Two guests on c; c goes into maintenance and is emptied; the controller restarts; c comes
    # back and, with maintenance_return, the guests go back to it: the new controller knew.
    clock = FakeClock()
    guests = [guest("x", "a", memory_gib=2, used=0.5), guest("y", "b", memory_gib=2, used=0.5)]
    guests += [guest("m", "c", memory_gib=2, used=0.5), guest("k", "c", memory_gib=2, used=0.5)]
    fake = FakeBackend(cluster([node("a"), node("b"), node("c")], guests), clock)
    history = History(":memory:")
    fake.set_maintenance("c", True)
    Controller(_config(maintenance_return=True), fake, clock, history).run(once=True)
    where = {g.id: g.node for g in fake.cluster.guests}
    assert where["m"] != "c" and where["k"] != "c"
    assert history.evacuated() == {"m": "c", "k": "c"}
    fake.set_maintenance("c", False)
    clock.sleep(60)
    restarted = Controller(_config(maintenance_return=True), fake, clock, history)
    assert restarted.state.evacuated == {"m": "c", "k": "c"}
    restarted.run(once=True)
    assert {g.id: g.node for g in fake.cluster.guests}["m"] == "c"
    assert {g.id: g.node for g in fake.cluster.guests}["k"] == "c"
    clock.sleep(60)
    restarted.cycle()  # the next observation sees them home: forgotten
    assert history.evacuated() == {}
    assert fake.violations == []


def test_a_guest_locked_under_a_plan_does_not_stop_a_later_maintenance_evacuation() -> None:
    # The plan's guest g3 is locked by a backup while it waits; then node a enters maintenance.
    # The executor drops the move instead of queueing it again every poll, so the policy decides
    # again and empties a (but for the locked guest) well within three hours.
    clock = FakeClock()
    c = replace(_unbalanced(), settings=replace(_unbalanced().settings, max_parallel=1))
    fake = FakeBackend(c, clock)
    controller = Controller(_config(), fake, clock, History(":memory:"))
    controller.run(until=1)
    assert controller.executor.busy
    guests = tuple(replace(g, lock="backup") if g.id == "g3" else g for g in fake.cluster.guests)
    fake.cluster = replace(fake.cluster, guests=guests)
    controller.run(until=600)
    fake.set_maintenance("a", True)
    controller.run(until=3 * 3600)
    left = {g.id for g in fake.cluster.guests if g.node == "a"}
    assert left <= {"g3"}
    assert "g3" not in {m.guest for m in fake.starts}


def test_settings_whose_reserve_leaves_a_node_nothing_are_refused_not_acted_on() -> None:
    clock = FakeClock()
    fake = FakeBackend(_unbalanced(), clock)
    config = replace(_config(), settings=replace(_unbalanced().settings, reserve_memory=16 * GIB))
    controller = Controller(config, fake, clock, History(":memory:"))
    cycle = controller.cycle()
    assert cycle.decision is None and "leaves node a no memory capacity" in (cycle.error or "")
    assert fake.starts == []


def test_a_stop_asked_during_a_cycle_skips_its_exact_repairs_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop_module = importlib.import_module("opendrs.controller.loop")
    real_decide = loop_module.decide
    asked = [False]
    seen: list[str] = []

    def decide(*args: Any, **kwargs: Any) -> Any:
        need, room = np.array([[2.0]]), np.array([[4.0], [4.0]])
        unit = (
            need,
            room,
            (Dimension(DimensionKind.VCPUS),),
            [np.array([0, 1])],
            [np.array([0, 3])],
            [],
        )
        seen.append(solve_repair(*unit).status)
        asked[0] = True  # SIGTERM while the cycle decides
        seen.append(solve_repair(*unit).status)
        return real_decide(*args, **kwargs)

    monkeypatch.setattr(loop_module, "decide", decide)
    clock = FakeClock()
    controller = Controller(
        _config("shadow"), FakeBackend(_unbalanced(), clock), clock, History(":memory:")
    )
    controller.run(until=600, should_stop=lambda: asked[0])
    assert seen == ["OPTIMAL", SKIPPED]  # one cycle, and its repairs after the stop skipped
