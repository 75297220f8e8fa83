"""Deadlines of the Proxmox backend against hostile servers (all on loopback).

Each API call has a total deadline of ``timeout`` — connect, send and the whole answer — whatever
the server does, and a call that waits for its answer is abandoned soon after the daemon is asked
to stop. The servers here hang, drip one byte at a time, answer garbage or close the connection
(``tests/hostile.py``); the fake Proxmox (``fakepve_fixture``) withholds the answer to a request it
carried out. Bounds are generous (a loaded two-core machine): the point is seconds, not minutes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from fakepve.certs import make_cert

from backends.fakepve_fixture import FakeCluster
from backends.test_proxmox import (
    SECRET,
    TOKEN_ID,
    closed_port,
    config_for,
    populate,
    requests_to,
)
from hostile import HostileServer, Mode
from opendrs.backends.base import BackendError
from opendrs.backends.proxmox import ProxmoxBackend, ProxmoxConfig, transport
from opendrs.model.cluster import Move, Settings

#: What a drip server answers /cluster/resources with: long enough to take minutes at 0.5 s a byte.
RESOURCES = [
    {"type": "node", "node": f"pve{n}", "status": "online", "maxcpu": 8, "maxmem": 1 << 35}
    for n in range(1, 6)
]


@pytest.fixture
def certs(tmp_path: Path) -> tuple[str, str]:
    certfile, keyfile, _ = make_cert(str(tmp_path), name="hostile", hosts=("127.0.0.1",))
    return certfile, keyfile


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    cluster = FakeCluster(str(tmp_path))
    cluster.pve.apitokens[TOKEN_ID] = SECRET
    try:
        yield cluster
    finally:
        cluster.stop()


def hostile(mode: Mode, certs: tuple[str, str], **options: object) -> HostileServer:
    """A hostile server with TLS (the backend speaks HTTPS only), held connections bounded."""
    values: dict[str, object] = {"tls": certs, "body": RESOURCES, "max_seconds": 90, **options}
    return HostileServer(mode, **values)  # type: ignore[arg-type]


def backend_at(
    server: HostileServer, certs: tuple[str, str], token_file: str | None, **changes: object
) -> ProxmoxBackend:
    values: dict[str, object] = {
        "hosts": (server.address,),
        "user": "opendrs@pve",
        "token_name": "drs",
        "token_file": token_file,
        "ca_file": certs[0],
        "timeout": 2.0,
        "retries": 0,
        "backoff": 0.01,
    }
    values.update(changes)
    return ProxmoxBackend(ProxmoxConfig(**values), Settings())  # type: ignore[arg-type]


def one_line(error: BackendError) -> str:
    text = str(error)
    assert "\n" not in text and SECRET not in text
    return text


def timed(call: object) -> tuple[BackendError, float]:
    """The BackendError ``call()`` raises, and how long it took."""
    started = time.monotonic()
    with pytest.raises(BackendError) as raised:
        call()  # type: ignore[operator]
    return raised.value, time.monotonic() - started


# --------------------------------------------------------------------------------------------
# A total deadline per call


def test_a_slow_drip_does_not_hold_a_call_beyond_its_timeout(
    certs: tuple[str, str], token_file: str
) -> None:
    # One byte every 0.5 s never trips a per-read timeout of 2 s: the answer would take minutes.
    with hostile("drip", certs, interval=0.5) as server:
        backend = backend_at(server, certs, token_file, timeout=2.0)
        try:
            error, took = timed(backend.observe)
        finally:
            backend.close()
    assert took < 10, f"gave up after {took:.1f}s"
    assert one_line(error) == f"GET /cluster/resources on {server.address}: no answer within 2s"
    assert error.transient and not error.uncertain


def test_retries_multiply_the_deadline_a_bounded_number_of_times(
    certs: tuple[str, str], token_file: str
) -> None:
    with hostile("drip", certs, interval=0.5) as server:
        backend = backend_at(server, certs, token_file, timeout=1.0, retries=2)
        try:
            error, took = timed(backend.observe)
        finally:
            backend.close()
    # Three tries of at most 1 s each (and two short backoffs).
    assert 2.5 < took < 12, f"gave up after {took:.1f}s"
    assert one_line(error) == (
        f"GET /cluster/resources on {server.address}: no answer within 1s (after 3 tries)"
    )
    assert len(server.requests) == 3


@pytest.mark.parametrize("mode", ["hang", "silent", "drip"])
def test_observe_and_start_migration_give_up_within_the_timeout(
    mode: Mode, certs: tuple[str, str], token_file: str
) -> None:
    with hostile(mode, certs, interval=0.5) as server:
        backend = backend_at(server, certs, token_file, timeout=2.0)
        try:
            error, took = timed(backend.observe)
            assert took < 10, f"observe gave up after {took:.1f}s"
            assert one_line(error).endswith(("no answer within 2s", "no connection within 2s"))
            assert error.transient
            error, took = timed(lambda: backend.start_migration(Move("100", "pve1", "pve2")))
            assert took < 10, f"start_migration gave up after {took:.1f}s"
            assert error.transient and one_line(error).startswith("GET /cluster/resources on ")
        finally:
            backend.close()


@pytest.mark.parametrize("mode", ["garbage", "close"])
def test_garbage_and_closed_connections_are_one_line_transient_errors(
    mode: Mode, certs: tuple[str, str], token_file: str
) -> None:
    with hostile(mode, certs) as server:
        backend = backend_at(server, certs, token_file, timeout=5.0, retries=1)
        try:
            error, took = timed(backend.observe)
        finally:
            backend.close()
    assert took < 10
    assert error.transient and not error.uncertain
    text = one_line(error)
    assert text.startswith(f"GET /cluster/resources on {server.address}: ")
    assert text.endswith("(after 2 tries)")


def test_calls_given_up_on_let_go_of_their_connection_and_thread(
    certs: tuple[str, str], token_file: str
) -> None:
    before = threading.active_count()
    with hostile("drip", certs, interval=0.2) as server:
        backend = backend_at(server, certs, token_file, timeout=0.5)
        try:
            for _ in range(8):
                with pytest.raises(BackendError, match=r"no answer within 0\.5s"):
                    backend.observe()
            # The server sees every abandoned connection closed by the client, soon.
            deadline = time.monotonic() + 10
            while (server.client_closed < 8 or server.active()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.client_closed >= 8 and server.active() == 0
        finally:
            backend.close()
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before


def test_a_password_login_is_under_the_same_deadline(
    tmp_path: Path, certs: tuple[str, str]
) -> None:
    password = tmp_path / "password"
    password.write_text("not-the-password\n")
    password.chmod(0o600)
    with hostile("drip", certs, interval=0.3) as server:
        backend = backend_at(
            server, certs, None, token_name=None, password_file=str(password), timeout=1.0
        )
        try:
            error, took = timed(backend.observe)
            assert took < 8, f"gave up after {took:.1f}s"
            assert (
                one_line(error)
                == f"GET /cluster/resources on {server.address}: no answer within 1s"
            )
            assert "not-the-password" not in str(error)
            assert server.requests == [("POST", "/api2/json/access/ticket")]
            # The login's connection was shut down with the try: the server sees it closed.
            deadline = time.monotonic() + 10
            while server.client_closed < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.client_closed >= 1
        finally:
            backend.close()


def test_calls_fail_at_once_while_too_many_given_up_on_still_run(
    certs: tuple[str, str], token_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the tries were stuck where a shut-down socket does not reach (a DNS lookup).
    monkeypatch.setattr(transport.Try, "abandon", lambda self: None)
    before = threading.active_count()
    # A byte every 0.05 s: far inside the 0.3 s socket timeout even on a loaded machine (a gap
    # beyond it ends a try, and frees its place), and the answer still takes ~25 s to drip.
    with hostile("drip", certs, interval=0.05) as server:
        backend = backend_at(server, certs, token_file, timeout=0.3)
        try:
            for _ in range(16):
                with pytest.raises(BackendError, match=r"no answer within 0\.3s"):
                    backend.observe()
            error, took = timed(backend.observe)
            assert took < 1 and len(server.requests) == 16
            assert one_line(error) == (
                f"GET /cluster/resources on {server.address}: not sent: 16 calls given up on "
                "have not ended yet"
            )
            assert error.transient
        finally:
            backend.close()
    # The server closed its side: the stuck threads end.
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before


def many_guests(fake: FakeCluster, count: int = 80) -> None:
    """Three nodes and ``count`` small running VMs."""
    for node in ("pve1", "pve2", "pve3"):
        fake.pve.add_node(node)
    for index in range(count):
        fake.pve.add_vm(
            1000 + index,
            f"g{index}",
            node=f"pve{index % 3 + 1}",
            status="running",
            config={"cores": 1, "memory": 512},
        )


def test_an_observation_ends_at_the_first_read_that_fails(
    fake: FakeCluster, token_file: str
) -> None:
    # Every guest's config hangs: 80 reads, four at a time, 1 s each would take 20 s.
    many_guests(fake)
    fake.pve.withhold("GET", "/config", secs=60)
    backend = ProxmoxBackend(config_for(fake, token_file, timeout=1.0, retries=0), Settings())
    try:
        error, took = timed(backend.observe)
    finally:
        backend.close()
    assert took < 8, f"gave up after {took:.1f}s"
    assert error.transient
    assert one_line(error).endswith("/config on " + f"{fake.address}: no answer within 1s")
    assert requests_to(fake, "GET", "/config") < 20  # the reads not started were dropped


def test_hanging_rrd_reads_cost_one_call_per_observation(
    fake: FakeCluster, token_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    # RRD reads are not needed (the current values stand in); when they hang, the observation
    # gives up on them after one call's worst case instead of one per guest (21 s here).
    caplog.set_level(logging.INFO, logger="opendrs")  # whatever an earlier test left it at
    many_guests(fake)
    fake.pve.withhold("GET", "/rrddata", secs=60)
    backend = ProxmoxBackend(config_for(fake, token_file, timeout=1.0, retries=0), Settings())
    try:
        started = time.monotonic()
        cluster = backend.observe()
        took = time.monotonic() - started
    finally:
        backend.close()
    assert took < 8, f"observed in {took:.1f}s"
    assert len(cluster.guests) == 80
    assert requests_to(fake, "GET", "/rrddata") < 20
    assert "RRD data cannot be read" in caplog.text


# --------------------------------------------------------------------------------------------
# Stopping


def test_a_stop_request_abandons_a_hanging_call_within_a_second(
    certs: tuple[str, str], token_file: str
) -> None:
    stop = threading.Event()
    with hostile("hang", certs) as server:
        backend = backend_at(server, certs, token_file, timeout=60.0, retries=3)
        backend.should_stop = stop.is_set

        def stop_when_asked() -> None:
            if server.seen.wait(30):
                time.sleep(0.3)
                stop.set()

        flipper = threading.Thread(target=stop_when_asked, daemon=True)
        flipper.start()
        try:
            error, took = timed(backend.observe)
            flipped = time.monotonic()
            assert stop.is_set()
            flipper.join(5)
            # Stopped about 0.3 s after the request arrived: abandoned within about a second.
            assert took < 8, f"abandoned after {took:.1f}s"
            assert error.transient and "opendrs is stopping" in one_line(error)
            assert len(server.requests) == 1
            # Once stopping, no call is sent at all.
            error, took = timed(backend.observe)
            assert took < 1 and "opendrs is stopping" in one_line(error)
            assert len(server.requests) == 1
            assert time.monotonic() - flipped < 5
        finally:
            backend.close()


def test_a_stop_request_during_the_backoff_ends_the_call(
    certs: tuple[str, str], token_file: str
) -> None:
    stop = threading.Event()
    with hostile("close", certs) as server:
        backend = backend_at(server, certs, token_file, timeout=5.0, retries=3, backoff=30.0)
        backend.should_stop = stop.is_set
        threading.Timer(0.5, stop.set).start()
        try:
            error, took = timed(backend.observe)
        finally:
            backend.close()
    assert took < 5, f"ended after {took:.1f}s"
    assert "opendrs is stopping" in one_line(error)


# --------------------------------------------------------------------------------------------
# Requests that change the cluster


def test_a_migration_request_whose_answer_never_comes_is_uncertain(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.time_scale = 0.05  # the migration takes 1 s in the fake
    fake.pve.withhold("POST", "/nodes/pve1/qemu/100/migrate", secs=60)
    backend = ProxmoxBackend(config_for(fake, token_file, timeout=2.0, retries=3), Settings())
    try:
        backend.observe()
        error, took = timed(lambda: backend.start_migration(Move("100", "pve1", "pve2")))
    finally:
        backend.close()
    assert took < 10, f"gave up after {took:.1f}s"
    assert error.uncertain and error.transient
    assert one_line(error) == (
        f"POST /nodes/pve1/qemu/100/migrate on {fake.address}: no answer within 2s"
    )
    # The request reached the server and took effect; it was not sent again.
    assert requests_to(fake, "POST", "/qemu/100/migrate") == 1
    assert len(fake.pve.migrations) == 1


def test_a_migration_request_whose_connection_breaks_is_uncertain(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.withhold("POST", "/nodes/pve1/qemu/100/migrate")
    backend = ProxmoxBackend(config_for(fake, token_file, retries=3), Settings())
    try:
        backend.observe()
        with pytest.raises(BackendError) as raised:
            backend.start_migration(Move("100", "pve1", "pve2"))
    finally:
        backend.close()
    assert raised.value.uncertain and raised.value.transient
    assert one_line(raised.value).startswith(f"POST /nodes/pve1/qemu/100/migrate on {fake.address}")
    assert requests_to(fake, "POST", "/qemu/100/migrate") == 1


def test_a_stop_request_during_a_migration_request_is_uncertain(
    fake: FakeCluster, token_file: str
) -> None:
    populate(fake)
    fake.pve.withhold("POST", "/nodes/pve1/qemu/100/migrate", secs=60)
    stop = threading.Event()
    backend = ProxmoxBackend(
        config_for(fake, token_file, timeout=60.0), Settings(), should_stop=stop.is_set
    )
    try:
        backend.observe()

        def stop_when_sent() -> None:
            deadline = time.monotonic() + 30
            while not fake.pve.migrations and time.monotonic() < deadline:
                time.sleep(0.02)
            stop.set()

        threading.Thread(target=stop_when_sent, daemon=True).start()
        error, took = timed(lambda: backend.start_migration(Move("100", "pve1", "pve2")))
    finally:
        backend.close()
    assert took < 8, f"abandoned after {took:.1f}s"
    assert error.uncertain and "opendrs is stopping" in one_line(error)


def test_a_migration_request_that_surely_did_not_arrive_is_not_uncertain(token_file: str) -> None:
    port = closed_port()
    config = ProxmoxConfig(
        hosts=(f"127.0.0.1:{port}",),
        user="opendrs@pve",
        token_name="drs",
        token_file=token_file,
        retries=0,
    )
    backend = ProxmoxBackend(config, Settings())
    try:
        with pytest.raises(BackendError, match="connection refused") as raised:
            backend._client.post("nodes/pve1/qemu/100/migrate", target="pve2")
    finally:
        backend.close()
    assert raised.value.transient and not raised.value.uncertain


# --------------------------------------------------------------------------------------------
# SIGTERM, as an operator sees it


def test_sigterm_during_a_hanging_api_call_stops_the_daemon(
    tmp_path: Path, certs: tuple[str, str], token_file: str
) -> None:
    """``opendrs run`` against an API that never answers (timeout 1h): SIGTERM ends it in seconds.

    Needs ``config.make_backend(should_stop=lambda: signals.stop)`` in cli/daemon.py.
    """
    with hostile("hang", certs, max_seconds=120) as server:
        config = tmp_path / "opendrs.yaml"
        config.write_text(
            "version: 1\n"
            "mode: shadow\n"
            "backend:\n"
            "  type: proxmox\n"
            f"  hosts: ['{server.address}']\n"
            "  user: opendrs@pve!drs\n"
            f"  token_file: {token_file}\n"
            f"  ca_file: {certs[0]}\n"
            "  timeout: 1h\n"
            "  retries: 3\n"
            f"history: {tmp_path / 'history.sqlite'}\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENDRS_")}
        process = subprocess.Popen(
            [sys.executable, "-m", "opendrs", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            assert server.seen.wait(60), "opendrs never called the API"
            time.sleep(0.5)  # inside the call now: the request is read, no answer comes
            assert process.poll() is None
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            try:
                status = process.wait(15)
            except subprocess.TimeoutExpired:
                pytest.fail("opendrs run did not stop within 15 s of SIGTERM")
            took = time.monotonic() - sent
            assert took < 10, f"stopped {took:.1f}s after SIGTERM"
            assert status == 0
            assert process.stderr is not None
            log = process.stderr.read().decode(errors="replace")
            assert SECRET not in log
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            if process.stderr is not None:
                process.stderr.close()
