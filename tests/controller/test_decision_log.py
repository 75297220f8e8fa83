"""The decision log (``log: {decisions: FILE}``), the one record schema it shares with
``opendrs history``, the history's listeners and holds, and the lock probe of ``opendrs status``."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from pathlib import Path

import pytest

from opendrs.controller.config import ConfigError, parse_config
from opendrs.controller.decision_log import DecisionLog, DecisionLogError
from opendrs.controller.history import History
from opendrs.controller.loop import InstanceLock, LockError
from opendrs.json_data import iso_time
from opendrs.model.cluster import Move
from opendrs.records import PENDING, jsonl, timeline

#: The decision log's logger (a command run in this process may have quietened "opendrs").
LOGGER = "opendrs.controller.decision_log"
SIM = {"backend": {"type": "sim", "scenario": "builtin:demo"}}


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def decide(
    history: History, at: float, guest: str | None = None, stop: dict[str, object] | None = None
) -> int:
    """A decision recorded, moving ``guest`` when given, its summary with ``stop`` when given."""
    plan = [] if guest is None else [{"guest": guest, "source": "a", "target": "b", "step": 1}]
    summary: dict[str, object] = {"code": "plan" if plan else "balanced"}
    if stop is not None:
        summary["stop"] = stop
    return history.record_decision(
        at=at,
        cluster="c",
        mode="active",
        policy="opendrs",
        action="plan" if plan else "none",
        reason="because",
        imbalance=0.2,
        predicted=0.1 if plan else None,
        summary=summary,
        plan=plan,
    )


def migrate(history: History, decision: int, guest: str, at: float, outcome: str) -> int:
    record = history.migration_started(
        decision=decision, move=Move(guest, "a", "b"), handle=PENDING, at=at
    )
    if outcome != "refused":
        history.migration_handle(record, f"task-{guest}", started=at + 1)
    history.migration_finished(
        record,
        at=at + 5,
        outcome="done" if outcome == "done" else "failed",
        error=None if outcome == "done" else "it broke",
    )
    return record


# -- configuration ---------------------------------------------------------------------------


def test_the_decision_log_path_is_relative_to_the_configuration(tmp_path: Path) -> None:
    config = parse_config(
        {**SIM, "log": {"decisions": "logs/decisions.jsonl"}},
        filename=str(tmp_path / "opendrs.yaml"),
    )
    assert config.decision_log == str(tmp_path / "logs" / "decisions.jsonl")
    assert parse_config(SIM, filename=str(tmp_path / "o.yaml")).decision_log is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (5, "log.decisions: expected a string"),
        ("history.sqlite", "is the history or its lock file"),
        ("history.sqlite.lock", "is the history or its lock file"),
        (".", "is a directory"),
    ],
)
def test_a_bad_decision_log_path_is_one_line(tmp_path: Path, value: object, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**SIM, "log": {"decisions": value}}, filename=str(tmp_path / "o.yaml"))
    assert reason in str(caught.value) and "\n" not in str(caught.value)


# -- the log against the history --------------------------------------------------------------


def test_the_log_has_what_history_jsonl_prints_line_for_line(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    with History(":memory:") as history, DecisionLog(str(path)) as log:
        history.listen(log.record)
        decide(history, 100.0)
        first = decide(history, 200.0, "101")
        migrate(history, first, "101", 200.0, "done")
        second = decide(history, 300.0, "102")
        migrate(history, second, "102", 300.0, "refused")  # no started line: no task
        third = decide(history, 400.0, "103")
        migrate(history, third, "103", 400.0, "failed")
        # An outcome recorded again changes nothing, and writes nothing.
        history.migration_finished(1, at=999.0, outcome="done")
        expected = timeline(history.decisions(), history.migrations())
    written = lines(path)
    assert written == expected
    assert path.read_text() == "".join(jsonl(item) for item in expected)
    kinds = [(o["kind"], o.get("event")) for o in written]
    assert kinds == [
        ("decision", None),
        ("decision", None),
        ("migration", "started"),
        ("migration", "done"),
        ("decision", None),
        ("migration", "failed"),
        ("decision", None),
        ("migration", "started"),
        ("migration", "failed"),
    ]
    started, done = written[2], written[3]
    assert started["at"] == 201.0 and started["outcome"] is None and started["ended"] is None
    assert done["at"] == 205.0 and done["outcome"] == "done" and done["started"] == 201.0
    assert written[5]["handle"] == PENDING and written[5]["error"] == "it broke"
    assert written[1]["act"] is True and written[1]["code"] == "plan"
    assert written[1]["moves"] == [
        {"guest": "101", "name": None, "source": "a", "target": "b", "step": 1, "parking": None}
    ]
    assert written[0]["time"] == iso_time(100.0) == "1970-01-01T00:01:40Z"


def test_a_decision_has_its_stop_and_one_recorded_before_stops_has_none_and_its_reason() -> None:
    stop = {"code": "batch_cut", "kept": 2, "proposed": 5, "limit": "batch", "batch": 2}
    with History(":memory:") as history:
        decide(history, 100.0)  # as a history written before stops were recorded has it
        decide(history, 200.0, "101", stop)
        old, new = timeline(history.decisions(), history.migrations())
    assert old["stop"] is None and old["reason"] == "because"
    assert new["stop"] == stop and new["reason"] == "because"


def test_a_rotated_log_is_written_anew_and_reopen_follows_the_configuration(
    tmp_path: Path,
) -> None:
    path = tmp_path / "decisions.jsonl"
    with History(":memory:") as history, DecisionLog(str(path)) as log:
        history.listen(log.record)
        decide(history, 1.0)
        path.rename(tmp_path / "decisions.jsonl.1")
        decide(history, 2.0)  # the path names another file now: opened again
        log.reopen(str(path))  # SIGHUP after the rotation: harmless
        decide(history, 3.0)
        other = tmp_path / "other.jsonl"
        log.reopen(str(other))
        decide(history, 4.0)
        # A reload naming a file that cannot be opened keeps the one open now.
        with pytest.raises(DecisionLogError, match="cannot open the decision log"):
            log.reopen(str(tmp_path / "missing" / "decisions.jsonl"))
        decide(history, 4.5)
        log.reopen(None)
        decide(history, 5.0)
    assert [o["at"] for o in lines(tmp_path / "decisions.jsonl.1")] == [1.0]
    assert [o["at"] for o in lines(path)] == [2.0, 3.0]
    assert [o["at"] for o in lines(other)] == [4.0, 4.5]


def test_a_log_that_cannot_be_written_warns_once_and_never_stops_the_writer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "decisions.jsonl"
    with History(":memory:") as history, DecisionLog(str(path)) as log:
        history.listen(log.record)
        path.unlink()
        path.mkdir()  # the path cannot be opened as a file any more
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            decide(history, 1.0)
            decide(history, 2.0)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            f"{path}: cannot open the decision log: Is a directory; "
            "the history still records everything"
        ]
        path.rmdir()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            decide(history, 3.0)
        assert "writing the decision log again" in caplog.text
        assert len(history.decisions()) == 3
    assert [o["at"] for o in lines(path)] == [3.0]


def test_the_log_is_appended_to_and_never_opened_through_a_link(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    path.write_text('{"kind":"old"}\n')
    with History(":memory:") as history, DecisionLog(str(path)) as log:
        history.listen(log.record)
        decide(history, 1.0)
    assert [o["kind"] for o in lines(path)] == ["old", "decision"]
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    with pytest.raises(DecisionLogError, match="symbolic link: refused"):
        DecisionLog(str(link))
    with pytest.raises(DecisionLogError, match="cannot open the decision log"):
        DecisionLog(str(tmp_path / "missing" / "decisions.jsonl"))


# -- what status reads ------------------------------------------------------------------------


def test_holds_come_with_their_reasons_and_latest_is_the_last_time_recorded() -> None:
    with History(":memory:") as history:
        assert history.latest() is None
        history.set_cooldown("101", 500.0, "moved")
        history.set_cooldown("102", 50.0, "moved")
        history.avoid("103", "b", 700.0, "failed: it broke")
        decision = decide(history, 10.0, "101")
        migrate(history, decision, "101", 20.0, "done")
        assert history.latest() == 25.0
        [cooldown] = history.cooldown_entries(100.0)
        assert (cooldown.guest, cooldown.until, cooldown.reason) == ("101", 500.0, "moved")
        assert history.cooldowns(100.0) == {"101": 500.0}
        [avoid] = history.avoid_entries(100.0)
        assert (avoid.guest, avoid.node, avoid.until, avoid.reason) == (
            "103",
            "b",
            700.0,
            "failed: it broke",
        )
        assert history.avoided(700.0) == {}


def test_the_lock_probe_tells_who_holds_it_and_keeps_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "history.sqlite.lock")
    assert InstanceLock(path).probe() == (False, None)
    assert not os.path.exists(path)  # never created by a probe
    with InstanceLock(path):
        assert InstanceLock(path).probe() == (True, os.getpid())
    assert InstanceLock(path).probe() == (False, None)
    with InstanceLock(path):  # the probe did not keep it
        pass
    link = tmp_path / "link.lock"
    link.symlink_to(path)
    with pytest.raises(LockError, match="cannot open the lock file"):
        InstanceLock(str(link)).probe()


def test_a_daemon_starting_during_a_probe_still_gets_its_lock(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite.lock"
    path.write_text("")
    probe = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe, caught in its instant
        timer = threading.Timer(0.02, fcntl.flock, (probe, fcntl.LOCK_UN))
        timer.start()
        lock = InstanceLock(str(path))
        lock.acquire()
        timer.join()
        lock.release()
        # A shared lock that stays (no probe keeps one) is another instance.
        fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        with pytest.raises(LockError, match="another opendrs instance"):
            InstanceLock(str(path)).acquire()
    finally:
        os.close(probe)
