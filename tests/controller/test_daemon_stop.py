"""``opendrs run`` stopped while its HTTP server answers: SIGTERM with requests in flight — pages
drawing their charts, ``POST /api/place``, approvals, balance now — must end the daemon with exit
status 0, its stop logged and no traceback, every time. A request thread still drawing a chart
while the interpreter exited had the process abort (SIGABRT, in matplotlib's C++ code). The
server's own stop is checked in the process too: it waits for the requests being answered, and
cuts those that outlast its grace."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path

import pytest
from tests.controller.test_dashboard import _config

from daemon import Daemon, send, served
from opendrs.controller.config import HttpConfig
from opendrs.controller.dashboard import Dashboard
from opendrs.controller.http_server import MetricsServer, start_server
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
    dashboard served with ``http.write`` on behind a bearer token."""
    pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
    pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")
    from backends.fakepve_fixture import proxmox_config, running_on_pve1, three_nodes

    cluster = three_nodes(str(tmp_path))
    running_on_pve1(cluster.pve, range(100, 108))
    (tmp_path / "http.token").write_text(TOKEN + "\n")
    (tmp_path / "http.token").chmod(0o600)
    http = "http: {listen: '127.0.0.1:0', token_file: http.token, write: true, token_name: ops}\n"
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
    place = HeldPlace(hold=1.0)
    server = held_server(place)
    statuses: list[int | None] = []
    client = post_place(server.address, statuses)
    assert place.entered.wait(10)
    with caplog.at_level(logging.DEBUG, logger="opendrs"):
        server.stop(grace=0.1)
    client.join(10)
    assert request_threads() == [], "stop returned before the request's thread ended"
    assert statuses == [None]  # the connection was cut: no answer
    assert "1 request(s) not answered within 0.1s of stopping: cut" in caplog.text
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
    client.join(10)
    assert statuses == [None] and request_threads() == []
    assert "cut" in caplog.text
    assert "cannot answer" not in caplog.text and "Traceback" not in caplog.text
