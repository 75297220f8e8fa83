"""``opendrs run`` against the fake Incus API: a move is requested only while starts are allowed,
a start given up on before its request leaves no trace, and a proxy's 502 or 504 to a move is
followed by where the instance goes — the daemon as a subprocess, with signals."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
pytest.importorskip("aiohttp", reason="the fake Incus API is an aiohttp server")

from backends.fakeincus import FakeIncus, Served, socket_path
from backends.incus_fixture import history, opendrs, packed
from daemon import Daemon, eventually

VMS = [f"vm{i}" for i in range(1, 5)]
#: Seconds the fake takes to answer the read of an instance before its move (within the timeout).
LATE = 3.0


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Served]:
    """Three members, four VMs that may move live, all on m1."""
    incus = packed(FakeIncus("m1"), VMS)
    incus.migration_seconds = 0.5
    server = Served(incus, socket=socket_path(tmp_path))
    try:
        yield server
    finally:
        server.close()


def write_config(tmp_path: Path, server: Served, *, mode: str, parallel: int = 1) -> Path:
    path = tmp_path / "opendrs.yaml"
    path.write_text(
        f"mode: {mode}\n"
        f"backend: {{type: incus, socket: {server.socket}, timeout: 5s}}\n"
        "history: history.sqlite\n"
        "policy: {interval: 1s, hold: 1, smoothing: 0}\n"
        f"executor: {{max_parallel: {parallel}, poll_interval: 1s}}\n"
    )
    return path


def reads_before_a_move(server: Served) -> int:
    return sum(len(server.fake.calls("GET", f"/1.0/instances/{name}")) for name in VMS)


def moves_posted(server: Served) -> int:
    return sum(len(server.fake.calls("POST", f"/1.0/instances/{name}")) for name in VMS)


def late_reads(server: Served) -> None:
    """The read of each instance before its move is answered ``LATE`` seconds late."""
    for name in VMS:
        server.fake.hang("GET", f"/1.0/instances/{name}", LATE)


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_reload_to_shadow_during_the_read_before_a_move_sends_no_move(
    tmp_path: Path, fake: Served, parallel: int
) -> None:
    """SIGHUP with the file now in shadow mode while the instance is read before its move (the
    first's, or two at a time the second's): the move is not requested, and leaves no row."""
    late_reads(fake)
    config = write_config(tmp_path, fake, mode="active", parallel=parallel)
    with Daemon(config) as daemon:
        eventually(lambda: reads_before_a_move(fake) >= parallel)
        sent = moves_posted(fake)
        assert sent == parallel - 1
        write_config(tmp_path, fake, mode="shadow", parallel=parallel)
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(r"configuration reloaded .*mode shadow")
        time.sleep(1)
        daemon.wait_for(r"shadow: would migrate", after=daemon.mark)
        assert moves_posted(fake) == sent, daemon.log()
        daemon.wait_for(r"not started: vm\d m1 → m\d: the configuration is being reloaded")
        assert daemon.stop() == 0
    assert [r[0] for r in history(tmp_path, "SELECT outcome FROM migrations")] == ["done"] * sent
    assert history(tmp_path, "SELECT * FROM avoid") == []


def test_sigterm_during_the_read_before_a_move_leaves_no_migration_and_no_avoid(
    tmp_path: Path, fake: Served
) -> None:
    late_reads(fake)
    config = write_config(tmp_path, fake, mode="active")
    with Daemon(config) as daemon:
        eventually(lambda: reads_before_a_move(fake) >= 1)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(LATE + 10) == 0
        log = daemon.log()
    assert moves_posted(fake) == 0
    assert history(tmp_path, "SELECT * FROM migrations") == [], log
    assert history(tmp_path, "SELECT * FROM avoid") == []
    assert "not started: vm1 m1 → m2: opendrs is stopping" in log, log


@pytest.mark.parametrize("status", [502, 504])
def test_a_proxy_error_to_a_move_is_followed_to_where_the_instance_goes(
    tmp_path: Path, fake: Served, status: int
) -> None:
    """A proxy in front of the API answers every move 502 or 504, though Incus moves the
    instance: each move is recorded done, and no instance is kept off the member it went to."""
    for name in VMS:
        fake.fake.answer_as_proxy("POST", f"/1.0/instances/{name}", status)
    config = write_config(tmp_path, fake, mode="active")
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    assert f"HTTP {status}" in result.stderr
    moved = history(tmp_path, "SELECT guest, target, outcome FROM migrations")
    assert moved and len(moved) == moves_posted(fake)
    for guest, target, outcome in moved:
        assert outcome == "done", result.stderr
        assert fake.fake.instance(str(guest)).location == target
    assert history(tmp_path, "SELECT * FROM avoid") == []
