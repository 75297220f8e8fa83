"""The daemon's HTTP server under a flood of idle connections: ``opendrs run`` as a subprocess
against the fake Proxmox API on loopback, with the 1,024 open files the shipped unit allows
(the systemd default), a bearer token, and more idle unauthenticated connections than it has
files. ``/healthz`` still answers, the daemon's own API calls still work, the idle connections
are closed after the request deadline."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster
from daemon import Daemon, eventually, fetch, served
from pve_daemon import fake_cluster, secret_file, shadow_config

HTTP_TOKEN = "dashboard-token-4c1e8a6f"
#: The shipped unit's limit of open files (systemd's default soft limit).
FILES = 1024
FLOOD = 1100
#: The documented bounds (docs/operations.md): connections held at once, and seconds a
#: connection has to send its request.
MAX_CONNECTIONS = 64
REQUEST_TIMEOUT = 10.0


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    with fake_cluster(tmp_path, nodes=2, vms=1) as cluster:
        yield cluster


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def flood(address: str, count: int) -> list[socket.socket]:
    """``count`` connections that never send a byte (those the kernel queues count too)."""
    host, _, port = address.rpartition(":")
    held: list[socket.socket] = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(2)
        try:
            sock.connect((host, int(port)))
        except OSError:
            sock.close()
            continue
        held.append(sock)
    return held


def metric(address: str, name: str) -> float:
    """The sum of a metric's samples on ``/metrics``."""
    status, text = fetch(address, "/metrics", token=HTTP_TOKEN)
    assert status == 200, text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name)] in " {"
    )


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (the end of its stream, or a reset)."""
    sock.settimeout(None)  # blocking: MSG_DONTWAIT then answers at once
    try:
        return sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_a_flood_of_idle_connections_leaves_healthz_and_the_api_calls_working(
    tmp_path: Path, fake: FakeCluster
) -> None:
    token = secret_file(tmp_path / "http.token", HTTP_TOKEN)
    config = shadow_config(tmp_path, fake, http_token=token)
    with Daemon(config, files=FILES) as daemon:
        address = served(daemon)
        eventually(lambda: fetch(address, "/healthz", token=HTTP_TOKEN) == (200, "ok\n"))
        errors = metric(address, "opendrs_observation_errors_total")
        pid = daemon.process.pid
        sockets = flood(address, FLOOD)
        try:
            # A health check is answered at once, and a client without the token refused.
            started = time.monotonic()
            assert fetch(address, "/healthz", token=HTTP_TOKEN) == (200, "ok\n")
            assert fetch(address, "/healthz")[0] == 401
            assert time.monotonic() - started < 5
            # Every connection was accepted; the server holds at most its cap, and the daemon
            # keeps files to spare.
            assert len(sockets) == FLOOD, f"only {len(sockets)} connections opened"
            assert open_files(pid) < MAX_CONNECTIONS + 100, f"{open_files(pid)} files open"
            # The control loop's own calls to the API still get their sockets: observations
            # after the flood, without an error.
            flooded = time.time()
            eventually(
                lambda: metric(address, "opendrs_last_observation_timestamp_seconds") > flooded + 1,
                timeout=30,
            )
            assert metric(address, "opendrs_observation_errors_total") == errors
            assert "Too many open files" not in daemon.log()
            # The idle ones still held are closed once the request deadline has passed.
            deadline = time.monotonic() + REQUEST_TIMEOUT + 10
            open_ones = sockets
            while open_ones and time.monotonic() < deadline:
                time.sleep(0.5)
                open_ones = [sock for sock in open_ones if not closed_by_server(sock)]
            assert not open_ones, f"{len(open_ones)} idle connections still open"
        finally:
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        assert fetch(address, "/healthz", token=HTTP_TOKEN) == (200, "ok\n")
        assert daemon.process.poll() is None


def test_a_client_that_sends_its_headers_a_byte_at_a_time_is_cut_off(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = shadow_config(tmp_path, fake, http=True)
    with Daemon(config) as daemon:
        address = served(daemon)
        host, _, port = address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            started = time.monotonic()
            request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200
            cut = False
            for byte in request:
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    cut = True
                    break
                if closed_by_server(sock):
                    cut = True
                    break
                time.sleep(1)
                if time.monotonic() - started > REQUEST_TIMEOUT + 10:
                    break
            took = time.monotonic() - started
        assert cut, "the slow client was never cut off"
        assert REQUEST_TIMEOUT - 1 < took < REQUEST_TIMEOUT + 5, f"cut off after {took:.1f}s"
