"""Why not, every time, from the daemon (issue 12, part 5): ``opendrs run --once`` logs a decision
that moves nothing at INFO, naming the filter that stopped it with counts, and the history keeps
the same sentence; a repair with no solution is one WARNING per stuck guest; a decision that does
not change is not logged again within the hour."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from daemon import run_once
from fakes import FakeBackend, FakeClock, cluster, guest, node
from opendrs.controller.config import BackendConfig, Config
from opendrs.controller.history import History
from opendrs.controller.loop import RECORD_EVERY, Controller
from opendrs.engine.policy import PolicyConfig
from repairs import write_config

#: 16 guests on one of three nodes, each up for less than the default min_uptime (10 min).
YOUNG = (
    "version: 1\n"
    "name: young\n"
    "settings: {mode: static}\n"
    "nodes:\n"
    "  a: {cpu: 16, memory: 64GiB}\n"
    "  b: {cpu: 16, memory: 64GiB}\n"
    "  c: {cpu: 16, memory: 64GiB}\n"
    "guests:\n"
    + "".join(
        f"  - {{id: {100 + i}, node: a, cpu: 1, memory: 2GiB, uptime: {30 * (i + 1)}s}}\n"
        for i in range(16)
    )
)
WHY = (
    "strategy balance proposes no migration; "
    "16 candidates, all excluded: 16 up for less than min_uptime 10m"
)


def _decisions(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " decision (shadow): " in line]


def test_run_once_names_min_uptime_at_info_and_the_history_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "young.yaml").write_text(YOUNG, encoding="utf-8")
    config = tmp_path / "run.yaml"
    config.write_text(
        "version: 1\nbackend: {type: file, path: young.yaml}\nhistory: young-history.sqlite\n",
        encoding="utf-8",
    )
    done = run_once(config)
    assert done.returncode == 0, done.stderr
    [line] = _decisions(done.stderr)
    assert " INFO    decision (shadow): " in line and line.endswith(WHY), done.stderr
    assert "pays for itself" not in done.stderr
    reason = line.split(" decision (shadow): ", 1)[1]
    with History(tmp_path / "young-history.sqlite", readonly=True) as history:
        [row] = history.decisions()
    assert row.action == "none" and row.reason == reason


def test_a_repair_without_solution_warns_once_per_guest_and_says_why_at_info(
    tmp_path: Path,
) -> None:
    done = run_once(write_config(tmp_path, "hopeless"))
    assert done.returncode == 0, done.stderr
    stuck = [line for line in done.stderr.splitlines() if "repair stuck: " in line]
    assert len(stuck) == 1 and " WARNING repair stuck: 1 is on m, in maintenance" in stuck[0]
    [line] = _decisions(done.stderr)
    assert " INFO    decision (shadow): " in line
    assert "repair needed (1 is on m, in maintenance) but no allowed migration reaches it" in line


def _young_config() -> Config:
    policy = PolicyConfig(interval=60, hold=1, smoothing=0, min_uptime=600)
    return Config(
        file="<test>",
        backend=BackendConfig("file", path="x"),
        history=":memory:",
        lock="",
        mode="shadow",
        policy=policy,
    )


def test_the_same_why_not_is_logged_and_recorded_once_an_hour(
    caplog: pytest.LogCaptureFixture,
) -> None:
    young = [replace(guest(f"g{i}", "a"), uptime=60) for i in range(6)]
    clock = FakeClock()
    fake = FakeBackend(cluster([node("a"), node("b"), node("c")], young), clock)
    history = History(":memory:")
    controller = Controller(_young_config(), fake, clock, history)
    with caplog.at_level(logging.INFO, logger="opendrs.controller.loop"):
        controller.run(until=RECORD_EVERY + 30)  # a cycle a minute: 61 decisions
    assert len(controller.cycles) == 61
    said = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and r.getMessage().startswith("decision (shadow): ")
    ]
    assert len(said) == 2 and said[0] == said[1]
    assert said[0].endswith("6 candidates, all excluded: 6 up for less than min_uptime 10m")
    assert [d.reason for d in history.decisions()] == [s.split(": ", 1)[1] for s in said]
