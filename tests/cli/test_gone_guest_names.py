"""A guest the cluster no longer has (deleted, or a migration of an earlier cycle) is named
``name (id)`` by ``history``, ``status`` and the report, from the name the daemon recorded
when it started the migration; the id alone where no name was ever recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon import opendrs, write_sim_config
from opendrs.controller.history import History
from opendrs.model.cluster import Move


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in demo's configuration, its history holding migrations of guests that are
    not in the demo: 9001 in flight (``old-db``), 9002 done (``gone-web``), 9003 done without a
    name."""
    written = write_sim_config(tmp_path_factory.mktemp("gone"), days=0.25)
    with History(written.parent / "history.sqlite") as history:
        for guest, name, at in (("9002", "gone-web", 10.0), ("9003", None, 20.0)):
            started = history.migration_started(
                decision=None, move=Move(guest, "pve1", "pve2"), handle="t", at=at, name=name
            )
            history.migration_finished(started, outcome="done", at=at + 30.0)
        history.migration_started(
            decision=None, move=Move("9001", "pve2", "pve3"), handle="u", at=100.0, name="old-db"
        )
    return written


def test_history_names_the_gone_guests_by_their_recorded_names(config: Path) -> None:
    shown = opendrs("history", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert "gone-web (9002)" in shown.stdout and "old-db (9001)" in shown.stdout
    assert " 9003 " in shown.stdout and "(9003)" not in shown.stdout
    data = json.loads(opendrs("history", "--config", str(config), "--format", "json").stdout)
    names = {m["guest"]: m["name"] for m in data["migrations"]}
    assert names == {"9001": "old-db", "9002": "gone-web", "9003": None}
    by_name = opendrs("history", "--config", str(config), "--guest", "gone-web", "--format", "json")
    assert [m["guest"] for m in json.loads(by_name.stdout)["migrations"]] == ["9002"]


def test_status_names_a_gone_guest_in_flight(config: Path) -> None:
    shown = opendrs("status", "--config", str(config))
    assert "old-db (9001)" in shown.stdout, shown.stdout + shown.stderr


def test_the_report_names_the_gone_movers(config: Path) -> None:
    report = opendrs("report", "--config", str(config), "--format", "md")
    assert report.returncode == 0, report.stderr
    movers = report.stdout.split("## The guests that moved most", 1)[1]
    assert "gone-web (9002)" in movers and "old-db (9001)" in movers
