"""The dashboard's snapshots, fed by a controller on the scripted backend, and its pages."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import time
from dataclasses import replace

import pytest

from daemon import fetch
from fakes import FakeBackend, FakeClock, cluster, guest, node
from opendrs.backends.paced import PacedClock
from opendrs.cli.simulate import simulated_config
from opendrs.controller.config import BackendConfig, Config, HttpConfig
from opendrs.controller.dashboard import CONTENT_SECURITY_POLICY, Dashboard, simulated_time
from opendrs.controller.history import History
from opendrs.controller.http_server import start_server
from opendrs.controller.loop import Controller, Cycle
from opendrs.controller.metrics import DaemonMetrics
from opendrs.engine.policy import PolicyConfig
from opendrs.engine.policy.windows import Schedule, parse_weekly
from opendrs.engine.strategies.base import STOP_CODES


def _config(mode: str = "active") -> Config:
    policy = PolicyConfig(interval=60, hold=1, smoothing=0, min_uptime=0)
    config = simulated_config(policy, "<test>", BackendConfig("file", path="x"))
    return replace(config, mode=mode)  # type: ignore[arg-type]


def _watched(mode: str = "active", *, arches: tuple[str, ...] = ("x86_64",)):
    """Six guests packed on node a of three (per architecture), a controller and its
    dashboard."""
    nodes, guests = [], []
    for arch in arches:
        names = [f"{arch}-{n}" for n in "abc"]
        nodes += [replace(node(name), arch=arch) for name in names]
        guests += [guest(f"{arch}-g{i}", names[0]) for i in range(6)]
    clock = FakeClock()
    fake = FakeBackend(cluster(nodes, guests, max_parallel=2), clock, duration=30)
    config = _config(mode)
    dashboard = Dashboard(config)
    controller = Controller(
        config,
        fake,
        clock,
        History(":memory:"),
        on_event=dashboard.event,
        on_cycle=dashboard.cycle,
    )
    dashboard.follow(controller)
    return controller, dashboard, fake


def test_a_cycle_publishes_loads_decisions_and_the_migrations_in_flight() -> None:
    controller, dashboard, _ = _watched()
    assert dashboard.snapshot().data["groups"] == []
    assert "waiting for the first observation" in dashboard.page()
    controller.cycle()
    data = dashboard.snapshot().data
    (group,) = data["groups"]
    assert group["arch"] is None
    assert [n["name"] for n in group["nodes"]] == ["x86_64-a", "x86_64-b", "x86_64-c"]
    assert group["nodes"][0]["guests"] == 6 and group["nodes"][0]["load"]["memory"] > 0.5
    assert group["spread"]["memory"] > 0.5
    (decision,) = data["decisions"]
    assert decision["code"] == "plan" and decision["act"] and decision["mode"] == "active"
    assert decision["moves"] and all(m["reason"] for m in decision["moves"])
    assert data["now"]["reason"] == decision["reason"]
    # The page says what the history recorded: the words, and the strategy's stop as its code.
    (recorded,) = controller.history.decisions()
    assert decision["reason"] == recorded.reason and decision["stop"] is not None
    assert decision["stop"] == recorded.summary["stop"] and decision["stop"]["code"] in STOP_CODES
    flying = {(m["guest"], m["source"], m["target"]) for m in data["in_flight"]}
    assert len(flying) == 2  # max_parallel
    assert all(m["since"] is not None for m in data["in_flight"])
    assert data["queued"] == len(decision["moves"]) - 2
    assert data["would"] is None  # active mode: it does it
    assert data["observation"]["ok"] and data["cluster"] == {
        "name": "cluster",
        "guests": 6,
        "platform_balancer": None,
    }


def test_migrations_that_end_are_listed_newest_first_and_leave_the_flight() -> None:
    controller, dashboard, _ = _watched()
    controller.run(until=600)
    data = dashboard.snapshot().data
    assert data["in_flight"] == [] and data["queued"] == 0
    ended = data["ended"]
    assert ended and all(m["outcome"] == "done" for m in ended)
    assert [m["at"] for m in ended] == sorted((m["at"] for m in ended), reverse=True)
    points = data["chart"]["points"]
    assert len(points) >= 2 and points[0][1] > points[-1][1]  # it balanced


def test_a_published_snapshot_never_changes() -> None:
    controller, dashboard, _ = _watched()
    controller.cycle()
    first = dashboard.snapshot()
    kept = copy.deepcopy(first.data)
    controller.run(until=600)
    assert dashboard.snapshot().version > first.version
    assert first.data == kept


def test_shadow_mode_shows_what_it_would_do() -> None:
    controller, dashboard, fake = _watched("shadow")
    controller.cycle()
    data = dashboard.snapshot().data
    assert fake.starts == [] and data["in_flight"] == []
    would = data["would"]
    assert would is not None and would["code"] == "plan" and would["moves"]
    page = dashboard.page()
    assert "Shadow mode: what it would do" in page
    assert would["moves"][0]["guest"] in page


def test_the_windows_show_whether_each_activity_may_start_migrations_now() -> None:
    controller, dashboard, _ = _watched()
    controller.cycle()
    assert dashboard.snapshot().data["windows"] is None and 'id="windows"' not in dashboard.page()
    saturday = Schedule((parse_weekly("Sat 10:00-11:00"),), timezone="UTC")
    controller.config = replace(
        controller.config, policy=replace(controller.config.policy, schedule=saturday)
    )
    controller.cycle()
    windows = dashboard.snapshot().data["windows"]
    assert windows is not None and not windows["now"]["balance"]["open"]
    page = dashboard.page()
    assert "windows: balance may start migrations only within Sat 10:00-11:00" in page
    assert "balance: closed now (outside the migration window Sat 10:00-11:00 UTC); next opens" in (
        page
    )


def test_nodes_are_grouped_by_architecture_where_there_are_several() -> None:
    controller, dashboard, _ = _watched(arches=("aarch64", "x86_64"))
    controller.cycle()
    groups = dashboard.snapshot().data["groups"]
    assert [g["arch"] for g in groups] == ["aarch64", "x86_64"]
    for g in groups:
        assert {n["arch"] for n in g["nodes"]} == {g["arch"]} and len(g["nodes"]) == 3
    assert "<h3>aarch64</h3>" in dashboard.page()


def test_a_failed_observation_is_shown_and_the_rest_kept() -> None:
    controller, dashboard, _ = _watched()
    controller.cycle()
    dashboard.cycle(Cycle(120.0, None, None, error="connection refused"))
    data = dashboard.snapshot().data
    assert data["observation"] == {
        "ok": False,
        "error": "connection refused",
        "at": 120.0,
        "time": "1970-01-01 00:02:00Z",
    }
    assert len(data["groups"][0]["nodes"]) == 3
    assert "cannot observe the cluster: connection refused" in dashboard.panel()


def test_pages_json_and_the_script_allowed_by_its_hash() -> None:
    controller, dashboard, _ = _watched()
    controller.run(until=600)
    page = dashboard.page()
    panel = dashboard.panel()
    assert page.startswith("<!doctype html>") and panel.startswith('<div id="panel"')
    assert panel in page
    assert "<svg" in panel and "threshold" in panel  # the chart
    assert json.loads(dashboard.state_json())["version"] == dashboard.snapshot().version
    (script,) = re.findall(r"<script>(.*?)</script>", page, re.S)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in CONTENT_SECURITY_POLICY
    # Nothing loaded from elsewhere: no script or style file, no image but inline data.
    assert re.findall(r'\s(?:src|href)="(?!data:|#)[^"]*"', page) == []


def test_names_are_escaped() -> None:
    dashboard = Dashboard(_config())
    clock = FakeClock()
    odd = cluster([node("<b>a</b>"), node("b")], [guest("<script>x</script>", "<b>a</b>")])
    controller = Controller(
        _config(), FakeBackend(odd, clock), clock, History(":memory:"), on_cycle=dashboard.cycle
    )
    dashboard.follow(controller)
    controller.cycle()
    page = dashboard.page()
    assert "&lt;b&gt;a&lt;/b&gt;" in page and "<b>a</b>" not in page
    assert "<script>x" not in page


def test_the_server_answers_from_the_snapshot_and_204_when_nothing_is_newer() -> None:
    controller, dashboard, _ = _watched()
    controller.cycle()
    server = start_server(HttpConfig("127.0.0.1", 0), DaemonMetrics(), dashboard)
    try:
        version = dashboard.snapshot().version
        assert fetch(server.address, f"/api/panel?after={version}") == (204, "")
        assert fetch(server.address, f"/api/panel?after={version - 1}") == (200, dashboard.panel())
        assert fetch(server.address, "/api/panel") == (200, dashboard.panel())
        assert fetch(server.address, "/") == (200, dashboard.page())
        assert json.loads(fetch(server.address, "/api/state")[1]) == dashboard.snapshot().data
        status, text = fetch(server.address, "/nothing")
        assert status == 404 and "/api/state" in text
    finally:
        server.stop()


def test_a_page_that_cannot_be_drawn_is_a_500_and_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dashboard = Dashboard(_config())

    def broken() -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr(dashboard, "page", broken)
    server = start_server(HttpConfig("127.0.0.1", 0), DaemonMetrics(), dashboard)
    try:
        status, text = fetch(server.address, "/")
        assert status == 500 and text == "cannot draw the page: see the log\n"
        assert fetch(server.address, "/api/state")[0] == 200  # the server goes on
    finally:
        server.stop()
    assert any("cannot answer /" in r.getMessage() and r.exc_info for r in caplog.records)


@pytest.mark.parametrize(
    ("at", "shown"), [(0.0, "sim 00:00:00"), (3725.9, "sim 01:02:05"), (90061.0, "sim 1d 01:01:01")]
)
def test_simulated_time(at: float, shown: str) -> None:
    assert simulated_time(at) == shown


def test_a_paced_clock_takes_wall_time_and_stops_when_asked() -> None:
    clock = FakeClock()
    paced = PacedClock(clock, speed=100.0)
    began = time.monotonic()
    paced.sleep(20.0)
    assert clock.now() == pytest.approx(20.0) and time.monotonic() - began >= 0.19
    stopping = PacedClock(clock, speed=1.0, should_stop=lambda: True)
    began = time.monotonic()
    stopping.sleep(3600.0)
    assert clock.now() == pytest.approx(20.0) and time.monotonic() - began < 0.5
    with pytest.raises(ValueError):
        PacedClock(clock, speed=0.0)
