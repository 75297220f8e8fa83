"""Migration windows and blackouts through ``opendrs run`` (a subprocess, active mode) against the
fake Proxmox API on loopback, on the wall clock: each window is put relative to now in a time
zone half an hour off UTC (Asia/Kolkata), so a window read in another zone would be closed when it
is open, and say another opening. Eight VMs on pve1 of three nodes: balancing wants to move."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from tests.cli.test_metrics import samples
from tests.controller.test_manual_daemon import history, migrations

from backends.fakepve_fixture import FakeCluster, proxmox_config, running_on_pve1, three_nodes
from daemon import Daemon, eventually, opendrs, served

ZONE = "Asia/Kolkata"
DECIDED = r"decision \(active\)"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    with three_nodes(str(tmp_path)) as cluster:
        running_on_pve1(cluster.pve, range(100, 108))
        yield cluster


def _local(offset: timedelta) -> datetime:
    """Now plus ``offset``, on the clock of :data:`ZONE`, to the minute."""
    return (datetime.now(ZoneInfo(ZONE)) + offset).replace(second=0, microsecond=0)


def daily_window(start: timedelta, end: timedelta) -> str:
    """A daily window from now + ``start`` to now + ``end`` (local times of :data:`ZONE`)."""
    return f"daily {_local(start):%H:%M}-{_local(end):%H:%M}"


def _config(tmp_path: Path, fake: FakeCluster, windows: str) -> Path:
    config = proxmox_config(tmp_path, fake, mode="active", extra="http: {listen: '127.0.0.1:0'}\n")
    plain = "policy: {interval: 1s, hold: 1, smoothing: 0}"
    policy = f"{plain[:-1]}, timezone: {ZONE},\n         {windows}}}"
    config.write_text(config.read_text().replace(plain, policy))
    return config


def _decisions_start_nothing(daemon: Daemon, fake: FakeCluster, held: str, code: str) -> str:
    """The decision saying ``held`` (logged once, when it is new), three decisions of ``code``
    (counted in ``/metrics``), and no migration asked of the API."""
    line = daemon.wait_for(rf"{DECIDED}: .*{re.escape(held)}", timeout=20)
    address = served(daemon)
    eventually(
        lambda: samples(address).get(("opendrs_decisions_total", (("code", code),)), 0) >= 3,
        timeout=20,
        log=daemon.log,
    )
    assert daemon.count(r"started ") == 0
    assert fake.pve.migrations == []
    return line


def test_no_balancing_migration_starts_while_the_window_is_closed(
    tmp_path: Path, fake: FakeCluster
) -> None:
    window = daily_window(timedelta(hours=2), timedelta(hours=3))
    config = _config(tmp_path, fake, f"windows: ['{window}']")
    opens = _local(timedelta(hours=2))
    said = f"outside the migration window {window} {ZONE}"
    with Daemon(config) as daemon:
        held = f"{said}, no balancing migration starts; next opens"
        line = _decisions_start_nothing(daemon, fake, held, "outside-window")
        assert f"next opens {opens:%a %H:%M}" in line
        status = opendrs("status", "--config", str(config), timeout=60)
        assert f"  balance: closed now ({said}); next opens {opens:%a %H:%M}\n" in status.stdout
        shown = opendrs("status", "--config", str(config), "--format", "json", timeout=60)
        balance = json.loads(shown.stdout)["windows"]["now"]["balance"]
        assert balance["open"] is False and balance["opens"] == opens.timestamp()
        assert daemon.stop() == 0
    codes = {d["code"] for d in history(config)["decisions"]}
    assert codes == {"outside-window"}
    assert migrations(tmp_path) == []


def test_balancing_starts_within_the_window(tmp_path: Path, fake: FakeCluster) -> None:
    window = daily_window(timedelta(hours=-1), timedelta(hours=1))
    config = _config(tmp_path, fake, f"windows: ['{window}']")
    with Daemon(config) as daemon:
        daemon.wait_for(r"done \S+ \(10\d\) pve1 → pve\d", timeout=30)
        status = opendrs("status", "--config", str(config), timeout=60)
        assert "  balance: open now\n" in status.stdout
        assert daemon.stop() == 0
    assert migrations(tmp_path)
    assert "outside-window" not in {d["code"] for d in history(config)["decisions"]}


def test_a_blackout_holds_balancing_back_within_the_window(
    tmp_path: Path, fake: FakeCluster
) -> None:
    window = daily_window(timedelta(hours=-1), timedelta(hours=1))
    start, end = _local(timedelta(minutes=-30)), _local(timedelta(minutes=30))
    blackout = f"{start:%Y-%m-%d %H:%M}-{end:%Y-%m-%d %H:%M}"
    config = _config(tmp_path, fake, f"windows: ['{window}'], blackouts: ['{blackout}']")
    with Daemon(config) as daemon:
        held = f"in the blackout {blackout} {ZONE}, no balancing migration starts; next opens"
        line = _decisions_start_nothing(daemon, fake, held, "blackout")
        assert f"next opens {end:%a %H:%M}" in line
        status = opendrs("status", "--config", str(config), timeout=60)
        assert f"  balance: closed now (in the blackout {blackout}" in status.stdout
        assert daemon.stop() == 0
    assert {d["code"] for d in history(config)["decisions"]} == {"blackout"}
    assert migrations(tmp_path) == []
    assert time.time() < end.timestamp()  # the blackout lasted the whole test
