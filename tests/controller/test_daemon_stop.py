"""``opendrs run`` stopped while its HTTP server answers: SIGTERM with requests in flight — pages
drawing their charts, ``POST /api/place``, approvals, balance now — must end the daemon with exit
status 0, its stop logged and no traceback, every time. A request thread still drawing a chart
while the interpreter exited had the process abort (SIGABRT, in matplotlib's C++ code). The
server's own stop is checked in the process too: it waits for the requests being answered, and
cuts those that outlast its grace."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from tests.controller.slow_place_daemon import SLOWED, WRITING
from tests.controller.test_dashboard import _config

from daemon import Daemon, eventually, send, served
from opendrs.controller.config import HttpConfig
from opendrs.controller.dashboard import Dashboard
from opendrs.controller.history import History
from opendrs.controller.http_server import (
    CUT_WAIT,
    STOP_GRACE,
    WRITE_WAIT,
    MetricsServer,
    _Handler,
    start_server,
)
from opendrs.controller.http_write import DashboardWriter
from opendrs.controller.loop import InstanceLock
from opendrs.controller.metrics import DaemonMetrics
from opendrs.controller.place_api import PlaceView

TOKEN = "stop-token-0123456789"
#: SIGTERM after this many seconds of requests, one run of the daemon each.
DELAYS = (0.3, 0.9, 1.6)
CLIENTS = 4
#: What a crash leaves in the log: a traceback, faulthandler's report, a C++ abort.
CRASHES = ("Traceback", "Fatal Python error", "terminate called", "Exception occurred")


def ask(address: str, path: str, *, method: str = "GET", body: bytes = b"") -> int | None:
    """The status of one request with the token, or None when the connection broke (the daemon
    stopping under it)."""
    headers = {"Content-Type": "application/json"} if method == "POST" else {}
    try:
        return send(address, path, method=method, token=TOKEN, body=body, headers=headers)[0]
    except (OSError, urllib.error.URLError):
        return None


def requests_of(address: str) -> list[Callable[[], int | None]]:
    """What the clients ask, in turn: the page and its panel (charts), a placement, the open
    proposals and an approval of each, balance now."""

    def approve_each() -> int | None:
        try:
            status, text, _ = send(address, "/api/proposals", method="GET", token=TOKEN)
        except (OSError, urllib.error.URLError):
            return None
        for proposal in json.loads(text)["proposals"] if status == 200 else []:
            ask(address, f"/api/proposals/{proposal['id']}/approve", method="POST")
        return status

    place = json.dumps({"cpu": 1, "memory": "2GiB"}).encode()
    return [
        lambda: ask(address, "/"),
        lambda: ask(address, "/api/panel"),
        lambda: ask(address, "/api/place", method="POST", body=place),
        approve_each,
        lambda: ask(address, "/api/balance-now", method="POST"),
    ]


def hammer(address: str, done: threading.Event, answered: list[int]) -> None:
    asked = requests_of(address)
    turn = 0
    while not done.is_set():
        status = asked[turn % len(asked)]()
        turn += 1
        if status is not None:
            answered.append(status)


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    """Manual mode on the fake Proxmox API (eight VMs on pve1: proposals to approve), the
    dashboard served with ``http.write`` on behind a bearer token, a decision log."""
    pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
    pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")
    from backends.fakepve_fixture import proxmox_config, running_on_pve1, three_nodes

    cluster = three_nodes(str(tmp_path))
    running_on_pve1(cluster.pve, range(100, 108))
    (tmp_path / "http.token").write_text(TOKEN + "\n")
    (tmp_path / "http.token").chmod(0o600)
    http = (
        "http: {listen: '127.0.0.1:0', token_file: http.token, write: true, token_name: ops}\n"
        "log: {decisions: decisions.jsonl}\n"
    )
    try:
        yield proxmox_config(tmp_path, cluster, mode="manual", extra=http)
    finally:
        cluster.stop()


def test_sigterm_with_requests_in_flight_exits_0_every_time(config: Path) -> None:
    for delay in DELAYS:
        status, log, answered = stopped_under_requests(config, delay)
        assert status == 0, f"exit status {status} after SIGTERM at {delay}s:\n{log[-4000:]}"
        assert "stopping: state recorded" in log, log[-4000:]
        for crash in CRASHES:
            assert crash not in log, log[-4000:]
        assert HTTPStatus.OK in answered


#: Seconds beyond the grace the daemon may take to exit (the loop's step, the backend closed).
EXIT_MARGIN = 4.0


def test_a_request_computing_past_the_grace_does_not_hold_the_exit(
    config: Path, tmp_path: Path
) -> None:
    """The first ``POST /api/place`` after an observation computes for a minute (its build
    slowed, as on a cluster far larger than this one): SIGTERM ends the daemon within the
    grace and a margin, exit status 0, the request named in one line, the history whole."""
    with slowed_daemon(config, SLOW_PLACE="60") as daemon:
        address = served(daemon)
        daemon.wait_for(r"decision \(manual\)", timeout=60)
        # A second decision: the place view has the first cycle's observation (no 503).
        daemon.wait_for(r"decision \(manual\)", timeout=60, after=daemon.mark)
        statuses: list[int | None] = []
        body = json.dumps({"cpu": 1, "memory": "2GiB"}).encode()
        client = threading.Thread(
            target=lambda: statuses.append(ask(address, "/api/place", method="POST", body=body))
        )
        client.start()
        daemon.wait_for(SLOWED, timeout=30)
        daemon.signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            status = daemon.wait(STOP_GRACE + EXIT_MARGIN)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"still running {STOP_GRACE + EXIT_MARGIN:g}s after SIGTERM:\n{daemon.log()}"
            )
        took = time.monotonic() - signalled
        client.join(15)
        log = daemon.log()
    assert status == 0, log[-4000:]
    assert took >= STOP_GRACE, f"exited {took:.1f}s after SIGTERM: the request had its grace?"
    cut = [line for line in log.splitlines() if "of stopping: cut" in line]
    assert len(cut) == 1, log[-4000:]
    assert cut[0].endswith(
        f"1 request(s) not answered within {STOP_GRACE:g}s of stopping: cut (POST /api/place); "
        "1 still computing, not waited for"
    )
    assert "stopping: state recorded" in log and statuses == [None]
    for crash in CRASHES:
        assert crash not in log, log[-4000:]
    assert_files_whole(tmp_path)


def slowed_daemon(config: Path, **slowed: str) -> Daemon:
    """``opendrs run`` on ``config`` with the parts ``slowed`` names slowed (or broken) as
    :mod:`tests.controller.slow_place_daemon` says."""
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    return Daemon(config, env={**slowed, "PYTHONPATH": path}, module="slow_place_daemon")


def stopped_while_writing(daemon: Daemon, path: str) -> tuple[int, str, list[int | None]]:
    """``POST path`` to ``daemon``, then SIGTERM once its write is slowed: the exit status, the
    log and the status the client got."""
    statuses: list[int | None] = []
    client = threading.Thread(
        target=lambda: statuses.append(ask(served(daemon), path, method="POST"))
    )
    client.start()
    daemon.wait_for(WRITING, timeout=30)
    daemon.signal(signal.SIGTERM)
    status = daemon.wait(60)
    client.join(15)
    return status, daemon.log(), statuses


def test_a_write_ending_after_the_stop_does_not_kill_the_daemon(
    config: Path, tmp_path: Path
) -> None:
    """A request to balance now waits 7 s for the history (as for SQLite's busy timeout) and
    the daemon's files take 3 s to close: the write, which wakes the daemon with SIGUSR1, ends
    before the daemon gives its signals back, not after (their default would kill it)."""
    with slowed_daemon(config, SLOW_WRITE="7", SLOW_CLOSE="3") as daemon:
        daemon.wait_for(r"decision \(manual\)", timeout=60)
        status, log, statuses = stopped_while_writing(daemon, "/api/balance-now")
    assert status == 0, log[-4000:]
    assert "cut (POST /api/balance-now)" in log and statuses == [None], log[-4000:]
    assert "still computing" not in log and "stopping: state recorded" in log, log[-4000:]
    for crash in CRASHES:
        assert crash not in log, log[-4000:]
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        asked = db.execute("SELECT value FROM state WHERE key = 'balance_now'").fetchall()
    assert asked == [("ops@http",)]


def test_an_approval_under_way_at_the_stop_is_logged_whole(config: Path, tmp_path: Path) -> None:
    """An approval whose decision-log line is slowed 8 s (a slow disk), past the grace: the
    daemon waits for it, so that its verdict is in the decision log as in the history."""
    with slowed_daemon(config, SLOW_WRITE="8") as daemon:
        daemon.wait_for(r"proposal \w+ \(balance\) waits for approval", timeout=60)
        status, text, _ = send(served(daemon), "/api/proposals", method="GET", token=TOKEN)
        assert status == 200, text
        proposal = json.loads(text)["proposals"][0]["id"]
        status, log, _ = stopped_while_writing(daemon, f"/api/proposals/{proposal}/approve")
    assert status == 0, log[-4000:]
    assert f"cut (POST /api/proposals/{proposal}/approve)" in log, log[-4000:]
    with History(tmp_path / "history.sqlite", readonly=True) as history:
        given = {(p.id, p.state, p.by) for p in history.proposals() if p.by is not None}
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    logged = [v for v in map(json.loads, lines) if v["kind"] == "verdict"]
    assert given == {(proposal, "approved", "ops@http")}, log[-4000:]
    assert [(v["proposal"], v["event"], v["by"]) for v in logged] == [
        (proposal, "approved", "ops@http")
    ]
    assert_files_whole(tmp_path)


def test_a_write_stuck_at_the_stop_does_not_hold_the_exit(config: Path, tmp_path: Path) -> None:
    """An approval whose decision-log line takes a minute (a hung disk): the daemon waits for
    it :data:`WRITE_WAIT` seconds past the cut, then says it did not wait for it and exits,
    status 0, within the grace, those seconds and a margin."""
    with slowed_daemon(config, SLOW_WRITE="60") as daemon:
        daemon.wait_for(r"proposal \w+ \(balance\) waits for approval", timeout=60)
        status, text, _ = send(served(daemon), "/api/proposals", method="GET", token=TOKEN)
        assert status == 200, text
        proposal = json.loads(text)["proposals"][0]["id"]
        client = threading.Thread(
            target=ask,
            args=(served(daemon), f"/api/proposals/{proposal}/approve"),
            kwargs={"method": "POST"},
        )
        client.start()
        daemon.wait_for(WRITING, timeout=30)
        daemon.signal(signal.SIGTERM)
        limit = STOP_GRACE + CUT_WAIT + WRITE_WAIT + EXIT_MARGIN
        signalled = time.monotonic()
        try:
            status = daemon.wait(limit)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {limit:g}s after SIGTERM:\n{daemon.log()}")
        took = time.monotonic() - signalled
        client.join(15)
        log = daemon.log()
    assert status == 0, log[-4000:]
    assert took >= STOP_GRACE + WRITE_WAIT, f"exited {took:.1f}s after SIGTERM: not waited?"
    stuck = [line for line in log.splitlines() if "dashboard write" in line]
    assert len(stuck) == 1 and stuck[0].endswith(
        f"WARNING http: 1 dashboard write(s) not ended within {WRITE_WAIT:g}s of the cut: not "
        "waited for (a verdict given may lack its decision-log line)"
    ), log[-4000:]
    assert "1 still computing, not waited for" in log and "stopping: state recorded" in log
    for crash in CRASHES:
        assert crash not in log, log[-4000:]


def test_a_bug_at_the_stop_with_a_request_computing_exits_at_once(config: Path) -> None:
    """The daemon fails once its controller has stopped (a bug) while a ``POST /api/place``
    computes for a minute: one line says so and the process ends with exit status 1 within the
    grace and a margin, not once the request is computed."""
    with slowed_daemon(config, SLOW_PLACE="60", BREAK_AFTER_STOP="1") as daemon:
        address = served(daemon)
        daemon.wait_for(r"decision \(manual\)", timeout=60)
        daemon.wait_for(r"decision \(manual\)", timeout=60, after=daemon.mark)
        body = json.dumps({"cpu": 1, "memory": "2GiB"}).encode()
        client = threading.Thread(
            target=lambda: ask(address, "/api/place", method="POST", body=body), daemon=True
        )
        client.start()
        daemon.wait_for(SLOWED, timeout=30)
        daemon.signal(signal.SIGTERM)
        try:
            status = daemon.wait(STOP_GRACE + EXIT_MARGIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {STOP_GRACE + EXIT_MARGIN:g}s after SIGTERM")
        log = daemon.log()
    assert status == 1, log[-4000:]
    assert (
        "error: internal error (a bug in opendrs, please report it): RuntimeError: test: a bug "
        "once the controller has stopped"
    ) in log
    assert "1 still computing, not waited for" in log and "Traceback" not in log, log[-4000:]


def assert_files_whole(directory: Path) -> None:
    """The daemon's history passes SQLite's integrity check and opens read-only, and its
    instance lock is free."""
    with sqlite3.connect(directory / "history.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with History(directory / "history.sqlite", readonly=True) as history:
        assert history.proposals() is not None
    lock = InstanceLock(str(directory / "history.sqlite.lock"), str(directory / "history.sqlite"))
    lock.acquire()
    lock.release()


def stopped_under_requests(config: Path, delay: float) -> tuple[int, str, list[int]]:
    """One run of the daemon, sent SIGTERM ``delay`` seconds into the clients' requests (once a
    write has been logged): its exit status, its log and the statuses the clients got."""
    with Daemon(config, env={"PYTHONFAULTHANDLER": "1"}) as daemon:
        address = served(daemon)
        daemon.wait_for(r"decision \(manual\)", timeout=60)  # observed: charts, placements
        done = threading.Event()
        answered: list[int] = []
        clients = [
            threading.Thread(target=hammer, args=(address, done, answered), daemon=True)
            for _ in range(CLIENTS)
        ]
        for client in clients:
            client.start()
        time.sleep(delay)
        daemon.wait_for(r"http 127\.0\.0\.1: POST", timeout=30)  # the writes are under way
        daemon.signal(signal.SIGTERM)
        status = daemon.wait(60)
        done.set()
        for client in clients:
            client.join(15)
        return status, daemon.log(), answered


# -- the server's stop, in this process -------------------------------------------------------


class HeldPlace(PlaceView):
    """A ``POST /api/place`` answer held until ``release`` is set (or ``hold`` seconds pass)."""

    def __init__(self, hold: float) -> None:
        super().__init__()
        self.hold = hold
        self.entered = threading.Event()
        self.release = threading.Event()

    def answer(self, body: bytes) -> tuple[HTTPStatus, bytes]:
        self.entered.set()
        self.release.wait(self.hold)
        return HTTPStatus.OK, b'{"best": "pve1"}\n'


def held_server(place: HeldPlace) -> MetricsServer:
    server = MetricsServer(HttpConfig("127.0.0.1", 0), DaemonMetrics(), TOKEN, None, place)
    server.start()
    return server


def request_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "opendrs-http-request"]


def post_place(address: str, statuses: list[int | None]) -> threading.Thread:
    client = threading.Thread(
        target=lambda: statuses.append(ask(address, "/api/place", method="POST", body=b"{}"))
    )
    client.start()
    return client


def test_stop_waits_for_the_request_being_answered() -> None:
    place = HeldPlace(hold=30)
    server = held_server(place)
    statuses: list[int | None] = []
    client = post_place(server.address, statuses)
    assert place.entered.wait(10)
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    stopper.join(0.5)
    assert stopper.is_alive(), "stop returned while a request was being answered"
    place.release.set()
    stopper.join(10)
    client.join(10)
    assert not stopper.is_alive() and statuses == [200]
    assert request_threads() == []


def test_a_request_outlasting_the_grace_is_cut(caplog: pytest.LogCaptureFixture) -> None:
    """A request whose body is still coming when the grace ends: its thread, reading, ends as
    soon as its connection is cut."""
    server = held_server(HeldPlace(hold=0))  # once its body is read, answered at once
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as client:
        client.sendall(
            b"POST /api/place HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n{{".encode()
        )
        eventually(lambda: len(request_threads()) == 1, 10, what="the request's thread")
        with caplog.at_level(logging.DEBUG, logger="opendrs"):
            server.stop(grace=0.1)
        assert client.recv(100) == b""  # the connection was cut: no answer
    assert request_threads() == [] and server.computing() == 0
    assert "1 request(s) not answered within 0.1s of stopping: cut (POST /api/place)" in caplog.text
    assert "still computing" not in caplog.text and "Traceback" not in caplog.text


def test_a_request_still_computing_after_the_cut_is_not_waited_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    place = HeldPlace(hold=30)
    server = held_server(place)
    statuses: list[int | None] = []
    client = post_place(server.address, statuses)
    assert place.entered.wait(10)
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="opendrs"):
        server.stop(grace=0.1)
    assert time.monotonic() - started < 0.1 + CUT_WAIT + 2.0
    assert server.computing() == 1 and len(request_threads()) == 1
    assert "cut (POST /api/place); 1 still computing, not waited for" in caplog.text
    place.release.set()  # its answer computed, it finds its connection cut and ends
    for thread in request_threads():
        thread.join(10)
    client.join(10)
    assert server.computing() == 0 and statuses == [None]
    assert "Traceback" not in caplog.text


def test_a_page_cut_while_drawing_is_no_error_of_the_page(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dashboard = Dashboard(_config())
    drawing = threading.Event()

    def slow_page() -> str:
        drawing.set()
        time.sleep(1.0)
        return "<html></html>"

    monkeypatch.setattr(dashboard, "page", slow_page)
    server = start_server(HttpConfig("127.0.0.1", 0), DaemonMetrics(), dashboard)
    statuses: list[int | None] = []
    client = threading.Thread(target=lambda: statuses.append(ask(server.address, "/")))
    client.start()
    assert drawing.wait(10)
    with caplog.at_level(logging.DEBUG, logger="opendrs"):
        server.stop(grace=0.1)
        for thread in request_threads():  # still drawing: it ends once its page is drawn
            thread.join(10)
    client.join(10)
    assert statuses == [None] and request_threads() == []
    assert "cut (GET /)" in caplog.text
    assert "cannot answer" not in caplog.text and "Traceback" not in caplog.text


def test_the_stops_line_never_repeats_a_path_it_does_not_serve(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A request for a 10 kB path with escape sequences, its answer held when the server stops
    (as one to a client that stopped reading would be): the stop's line names no such path."""
    held = threading.Event()
    send_answer = _Handler._send

    def held_send(handler: _Handler, *args: Any, **kwargs: Any) -> None:
        held.set()
        time.sleep(1.0)
        send_answer(handler, *args, **kwargs)

    monkeypatch.setattr(_Handler, "_send", held_send)
    server = held_server(HeldPlace(hold=0))
    host, port = server.address.rsplit(":", 1)
    path = b"/\x1b[2J\x1b[31m" + b"A" * 10_000
    with socket.create_connection((host, int(port)), timeout=10) as client:
        client.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert held.wait(10)
        with caplog.at_level(logging.WARNING, logger="opendrs"):
            server.stop(grace=0.1)
            for thread in request_threads():
                thread.join(10)
    assert "cut (another request)" in caplog.text, caplog.text[:500]
    assert "\x1b" not in caplog.text and "AAAA" not in caplog.text
    assert max(len(line) for line in caplog.text.splitlines()) < 200


def test_a_write_asked_once_the_server_stops_is_refused(tmp_path: Path) -> None:
    """Once stopped, the writer refuses a write (503), opens no history and wakes no one."""
    woken: list[int] = []
    writer = DashboardWriter(str(tmp_path / "history.sqlite"), "ops@http", lambda: woken.append(1))
    assert writer.stop(1.0) == (0, 0)  # no write was under way
    status, answer = writer.post("/api/balance-now", b"")
    assert (status, answer) == (HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the daemon is stopping"})
    assert woken == [] and not (tmp_path / "history.sqlite").exists()
