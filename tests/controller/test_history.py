"""The controller history: round-trips, schema versions, restarts, windows, and one invariant."""

from __future__ import annotations

import math
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from opendrs.backends.base import Handle
from opendrs.controller import history_file
from opendrs.controller.history import History
from opendrs.controller.history_file import APPLICATION_ID, SCHEMA_VERSION, HistoryError
from opendrs.model.cluster import Move
from opendrs.records import DecisionRecord, MigrationRecord, timeline


def raises(match: str) -> Any:
    """``pytest.raises(HistoryError)`` that also checks the message is one line."""

    class _Check:
        def __enter__(self) -> Any:
            self._cm = pytest.raises(HistoryError, match=match)
            self.info = self._cm.__enter__()
            return self.info

        def __exit__(self, *exc: Any) -> bool:
            handled = self._cm.__exit__(*exc)
            message = str(self.info.value)
            assert "\n" not in message and message == message.strip() and message
            return bool(handled)

    return _Check()


def decision(h: History, at: float = 0.0, **overrides: Any) -> int:
    fields: dict[str, Any] = {
        "at": at,
        "cluster": "lab",
        "mode": "active",
        "policy": "balance",
        "action": "plan",
        "reason": "CPU spread above threshold.",
        "imbalance": 0.4,
        "predicted": 0.1,
        "summary": {"nodes": 3, "guests": 12},
        "plan": [{"guest": "101", "source": "pve1", "target": "pve2"}],
    }
    fields.update(overrides)
    return h.record_decision(**fields)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "history.db"


@pytest.fixture
def h() -> Any:
    with History(":memory:") as history:
        yield history


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


# ---------------------------------------------------------------------- round-trips


def test_decision_round_trip(h: History) -> None:
    plan = [
        {"move": Move("101", "pve1", "pve2"), "reason": "most loaded node"},
        {"guest": "102", "source": "pve3", "target": "pve2", "cost": 4},
    ]
    summary = {"nodes": 3, "guests": 2, "loads": {"pve1": 0.9, "pve2": 0.2}, "tags": ("a", "b")}
    first = decision(h, at=10.5, reason="Spread  too\nhigh.", summary=summary, plan=plan)
    second = decision(
        h, at=20, mode="shadow", action="none", imbalance=None, predicted=None, plan=[]
    )
    assert second > first
    records = h.decisions()
    assert [r.id for r in records] == [first, second]
    one = records[0]
    assert isinstance(one, DecisionRecord)
    assert (one.at, one.cluster, one.mode, one.policy, one.action) == (
        10.5,
        "lab",
        "active",
        "balance",
        "plan",
    )
    assert one.reason == "Spread too high."
    assert (one.imbalance, one.predicted) == (0.4, 0.1)
    assert dict(one.summary) == {
        "nodes": 3,
        "guests": 2,
        "loads": {"pve1": 0.9, "pve2": 0.2},
        "tags": ["a", "b"],
    }
    assert [dict(step) for step in one.plan] == [
        {
            "move": {"guest": "101", "source": "pve1", "target": "pve2"},
            "reason": "most loaded node",
        },
        {"guest": "102", "source": "pve3", "target": "pve2", "cost": 4},
    ]
    two = records[1]
    assert (two.mode, two.action, two.imbalance, two.predicted, two.plan) == (
        "shadow",
        "none",
        None,
        None,
        (),
    )
    with pytest.raises(TypeError):
        one.summary["nodes"] = 4  # type: ignore[index]


def test_decisions_since_and_limit(h: History) -> None:
    ids = [decision(h, at=t) for t in (5.0, 1.0, 3.0, 3.0)]
    assert [r.at for r in h.decisions()] == [1.0, 3.0, 3.0, 5.0]
    assert [r.id for r in h.decisions(since=3.0)] == [ids[2], ids[3], ids[0]]
    assert [r.id for r in h.decisions(limit=2)] == [ids[3], ids[0]]
    assert [r.id for r in h.decisions(since=2.0, limit=1)] == [ids[0]]
    assert h.decisions(limit=0) == []
    assert h.decisions(since=5.5) == []


def test_migration_round_trip_and_queries(h: History) -> None:
    d = decision(h)
    a = h.migration_started(decision=d, move=Move("101", "pve1", "pve2"), handle="UPID:1", at=10)
    b = h.migration_started(
        decision=None, move=Move("102", "pve3", "pve9"), handle="op-2", at=12, parking=True
    )
    c = h.migration_started(decision=d, move=Move("103", "pve1", "pve3"), handle="op-3", at=11)
    [ra, rb] = [r for r in h.migrations() if r.id in (a, b)]
    assert ra == MigrationRecord(
        id=a,
        decision=d,
        move=Move("101", "pve1", "pve2"),
        handle="UPID:1",
        started=10.0,
        parking=False,
        ended=None,
        outcome=None,
        error=None,
    )
    assert (rb.decision, rb.parking, rb.guest, rb.in_flight) == (None, True, "102", True)
    assert [r.id for r in h.migrations()] == [a, c, b]
    assert [r.id for r in h.migrations(since=11)] == [c, b]
    assert [r.id for r in h.migrations(guest="103")] == [c]
    assert h.migrations(since=11, guest="101") == []
    done = h.migration_finished(a, at=30, outcome="done")
    assert (done.ended, done.outcome, done.error, done.in_flight) == (30.0, "done", None, False)
    failed = h.migration_finished(c, at=31, outcome="failed", error="target\nout of memory")
    assert (failed.outcome, failed.error) == ("failed", "target out of memory")
    assert h.migrations(guest="103") == [failed]


def test_a_move_that_stopped_its_guest_records_for_how_long(h: Any) -> None:
    live, stopped, broken = (
        h.migration_started(decision=None, move=Move(g, "a", "b"), handle="t", at=1)
        for g in ("101", "102", "103")
    )
    assert h.migration_finished(live, at=2, outcome="done").downtime is None
    assert h.migration_finished(stopped, at=9, outcome="done", downtime=4.25).downtime == 4.25
    assert [m.downtime for m in h.migrations()] == [None, 4.25, None]
    with raises("migration 3: a downtime for outcome 'failed'"):
        h.migration_finished(broken, at=9, outcome="failed", error="no", downtime=1.0)
    with raises("downtime must be at least 0 seconds, got -1.0"):
        h.migration_finished(broken, at=9, outcome="done", downtime=-1.0)


# ---------------------------------------------------------------------- the file


def test_new_file_settings(path: Path) -> None:
    with History(path) as h:
        db = h._conn()
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert h.path == str(path)
        assert not h.closed
    assert h.closed
    db = raw(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"state", "decisions", "migrations", "cooldowns", "avoid", "proposals"}
    db.close()


def test_reopen_keeps_everything(path: Path) -> None:
    with History(path) as h:
        h.bind("lab")
        d = decision(h, at=1)
        m1 = h.migration_started(decision=d, move=Move("101", "a", "b"), handle="t1", at=2)
        h.migration_finished(m1, at=3, outcome="done")
        h.set_cooldown("101", 100, "just moved")
        h.avoid("102", "c", 200, "migration failed")
    with History(path) as h:
        assert h.cluster == "lab"
        assert [r.id for r in h.decisions()] == [d]
        assert [(r.id, r.outcome) for r in h.migrations()] == [(m1, "done")]
        assert h.cooldowns(50) == {"101": 100.0}
        assert h.avoided(50) == {("102", "c"): 200.0}
        assert h.departures(0) == {"101": [("a", 3.0)]}


def test_restart_reconciles_in_flight(path: Path) -> None:
    with History(path) as h:
        d = decision(h, at=1)
        m = h.migration_started(decision=d, move=Move("101", "a", "b"), handle="UPID:x", at=2)
        lost = h.migration_started(decision=d, move=Move("102", "a", "c"), handle="op", at=3)
    # the daemon dies here; a new one starts
    with History(path) as h:
        pending = h.in_flight()
        assert [r.id for r in pending] == [m, lost]
        assert pending[0].as_handle() == Handle("UPID:x", Move("101", "a", "b"), 2.0)
        with raises("already has migration"):
            h.migration_started(decision=None, move=Move("101", "a", "c"), handle="again", at=5)
        h.migration_finished(m, at=6, outcome="done")
        h.migration_finished(lost, at=6, outcome="lost", error="task unknown after restart")
        assert h.in_flight() == []
    with History(path) as h:
        assert h.in_flight() == []
        assert [(r.outcome, r.error) for r in h.migrations()] == [
            ("done", None),
            ("lost", "task unknown after restart"),
        ]


def test_newer_schema_refused_and_untouched(path: Path) -> None:
    with History(path):
        pass
    db = raw(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 7}")
    db.close()
    message = (
        f"{path}: history schema version {SCHEMA_VERSION + 7} is newer than this opendrs "
        f"({SCHEMA_VERSION}); upgrade opendrs"
    )
    for readonly in (False, True):
        with raises("newer") as info:
            History(path, readonly=readonly)
        assert str(info.value) == message
    db = raw(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 7
    db.close()


@pytest.mark.parametrize("empty", [True, False])
def test_version_0_file_is_migrated(path: Path, empty: bool) -> None:
    if empty:
        path.write_bytes(b"")
    else:  # a real SQLite file, header written, no tables, user_version 0
        db = raw(path)
        db.execute("CREATE TABLE scratch (x)")
        db.execute("DROP TABLE scratch")
        db.close()
        assert path.stat().st_size > 0
    with History(path) as h:
        decision(h)
        assert len(h.decisions()) == 1
    db = raw(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_older_schema_is_migrated_in_one_transaction(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = SCHEMA_VERSION  # a file of this version, upgraded to a next one
    with History(path) as h:
        h.bind("lab")
        m = h.migration_started(decision=None, move=Move("101", "a", "b"), handle="t", at=1)
    step = (
        "ALTER TABLE migrations ADD COLUMN note TEXT",
        "UPDATE migrations SET note = 'from before'",
    )
    broken = (*step, "CREATE TABLE cooldowns (x)")  # fails after two statements
    current = history_file.UPGRADES
    monkeypatch.setattr(history_file, "UPGRADES", (*current, broken))
    monkeypatch.setattr(history_file, "SCHEMA_VERSION", now + 1)
    with raises(
        rf"cannot upgrade the history schema from version {now} to {now + 1}: table cooldowns"
    ):
        History(path)
    db = raw(path)  # nothing of the failed step was kept
    assert db.execute("PRAGMA user_version").fetchone()[0] == now
    columns = [r[1] for r in db.execute("PRAGMA table_info(migrations)")]
    assert "note" not in columns
    db.close()
    with raises(
        f"version {now} is older than this opendrs [(]{now + 1}[)]; open it once read-write"
    ):
        History(path, readonly=True)
    monkeypatch.setattr(history_file, "UPGRADES", (*current, step))
    with History(path) as h:
        assert h.cluster == "lab"
        assert [r.id for r in h.in_flight()] == [m]
    db = raw(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == now + 1
    assert db.execute("SELECT note FROM migrations").fetchall() == [("from before",)]
    db.close()


@pytest.mark.parametrize(
    ("content", "reason", "foreign"),
    [
        (
            b"this is not a database, it is a note\n" * 40,
            r"not an opendrs history \(not an SQLite database\)",
            True,
        ),
        (
            b"SQLite format 3\x00" + b"\xff" * 4000,
            "cannot open history: file is not a database",
            False,
        ),
    ],
)
def test_corrupt_file(path: Path, content: bytes, reason: str, foreign: bool) -> None:
    path.write_bytes(content)
    for readonly in (False, True):
        with raises(f"^{path}: {reason}$") as raised:
            History(path, readonly=readonly)
        assert raised.value.foreign is foreign and not raised.value.passing
    assert path.read_bytes() == content


def test_damaged_database(path: Path) -> None:
    with History(path) as h:
        decision(h)
    db = raw(path)
    db.execute("PRAGMA journal_mode = DELETE")  # everything in the main file, no WAL beside it
    db.close()
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xa5" * (4096 - 100)  # the schema page, after the file header
    path.write_bytes(bytes(data))
    with raises(f"^{path}: cannot open history: .*malformed"):
        History(path)


def test_foreign_databases_are_refused(path: Path, tmp_path: Path) -> None:
    db = raw(path)
    db.execute("CREATE TABLE invoices (id)")
    db.close()
    with raises(f"^{path}: not an opendrs history [(]a database with tables invoices[)]$"):
        History(path)
    other = tmp_path / "other.db"
    db = raw(other)
    db.execute("PRAGMA application_id = 1234")
    db.close()
    with raises("not an opendrs history [(]SQLite application id 0x4d2[)]"):
        History(other)


def test_unopenable_paths(tmp_path: Path) -> None:
    with raises("it is a directory"):
        History(tmp_path)
    with raises(f"directory {tmp_path / 'nope'} does not exist"):
        History(tmp_path / "nope" / "h.db")
    with raises("no such file"):
        History(tmp_path / "missing.db", readonly=True)
    assert not (tmp_path / "missing.db").exists()
    with raises("cannot be opened read-only"):
        History(":memory:", readonly=True)
    with raises("timeout"):
        History(":memory:", timeout=-1)


def test_closed_history(path: Path) -> None:
    h = History(path)
    h.close()
    h.close()
    with raises("history is closed"):
        h.in_flight()
    with raises("history is closed"):
        h.set_cooldown("101", 5, "x")


# ---------------------------------------------------------------------- readers and writers


def test_reader_beside_the_writer(path: Path) -> None:
    with History(path) as writer:
        decision(writer, at=1)
        with History(path, readonly=True) as reader:
            assert len(reader.decisions()) == 1
            decision(writer, at=2)
            assert len(reader.decisions()) == 2
            with raises("cannot record a decision: history is open read-only"):
                decision(reader, at=3)
            with raises("read-only"):
                reader.prune(10)
        assert len(writer.decisions()) == 2


@pytest.mark.parametrize("written", [False, True], ids=["left-alone", "written-since"])
def test_an_immutable_read_torn_by_a_writer_that_began_is_a_passing_error(
    path: Path, monkeypatch: pytest.MonkeyPatch, written: bool
) -> None:
    """A history read as an immutable file (no lock: a reader that cannot write beside it) whose
    read fails: corrupt, lasting, unless a write-ahead log is there now — a daemon began to write
    it while it was read — which passes (try again)."""
    with History(path) as h:
        for at in range(200):
            decision(h, at=at)
    db = raw(path)
    db.execute("PRAGMA journal_mode = DELETE")  # as a stopped daemon leaves it: no WAL beside it
    db.close()

    def immutable(name: str, *, readonly: bool, timeout: float) -> sqlite3.Connection:
        return history_file._opened(name, readonly, timeout, "mode=ro&immutable=1")

    monkeypatch.setattr("opendrs.controller.history.connect", immutable)
    with History(path, readonly=True) as reader:
        data = bytearray(path.read_bytes())
        data[4096:] = b"\xa5" * (len(data) - 4096)  # every page after the schema's, torn
        path.write_bytes(bytes(data))
        if written:
            Path(f"{path}-wal").write_bytes(b"")
        with raises(f"^{path}: " if written else "cannot read") as raised:
            reader.decisions()
    if written:
        assert str(raised.value).endswith("the history began to be written while read; try again")
    assert raised.value.passing is written


def test_locked_database_is_one_line_error(path: Path) -> None:
    with History(path, timeout=0.05) as h:
        decision(h, at=1)
        other = raw(path)
        other.execute("BEGIN IMMEDIATE")
        try:
            assert len(h.decisions()) == 1  # WAL: reads do not wait for the writer
            with raises("cannot set a cooldown: database is locked"):
                h.set_cooldown("101", 10, "x")
        finally:
            other.execute("ROLLBACK")
            other.close()
        h.set_cooldown("101", 10, "x")
        assert h.cooldowns(0) == {"101": 10.0}


# ---------------------------------------------------------------------- start and finish rules


def test_second_in_flight_migration_of_a_guest_is_refused(h: History) -> None:
    m = h.migration_started(decision=None, move=Move("101", "a", "b"), handle="t1", at=1)
    with raises(r"guest 101 already has migration 1 in flight [(]a → b, task t1[)]"):
        h.migration_started(decision=None, move=Move("101", "b", "c"), handle="t2", at=2)
    other = h.migration_started(decision=None, move=Move("102", "a", "b"), handle="t3", at=2)
    h.migration_finished(m, at=3, outcome="failed", error="timeout")
    again = h.migration_started(decision=None, move=Move("101", "a", "c"), handle="t4", at=4)
    assert [r.id for r in h.in_flight()] == [other, again]


def test_schema_itself_refuses_two_in_flight_rows(path: Path) -> None:
    with History(path) as h:
        h.migration_started(decision=None, move=Move("101", "a", "b"), handle="t1", at=1)
    db = raw(path)
    with pytest.raises(sqlite3.IntegrityError):
        db.execute(
            "INSERT INTO migrations (guest, source, target, handle, started) "
            "VALUES ('101', 'a', 'c', 't2', 2)"
        )
    db.close()


def test_finish_is_idempotent_for_the_same_outcome(h: History) -> None:
    m = h.migration_started(decision=None, move=Move("101", "a", "b"), handle="t", at=1)
    first = h.migration_finished(m, at=5, outcome="failed", error="no space")
    again = h.migration_finished(m, at=9, outcome="failed", error="other words")
    assert again == first
    assert h.migrations() == [first]
    with raises(f"migration {m} of 101 already ended as 'failed'; cannot record 'done'"):
        h.migration_finished(m, at=9, outcome="done")
    with raises("unknown migration 99"):
        h.migration_finished(99, at=9, outcome="done")
    m2 = h.migration_started(decision=None, move=Move("102", "a", "b"), handle="t", at=1)
    with raises("an error for outcome 'done'"):
        h.migration_finished(m2, at=2, outcome="done", error="?")
    with raises("outcome must be one of done, failed, lost"):
        h.migration_finished(m2, at=2, outcome="ok")  # type: ignore[arg-type]
    assert h.in_flight()[0].id == m2


def test_migration_arguments_are_checked(h: History) -> None:
    with raises("unknown decision 7"):
        h.migration_started(decision=7, move=Move("101", "a", "b"), handle="t", at=1)
    with raises("source and target are both 'a'"):
        h.migration_started(decision=None, move=Move("101", "a", "a"), handle="t", at=1)
    with raises("migration handle must be a non-empty string"):
        h.migration_started(decision=None, move=Move("101", "a", "b"), handle="", at=1)
    with raises("at must be a finite time"):
        h.migration_started(decision=None, move=Move("101", "a", "b"), handle="t", at=math.inf)
    with raises("at must be a time in seconds"):
        h.migration_started(decision=None, move=Move("101", "a", "b"), handle="t", at=True)
    with raises("move must be a Move"):
        h.migration_started(decision=None, move=("101", "a", "b"), handle="t", at=1)  # type: ignore[arg-type]
    assert h.migrations() == []


def test_decision_arguments_are_checked(h: History) -> None:
    with raises("mode must be one of shadow, manual, active"):
        decision(h, mode="dry-run")
    with raises("action must be one of none, plan, repair"):
        decision(h, action="rebalance")
    with raises("reason must be a non-empty string"):
        decision(h, reason="  ")
    with raises("imbalance must be a finite number"):
        decision(h, imbalance=math.nan)
    with raises("decision summary cannot be stored as JSON: Out of range float"):
        decision(h, summary={"load": math.nan})
    with raises("decision summary cannot be stored as JSON: object is not JSON"):
        decision(h, summary={"x": object()})
    with raises("decision summary must be a mapping"):
        decision(h, summary=[1, 2])
    with raises("decision plan must be a sequence"):
        decision(h, plan="101:a->b")
    with raises(r"decision plan\[1\] must be a mapping"):
        decision(h, plan=[{"guest": "1"}, Move("2", "a", "b")])
    assert h.decisions() == []


# ---------------------------------------------------------------------- windows


def test_departures_window(h: History) -> None:
    def finished(guest: str, src: str, dst: str, end: float, outcome: str = "done") -> None:
        m = h.migration_started(decision=None, move=Move(guest, src, dst), handle="t", at=end - 1)
        h.migration_finished(m, at=end, outcome=outcome)  # type: ignore[arg-type]

    finished("101", "a", "b", 99.5)
    finished("101", "b", "c", 100.0)
    finished("101", "c", "a", 150.0)
    finished("102", "a", "b", 120.0, "failed")
    finished("103", "a", "b", 120.0, "lost")
    h.migration_started(decision=None, move=Move("104", "a", "b"), handle="t", at=130)
    assert h.departures(100.0) == {"101": [("b", 100.0), ("c", 150.0)]}
    assert h.departures(100.5) == {"101": [("c", 150.0)]}
    assert h.departures(150.5) == {}


def test_budget_spent_counts_budgeted_decisions_only(h: History) -> None:
    # A balancing plan recorded before decisions said "budgeted" counts by its action; a repair
    # counts only when it says so (a node that only ran hot); a migration without a decision,
    # a return from maintenance, and one before the window do not.
    old_plan = decision(h, at=10.0)
    plan = decision(h, at=20.0, summary={"code": "plan", "budgeted": True})
    hot = decision(h, at=30.0, action="repair", summary={"code": "repair", "budgeted": True})
    fix = decision(h, at=40.0, action="repair", summary={"code": "repair", "budgeted": False})
    back = decision(h, at=50.0, action="repair", summary={"code": "return", "budgeted": False})
    started = [(old_plan, 5.0), (old_plan, 11.0), (plan, 21.0), (hot, 31.0), (fix, 41.0)]
    started += [(back, 51.0), (None, 60.0)]
    for k, (made_by, at) in enumerate(started):
        move = Move(f"g{k}", "a", "b")
        h.migration_started(decision=made_by, move=move, handle="t", at=at)
    assert h.budget_spent(10.0) == [11.0, 21.0, 31.0]
    assert h.budget_spent(0.0) == [5.0, 11.0, 21.0, 31.0]
    assert h.budget_spent(32.0) == []


def test_cooldown_window(h: History) -> None:
    h.set_cooldown("101", 100.0, "moved")
    h.set_cooldown("102", 50.0, "moved")
    assert h.cooldowns(49.999) == {"101": 100.0, "102": 50.0}
    assert h.cooldowns(50.0) == {"101": 100.0}
    assert h.cooldowns(100.0) == {}
    h.set_cooldown("101", 40.0, "released by hand")  # setting again replaces, even shorter
    assert h.cooldowns(45.0) == {"102": 50.0}


def test_avoid_window(h: History) -> None:
    h.avoid("101", "pve2", 100.0, "migration failed: no space")
    h.avoid("101", "pve3", 80.0, "migration failed")
    h.avoid("102", "pve2", 60.0, "migration failed")
    assert h.avoided(59.0) == {
        ("101", "pve2"): 100.0,
        ("101", "pve3"): 80.0,
        ("102", "pve2"): 60.0,
    }
    assert h.avoided(60.0) == {("101", "pve2"): 100.0, ("101", "pve3"): 80.0}
    h.avoid("101", "pve3", 200.0, "failed again")
    assert h.avoided(100.0) == {("101", "pve3"): 200.0}
    assert h.avoided(200.0) == {}


def test_prune_keeps_in_flight_and_recent(h: History) -> None:
    old = decision(h, at=10)
    older_alone = decision(h, at=5, action="none", plan=[])
    recent = decision(h, at=200)
    flying = h.migration_started(decision=old, move=Move("101", "a", "b"), handle="t", at=11)
    gone = h.migration_started(decision=old, move=Move("102", "a", "b"), handle="t", at=11)
    h.migration_finished(gone, at=20, outcome="done")
    edge = h.migration_started(decision=None, move=Move("103", "a", "b"), handle="t", at=50)
    h.migration_finished(edge, at=100, outcome="failed")
    h.set_cooldown("101", 100, "x")
    h.set_cooldown("102", 100.5, "x")
    h.avoid("101", "b", 99, "x")
    h.avoid("101", "c", 300, "x")
    assert h.prune(100.0) == {
        "decisions": 1,
        "migrations": 1,
        "cooldowns": 1,
        "avoid": 1,
        "proposals": 0,
    }
    assert [r.id for r in h.decisions()] == [old, recent]  # old is kept: a migration flies
    assert older_alone not in [r.id for r in h.decisions()]
    assert [r.id for r in h.migrations()] == [flying, edge]
    assert h.cooldowns(0) == {"102": 100.5}
    assert h.avoided(0) == {("101", "c"): 300.0}
    h.migration_finished(flying, at=150, outcome="done")
    assert h.prune(1000.0) == {
        "decisions": 2,
        "migrations": 2,
        "cooldowns": 1,
        "avoid": 1,
        "proposals": 0,
    }
    assert h.decisions() == h.migrations() == []


def test_summary_counts(h: History) -> None:
    decision(h, at=1, action="none", plan=[])
    d = decision(h, at=10)
    decision(h, at=11, mode="shadow", plan=[{"guest": "1"}, {"guest": "2"}])
    decision(h, at=12, mode="shadow", action="repair", plan=[{"guest": "3"}])
    decision(h, at=13, action="none", plan=[])
    outcomes = ["done", "done", "failed", "lost"]
    for i, outcome in enumerate(outcomes):
        m = h.migration_started(decision=d, move=Move(str(i), "a", "b"), handle="t", at=10 + i)
        h.migration_finished(m, at=20 + i, outcome=outcome)  # type: ignore[arg-type]
    h.migration_started(decision=d, move=Move("9", "a", "b"), handle="t", at=8)
    old = h.migration_started(decision=None, move=Move("8", "a", "b"), handle="t", at=2)
    h.migration_finished(old, at=3, outcome="failed")
    assert h.summary(10) == {
        "since": 10.0,
        "decisions": {"none": 1, "plan": 2, "repair": 1},
        "modes": {"shadow": 2, "manual": 0, "active": 2},
        "shadow_moves": 3,
        "migrations": {"done": 2, "failed": 1, "lost": 1, "in_flight": 1},
        "started": 4,
    }


# ---------------------------------------------------------------------- one history, one cluster


def test_bind_to_another_cluster_is_refused(path: Path) -> None:
    with History(path) as h:
        assert h.cluster is None
        decision(h, cluster="anything")  # not bound yet: no check
        h.bind("lab")
        h.bind("lab")
        assert h.cluster == "lab"
        decision(h, cluster="lab")
        with raises("belongs to cluster 'lab', not 'prod'; decision not recorded"):
            decision(h, cluster="prod")
    with History(path) as h:
        with raises(f"^{path}: this history belongs to cluster 'lab', not 'prod'; use another"):
            h.bind("prod")
        assert h.cluster == "lab"
        assert len(h.decisions()) == 2


# ---------------------------------------------------------------------- the invariant


GUESTS = ("101", "102", "103")


class StartFinish(RuleBasedStateMachine):
    """Any sequence of starts and finishes: at most one in flight per guest, and in_flight()
    is exactly the set started and not finished."""

    @initialize()
    def open(self) -> None:
        self.history = History(":memory:")
        self.started: dict[int, str] = {}  # id -> guest
        self.ended: dict[int, str] = {}  # id -> outcome
        self.clock = 0.0

    def teardown(self) -> None:
        if hasattr(self, "history"):
            self.history.close()

    @rule(guest=st.sampled_from(GUESTS), node=st.sampled_from(("x", "y")))
    def start(self, guest: str, node: str) -> None:
        self.clock += 1
        flying = {g for i, g in self.started.items() if i not in self.ended}
        move = Move(guest, "src", node)
        if guest in flying:
            with raises("already has migration"):
                self.history.migration_started(decision=None, move=move, handle="t", at=self.clock)
        else:
            m = self.history.migration_started(decision=None, move=move, handle="t", at=self.clock)
            assert m not in self.started
            self.started[m] = guest

    @rule(pick=st.integers(0, 50), outcome=st.sampled_from(("done", "failed", "lost")))
    def finish(self, pick: int, outcome: str) -> None:
        self.clock += 1
        ids = sorted(self.started)
        if not ids or pick >= len(ids) + 2:  # sometimes an id that does not exist
            with raises("unknown migration"):
                self.history.migration_finished(1000 + pick, at=self.clock, outcome=outcome)  # type: ignore[arg-type]
            return
        m = ids[pick % len(ids)]
        if m in self.ended and self.ended[m] != outcome:
            with raises("already ended"):
                self.history.migration_finished(m, at=self.clock, outcome=outcome)  # type: ignore[arg-type]
        else:
            record = self.history.migration_finished(m, at=self.clock, outcome=outcome)  # type: ignore[arg-type]
            self.ended.setdefault(m, outcome)
            assert record.outcome == self.ended[m]

    @invariant()
    def in_flight_matches(self) -> None:
        if not hasattr(self, "history"):
            return
        flying = self.history.in_flight()
        assert {r.id for r in flying} == set(self.started) - set(self.ended)
        guests = [r.guest for r in flying]
        assert len(guests) == len(set(guests))
        assert [r.started for r in flying] == sorted(r.started for r in flying)


TestStartFinish = StartFinish.TestCase
TestStartFinish.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_module_docstring_documents_every_column() -> None:
    doc = history_file.__doc__ or ""
    with tempfile.TemporaryDirectory() as tmp, History(Path(tmp) / "h.db"):
        db = raw(Path(tmp) / "h.db")
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            assert f"``{table}``" in doc, table
            for column in db.execute(f"PRAGMA table_info({table})"):
                assert f"``{column[1]}``" in doc, f"{table}.{column[1]}"
        db.close()


def test_evacuated_guests_round_trip_and_a_damaged_value_is_one_clear_error(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "h.sqlite")
    with History(path) as history:
        assert history.evacuated() == {}
        history.set_evacuated({"vm:101": "pve3", "vm:102": "pve3"})
        history.set_evacuated({"vm:102": "pve3"})
    with History(path) as history:
        assert history.evacuated() == {"vm:102": "pve3"}
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE state SET value = '[1, 2]' WHERE key = 'evacuated'")
    db.close()
    with History(path) as history, pytest.raises(HistoryError, match="evacuated guests"):
        history.evacuated()


def test_nodes_seen_running_hot_round_trip_and_a_damaged_value_is_one_clear_error(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "h.sqlite")
    with History(path) as history:
        assert history.hot_seen() == {}
        history.set_hot_seen({"pve1": 1000.0, "pve2": 1300.5})
        history.set_hot_seen({"pve2": 1600.5})
    with History(path) as history:
        assert history.hot_seen() == {"pve2": 1600.5}
    for damaged in ('{"pve1": "noon"}', '{"pve1": true}', "not json"):
        db = sqlite3.connect(path)
        with db:
            db.execute("UPDATE state SET value = ? WHERE key = 'hot_seen'", (damaged,))
        db.close()
        with History(path) as history, pytest.raises(HistoryError, match="seen running hot"):
            history.hot_seen()


def test_outcomes_are_told_in_the_order_recorded_and_older_files_are_numbered_by_id(
    path: Path,
) -> None:
    db = sqlite3.connect(path)  # a version-1 file: one migration ended, as version 1 wrote it
    for statement in history_file.UPGRADES[0]:
        db.execute(statement)
    db.execute("INSERT INTO state VALUES ('cluster', 'lab')")
    db.execute(
        "INSERT INTO migrations (id, guest, source, target, handle, started, ended, outcome) "
        "VALUES (1, '101', 'a', 'b', 't1', 1, 2, 'done')"
    )
    db.execute(f"PRAGMA application_id = {history_file.APPLICATION_ID}")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with History(path) as h:  # upgraded to the current version
        second = h.migration_started(decision=None, move=Move("102", "a", "b"), handle="t2", at=3)
        third = h.migration_started(decision=None, move=Move("103", "a", "b"), handle="t3", at=3)
        h.migration_finished(third, at=5, outcome="done")  # the later id ends first
        h.migration_finished(second, at=5, outcome="failed", error="refused")
        by_id = {r.id: r.ended_order for r in h.migrations()}
        told = [
            (item["id"], item["event"])
            for item in timeline([], h.migrations())
            if item["event"] != "started"
        ]
    assert by_id == {1: 1, second: 3, third: 2}
    assert told == [(1, "done"), (third, "done"), (second, "failed")]


def test_an_intent_whose_request_was_not_sent_is_withdrawn_and_tells_no_listener() -> None:
    heard: list[object] = []
    with History(":memory:") as h:
        h.listen(heard.append)
        move = Move("101", "a", "b")
        intent = h.migration_started(decision=None, move=move, handle="(pending)", at=1.0)
        h.migration_withdrawn(intent)
        assert h.migrations() == [] and h.in_flight() == [] and heard == []
        # The guest may be started again at once; a migration that ended cannot be withdrawn.
        again = h.migration_started(decision=None, move=move, handle="(pending)", at=2.0)
        h.migration_finished(again, at=3.0, outcome="failed", error="refused")
        with pytest.raises(HistoryError, match=f"no migration {again} in flight"):
            h.migration_withdrawn(again)
        with pytest.raises(HistoryError, match="must be an integer"):
            h.migration_withdrawn("1")  # type: ignore[arg-type]
        assert [r.outcome for r in h.migrations()] == ["failed"]


def test_a_decision_keeps_its_code_in_a_column_taken_from_the_summary_when_not_given() -> None:
    with History(":memory:") as h:
        given = decision(h, code="plan", summary={"code": "other"})
        from_summary = decision(h, at=1.0, summary={"code": "balanced", "nodes": 3})
        without = decision(h, at=2.0)
        codes = {r.id: r.code for r in h.decisions()}
        with raises("decision code must be a non-empty string"):
            decision(h, at=3.0, code="")
    assert codes == {given: "plan", from_summary: "balanced", without: None}


def test_a_version_3_file_gets_the_code_column_filled_from_each_summary(path: Path) -> None:
    db = sqlite3.connect(path)  # a version-3 file: decisions kept their code in the summary
    for step in history_file.UPGRADES[:3]:
        for statement in step:
            db.execute(statement)
    db.execute("INSERT INTO state VALUES ('cluster', 'lab')")
    for id_, summary in ((1, '{"code": "holding", "nodes": 3}'), (2, '{"nodes": 3}')):
        db.execute(
            "INSERT INTO decisions (id, at, cluster, mode, policy, action, reason, moves, "
            "summary, plan) VALUES (?, ?, 'lab', 'shadow', 'balance', 'none', 'why', 0, ?, '[]')",
            (id_, float(id_), summary),
        )
    db.execute(f"PRAGMA application_id = {history_file.APPLICATION_ID}")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    with History(path) as h:  # upgraded to the current version
        later = decision(h, at=5.0, summary={"code": "plan"})
        codes = {r.id: r.code for r in h.decisions()}
        summaries = {r.id: dict(r.summary) for r in h.decisions()}
    assert codes == {1: "holding", 2: None, later: "plan"}
    assert summaries[1] == {"code": "holding", "nodes": 3}  # the summary is left as it was
    assert raw(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
