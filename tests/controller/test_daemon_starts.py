"""``opendrs run`` against the fake Proxmox API: a migration request is sent only while starts are
allowed, a start given up on before its request leaves no trace, and a proxy's 502 or 504 to a
request is followed by where the guest goes — the daemon as a subprocess, with signals."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster, proxmox_config, running_on_pve1, three_nodes
from daemon import Daemon, eventually, run_once

#: Seconds the fake holds back the answer to Proxmox's migration precheck (within the 5 s timeout).
LATE = 4.0


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    """Three nodes, six running VMs all on pve1; a migration takes about a second."""
    cluster = three_nodes(str(tmp_path))
    running_on_pve1(cluster.pve, range(100, 106), memory_gib=4)
    try:
        yield cluster
    finally:
        cluster.stop()


def write_config(tmp_path: Path, fake: FakeCluster, *, mode: str, parallel: int = 1) -> Path:
    return proxmox_config(
        tmp_path,
        fake,
        mode=mode,
        executor=f"{{max_parallel: {parallel}, poll_interval: 1s}}",
    )


def rows(tmp_path: Path, query: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        return db.execute(query).fetchall()


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_reload_to_shadow_during_the_reads_before_a_request_sends_no_request(
    tmp_path: Path, fake: FakeCluster, parallel: int
) -> None:
    """The precheck of a start is answered 4 s late; the file says shadow now and SIGHUP comes
    meanwhile — during the first start's reads, or (two at a time) the second's. The reads are
    given up on at once, the request is not sent, the reload takes effect within about a second,
    and the start leaves no migration row."""
    fake.pve.withhold("GET", "/migrate", LATE)
    config = write_config(tmp_path, fake, mode="active", parallel=parallel)
    with Daemon(config) as daemon:
        eventually(lambda: len(fake.pve.held_back) >= parallel)
        sent = len(fake.pve.migrations)
        assert sent == parallel - 1
        write_config(tmp_path, fake, mode="shadow", parallel=parallel)
        signalled = time.monotonic()
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(r"configuration reloaded .*mode shadow")
        reloaded = time.monotonic() - signalled
        time.sleep(LATE + 1)  # the late answer has come
        daemon.wait_for(r"shadow: would migrate", after=daemon.mark)
        assert len(fake.pve.migrations) == sent, daemon.log()
        assert reloaded < 2.0, daemon.log()
        daemon.wait_for(r"not started: 10\d pve1 → pve\d: the configuration is being reloaded")
        assert daemon.stop() == 0
    assert [r[0] for r in rows(tmp_path, "SELECT outcome FROM migrations")] == ["done"] * sent
    assert rows(tmp_path, "SELECT * FROM avoid") == []


def test_sigterm_during_the_reads_before_a_request_leaves_no_migration_and_no_avoid(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """SIGTERM while the precheck is answered late: the daemon stops within about a second, and
    the start it gave up on leaves no migration row and keeps no guest off its target — the next
    run moves guests there."""
    fake.pve.withhold("GET", "/migrate", LATE)
    config = write_config(tmp_path, fake, mode="active")
    with Daemon(config) as daemon:
        eventually(lambda: fake.pve.held_back)
        signalled = time.monotonic()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(10) == 0
        stopped = time.monotonic() - signalled
        log = daemon.log()
    assert fake.pve.migrations == []
    assert rows(tmp_path, "SELECT * FROM migrations") == [], log
    assert rows(tmp_path, "SELECT * FROM avoid") == []
    assert stopped < 2.0 and "not started: 100 pve1 → pve2: opendrs is stopping" in log, log
    fake.pve.withheld.clear()
    result = run_once(config)
    assert result.returncode == 0, result.stderr
    moved = rows(tmp_path, "SELECT guest, target, outcome FROM migrations")
    assert moved and {outcome for _, _, outcome in moved} == {"done"}
    assert {target for _, target, _ in moved} == {"pve2", "pve3"}


@pytest.mark.parametrize("status", [502, 504])
def test_a_proxy_error_to_a_migration_request_is_followed_to_where_the_guest_goes(
    tmp_path: Path, fake: FakeCluster, status: int
) -> None:
    """A proxy in front of the API answers every migration request 502 or 504, though Proxmox
    started the migration: the daemon follows each to its end (its task found), records it
    done, and keeps no guest off the node it went to."""
    fake.pve.answer_as_proxy("POST", "/migrate", status)
    config = write_config(tmp_path, fake, mode="active")
    result = run_once(config)
    assert result.returncode == 0, result.stderr
    assert f"HTTP {status}" in result.stderr
    moved = rows(tmp_path, "SELECT guest, target, outcome FROM migrations")
    assert moved and len(moved) == len(fake.pve.migrations)
    for guest, target, outcome in moved:
        assert outcome == "done", result.stderr
        assert fake.pve.guest(int(str(guest))).node == target
    assert rows(tmp_path, "SELECT * FROM avoid") == []
