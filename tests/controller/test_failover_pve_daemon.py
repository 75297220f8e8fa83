"""The failover headroom through the daemon against the fake Proxmox API on loopback, its HA
guests read from ``/cluster/ha/resources``: ``opendrs headroom --config`` and ``opendrs status``
against the API, ``opendrs run`` (a subprocess, active mode, ``policy.keep_failover: 1``)
repairing toward the headroom with a real migration, ``/metrics`` saying it before and after, and
the balancing plan that would lose it again refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from tests.cli.test_metrics import samples, value
from tests.controller.test_failover_manual_daemon import short_of_failover
from tests.controller.test_manual_daemon import migrations

from backends.fakepve_fixture import FakeCluster, proxmox_config
from daemon import Daemon, eventually, opendrs, served

REPAIRED = r"done .*scratch \(103\) pve3 → pve1"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    cluster = short_of_failover(str(tmp_path))
    try:
        yield cluster
    finally:
        cluster.stop()


def _config(tmp_path: Path, fake: FakeCluster) -> Path:
    config = proxmox_config(tmp_path, fake, mode="active", extra="http: {listen: '127.0.0.1:0'}\n")
    plain = "policy: {interval: 1s, hold: 1, smoothing: 0}"
    config.write_text(
        config.read_text().replace(plain, plain[:-1] + ", hot: null, keep_failover: 1}")
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
            lambda: samples(address)[("opendrs_decisions_total", (("code", "failover"),))] >= 2,
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
