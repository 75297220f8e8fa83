"""The streaming executor, driven against a scripted backend with exact timings."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from fakes import FakeBackend, FakeClock, cluster, guest, node, run_executor, setup_executor
from opendrs.controller.executor import Executor, ExecutorConfig
from opendrs.controller.history import History
from opendrs.engine.planner import Plan, PlannedMove, plan_moves
from opendrs.model.cluster import Move

_run = run_executor
_setup = setup_executor


def test_a_plan_runs_to_the_end_and_records_every_migration() -> None:
    c = cluster(
        [node("a"), node("b"), node("c")],
        [guest("1", "a"), guest("2", "a"), guest("3", "a")],
        max_parallel=1,
    )
    fake, clock, history, executor = _setup(c)
    executor.submit(plan_moves(c, {"1": "b", "2": "c", "3": "b"}), None)
    _run(executor, clock)
    assert {g.id: g.node for g in fake.cluster.guests} == {"1": "b", "2": "c", "3": "b"}
    assert len(fake.starts) == 3
    records = history.migrations()
    assert [r.outcome for r in records] == ["done", "done", "done"]
    # One at a time: each starts only after the previous ended.
    for before, after in itertools.pairwise(records):
        assert before.ended is not None and after.started >= before.ended
    assert set(history.cooldowns(clock.now())) == {"1", "2", "3"}
    assert fake.violations == []


def test_the_next_migration_starts_as_soon_as_one_finishes() -> None:
    # Two slots; guest 1 takes 100 s, guest 2 10 s: guest 3 must start when 2 ends, not at 100 s.
    c = cluster(
        [node("a"), node("b"), node("c"), node("d")],
        [guest("1", "a"), guest("2", "a"), guest("3", "a")],
        max_parallel=2,
    )
    _fake, clock, history, executor = _setup(c, durations={"1": 100.0, "2": 10.0, "3": 10.0})
    executor.submit(plan_moves(c, {"1": "b", "2": "c", "3": "d"}), None)
    _run(executor, clock)
    started = {r.guest: r.started for r in history.migrations()}
    assert started["3"] < 100.0
    assert [r.outcome for r in history.migrations()] == ["done"] * 3


def test_a_failed_migration_is_recorded_avoided_and_the_rest_replanned() -> None:
    c = cluster(
        [node("a"), node("b"), node("c")],
        [guest("1", "a"), guest("2", "a")],
        max_parallel=1,
    )
    fake, clock, history, executor = _setup(c, failing={("1", "b"): "migration aborted: boom"})
    executor.submit(plan_moves(c, {"1": "b", "2": "c"}), None)
    _run(executor, clock)
    outcome = {r.guest: (r.outcome, r.error) for r in history.migrations()}
    assert outcome["1"] == ("failed", "migration aborted: boom")
    assert outcome["2"] == ("done", None)
    assert ("1", "b") in history.avoided(clock.now())
    assert fake.cluster.guest("1").node == "a"
    assert any(e.kind == "failed" for e in executor.events)
    assert fake.violations == []


def test_a_refused_start_is_recorded_and_never_retried_in_the_same_plan() -> None:
    c = cluster([node("a"), node("b")], [guest("1", "a"), guest("2", "a")], max_parallel=1)
    fake, clock, history, executor = _setup(c, refusing={"1"})
    executor.submit(plan_moves(c, {"1": "b", "2": "b"}), None)
    _run(executor, clock)
    assert [m.guest for m in fake.starts] == ["2"]
    outcomes = sorted((r.guest, r.outcome) for r in history.migrations())
    assert outcomes == [("1", "failed"), ("2", "done")]


def test_a_guest_moved_by_someone_else_is_dropped_from_the_queue() -> None:
    c = cluster([node("a"), node("b"), node("c")], [guest("1", "a"), guest("2", "a")])
    fake, clock, _history, executor = _setup(c)
    executor.submit(plan_moves(c, {"1": "b", "2": "b"}, max_parallel=1), None)
    # Before anything starts, an operator moves guest 2 to c by hand.
    fake._set(replace(fake.cluster.guest("2"), node="c"))
    _run(executor, clock)
    assert [m.guest for m in fake.starts] == ["1"]
    assert any(e.kind == "skipped" and "someone else" in e.detail for e in executor.events)
    assert fake.cluster.guest("2").node == "c"


def test_room_is_waited_for_while_a_migration_frees_it() -> None:
    # b is full: guest 2 must leave b (to c) before guest 1 can go to b.
    c = cluster(
        [node("a"), node("b", memory_gib=4), node("c")],
        [guest("1", "a", memory_gib=3), guest("2", "b", memory_gib=3)],
        max_parallel=2,
        max_node_inflow=1,
    )
    fake, clock, history, executor = _setup(c, durations={"2": 60.0, "1": 10.0})
    plan = plan_moves(c, {"1": "b", "2": "c"})
    assert plan.feasible and plan.steps == 2
    executor.submit(plan, None)
    _run(executor, clock)
    records = {r.guest: r for r in history.migrations()}
    assert records["1"].started >= records["2"].ended  # type: ignore[operator]
    assert fake.violations == []


def test_a_restart_follows_migrations_in_flight_and_never_starts_them_again(tmp_path) -> None:
    c = cluster([node("a"), node("b"), node("c")], [guest("1", "a"), guest("2", "a")])
    path = tmp_path / "history.sqlite"
    clock = FakeClock()
    fake = FakeBackend(c, clock, duration=100.0)
    first = Executor(fake, clock, History(path), ExecutorConfig(poll_interval=5))
    first.submit(plan_moves(c, {"1": "b", "2": "c"}, max_parallel=2, max_node_inflow=1), None)
    first.tick()
    assert len(fake.starts) == 2
    first.history.close()  # the daemon dies here
    clock.sleep(20)
    second = Executor(fake, clock, History(path), ExecutorConfig(poll_interval=5))
    second.reconcile()
    assert second.busy
    _run(second, clock)
    assert len(fake.starts) == 2  # nothing started twice
    assert sorted((r.guest, r.outcome) for r in second.history.migrations()) == [
        ("1", "done"),
        ("2", "done"),
    ]


class _SteppedWall:
    """``clock`` as a host sees it whose wall clock (``now``) was stepped by ``step`` seconds:
    its monotonic time is not."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.step = 0.0

    def now(self) -> float:
        return self.clock.t + self.step

    def monotonic(self) -> float:
        return self.clock.t

    def sleep(self, seconds: float) -> None:
        self.clock.sleep(seconds)


def test_a_migration_taken_over_after_a_restart_times_out_from_when_it_was_first_seen(
    tmp_path,
) -> None:
    """Its start is known only on the wall clock, stepped two hours forward meanwhile: it is not
    given up at once, and still is once it outlives ``timeout`` from the restart."""
    c = cluster([node("a"), node("b")], [guest("1", "a"), guest("2", "a")])
    path = tmp_path / "history.sqlite"
    platform = FakeClock()
    host = _SteppedWall(platform)
    fake = FakeBackend(c, platform, durations={"1": 100.0, "2": 10_000.0})
    config = ExecutorConfig(timeout=120, poll_interval=5)
    first = Executor(fake, host, History(path), config)
    first.submit(plan_moves(c, {"1": "b", "2": "b"}, max_parallel=2, max_node_inflow=2), None)
    first.tick()
    first.history.close()  # the daemon dies here, and NTP steps the clock
    platform.sleep(10)
    host.step = 7200.0
    second = Executor(fake, host, History(path), config)
    second.reconcile()
    _run(second, platform)
    outcomes = {r.guest: (r.outcome, r.error) for r in second.history.migrations()}
    assert outcomes["1"] == ("done", None)
    assert outcomes["2"][0] == "failed" and "timed out after 2h" in str(outcomes["2"][1])
    assert fake.cancelled == ["op-2"]
    assert platform.t < 10 + 120 + 30  # given up a timeout after the restart, not later


@pytest.mark.parametrize(("where", "outcome"), [("a", "failed"), ("b", "done")])
def test_a_migration_unknown_after_a_restart_is_settled_by_where_the_guest_is(
    tmp_path, where: str, outcome: str
) -> None:
    c = cluster([node("a"), node("b")], [guest("1", where)])
    path = tmp_path / "history.sqlite"
    clock = FakeClock()
    history = History(path)
    history.migration_started(decision=None, move=Move("1", "a", "b"), handle="op-99", at=0.0)
    fake = FakeBackend(c, clock)
    executor = Executor(fake, clock, history, ExecutorConfig())
    executor.reconcile()
    executor.tick()
    assert not executor.busy
    assert [(r.guest, r.outcome) for r in history.migrations()] == [("1", outcome)]
    assert ("1" in history.cooldowns(clock.now())) == (outcome == "done")


def test_a_migration_that_never_ends_times_out() -> None:
    c = cluster([node("a"), node("b")], [guest("1", "a")])
    _fake, clock, history, executor = _setup(
        c, config=ExecutorConfig(timeout=60, poll_interval=5), duration=10_000.0
    )
    executor.submit(plan_moves(c, {"1": "b"}), None)
    _run(executor, clock)
    (record,) = history.migrations()
    assert record.outcome == "failed" and "timed out" in (record.error or "")


def test_observation_errors_delay_starts_but_lose_nothing() -> None:
    c = cluster([node("a"), node("b")], [guest("1", "a")])
    _fake, clock, history, executor = _setup(c, observe_errors=3)
    executor.submit(plan_moves(c, {"1": "b"}), None)
    _run(executor, clock)
    assert [(r.guest, r.outcome) for r in history.migrations()] == [("1", "done")]


def test_parking_moves_and_bundles_keep_the_planner_order() -> None:
    # A swap between two full nodes needs a parking move on the spare node c.
    c = cluster(
        [node("a", memory_gib=4), node("b", memory_gib=4), node("c", memory_gib=8)],
        [guest("1", "a", memory_gib=3), guest("2", "b", memory_gib=3)],
        max_parallel=4,
        max_node_inflow=1,
    )
    fake, clock, _history, executor = _setup(c)
    plan = plan_moves(c, {"1": "b", "2": "a"})
    assert plan.feasible and any(m.parking for m in plan.moves)
    executor.submit(plan, None)
    _run(executor, clock)
    assert {g.id: g.node for g in fake.cluster.guests} == {"1": "b", "2": "a"}
    assert fake.violations == []


def test_an_empty_plan_leaves_the_executor_idle() -> None:
    c = cluster([node("a")], [guest("1", "a")])
    _fake, _clock, _history, executor = _setup(c)
    executor.submit(Plan(moves=(), feasible=True), None)
    assert not executor.busy
    executor.submit(Plan(moves=(PlannedMove("1", "a", "a", 1),), feasible=True), None)
    assert executor.busy
