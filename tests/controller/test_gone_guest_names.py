"""A guest deleted or renamed since is still named ``name (id)`` by what was recorded: the
executor's log and outcomes, the history (its migrations, and older files upgraded) and the
dashboard."""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from fakes import FakeBackend, FakeClock, cluster, guest, node, run_executor, setup_executor
from opendrs.controller.dashboard import Dashboard
from opendrs.controller.executor import Event
from opendrs.controller.history import History
from opendrs.controller.history_file import SCHEMA_VERSION, UPGRADES
from opendrs.controller.loop import Controller, Cycle
from opendrs.engine.planner import plan_moves
from opendrs.model.cluster import Guest, Move

from .test_dashboard import _config


def _named(gid: str, name: str, where: str) -> Guest:
    return replace(guest(gid, where), name=name)


def test_a_guest_deleted_while_it_migrates_is_logged_and_recorded_by_its_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = cluster(
        [node("a"), node("b")],
        [_named("101", "db-main", "a"), guest("102", "a")],
        max_parallel=2,
        max_node_inflow=2,
    )
    fake, clock, history, executor = setup_executor(c)
    executor.submit(plan_moves(c, {"101": "b", "102": "b"}), None)
    executor.tick()
    assert {m.name for m in history.in_flight()} == {"db-main", None}  # 102 has no name
    fake.cluster = replace(fake.cluster, guests=(fake.cluster.guest("102"),))  # 101 deleted
    fake.ops = {k: op for k, op in fake.ops.items() if op.handle.move.guest != "101"}
    with caplog.at_level(logging.INFO, logger="opendrs.controller.executor"):
        run_executor(executor, clock)
    lost = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lost")]
    assert lost and all("db-main (101) a → b" in line for line in lost), caplog.text
    outcomes = {m.guest: (m.outcome, m.name) for m in history.migrations()}
    assert outcomes == {"101": ("lost", "db-main"), "102": ("done", None)}
    assert history.guest_names() == {"101": "db-main"}


def test_a_guest_deleted_while_queued_is_skipped_from_the_node_it_was_last_seen_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = cluster(
        [node("a"), node("b"), node("c")],
        [_named("101", "db-main", "a"), _named("102", "web", "c")],
        max_parallel=1,
    )
    fake, clock, history, executor = setup_executor(c)
    executor.submit(plan_moves(c, {"101": "b", "102": "b"}), None)
    executor.tick()
    (first,) = fake.starts
    queued = "102" if first.guest == "101" else "101"
    fake.cluster = replace(
        fake.cluster, guests=tuple(g for g in fake.cluster.guests if g.id != queued)
    )
    with caplog.at_level(logging.INFO, logger="opendrs.controller.executor"):
        run_executor(executor, clock)
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped")]
    label, source = ("db-main (101)", "a") if queued == "101" else ("web (102)", "c")
    assert skipped == [f"skipped {label} {source} → b the guest is no longer in the cluster"], (
        caplog.text
    )
    assert [m.guest for m in history.migrations()] == [first.guest]


def test_the_migrations_name_outlives_the_plan_that_named_it() -> None:
    with History(":memory:") as h:
        h.migration_started(decision=None, move=Move("7", "a", "b"), handle="t", at=1.0, name="x")
        h.migration_started(decision=None, move=Move("8", "a", "b"), handle="u", at=2.0, name="")
        (seven, eight) = h.migrations()
        assert (seven.name, eight.name) == ("x", None)
        assert h.guest_names() == {"7": "x"}


def test_a_version_5_file_gives_its_migrations_the_names_their_plans_recorded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "h.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    for step in UPGRADES[:5]:
        for statement in step:
            db.execute(statement)
    db.execute("PRAGMA user_version = 5")
    plan = '[{"guest": "101", "name": "db-main"}, {"guest": "102", "name": null}]'
    db.execute(
        "INSERT INTO decisions (id, at, cluster, mode, policy, action, reason, moves, summary, "
        "plan, code) VALUES (7, 1.0, 'lab', 'active', 'p', 'plan', 'r', 2, '{}', ?, 'plan')",
        (plan,),
    )
    for guest_id, handle in (("101", "t1"), ("102", "t2"), ("103", "t3")):
        decision = None if guest_id == "103" else 7
        db.execute(
            "INSERT INTO migrations (decision, guest, source, target, handle, started) "
            "VALUES (?, ?, 'a', 'b', ?, 1.0)",
            (decision, guest_id, handle),
        )
    db.close()
    with History(path) as h:
        names = {m.guest: m.name for m in h.migrations()}
    assert names == {"101": "db-main", "102": None, "103": None}
    with History(path, readonly=True) as h:  # upgraded once: read-only readers read it
        assert h.guest_names() == {"101": "db-main"}
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_the_dashboard_names_a_guest_gone_since_as_the_history_or_the_last_cycle_had_it() -> None:
    history = History(":memory:")
    history.migration_started(decision=None, move=Move("9", "a", "b"), handle="t", at=0.0)
    history.migration_started(
        decision=None, move=Move("77", "a", "b"), handle="u", at=1.0, name="old-db"
    )
    c = cluster([node("a"), node("b")], [_named("5", "web", "a")])
    clock = FakeClock()
    dashboard = Dashboard(_config())
    dashboard.follow(Controller(_config(), FakeBackend(c, clock), clock, history))
    dashboard.cycle(Cycle(clock.now(), c, None))
    dashboard.cycle(Cycle(clock.now(), replace(c, guests=()), None))  # 5 deleted
    dashboard.event(Event(clock.now(), "lost", Move("5", "a", "b"), "gone"))
    dashboard.event(Event(clock.now(), "done", Move("77", "a", "b")))
    dashboard.event(Event(clock.now(), "done", Move("9", "a", "b")))
    labels = [m["label"] for m in dashboard.snapshot().data["ended"]]
    assert labels == ["9", "old-db (77)", "web (5)"]  # newest first; 9 never had a name


def test_after_a_restart_a_migration_of_a_gone_guest_is_told_by_its_recorded_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = cluster([node("a"), node("b")], [guest("1", "a")])
    _fake, clock, history, executor = setup_executor(c)
    move = Move("77", "a", "b")
    history.migration_started(decision=None, move=move, handle="op-9", at=0.0, name="old-db")
    with caplog.at_level(logging.INFO, logger="opendrs.controller.executor"):
        executor.reconcile()  # the platform knows no task op-9, and has no guest 77
        run_executor(executor, clock)
    (record,) = history.migrations()
    assert record.outcome == "lost" and record.name == "old-db"
    assert "old-db (77) a → b" in caplog.text
