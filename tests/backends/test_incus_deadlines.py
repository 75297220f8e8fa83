"""Deadlines of the Incus backend against hostile servers (all on loopback or a unix socket).

Each try of an API call has a total deadline of ``timeout`` — connect, send and the whole answer
— whatever the server does: httpx's own timeouts are per read, so a server that sends one byte
every two seconds would otherwise hold a call for as long as its answer lasts. A call waiting for
its answer is given up on within a second of the daemon being asked to stop. The servers here
hang or drip one byte at a time (``tests/hostile.py``).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
pytest.importorskip("aiohttp", reason="the fake Incus API is an aiohttp server")
pytest.importorskip("cryptography", reason="the TLS tests make certificates")

from backends.fakeincus import make_pki
from daemon import Daemon, opendrs
from hostile import HostileServer, Mode
from opendrs.backends.base import BackendError
from opendrs.backends.incus.client import Client
from opendrs.backends.incus.config import IncusConfig

#: An answer long enough to take minutes at one byte every 2 s.
BODY = [{"name": f"m{n}", "status": "Online", "roles": ["database"]} for n in range(1, 6)]


@pytest.fixture
def unix(tmp_path: Path) -> str:
    return str(tmp_path / "incus.sock")


def drip(unix: str, *, interval: float = 2.0, mode: Mode = "drip") -> HostileServer:
    return HostileServer(mode, unix=unix, interval=interval, body=BODY, max_seconds=120)


def timed(call: object) -> tuple[BackendError, float]:
    started = time.monotonic()
    with pytest.raises(BackendError) as raised:
        call()  # type: ignore[operator]
    return raised.value, time.monotonic() - started


# -- the client ------------------------------------------------------------------------------


def test_a_slow_drip_on_the_socket_does_not_hold_a_read_beyond_its_timeout(unix: str) -> None:
    with drip(unix) as server:
        client = Client(IncusConfig(socket=unix, timeout=2.0, retries=0))
        try:
            error, took = timed(lambda: client.get("/1.0/cluster/members"))
            assert took < 6, f"gave up after {took:.1f}s"
            assert str(error) == f"GET /1.0/cluster/members at unix:{unix}: no answer within 2s"
            assert error.transient and not error.uncertain
            # The try given up on let go of its connection: the server sees it closed.
            deadline = time.monotonic() + 10
            while server.client_closed < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.client_closed >= 1 and server.active() == 0
        finally:
            client.close()


def test_a_slow_drip_over_https_does_not_hold_a_read_beyond_its_timeout(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tls = (pki.server_cert, pki.server_key)
    with HostileServer("drip", tls=tls, interval=2.0, body=BODY, max_seconds=120) as server:
        config = IncusConfig(
            socket=None,
            addresses=(f"https://{server.address}",),
            client_cert=pki.client_cert,
            client_key=pki.client_key,
            server_cert=pki.server_cert,
            timeout=2.0,
            retries=1,
            backoff=0.1,
        )
        client = Client(config)
        try:
            error, took = timed(lambda: client.get("/1.0"))
        finally:
            client.close()
    # Two tries of 2 s each and a short backoff.
    assert 3.5 < took < 10, f"gave up after {took:.1f}s"
    assert str(error) == (
        f"GET /1.0 at https://{server.address}: no answer within 2s (after 2 tries)"
    )
    assert len(server.requests) == 2


def test_an_operation_wait_has_the_wait_asked_for_on_top(unix: str) -> None:
    with drip(unix, interval=0.5) as server:
        client = Client(IncusConfig(socket=unix, timeout=1.0, retries=0))
        try:
            error, took = timed(lambda: client.wait("abc", 2))
        finally:
            client.close()
    assert 2.5 < took < 7, f"gave up after {took:.1f}s"
    assert str(error).endswith("no answer within 3s")
    assert server.requests == [("GET", "/1.0/operations/abc/wait?timeout=2")]


def test_a_change_whose_answer_drips_is_uncertain_and_not_sent_again(unix: str) -> None:
    with drip(unix, interval=0.5) as server:
        client = Client(IncusConfig(socket=unix, timeout=1.0, retries=3, backoff=0.1))
        try:
            error, took = timed(
                lambda: client.send("POST", "/1.0/instances/vm1", {"migration": True})
            )
        finally:
            client.close()
    assert took < 5, f"gave up after {took:.1f}s"
    assert error.uncertain
    assert str(error) == f"POST /1.0/instances/vm1 at unix:{unix}: no answer within 1s"
    assert len(server.requests) == 1


def test_a_stop_request_abandons_a_dripping_call_within_a_second(unix: str) -> None:
    stop = threading.Event()
    stopped_at: list[float] = []
    with drip(unix) as server:
        client = Client(IncusConfig(socket=unix, timeout=600.0, retries=3), stop.is_set)

        def stop_when_asked() -> None:
            if server.seen.wait(30):
                time.sleep(2.5)  # bytes of the answer arrive meanwhile
                stopped_at.append(time.monotonic())
                stop.set()

        threading.Thread(target=stop_when_asked, daemon=True).start()
        try:
            error, _ = timed(lambda: client.get("/1.0/instances"))
            late = time.monotonic() - stopped_at[0]
            assert late < 1, f"abandoned {late:.1f}s after the stop request"
            assert str(error) == f"GET /1.0/instances at unix:{unix}: given up: opendrs is stopping"
            assert error.transient and not error.uncertain
            assert len(server.requests) == 1
            # Once stopping, nothing more is sent.
            error, took = timed(lambda: client.get("/1.0"))
            assert took < 1 and "opendrs is stopping" in str(error)
            assert len(server.requests) == 1
        finally:
            client.close()


# -- opendrs run, as an operator runs it ----------------------------------------------------


def write_config(tmp_path: Path, unix: str, *, timeout: str, retries: int) -> Path:
    path = tmp_path / "opendrs.yaml"
    path.write_text(
        "version: 1\n"
        "mode: shadow\n"
        f"backend: {{type: incus, socket: {unix}, timeout: {timeout}, retries: {retries}}}\n"
        "history: history.sqlite\n"
    )
    return path


def test_run_once_against_a_dripping_socket_ends_within_its_deadline(
    tmp_path: Path, unix: str
) -> None:
    # One byte every 2 s: each read comes well within the 3 s timeout, the answer never ends.
    config = write_config(tmp_path, unix, timeout="3s", retries=1)
    with drip(unix) as server:
        started = time.monotonic()
        try:
            result = opendrs("run", "--once", "--config", str(config), timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("opendrs run --once was still running after 60 s")
        took = time.monotonic() - started
    # Three calls (the platform's policy defaults, asked at the start and at the cycle, and the
    # observation), each two tries of at most 3 s and a backoff of 0.5 s: 19.5 s at most, and
    # the start of Python.
    assert took < 35, f"ended after {took:.1f}s"
    assert result.returncode == 1, result.stderr
    assert result.stderr.endswith(
        f"error: cannot observe the cluster: GET /1.0 at unix:{unix}: no answer within 3s "
        "(after 2 tries)\n"
    )
    assert "Traceback" not in result.stderr
    assert len(server.requests) == 6


@pytest.fixture
def daemon_at_drip(tmp_path: Path, unix: str) -> Iterator[tuple[Daemon, HostileServer]]:
    config = write_config(tmp_path, unix, timeout="10m", retries=3)
    with drip(unix) as server, Daemon(config) as daemon:
        yield daemon, server


def test_sigterm_during_a_dripping_call_stops_the_daemon_within_a_second(
    daemon_at_drip: tuple[Daemon, HostileServer],
) -> None:
    daemon, server = daemon_at_drip
    assert server.seen.wait(60), "opendrs never called the API:\n" + daemon.log()
    time.sleep(2.5)  # inside the call now: bytes of the answer arrive, it never ends
    assert daemon.process.poll() is None
    sent = time.monotonic()
    daemon.signal(signal.SIGTERM)
    try:
        status = daemon.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail("opendrs run did not stop within 15 s of SIGTERM")
    took = time.monotonic() - sent
    # The call is abandoned within 0.2 s; the rest is the daemon's orderly exit.
    assert took < 2.5, f"stopped {took:.1f}s after SIGTERM"
    assert status == 0, daemon.log()
    assert "Traceback" not in daemon.log()
