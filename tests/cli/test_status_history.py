"""``opendrs status`` and ``opendrs history`` as an operator runs them: subprocesses against a
configuration with the simulator backend, beside a daemon that runs (and writes its decision log)
or has run. Every daemon a test starts is stopped by it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon import Daemon, opendrs, write_sim_config
from opendrs.cli.history_command import parse_since


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def rows(history: Path, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{history}?mode=ro", uri=True) as db:
        return db.execute(query).fetchall()


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A configuration whose daemon ran half a simulated day to its end."""
    directory = tmp_path_factory.mktemp("ran")
    config = write_sim_config(directory, days=0.5)
    done = opendrs("run", "--config", str(config))
    assert done.returncode == 0, done.stderr
    return config


# -- the decision log and history --format jsonl -------------------------------------------


def test_the_decision_log_is_what_history_jsonl_prints_and_what_the_history_holds(
    ran: Path,
) -> None:
    directory = ran.parent
    log = (directory / "decisions.jsonl").read_text()
    shown = opendrs("history", "--config", str(ran), "--format", "jsonl")
    assert shown.returncode == 0 and shown.stderr == ""
    assert shown.stdout == log
    items = jsonl(log)
    history = directory / "history.sqlite"
    decisions = rows(history, "SELECT id, at, action, reason FROM decisions ORDER BY id")
    logged = [
        (o["id"], o["at"], o["action"], o["reason"]) for o in items if o["kind"] == "decision"
    ]
    assert logged == decisions and len(decisions) > 10
    migrations = rows(
        history, "SELECT id, guest, source, target, outcome, error, ended FROM migrations"
    )
    ends = {o["id"]: o for o in items if o["kind"] == "migration" and o["event"] != "started"}
    assert len(ends) == len(migrations) > 5
    for mid, guest, source, target, outcome, error, ended in migrations:
        end = ends[mid]
        assert (end["guest"], end["source"], end["target"]) == (guest, source, target)
        assert (end["event"], end["outcome"], end["error"], end["at"]) == (
            outcome,
            outcome,
            error,
            ended,
        )
    assert {o["event"] for o in ends.values()} >= {"done"}
    assert all(set(o) >= {"kind", "at", "time", "id"} for o in items)


def test_history_filters_by_guest_node_and_time(ran: Path) -> None:
    everything = json.loads(opendrs("history", "--config", str(ran), "--format", "json").stdout)
    guest = everything["migrations"][0]["guest"]
    mine = json.loads(
        opendrs("history", "--config", str(ran), "--guest", guest, "--format", "json").stdout
    )
    assert mine["migrations"] and all(m["guest"] == guest for m in mine["migrations"])
    assert mine["decisions"] and all(
        any(move["guest"] == guest for move in d["moves"]) for d in mine["decisions"]
    )
    node = everything["migrations"][0]["target"]
    touching = json.loads(
        opendrs("history", "--config", str(ran), "--node", node, "--format", "json").stdout
    )
    assert touching["migrations"] and all(
        node in (m["source"], m["target"]) for m in touching["migrations"]
    )
    assert len(touching["migrations"]) < len(everything["migrations"])
    recent = json.loads(
        opendrs("history", "--config", str(ran), "--since", "2h", "--format", "json").stdout
    )
    # The simulator's "now" is the latest time in its history.
    assert recent["since"] == everything["now"] - 7200
    assert recent["decisions"] and all(d["at"] >= recent["since"] for d in recent["decisions"])
    assert len(recent["decisions"]) < len(everything["decisions"])
    absolute = opendrs(
        "history", "--config", str(ran), "--since", "1970-01-01T06:00", "--format", "jsonl"
    )
    assert absolute.returncode == 0
    assert min(o["at"] for o in jsonl(absolute.stdout)) >= 6 * 3600


def test_history_as_text(ran: Path) -> None:
    shown = opendrs("history", "--config", str(ran), "--since", "3h")
    assert shown.returncode == 0 and shown.stderr == ""
    assert "Decisions (" in shown.stdout and "Migrations (" in shown.stdout
    assert "decisions (" in shown.stdout.splitlines()[-1]


@pytest.fixture
def unwritable(ran: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of ``ran``'s configuration and history in a directory that :func:`read_only` makes
    read-only (as for a user of the daemon's group, or a copy kept on a read-only mount): the
    configuration in it."""
    shutil.copy(ran, tmp_path / "opendrs.yaml")
    # As a daemon that stopped leaves it: in write-ahead-log mode, no log beside it.
    with (
        contextlib.closing(sqlite3.connect(ran.parent / "history.sqlite")) as source,
        contextlib.closing(sqlite3.connect(tmp_path / "history.sqlite")) as copy,
    ):
        source.backup(copy)
        assert copy.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert not (tmp_path / "history.sqlite-wal").exists()
    if os.geteuid() != 0:
        tmp_path.chmod(0o555)
    try:
        yield tmp_path / "opendrs.yaml"
    finally:
        tmp_path.chmod(0o755)


def read_only(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``opendrs ARGS`` unable to write in ``directory``: mode 555 for a user; as root (whom no
    mode stops), the directory mounted read-only over itself in a mount namespace of its own."""
    command = [sys.executable, "-m", "opendrs", *args]
    if os.geteuid() == 0:
        remount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
        command = ["unshare", "--mount", "sh", "-c", remount, str(directory), *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if os.geteuid() == 0 and "mount" in done.stderr and "opendrs" not in done.stderr:
        pytest.skip(f"cannot mount read-only here: {done.stderr.strip()}")
    return done


@pytest.mark.parametrize(
    "command",
    [
        ("history", "--since", "3h", "--format", "json"),
        ("status", "--format", "json"),
        ("report", "-o", "-", "--format", "md"),
    ],
)
def test_the_history_is_read_where_the_reader_cannot_write(
    unwritable: Path, command: tuple[str, ...]
) -> None:
    """SQLite's write-ahead log needs a file beside the history that a reader cannot make there:
    the history is read all the same, as the daemon left it."""
    shown = read_only(unwritable.parent, command[0], "--config", str(unwritable), *command[1:])
    assert shown.returncode == 0, shown.stderr
    assert "cannot open history" not in shown.stdout + shown.stderr
    if command[0] == "history":
        assert json.loads(shown.stdout)["decisions"]
    elif command[0] == "status":
        assert json.loads(shown.stdout)["history"]["last_decision"] is not None
    assert sorted(p.name for p in unwritable.parent.iterdir()) == ["history.sqlite", "opendrs.yaml"]


# -- status ------------------------------------------------------------------------------------


def test_status_shows_the_cluster_the_last_decision_and_the_holds(ran: Path) -> None:
    shown = opendrs("status", "--config", str(ran), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["observation"] == {"ok": True, "error": None}
    nodes = status["cluster"]["nodes"]
    assert [n["name"] for n in nodes] == [f"pve{i}" for i in range(1, 9)]
    assert all(0 <= n["load"]["cpu"] <= 1 and 0 <= n["load"]["memory"] <= 1 for n in nodes)
    assert set(status["cluster"]["spread"]) == {"all"}
    assert status["policy"] == {
        "mode": "active",
        "name": "opendrs",
        "strategy": "balance",
        "metric": "spread",
        "threshold": 0.15,
        "target": 0.08,
        "interval": 300,
    }
    assert status["daemon"]["running"] is False and status["daemon"]["pid"] is None
    history = status["history"]
    database = ran.parent / "history.sqlite"
    [(last,)] = rows(database, "SELECT max(id) FROM decisions")
    assert history["last_decision"]["id"] == last and history["last_decision"]["code"]
    now = history["now"]
    cooling = rows(database, f"SELECT guest, until FROM cooldowns WHERE until > {now} ORDER BY 1")
    assert [(c["guest"], c["until"]) for c in history["cooldowns"]] == cooling
    avoided = rows(database, f"SELECT guest, node FROM avoid WHERE until > {now} ORDER BY 1, 2")
    assert [(a["guest"], a["node"]) for a in history["avoid"]] == avoided
    assert history["in_flight"] == []  # the run ended with every migration settled
    text = opendrs("status", "--config", str(ran))
    assert text.returncode == 0
    assert "not running: nothing holds" in text.stdout and "last decision" in text.stdout
    assert (
        "policy opendrs, active mode in the file: every 5m, acts when the spread is above 15 pp "
        "(strategy balance, target 8 pp)" in text.stdout
    )


def test_status_without_an_observation_still_shows_the_history(ran: Path, tmp_path: Path) -> None:
    config = tmp_path / "opendrs.yaml"
    config.write_text(
        f"backend: {{type: file, path: missing.yaml}}\nhistory: {ran.parent / 'history.sqlite'}\n"
    )
    shown = opendrs("status", "--config", str(config), "--format", "json")
    assert shown.returncode == 1
    [line] = shown.stderr.splitlines()
    assert line.startswith("error: cannot observe the cluster: ") and "missing.yaml" in line
    status = json.loads(shown.stdout)
    assert status["cluster"] is None and status["observation"]["ok"] is False
    assert status["history"]["last_decision"] is not None
    text = opendrs("status", "--config", str(config))
    assert text.returncode == 1 and "last decision" in text.stdout


def test_status_and_history_before_the_daemon_ever_ran(tmp_path: Path) -> None:
    config = write_sim_config(tmp_path, days=0.1)
    shown = opendrs("status", "--config", str(config), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["history"]["exists"] is False
    history = opendrs("history", "--config", str(config))
    assert history.returncode == 2  # as approve and report: no history file is bad input
    [line] = history.stderr.splitlines()
    assert line.startswith(f"error: {config}: history: ")
    assert "does not exist (has the daemon run with this configuration?" in line
    assert "--config FILE" in line
    assert not (tmp_path / "history.sqlite").exists()  # read-only: never created


def test_since_is_bounded_at_100_years_as_every_duration(tmp_path: Path) -> None:
    """Checked before the history is looked for: the option's error, not the missing file's."""
    config = write_sim_config(tmp_path, days=0.1)
    done = opendrs("history", "--config", str(config), "--since", "9999999999999d")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line == (
        "error: --since: must be at most 36500d (100 years) back, got '9999999999999d'; an ISO "
        "8601 time (2026-11-26T10:00Z) for an exact start"
    )
    assert parse_since("36500d").seconds == 36500 * 86400


def test_status_node_table_fits_the_width_it_gets(tmp_path: Path) -> None:
    """A row per node, its bars as wide as the terminal lets them be: at 80 columns, on a terminal
    (rich's table) or not, each node's row fits; wider, the bars are longer."""
    config = write_sim_config(tmp_path, days=0.1)
    widths = {}
    for columns in (80, 120):
        for terminal in ("", "1"):
            env = {**os.environ, "COLUMNS": str(columns), "FORCE_COLOR": terminal}
            shown = opendrs("status", "--config", str(config), env=env)
            assert shown.returncode == 0, shown.stderr
            plain = re.sub(r"\x1b\[[0-9;]*m", "", shown.stdout).splitlines()
            nodes = [line for line in plain if re.match(r"pve\d ", line)]
            assert len(nodes) == 8 and all(line.rstrip().endswith("%") for line in nodes)
            assert max(len(line) for line in nodes) <= columns, (columns, terminal, nodes)
            first_bar = re.search(r"[#.]{5,}", nodes[0])
            assert first_bar is not None
            widths[columns, terminal] = len(first_bar.group())
    assert widths[80, ""] < widths[120, ""]


@pytest.mark.parametrize(
    "args",
    [
        ("history", "--since", "yesterday"),
        ("history", "--since", "2026-13-01"),
        ("history", "--since", "-1d"),
        ("history", "--guest", " 101"),
        ("history", "--format", "xml"),
        ("status", "--format", "jsonl"),
        ("status", "--verbose"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(ran: Path, args: tuple[str, ...]) -> None:
    command, *rest = args
    done = opendrs(command, "--config", str(ran), *rest)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ")


@pytest.mark.parametrize("command", ["status", "history", "run"])
def test_a_bad_configuration_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    config = write_sim_config(tmp_path, days=0.1, extra="")
    config.write_text(config.read_text().replace("decisions.jsonl", "history.sqlite"))
    done = opendrs(command, "--config", str(config))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "log.decisions" in line and "history or its lock file" in line
    missing = opendrs(command, "--config", str(tmp_path / "nothing.yaml"))
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1


def test_a_decision_log_that_cannot_be_opened_stops_run_with_one_line(tmp_path: Path) -> None:
    config = write_sim_config(tmp_path, days=0.1)
    config.write_text(config.read_text().replace("decisions.jsonl", "nowhere/decisions.jsonl"))
    done = opendrs("run", "--config", str(config))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "cannot open the decision log" in line


# -- beside a running daemon -------------------------------------------------------------------


def test_status_and_history_read_while_the_daemon_writes(tmp_path: Path) -> None:
    config = write_sim_config(tmp_path, days=60)  # runs far longer than the test
    log = tmp_path / "decisions.jsonl"
    with Daemon(config) as daemon:
        daemon.wait_for(r"decision \(active\)", timeout=60)
        seen = []
        for _ in range(3):
            shown = opendrs("history", "--config", str(config), "--format", "jsonl")
            assert shown.returncode == 0, shown.stderr
            seen.append(len(shown.stdout.splitlines()))
            status = opendrs("status", "--config", str(config), "--format", "json")
            assert status.returncode == 0, status.stderr
            daemon_part = json.loads(status.stdout)["daemon"]
            assert daemon_part["running"] is True
            assert daemon_part["pid"] == daemon.process.pid
            assert daemon.process.poll() is None  # never disturbed
        assert seen[0] > 0 and seen[-1] > seen[0]  # the daemon went on writing meanwhile
        text = opendrs("status", "--config", str(config))
        assert f"running (pid {daemon.process.pid})" in text.stdout
        # A rotation: the file renamed, SIGHUP, the lines go on in a new file.
        rotated = tmp_path / "decisions.jsonl.1"
        log.rename(rotated)
        mark = daemon.mark
        daemon.signal(signal.SIGHUP)
        daemon.wait_for("configuration reloaded", after=mark)
        deadline = time.monotonic() + 30
        while not (log.exists() and log.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert daemon.stop() == 0
    status = json.loads(opendrs("status", "--config", str(config), "--format", "json").stdout)
    assert status["daemon"]["running"] is False
    shown = opendrs("history", "--config", str(config), "--format", "jsonl")
    # Together the rotated file and the new one hold exactly what the history holds.
    written = jsonl(rotated.read_text()) + jsonl(log.read_text())
    assert written == jsonl(shown.stdout)
    assert os.path.getsize(log) > 0


def test_status_spreads_each_cpu_architecture_on_its_own(tmp_path: Path) -> None:
    (tmp_path / "live.yaml").write_text(
        "version: 1\n"
        "name: mixed\n"
        "settings: {mode: static}\n"
        "nodes:\n"
        "  x1: {cpu: 8, memory: 32GiB}\n"
        "  x2: {cpu: 8, memory: 32GiB}\n"
        "  a1: {cpu: 8, memory: 32GiB, arch: aarch64}\n"
        "  a2: {cpu: 8, memory: 32GiB, arch: aarch64}\n"
        "guests:\n"
        "  - {id: 101, node: x1, cpu: 4, memory: 8GiB}\n"
        "  - {id: 201, node: a1, cpu: 2, memory: 16GiB, arch: aarch64}\n"
    )
    config = tmp_path / "opendrs.yaml"
    config.write_text("backend: {type: file, path: live.yaml}\n")
    shown = opendrs("status", "--config", str(config), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    cluster = json.loads(shown.stdout)["cluster"]
    assert cluster["name"] == "mixed"
    assert [(n["name"], n["arch"], n["guests"]) for n in cluster["nodes"]] == [
        ("x1", "x86_64", 1),
        ("x2", "x86_64", 0),
        ("a1", "aarch64", 1),
        ("a2", "aarch64", 0),
    ]
    assert cluster["spread"] == {
        "aarch64": {"cpu": 0.25, "memory": 0.5},
        "x86_64": {"cpu": 0.5, "memory": 0.25},
    }
    text = opendrs("status", "--config", str(config))
    assert "spread of the x86_64 nodes: cpu 50.0 pp, memory 25.0 pp" in text.stdout
    assert "spread of the aarch64 nodes: cpu 25.0 pp, memory 50.0 pp" in text.stdout
