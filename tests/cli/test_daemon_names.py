"""Guests by name after a daemon ran, through the commands as processes: the daemon's log, the
history it recorded (names beside the ids of its plans), ``history`` (``--guest`` by name or id),
``status`` and the history report say ``name (id)``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from daemon import opendrs, write_sim_config

#: A guest of the built-in demo as the operator reads it: ``web-013 (112)``.
LABEL = re.compile(r"\b[a-z]+-\d{3} \(\d+\)")


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A configuration whose daemon ran a quarter of a simulated day, and its log."""
    config = write_sim_config(tmp_path_factory.mktemp("names"), days=0.25)
    done = opendrs("run", "--config", str(config))
    assert done.returncode == 0, done.stderr
    return config, done.stderr


def test_the_daemon_logs_guests_by_name(ran: tuple[Path, str]) -> None:
    _config, log = ran
    started = [line for line in log.splitlines() if " INFO    started " in line]
    assert started and all(LABEL.search(line) for line in started)


def test_the_history_records_names_and_history_shows_them(ran: tuple[Path, str]) -> None:
    config, _log = ran
    data = json.loads(opendrs("history", "--config", str(config), "--format", "json").stdout)
    planned = [m for d in data["decisions"] for m in d["moves"]]
    assert planned and all(m["name"] and m["guest"].isdigit() for m in planned)
    first = data["migrations"][0]
    name = next(m["name"] for m in planned if m["guest"] == first["guest"])
    text = opendrs("history", "--config", str(config)).stdout
    assert f"{name} ({first['guest']})" in text
    by_name = opendrs("history", "--config", str(config), "--guest", name, "--format", "json")
    by_id = opendrs(
        "history", "--config", str(config), "--guest", first["guest"], "--format", "json"
    )
    assert by_name.returncode == 0 and by_name.stdout == by_id.stdout
    assert {m["guest"] for m in json.loads(by_name.stdout)["migrations"]} == {first["guest"]}


def test_status_and_the_report_name_the_guests(ran: tuple[Path, str]) -> None:
    config, _log = ran
    status = opendrs("status", "--config", str(config))
    cooldowns = status.stdout.split("In cooldown", 1)[1].splitlines()[2:5]
    assert cooldowns and all(LABEL.match(line) for line in cooldowns)
    report = opendrs("report", "--config", str(config), "--format", "md").stdout
    movers = report.split("## The guests that moved most", 1)[1]
    assert LABEL.search(movers)
