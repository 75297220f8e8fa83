"""The executor when the world does not keep still: guests that may no longer move, answers that
are lost, migrations that outlive their timeout, a restart between a request and its record,
a mode that changes under a plan. Each case is one the executor once got wrong."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import pytest

from fakes import FakeBackend, FakeClock, cluster, guest, node, run_executor, setup_executor
from opendrs.backends.base import Handle, StartGate
from opendrs.controller.executor import Executor, ExecutorConfig
from opendrs.controller.history import History
from opendrs.engine.planner import plan_moves
from opendrs.model.cluster import Cluster, Move
from opendrs.model.rules import Rules
from opendrs.records import PENDING

_run = run_executor
_setup = setup_executor


def _spread_out() -> Cluster:
    return cluster(
        [node("a"), node("b"), node("c")],
        [guest("1", "a"), guest("2", "a"), guest("3", "a"), guest("4", "a")],
        max_parallel=1,
    )


def _set_guest(fake: FakeBackend, gid: str, **changes: object) -> None:
    fake.cluster = replace(
        fake.cluster,
        guests=tuple(replace(g, **changes) if g.id == gid else g for g in fake.cluster.guests),
    )


def _unmovable(how: str) -> Callable[[FakeBackend], None]:
    def apply(fake: FakeBackend) -> None:
        if how == "locked":
            _set_guest(fake, "3", lock="backup")
        elif how == "ignored":
            fake.cluster = replace(fake.cluster, rules=Rules(ignored=frozenset({"3"})))
        elif how == "shut down":
            _set_guest(fake, "3", state="stopped", cpu_used=0.0, memory_used=0)
        elif how == "source offline":
            nodes = tuple(
                replace(n, online=False) if n.name == "a" else n for n in fake.cluster.nodes
            )
            fake.cluster = replace(fake.cluster, nodes=nodes)

    return apply


@pytest.mark.parametrize("how", ["locked", "ignored", "shut down"])
def test_a_queued_guest_that_may_no_longer_move_is_dropped_not_queued_for_ever(how: str) -> None:
    c = _spread_out()
    fake, clock, history, executor = _setup(c)
    executor.submit(plan_moves(c, {"1": "b", "2": "c", "3": "b", "4": "c"}), None)
    executor.tick()  # guest 1 starts
    _unmovable(how)(fake)
    took = _run(executor, clock)
    assert took < 600
    assert "3" not in {m.guest for m in fake.starts}
    skipped = [e for e in executor.events if e.kind == "skipped" and e.move and e.move.guest == "3"]
    assert skipped and "may not move" in skipped[0].detail
    assert {r.guest for r in history.migrations()} == {"1", "2", "4"}


def test_a_source_node_going_offline_ends_the_plan() -> None:
    c = _spread_out()
    fake, clock, _history, executor = _setup(c)
    executor.submit(plan_moves(c, {"1": "b", "2": "c", "3": "b", "4": "c"}), None)
    executor.tick()
    _unmovable("source offline")(fake)
    assert _run(executor, clock) < 600
    assert len(fake.starts) == 1


def test_a_queue_that_cannot_start_is_abandoned_after_the_stall_timeout() -> None:
    # Guest 1 shows a migration someone else started and that never ends: our move waits.
    c = _spread_out()
    fake, clock, _history, executor = _setup(c, config=ExecutorConfig(stall_timeout=600))
    executor.submit(plan_moves(c, {"1": "b"}), None)
    _set_guest(fake, "1", migrating_to="c")
    took = _run(executor, clock)
    assert 600 <= took < 700
    assert fake.starts == []
    (event,) = [e for e in executor.events if e.kind == "skipped"]
    assert "no migration of the plan could start" in event.detail


def test_a_queue_waiting_for_a_migration_it_did_not_start_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``run --once`` would otherwise wait silently for up to ``stall_timeout``."""
    c = _spread_out()
    fake, clock, _history, executor = _setup(c, config=ExecutorConfig(stall_timeout=600))
    clock.t = 1_764_460_800.0  # 2025-11-30T00:00:00Z
    _set_guest(fake, "1", name="web1", migrating_to="c")
    executor.submit(plan_moves(c, {"2": "b"}), None)
    with caplog.at_level(logging.INFO, logger="opendrs.controller.executor"):
        for _ in range(6):
            executor.tick()
            clock.sleep(5)
    said = [r.getMessage() for r in caplog.records if "did not start" in r.getMessage()]
    assert said == [
        "waiting for migrations opendrs did not start (they count against max_parallel): "
        "web1 (1) on a → c, migrating since 2025-11-30T00:00:00Z at least; the plan waits "
        "until 2025-11-30T00:10:00Z at most (executor.stall_timeout)"
    ]
    assert fake.starts == []
    _set_guest(fake, "1", node="c", migrating_to=None)
    executor.tick()
    assert [m.guest for m in fake.starts] == ["2"]


def test_a_migration_whose_answer_was_lost_is_recorded_as_what_happened() -> None:
    c = _spread_out()
    fake, clock, history, executor = _setup(c, losing_answer={"1"})
    executor.submit(plan_moves(c, {"1": "b", "2": "c"}), None)
    _run(executor, clock)
    outcome = {r.guest: r.outcome for r in history.migrations()}
    assert outcome == {"1": "done", "2": "done"}
    assert len(fake.starts) == 2  # the request whose answer was lost was not sent again
    assert set(history.cooldowns(clock.now())) == {"1", "2"}
    assert history.avoided(clock.now()) == {}
    assert history.departures(0.0)["1"] == [("a", history.migrations()[0].ended)]


def test_a_migration_that_outlives_its_timeout_but_completes_is_done() -> None:
    class Uncancellable(FakeBackend):
        def cancel(self, handle: Handle) -> bool:
            return False

    c = _spread_out()
    clock = FakeClock()
    fake = Uncancellable(c, clock, durations={"1": 90.0})
    history = History(":memory:")
    executor = Executor(fake, clock, history, ExecutorConfig(timeout=60, poll_interval=5))
    executor.submit(plan_moves(c, {"1": "b"}), None)
    _run(executor, clock)
    (record,) = history.migrations()
    assert record.outcome == "done"
    assert "1" in history.cooldowns(clock.now())
    assert history.avoided(clock.now()) == {}
    assert any(e.kind == "watching" and "timed out" in e.detail for e in executor.events)


def test_a_migration_given_up_is_cancelled_on_the_platform() -> None:
    c = _spread_out()
    fake, clock, history, executor = _setup(
        c, config=ExecutorConfig(timeout=60, poll_interval=5), hanging={"1"}
    )
    executor.submit(plan_moves(c, {"1": "b"}), None)
    _run(executor, clock)
    assert fake.cancelled == ["op-1"]
    (record,) = history.migrations()
    assert record.outcome == "failed" and "timed out" in (record.error or "")
    assert fake.cluster.guest("1").node == "a"
    assert ("1", "b") in history.avoided(clock.now())


@pytest.mark.parametrize(("where", "outcome"), [("b", "done"), ("a", "failed")])
def test_a_request_recorded_but_never_answered_before_a_restart_is_settled(
    where: str, outcome: str
) -> None:
    # The daemon was killed after recording its intent, before the answer came back.
    c = replace(_spread_out(), guests=(guest("1", where), guest("2", "a")))
    fake, clock, history, _ = _setup(c)
    history.migration_started(decision=None, move=Move("1", "a", "b"), handle=PENDING, at=0.0)
    clock.sleep(30)
    executor = Executor(fake, clock, history, ExecutorConfig(poll_interval=5))
    executor.reconcile()
    _run(executor, clock)
    assert [(r.guest, r.outcome) for r in history.migrations()] == [("1", outcome)]
    assert ("1" in history.cooldowns(clock.now())) == (outcome == "done")


def test_the_intent_is_recorded_before_the_request() -> None:
    c = _spread_out()
    clock = FakeClock()
    history = History(":memory:")
    seen: list[list[str | None]] = []

    class Watching(FakeBackend):
        def start_migration(self, move: Move, gate: StartGate | None = None) -> Handle:
            seen.append([r.handle for r in history.in_flight()])
            return super().start_migration(move, gate)

    fake = Watching(c, clock)
    executor = Executor(fake, clock, history, ExecutorConfig(poll_interval=5))
    executor.submit(plan_moves(c, {"1": "b"}), None)
    executor.tick()
    assert seen == [[PENDING]]
    (record,) = history.in_flight()
    assert record.handle == "op-1"


def test_nothing_starts_outside_active_mode_or_while_held() -> None:
    c = _spread_out()
    fake, _clock, _history, executor = _setup(c)
    held: str | None = "a reload is pending"
    executor.hold = lambda: held
    executor.submit(plan_moves(c, {"1": "b", "2": "c"}), None)
    executor.tick()
    assert fake.starts == [] and executor.busy  # held: waits
    held = None
    executor.active = False
    executor.tick()
    assert fake.starts == [] and not executor.busy  # not active: the queue is dropped
    assert {e.move.guest for e in executor.events if e.kind == "skipped" and e.move} == {"1", "2"}


def test_a_start_held_back_during_its_reads_sends_nothing_records_nothing_and_waits() -> None:
    # A reload comes while the backend reads what the start needs: the gate closes before the
    # request, no row is left, the move stays queued and starts once the reload is done.
    c = _spread_out()
    fake, clock, history, executor = _setup(c)
    held: str | None = None

    def reload_comes(move: Move) -> None:
        nonlocal held
        held = "the configuration is being reloaded"

    fake.during_reads = reload_comes
    executor.hold = lambda: held
    executor.submit(plan_moves(c, {"1": "b"}), None)
    executor.tick()
    assert fake.starts == [] and history.migrations() == [] and executor.busy
    assert history.avoided(clock.now()) == {}
    executor.tick()
    assert fake.starts == []  # still held: nothing is tried
    fake.during_reads = None
    held = None
    executor.tick()
    assert fake.starts == [Move("1", "a", "b")]
    _run(executor, clock)
    assert [(r.guest, r.outcome) for r in history.migrations()] == [("1", "done")]


def test_leaving_active_mode_during_a_starts_reads_drops_the_queue_with_no_row() -> None:
    c = replace(_spread_out(), settings=replace(_spread_out().settings, max_parallel=2))
    fake, clock, history, executor = _setup(c)
    reads: list[str] = []

    def shadow_now(move: Move) -> None:
        reads.append(move.guest)
        if len(reads) == 2:  # during the second start of the tick
            executor.active = False

    fake.during_reads = shadow_now
    executor.submit(plan_moves(c, {"1": "b", "2": "c"}), None)
    executor.tick()
    assert [m.guest for m in fake.starts] == ["1"] and reads == ["1", "2"]
    executor.tick()
    assert not executor.queued
    assert [e.move.guest for e in executor.events if e.kind == "skipped" and e.move] == ["2"]
    _run(executor, clock)
    assert [(r.guest, r.outcome) for r in history.migrations()] == [("1", "done")]
    assert history.avoided(clock.now()) == {}


@pytest.mark.parametrize("seen_offline", [True, False])
def test_a_guest_restarted_on_the_target_after_its_source_failed_was_not_migrated(
    seen_offline: bool,
) -> None:
    # The answer is lost (and the platform cannot show the migration) and the migration hangs;
    # its source fails while the executor follows it, and HA starts the guest again on the
    # target. Seen offline with the guest not yet on the target, the migration cannot have
    # finished: failed. Never seen so (the guest arrived first), it is done.
    c = _spread_out()
    fake, clock, history, executor = _setup(
        c,
        config=ExecutorConfig(timeout=60, poll_interval=5),
        losing_answer={"1"},
        hanging={"1"},
        findable=False,
    )
    executor.submit(plan_moves(c, {"1": "b"}), None)
    executor.tick()
    assert executor.watching
    clock.sleep(5)
    down = tuple(replace(n, online=n.name != "a") for n in fake.cluster.nodes)
    if seen_offline:
        fake.cluster = replace(fake.cluster, nodes=down)
        _set_guest(fake, "1", migrating_to=None, state="stopped")
        executor.tick()
    _set_guest(fake, "1", node="b", migrating_to=None, state="running")
    fake.cluster = replace(fake.cluster, nodes=down)
    clock.sleep(5)
    executor.tick()
    (record,) = history.migrations()
    if seen_offline:
        assert record.outcome == "failed"
        assert "a went offline before the guest reached b" in (record.error or "")
        assert "1" not in history.cooldowns(clock.now())
        assert history.avoided(clock.now()) == {}  # it runs there
    else:
        assert record.outcome == "done"


def test_a_hanging_migration_whose_answer_was_lost_is_found_and_stopped() -> None:
    c = _spread_out()
    fake, clock, history, executor = _setup(
        c, config=ExecutorConfig(timeout=60, poll_interval=5), losing_answer={"1"}, hanging={"1"}
    )
    executor.submit(plan_moves(c, {"1": "b"}), None)
    _run(executor, clock)
    assert fake.cancelled == ["op-1"]  # found by its move, then stopped after its timeout
    (record,) = history.migrations()
    assert record.handle == "op-1" and record.outcome == "failed"
    assert fake.cluster.guest("1").node == "a"
    assert any(
        e.kind == "watching" and "found its migration op-1" in e.detail for e in executor.events
    )
