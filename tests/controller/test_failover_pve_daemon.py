"""The failover headroom through the daemon against the fake Proxmox API on loopback, its HA
guests read from ``/cluster/ha/resources``: ``opendrs headroom --config`` and ``opendrs status``
against the API, ``opendrs run`` (a subprocess, active mode, ``policy.keep_failover: 1``)
repairing toward the headroom with a real migration, ``/metrics`` saying it, and the balancing
plan that would lose it again refused; the repair waits for a closed migration window (``/metrics``
saying the headroom is short meanwhile); with the default hot guard, which forbids the only
helping move, the log says once which HA guest cannot restart and why no move gives it back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from tests.cli.test_metrics import samples, value
from tests.controller.test_failover_manual_daemon import short_of_failover
from tests.controller.test_manual_daemon import migrations
from tests.controller.test_windows_pve_daemon import ZONE, daily_window

from backends.fakepve_fixture import FakeCluster, proxmox_config
from daemon import Daemon, eventually, opendrs, served

REPAIRED = r"done .*scratch \(103\) pve3 → pve1"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    with short_of_failover(str(tmp_path)) as cluster:
        yield cluster


def _config(tmp_path: Path, fake: FakeCluster, more: str = "", hot: str = ", hot: null") -> Path:
    """Active mode, keep_failover 1, no hot guard (the repair fills pve1 to 97 % of its memory;
    ``hot``: "" keeps the default 85 %); ``more``: more policy keys."""
    config = proxmox_config(tmp_path, fake, mode="active", extra="http: {listen: '127.0.0.1:0'}\n")
    plain = "policy: {interval: 1s, hold: 1, smoothing: 0}"
    config.write_text(
        config.read_text().replace(plain, f"{plain[:-1]}{hot}, keep_failover: 1{more}}}")
    )
    return config


def test_the_daemon_repairs_toward_it_then_refuses_to_lose_it(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = _config(tmp_path, fake)
    before = opendrs("headroom", "--config", str(config), timeout=60)
    assert before.returncode == 1, before.stderr
    assert before.stdout.startswith(
        "fakecluster: failover headroom: no, 1 HA guest cannot restart when pve1 fails\n"
        "  if pve1 fails: 1 HA guest of 1 cannot restart: db (101)\n"
    )
    status = opendrs("status", "--config", str(config), timeout=60)
    assert "failover headroom: no, 1 HA guest cannot restart when pve1 fails" in status.stdout
    with Daemon(config) as daemon:
        address = served(daemon)
        daemon.wait_for(
            r"decision \(active\): repair: failover headroom: no, 1 HA guest cannot restart when "
            r"pve1 fails; 1 migration",
            timeout=30,
        )
        daemon.wait_for(REPAIRED, timeout=30)
        # Balancing would move scratch back off pve1 (the spread is far above the threshold).
        daemon.wait_for(r"would lose the failover headroom .*: refused \(keep_failover\)", 30)
        eventually(
            lambda: (
                samples(address).get(("opendrs_decisions_total", (("code", "failover"),)), 0) >= 2
            ),
            timeout=30,
            log=daemon.log,
        )
        metrics = samples(address)
        assert metrics[("opendrs_failover_headroom", ())] == 1
        assert metrics[("opendrs_failover_unrestartable_guests", ())] == 0
        assert value(metrics, "opendrs_migrations_started_total") == 1
        assert daemon.stop() == 0
    assert migrations(tmp_path) == [("103", "pve3", "pve1")]
    assert [(path, asked["target"]) for path, asked in fake.pve.migrations] == [
        ("/nodes/pve3/qemu/103/migrate", "pve1")
    ]
    after = opendrs("headroom", "--config", str(config), "--format", "json", timeout=60)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["ok"] is True
    status = opendrs("status", "--config", str(config), timeout=60)
    assert "failover headroom: yes, for any 1 node failing (3 HA guests)" in status.stdout


def test_the_repair_waits_for_a_closed_window_and_metrics_say_it_is_short(
    tmp_path: Path, fake: FakeCluster
) -> None:
    window = daily_window(timedelta(hours=2), timedelta(hours=3))
    config = _config(tmp_path, fake, f", timezone: {ZONE}, windows: ['{window}']")
    with Daemon(config) as daemon:
        address = served(daemon)
        line = daemon.wait_for(r"decision \(active\): .*outside the migration window", 30)
        assert "1 toward the failover headroom" in line, line
        eventually(
            lambda: value(samples(address), "opendrs_decisions_total") >= 3,
            timeout=20,
            log=daemon.log,
        )
        metrics = samples(address)
        assert metrics[("opendrs_failover_headroom", ())] == 0
        assert metrics[("opendrs_failover_unrestartable_guests", ())] == 1
        assert daemon.count(r"started ") == 0
        assert daemon.stop() == 0
    assert fake.pve.migrations == [] and migrations(tmp_path) == []


def test_the_log_says_once_why_no_move_gives_the_headroom_back(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = _config(tmp_path, fake, hot="")
    short = (
        "failover headroom short: db (101) cannot restart when pve1 fails, and the only moves "
        "that would give it back fill pve1 above the hot level 85 %"
    )
    with Daemon(config) as daemon:
        address = served(daemon)
        line = daemon.wait_for(r"decision \(active\): .*failover headroom short", timeout=30)
        assert line.rstrip().endswith(short), line
        eventually(
            lambda: value(samples(address), "opendrs_decisions_total") >= 4,
            timeout=30,
            log=daemon.log,
        )
        # Unchanged, the reason is logged once; status's last decision says it too.
        assert daemon.count(r"failover headroom short") == 1
        status = opendrs("status", "--config", str(config), timeout=60)
        assert short in status.stdout, status.stdout
        assert daemon.count(r"started ") == 0
        assert daemon.stop() == 0
    assert fake.pve.migrations == [] and migrations(tmp_path) == []
